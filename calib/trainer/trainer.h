/* The trainer's shared library. */
void lib_leaf(void);
void lib_nonleaf(int b, int c);
