/* itrace calibration trainer, shared-library half: called through the PLT from the program;
 * its own calls stay inside the library (direct, or through a pointer). */
#include "trainer.h"

volatile int lib_sink;

void lib_leaf(void) {}
static void lib_leaf_work(void) { lib_sink++; }
void (*volatile lib_leaf_p)(void) = lib_leaf;
void (*volatile lib_nonleaf_p)(int, int) = lib_nonleaf;

void lib_nonleaf(int b, int c) {
    int k[2] = {b, c};
    for (int i = 0; i < 2; i++) {
        switch (k[i]) {
        case 0: case 2: lib_leaf(); break;
        case 1: case 7: lib_leaf_p(); break;
        case 3: case 5: lib_nonleaf(-1, -1); break;
        case 4: lib_nonleaf_p(-1, -1); break;
        case 6: lib_leaf_work(); break;
        default: break;
        }
    }
}
