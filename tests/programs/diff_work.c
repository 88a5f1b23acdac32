/* itrace diff's test program (tests/tests/diff.rs), built twice: with -DWORK_ITERATIONS=100
 * and =700. Only `work` differs between the builds; `caller` and main call it (their
 * inclusive counts move with it), `helper` is a sibling whose counts must not move. */

#ifndef WORK_ITERATIONS
#error "build with -DWORK_ITERATIONS=N"
#endif

static volatile long sink;

__attribute__((noinline)) long work(long n)
{
    long s = 0;
    for (long i = 0; i < WORK_ITERATIONS; i++)
        s += i ^ n;
    return s;
}

__attribute__((noinline)) long helper(long x)
{
    long s = 0;
    for (long i = 0; i < 50; i++)
        s += x * i;
    return s;
}

__attribute__((noinline)) long caller(long n)
{
    return work(n) + 1;
}

int main(void)
{
    long t = 0;
    for (long k = 0; k < 3; k++) {
        t += caller(k);
        t += helper(k);
    }
    sink = t;
    return 0;
}
