/* libitrace's region entry points for the s390x guest's region program (tests/programs/region.c).
 * The ptrace recorder puts breakpoints on them and returns for them itself (r2 the result), so
 * these bodies never run under it: it needs the symbols only. (libitrace proper is a Rust library
 * whose in-process recorder is x86_64's; it is not cross-built for the guest.) Untraced, they do
 * nothing. */
#include "itrace.h"

void ITraceOn(void) {}
void ITraceOff(void) {}
int ITraceEnabled(void) { return 0; }
