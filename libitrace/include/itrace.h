/* itrace.h - region tracing from inside a program.
 *
 * Bracket the code to trace with ITraceOn() and ITraceOff(); run the program
 * under `itrace record --region -- ./prog` (or attach with
 * `itrace record --region -p PID`). Outside itrace the calls do nothing and
 * cost a few nanoseconds (where the kernel shim is loaded, an outermost
 * ITraceOn also asks /dev/itrace whether the thread is traced).
 *
 * Semantics (PI's ITraceEnableCurrent): tracing applies to the calling
 * thread, from the return of ITraceOn() to the call of ITraceOff(); other
 * threads run untouched. Pairs nest: only the outermost pair starts and
 * stops tracing. A thread that exits inside a region ends it.
 *
 * Link with -litrace (libitrace.so or libitrace.a, built by
 * `cargo build -p libitrace`), or call the functions through this header and
 * load the library with LD_PRELOAD.
 */
#ifndef ITRACE_H
#define ITRACE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Start tracing the calling thread (nested calls count). */
void ITraceOn(void);

/* Stop tracing the calling thread when the outermost region ends. */
void ITraceOff(void);

/* 1 if the calling thread is being traced now, else 0. */
int ITraceEnabled(void);

/* The calling thread's virtual instruction counter while the in-process
 * recorder traces it: its instructions since the outermost ITraceOn(),
 * counting the call of this function but none of its own; 0 untraced. */
unsigned long long ITraceInstructions(void);

/* The counter, then stepping pauses (nothing is traced or counted) until
 * ITraceInstructionsResume(), which returns the counter again; stepping
 * resumes after it returns. A profiler's Early and Late Reads. */
unsigned long long ITraceInstructionsPause(void);
unsigned long long ITraceInstructionsResume(void);

#ifdef __cplusplus
}
#endif

#endif /* ITRACE_H */
