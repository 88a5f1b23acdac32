/* Calls through the PLT: printf, malloc, strcpy, strcmp and free, six times each from main
 * (tests/tests/plt_calls.rs compares their call counts and inclusive costs with callgrind's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    static const char *words[] = {"pear", "apple", "fig", "plum", "kiwi", "lime"};
    int found = 0;
    for (int i = 0; i < 6; i++) {
        char *p = malloc(16 + 8 * i);
        if (!p)
            return 2;
        strcpy(p, words[i]);
        if (strcmp(p, argc > 1 ? argv[1] : "fig") == 0)
            found++;
        printf("%d %s %d\n", i, p, found);
        free(p);
    }
    return found == 1 ? 0 : 1;
}
