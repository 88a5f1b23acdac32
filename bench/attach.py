#!/usr/bin/env python3
"""itrace benchmark of attaching (`itrace record -p PID`, issue 29), baselines in the same run.

On bench/attach_busy.c (THREADS threads computing, no system call in their loop):
  - rate: instructions recorded per second of attach (`--duration D`), with --backend translate
    and with --step block (block stepping), 1 thread and 8 threads; the ratios translate/block
    and 8 threads/1 thread (2 cores: at most 2x);
  - attach: from the command (the moment before itrace is started) to the first recorded block
    and to the last thread's trace start (TraceOn), 8 threads, from `itrace dump`'s time stamps
    (CLOCK_MONOTONIC, as this script's time.monotonic_ns);
  - detach: from SIGTERM to itrace's exit, with every thread let go (8 threads);
  - side by side: Frida's Stalker attached to the same program (`frida.attach`, every thread
    followed, every block event delivered; bench/frida_attach.py), 1 and 8 threads: its rate,
    its attach time, and whether the threads run free after its detach. A Frida run that does
    not finish within BENCH_FRIDA_TIMEOUT (120 s) counts as a hang (it is killed).
Each configuration runs REPS times; the best is compared, the median printed too. The target
must run on after every detach and end with exit status 0. A benchmark, not a test: exit status
non-zero only when something failed to run. Results go in bench/README.md.

Environment: ITRACE (default target/release/itrace, built with cargo unless BENCH_NO_CARGO=1),
BENCH_REPS (3), BENCH_SECONDS (2: attach length for rates), BENCH_OUT (bench/build),
BENCH_NO_FRIDA=1 (skip Frida; otherwise it is pip-installed into target/frida-venv if
`import frida` fails, and the script says so), BENCH_FRIDA_TIMEOUT (120).

`bench/attach.py --detach-only [BASELINE_ITRACE]`: only the detach (SIGTERM to itrace's exit, 8
threads, 1 s attached), BENCH_REPS times; with a baseline binary, the two alternate on the same
target (the machine's load changes between runs), each run of one followed by one of the other.
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ITRACE = os.environ.get("ITRACE", os.path.join(ROOT, "target/release/itrace"))
REPS = int(os.environ.get("BENCH_REPS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
OUT = os.environ.get("BENCH_OUT", os.path.join(HERE, "build"))
FRIDA_TIMEOUT = float(os.environ.get("BENCH_FRIDA_TIMEOUT", "120"))
FAILS = []


def say(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def build():
    if not os.environ.get("BENCH_NO_CARGO") and "ITRACE" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "itrace"], cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)
    exe = os.path.join(OUT, "attach_busy")
    subprocess.run(["gcc", "-O1", "-g", "-pthread", "-o", exe, os.path.join(HERE, "attach_busy.c")], check=True)
    return exe


class Target:
    def __init__(self, exe, threads):
        self.p = subprocess.Popen([exe, str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if "started pid=" not in line:
            raise RuntimeError(f"attach_busy did not start: {line!r}")
        self.pid = self.p.pid

    def threads_free(self):
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                status = open(f"/proc/{self.pid}/task/{tid}/status").read()
            except OSError:
                continue
            tracer = int(status.split("TracerPid:")[1].split()[0])
            state = status.split("State:")[1].split()[0]
            if tracer != 0 or state not in ("R", "S"):
                return False
        return True

    def finish(self):
        self.p.stdin.close()
        out = self.p.stdout.read()
        rc = self.p.wait(timeout=60)
        if rc != 0 or "done" not in out:
            FAILS.append(f"attach_busy ended with {rc}: {out!r}")


def record(pid, args, trace, duration=None):
    cmd = [ITRACE, "record", *args, "-p", str(pid), "-o", trace]
    if duration is not None:
        cmd += ["--duration", str(duration)]
    t0 = time.monotonic_ns()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    t1 = time.monotonic_ns()
    if r.returncode != 0:
        FAILS.append(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return t0, t1


def instructions(trace):
    r = subprocess.run([ITRACE, "report", "--json", "-q", trace], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        FAILS.append(f"report {trace}: {r.stderr.strip()}")
        return 0
    return json.loads(r.stdout)["total_instructions"]


def first_times(trace):
    """(first branch record's time stamp, last TraceOn's time stamp) of a trace, in ns."""
    p = subprocess.Popen([ITRACE, "dump", "-q", trace], stdout=subprocess.PIPE, text=True)
    first_branch, trace_ons, lines = None, [], 0
    for line in p.stdout:
        lines += 1
        if "TraceOn(" in line:
            trace_ons.append(int(line.split("ts: ")[1].split(",")[0]))
        elif first_branch is None and " U " in line:
            first_branch = int(line.split()[2])
        if first_branch is not None and lines > 20000:
            break
    p.kill()
    p.wait()
    return first_branch, max(trace_ons) if trace_ons else None


def frida_python():
    """A python that imports frida (installed into target/frida-venv if needed), or None."""
    if os.environ.get("BENCH_NO_FRIDA") == "1":
        return None
    venv = os.path.join(ROOT, "target/frida-venv")
    for py in (sys.executable, os.path.join(venv, "bin/python")):
        if os.path.exists(py) and subprocess.run([py, "-c", "import frida"], capture_output=True).returncode == 0:
            return py
    say(f"frida is not installed: installing it (pip install frida) into {venv}")
    r = subprocess.run([sys.executable, "-m", "venv", venv])
    if r.returncode == 0:
        r = subprocess.run([os.path.join(venv, "bin/pip"), "install", "-q", "frida"])
    if r.returncode != 0:
        FAILS.append(f"pip install frida (into {venv})")
        return None
    return os.path.join(venv, "bin/python")


def frida_attach(py, pid, secs):
    """Frida's run on `pid`: its JSON result, or "hang" when it did not finish in time."""
    cmd = [py, os.path.join(HERE, "frida_attach.py"), str(pid), str(secs)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=FRIDA_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return "hang"
    if p.returncode != 0:
        FAILS.append(f"{' '.join(cmd)}: {err.strip()[-300:]}")
        return None
    return json.loads(out.strip().splitlines()[-1])


def detach_once(itrace, target, trace):
    """Attach with --backend translate for 1 s, then SIGTERM: the time to itrace's exit, in ms."""
    p = subprocess.Popen([itrace, "record", "--backend", "translate", "-p", str(target.pid), "-o", trace],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    t_sig = time.monotonic_ns()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    ms = (time.monotonic_ns() - t_sig) / 1e6
    if p.returncode != 0:
        FAILS.append(f"detach by SIGTERM: {itrace} exited with {p.returncode}")
    if not target.threads_free():
        FAILS.append(f"after SIGTERM ({itrace}): a thread still traced or stopped")
    os.unlink(trace)
    return ms


def detach_only(baseline):
    """SIGTERM to itrace's exit, 8 threads, REPS times (alternating with `baseline` if given)."""
    exe = build()
    bins = [ITRACE] + ([baseline] if baseline else [])
    tmp = tempfile.mkdtemp(prefix="itrace-bench-detach-")
    target = Target(exe, 8)
    got = {b: [] for b in bins}
    load = os.getloadavg()[0]
    for rep in range(REPS):
        for n, b in enumerate(bins):
            got[b].append(detach_once(b, target, os.path.join(tmp, f"det-{n}-{rep}.itr")))
    target.finish()
    for b in bins:
        best, med = best_med(got[b], min)
        runs = " ".join(f"{x:.1f}" for x in got[b])
        print(f"{b}: SIGTERM to itrace's exit (detach), 8 threads: best {best:.1f} ms, median {med:.1f} ms ({runs})")
    print(f"load average: {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if FAILS:
        for f in FAILS:
            print(f"bench: FAILED: {f}", file=sys.stderr)
        sys.exit(1)


def best_med(xs, best=max):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return best(xs), statistics.median(xs)


def main():
    exe = build()
    py = frida_python()
    frida = {}
    tmp = tempfile.mkdtemp(prefix="itrace-bench-attach-")
    rates = {}
    for threads in (1, 8):
        target = Target(exe, threads)
        for name, args, secs in (("translate", ["--backend", "translate"], SECONDS), ("block", ["--step", "block"], SECONDS)):
            got = []
            for rep in range(REPS):
                trace = os.path.join(tmp, f"r{threads}-{name}-{rep}.itr")
                record(target.pid, args, trace, secs)
                if not target.threads_free():
                    FAILS.append(f"{name} {threads} threads: a thread still traced or stopped after the detach")
                got.append(instructions(trace) / secs)
                os.unlink(trace)
            rates[(threads, name)] = best_med(got)
            say(f"{threads} thread(s), {name}: best {rates[(threads, name)][0] / 1e6:.2f} M instructions/s")
        if py:
            got, attach_s, hangs, unfree = [], [], 0, 0
            for rep in range(REPS):
                r = frida_attach(py, target.pid, SECONDS)
                if r == "hang":
                    hangs += 1
                elif r:
                    got.append(r["instructions"] / r["seconds"])
                    attach_s.append(r["attach_seconds"] * 1e3)
                time.sleep(0.5)
                if not target.threads_free():
                    unfree += 1
            frida[threads] = (best_med(got), best_med(attach_s, min), hangs, unfree)
            say(f"{threads} thread(s), Frida: best {(frida[threads][0][0] or 0) / 1e6:.2f} M instructions/s, {hangs} hang(s)")
        target.finish()

    # attach and detach latencies, 8 threads
    target = Target(exe, 8)
    first, all_on, detach = [], [], []
    for rep in range(REPS):
        trace = os.path.join(tmp, f"lat-{rep}.itr")
        t0, _ = record(target.pid, ["--backend", "translate"], trace, 0.2)
        fb, on = first_times(trace)
        first.append(None if fb is None else (fb - t0) / 1e6)
        all_on.append(None if on is None else (on - t0) / 1e6)
        os.unlink(trace)
        detach.append(detach_once(ITRACE, target, os.path.join(tmp, f"det-{rep}.itr")))
    target.finish()

    def m(x):
        return "n/a" if x is None else f"{x / 1e6:.2f} M"

    print()
    print("| attached to bench/attach_busy.c | instructions/s, best (median) |")
    print("|---|---|")
    for (threads, name), (b, med) in sorted(rates.items()):
        print(f"| {threads} thread(s), {'--backend translate' if name == 'translate' else '--step block'} | {m(b)} ({m(med)}) |")
    tr1, bl1, tr8 = rates[(1, "translate")][0], rates[(1, "block")][0], rates[(8, "translate")][0]
    print()
    print(f"translate / block stepping, 1 thread: {tr1 / bl1:.0f}x (target 50x, stretch 100x)")
    print(f"translate / block stepping, 8 threads: {tr8 / rates[(8, 'block')][0]:.0f}x")
    print(f"8 threads / 1 thread, translate: {tr8 / tr1:.2f}x (target 1.6x on 2 cores)")
    for threads, ((fb, fmed), (ab, amed), hangs, unfree) in sorted(frida.items()):
        if fb is None:
            print(f"Frida's Stalker, {threads} thread(s): no complete run ({hangs} hang(s) in {REPS})")
            continue
        print(f"Frida's Stalker, {threads} thread(s): best {m(fb)} ({m(fmed)}) instructions/s, attach "
              f"{ab:.0f} ms ({amed:.0f}); translate / Frida: {rates[(threads, 'translate')][0] / fb:.1f}x; "
              f"{hangs} hang(s) in {REPS}; {unfree} run(s) leaving a thread not free")
    for label, xs, target_ms in (("command to first recorded block", first, 50),
                                 ("command to every thread traced", all_on, None),
                                 ("SIGTERM to itrace's exit (detach)", detach, 50)):
        b, med = best_med(xs, min)
        tail = f" (target {target_ms} ms)" if target_ms else ""
        print(f"{label}, 8 threads: best {b:.1f} ms, median {med:.1f} ms{tail}" if b is not None else f"{label}: n/a")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if FAILS:
        for f in FAILS:
            print(f"bench: FAILED: {f}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    if "--detach-only" in sys.argv[1:]:
        rest = [a for a in sys.argv[1:] if a != "--detach-only"]
        detach_only(rest[0] if rest else None)
    else:
        main()
