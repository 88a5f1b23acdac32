//! CPU numbers without a system call per step: each traced thread is pinned to one CPU of
//! its allowed set (round robin) while traced, and the tracer follows the thread it steps.

use super::engine::*;

impl Session<'_> {
    /// The CPU of a new traced thread: of the CPUs with the fewest traced threads, the first
    /// from the round robin's next. (A thread that followed the tracer, below, may be on the
    /// CPU the round robin gives next.)
    pub(super) fn assign_cpu(&mut self) -> usize {
        let n = self.cpus.len();
        let threads_on = |c: usize| self.threads.values().filter(|t| t.cpu == c).count();
        let c = (0..n)
            .map(|i| self.cpus[(self.next_cpu + i) % n])
            .min_by_key(|&c| threads_on(c))
            .expect("at least one CPU");
        self.next_cpu += 1;
        c
    }

    /// A tracer that does not follow its threads (the translating recorder, see
    /// `tracer_follows_threads`) while it traces a single thread: the thread is moved to the
    /// CPU the tracer runs on, before it is resumed. Its stops (a unit to translate, an
    /// indirect target new to it, a system call, a full ring) are then a ping-pong on one
    /// CPU, where a wake-up across CPUs each way cost more than the stop's work in these VMs
    /// (`python3 -c pass`, 150 k stops: 8.6-9.2 s, 5.9 s with everything on one CPU). The
    /// tracer stays free to move (pinned, the scheduler could starve it, `unpin_thread`); the
    /// thread follows it at its next stop. Pinned where the tracer is not, the thread itself
    /// is the one a busy machine starves: its group's load is on the tracer's CPU.
    pub(super) fn thread_follows_tracer(&mut self, tid: i32) {
        if self.threads.len() != 1 || self.detaching.is_some() {
            return;
        }
        // SAFETY: sched_getcpu has no preconditions.
        let Ok(cpu) = usize::try_from(unsafe { libc::sched_getcpu() }) else { return };
        if self.threads.get(&tid).is_none_or(|t| t.cpu == cpu) || !self.cpus.contains(&cpu) {
            return;
        }
        self.move_thread(tid, cpu);
    }

    /// Pin a thread to its CPU, remembering its affinity to restore later.
    pub(super) fn pin_thread(&mut self, tid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            if t.original_affinity.is_none() {
                t.original_affinity = get_affinity(tid);
            }
            if let Some(p) = self.procs.get_mut(&t.pid) {
                if p.affinity.is_none() {
                    p.affinity = t.original_affinity;
                }
            }
            if !pin(tid, t.cpu) {
                // Cannot pin (cpuset rules): report the CPU the tracer sees; mostly right for a ping-pong.
                // SAFETY: sched_getcpu has no preconditions.
                let c = unsafe { libc::sched_getcpu() };
                t.cpu = c.max(0) as usize;
            }
        }
    }

    /// Move a traced thread to `cpu` (pinned there, its records that CPU's from now on; the
    /// sink keeps them after its records on the CPU it left, `sink::stamp_with`).
    pub(super) fn move_thread(&mut self, tid: i32, cpu: usize) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.cpu = cpu;
        self.pin_thread(tid);
    }

    /// Keep the tracer on the CPU of the (first) traced thread: a step is a ping-pong between
    /// the two, cheaper without a cross-CPU wake-up.
    pub(super) fn pin_tracer(&mut self, tid: i32) {
        if !self.opts.step.tracer_follows_threads() {
            return;
        }
        if let Some(t) = self.threads.get(&tid) {
            pin(0, t.cpu);
        }
    }

    /// Give a pinned thread back the CPUs it may use untraced: its affinity before we pinned it,
    /// or, for one made while traced, its process's (it may have inherited its creator's pin).
    ///
    /// Done for a thread itrace waits for and cannot do without: one a detach interrupted, one
    /// a nested wait (a remote system call, a step inside a stub) still waits for at itrace's
    /// tick. Pinned, such a thread can be left runnable and unrun for seconds: with
    /// autogroups (or any cgroup), the scheduler weighs a process's threads on a CPU by the
    /// group's load there, and a thread alone on its CPU while the group's other threads (and
    /// itrace, nice -10, or threads a detach raised to -20) load the other one gets a share
    /// of a few percent there, and a lag scaled up with it; `/sys/kernel/debug/sched/debug`
    /// showed such a group entity at weight 70 of 1024, 79 ms of virtual time behind the
    /// others, not run for 5 s while the other CPU was all but idle, the recording stalled in a
    /// nested wait for that thread. Unpinned, the idle CPU takes it.
    pub(super) fn unpin_thread(&self, tid: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        if let Some(set) = t.original_affinity.or_else(|| self.procs.get(&t.pid).and_then(|p| p.affinity)) {
            set_affinity(tid, &set);
        }
    }
}

pub(super) fn allowed_cpus(pid: i32) -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    let v: Vec<usize> = if r == 0 {
        // SAFETY: CPU_ISSET reads the set only, with an in-range index.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
    } else {
        Vec::new()
    };
    if v.is_empty() {
        vec![0]
    } else {
        v
    }
}

/// Raise a thread that must stop soon (a detach's interrupt is pending) to the highest
/// priority of its scheduling policy, if the policy is one with nice values (SCHED_OTHER,
/// SCHED_BATCH): its nice value before, to give back with [`set_nice`]. Real-time and idle
/// threads are left as they are.
pub(super) fn boost_to_stop(tid: i32) -> Option<i32> {
    // SAFETY: plain integer system calls on a thread id.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 || !matches!(policy & !libc::SCHED_RESET_ON_FORK, libc::SCHED_OTHER | libc::SCHED_BATCH) {
        return None;
    }
    nix::errno::Errno::clear();
    // SAFETY: as above; -1 is also a valid nice value, hence errno.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    if nice == -1 && nix::errno::Errno::last_raw() != 0 {
        return None;
    }
    (nice > -20 && set_nice(tid, -20)).then_some(nice)
}

/// Set a thread's nice value (Linux keeps one per thread).
pub(super) fn set_nice(tid: i32, nice: i32) -> bool {
    // SAFETY: plain integer system call on a thread id.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0 }
}

pub(super) fn get_affinity(tid: i32) -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is a plain bit array: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
}

pub(super) fn set_affinity(tid: i32, set: &libc::cpu_set_t) -> bool {
    // SAFETY: set is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
}

pub(super) fn pin(tid: i32, cpu: usize) -> bool {
    // SAFETY: cpu_set_t is a plain bit array: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu < CPU_SETSIZE (it came from an affinity mask); set is valid.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set_affinity(tid, &set)
}
