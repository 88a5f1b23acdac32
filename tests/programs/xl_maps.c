/* xl_maps.c - a program that reads its own /proc/self/maps (tests/tests/translate.rs): it
 * prints every line (the test compares them with the untraced run's), then how many it read. */
#include <stdio.h>

int main(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 2;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        fputs(line, stdout);
        n++;
    }
    fclose(f);
    printf("xl_maps: %d lines\n", n);
    return n > 0 ? 0 : 1;
}
