/* itrace calibration trainer: produces every sequence of two hook events (entry, exit) and
 * function kinds (leaf or not; called directly, through a pointer, or through the PLT of a
 * shared library) that C code compiled with -finstrument-functions can show. Built and run by
 * `itrace calib train`. */
#include "trainer.h"

volatile int sink;

void leaf(void) {}
void leaf_work(void) { sink++; }

void (*volatile leaf_ptr)(void) = leaf;
void (*volatile leaf_work_ptr)(void) = leaf_work;
void nonleaf(int b, int c);
void (*volatile nonleaf_ptr)(int, int) = nonleaf;
void (*volatile lib_leaf_ptr)(void) = lib_leaf;

/* Call child kind k: 0 leaf, 1 leaf by pointer, 2 library leaf (PLT), 3 non-leaf, 4 non-leaf
 * by pointer, 5 library non-leaf (PLT), 6 leaf with work, 7 library leaf by pointer. */
#define CHILD(k)                                                                                   \
    switch (k) {                                                                                   \
    case 0: leaf(); break;                                                                         \
    case 1: leaf_ptr(); break;                                                                     \
    case 2: lib_leaf(); break;                                                                     \
    case 3: nonleaf(-1, -1); break;                                                                \
    case 4: nonleaf_ptr(-1, -1); break;                                                            \
    case 5: lib_nonleaf(-1, -1); break;                                                            \
    case 6: leaf_work_ptr(); break;                                                                \
    case 7: lib_leaf_ptr(); break;                                                                 \
    default: break;                                                                                \
    }

void nonleaf(int b, int c) {
    CHILD(b);
    CHILD(c);
}

int main(void) {
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 3; k++)
            for (int b = -1; b < 8; b++)
                for (int c = -1; c < 8; c++) {
                    if (k == 0) nonleaf(b, c);
                    else if (k == 1) nonleaf_ptr(b, c);
                    else lib_nonleaf(b, c);
                }
    return 0;
}
