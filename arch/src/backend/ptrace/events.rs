//! The stops that are not single steps: ptrace events (clone, exec, exit), group stops and
//! interrupts, a thread's first stop, and signals on their way to the program.

use super::engine::*;
use crate::procfs::{self};
use crate::Arch;
use itrace_decoders::Flow;
use itrace_format::{branch_flags, now_ns, Branch, BranchKind, Mte, Record, StopReason, TraceOn, TraceOnReason};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

impl Session<'_> {
    pub(super) fn on_event(&mut self, tid: i32, sig: i32, ev: i32) {
        if !self.threads.contains_key(&tid) {
            self.adopt(tid);
        }
        self.put_back_lifted(tid);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stopped = true;
        }
        self.at_event(tid);
        match ev {
            libc::PTRACE_EVENT_STOP => self.on_interrupt_stop(tid, sig),
            libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let child = ptrace::getevent(Pid::from_raw(tid)).unwrap_or(0) as i32;
                self.on_clone(tid, child, ev);
                self.go_on(tid);
            }
            libc::PTRACE_EVENT_EXEC => {
                let former = ptrace::getevent(Pid::from_raw(tid)).unwrap_or(tid as i64) as i32;
                self.on_exec(tid, former);
                self.go_on(tid);
            }
            libc::PTRACE_EVENT_EXIT => {
                let status = ptrace::getevent(Pid::from_raw(tid)).unwrap_or(0) as i32;
                self.on_exit_event(tid, status);
                // Let it exit; it is no longer ours to step.
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.stopped = false;
                }
                let _ = ptrace::cont(Pid::from_raw(tid), None);
            }
            _ => self.go_on(tid),
        }
    }

    /// After an event: a thread seized but not started yet (its attach's interrupt stop still
    /// to come: the event, a clone or an exec, came first) runs on untraced until that stop,
    /// as `pass_on_before_start` says why; the others are resumed as traced.
    fn go_on(&mut self, tid: i32) {
        match self.threads.get(&tid).map(|t| t.state) {
            Some(ThreadState::New) => self.pass_on_before_start(tid, 0),
            _ => self.resume(tid, 0),
        }
    }

    /// A stopped tid we did not know: a new thread or child reported before its parent's event.
    pub(super) fn adopt(&mut self, tid: i32) {
        let pid = procfs::tgid(tid).unwrap_or(tid);
        let cpu = self.assign_cpu();
        let t = self.new_thread(tid, pid, cpu);
        self.threads.insert(tid, t);
    }

    pub(super) fn on_clone(&mut self, parent: i32, child: i32, ev: i32) {
        let Some(p) = self.threads.get(&parent) else { return };
        let parent_pid = p.pid;
        let parent_affinity = p.original_affinity;
        let parent_nice = p.nice_before_detach;
        let child_pid = procfs::tgid(child).unwrap_or(if ev == libc::PTRACE_EVENT_CLONE { parent_pid } else { child });
        let thread = child_pid == parent_pid;
        let ts = now_ns();
        self.emit_mte(Mte::Clone {
            ts,
            parent_pid: parent_pid as u32,
            parent_tid: parent as u32,
            child_pid: child_pid as u32,
            child_tid: child as u32,
            thread,
        });
        if !self.threads.contains_key(&child) {
            let cpu = self.assign_cpu();
            let t = self.new_thread(child, child_pid, cpu);
            self.threads.insert(child, t);
        }
        if let Some(t) = self.threads.get_mut(&child) {
            t.pid = child_pid;
            // It inherited its parent's affinity as we pinned it: untraced, it would have the
            // parent's own, which a detach gives back (before, it stayed on one CPU).
            if parent_affinity.is_some() {
                t.original_affinity = parent_affinity;
            }
            // Made by a thread a detach raised (`boost_to_stop`), it may have inherited the
            // raised priority: it gets its parent's own back too.
            if parent_nice.is_some() {
                t.nice_before_detach = parent_nice;
            }
        }
        if !thread && self.opts.follow_forks {
            self.out.processes += 1;
            // The child starts with a copy of the parent's address space.
            let (maps, code, name) = match self.procs.get(&parent_pid) {
                Some(pp) => (pp.maps.clone(), pp.code.clone(), pp.name.clone()),
                None => (Vec::new(), IntMap::default(), String::new()),
            };
            self.emit_mte(Mte::ProcessName { ts, pid: child_pid as u32, ppid: parent_pid as u32, name: name.clone() });
            for m in &maps {
                self.emit_mte(Mte::Segment {
                    ts,
                    pid: child_pid as u32,
                    prot: m.prot,
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    path: m.path.clone(),
                });
            }
            self.seen_pids.push((child_pid, crate::procfs::process_start(child_pid)));
            let mut p = Process::new(maps, code, name);
            if let Some(pp) = self.procs.get(&parent_pid) {
                // The child's memory is a copy, our breakpoints and traps included.
                p.arch = pp.arch.copy_for_child(ev == libc::PTRACE_EVENT_VFORK);
                p.region = pp.region.clone();
            }
            self.procs.insert(child_pid, p);
        }
    }

    pub(super) fn on_exec(&mut self, tid: i32, former: i32) {
        let ts = now_ns();
        if former != tid {
            // A non-leader thread called exec and took over the leader's tid.
            if let Some(mut t) = self.threads.remove(&former) {
                self.finish_thread(tid, StopReason::Vanished, 0);
                self.threads.remove(&tid);
                t.tid = tid;
                self.threads.insert(tid, t);
            }
        }
        self.at_exec(tid);
        let Some(t) = self.threads.get(&tid) else { return };
        let pid = t.pid;
        let launching = t.state == ThreadState::Launching;
        let path = procfs::exe(pid);
        self.emit_mte(Mte::Exec { ts, pid: pid as u32, tid: tid as u32, path });
        self.procs.remove(&pid);
        let ppid = procfs::ppid(pid).unwrap_or(0);
        self.new_process(pid, ts, ppid);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.name.clear();
        }
        self.name_thread(pid, tid, ts);
        if self.region_exec(tid, pid, launching) {
            return;
        }
        if launching {
            // The launched program's first instruction: start stepping here.
            self.pin_thread(tid);
            self.pin_tracer(tid);
            let Some(pending) = self.first_pending(tid, pid, true) else { return };
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.state = ThreadState::Stepping;
            t.pending = Some(pending);
            // Resuming with a step makes the kernel report the end of execve before the first instruction.
            t.skip_report_at = Some(pending.pc);
            let (cpu, pc) = (t.cpu, pending.pc);
            self.out.threads += 1;
            let on = TraceOn { ts, reason: TraceOnReason::Start, pid: pid as u32, tid: tid as u32, pc };
            self.push_control(cpu, Record::TraceOn(on));
        }
    }

    pub(super) fn on_exit_event(&mut self, tid: i32, status: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        if t.state != ThreadState::Stepping {
            return;
        }
        let (pid, cpu) = (t.pid, t.cpu);
        self.name_thread(pid, tid, now_ns());
        let signaled = libc::WIFSIGNALED(status);
        let nr = self.exit_syscall_nr(tid, signaled);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        if let Some(p) = t.pending {
            if p.insn.flow == Flow::Syscall && !signaled && t.arch.isa().is_exit_syscall(nr) {
                // The exit system call ran and never returns.
                let b = Branch {
                    ts: t.syscall_ts,
                    kernel: false,
                    kind: BranchKind::Intrpt,
                    flags: branch_flags::SYSCALL,
                    aux: nr as u16,
                    from: p.pc,
                    to: 0,
                    tid: tid as u32,
                    icount: t.icount + 1,
                };
                t.icount = 0;
                t.pending = Some(Pending { pc: p.pc + p.insn.len as u64, ..p });
                self.push_branch(cpu, b);
            }
        }
        if signaled {
            self.finish_thread(tid, StopReason::Signaled, libc::WTERMSIG(status));
        } else {
            self.finish_thread(tid, StopReason::Exited, libc::WEXITSTATUS(status));
        }
    }

    /// PTRACE_EVENT_STOP: our interrupt, a new thread's first stop, or a group-stop.
    pub(super) fn on_interrupt_stop(&mut self, tid: i32, sig: i32) {
        let group_stop = matches!(sig, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU);
        let state = self.threads.get(&tid).map(|t| t.state);
        if self.detaching.is_some() {
            let traced = matches!(state, Some(ThreadState::Stepping | ThreadState::Running));
            if traced && procfs::thread_pending_signals(tid) & (1 << (libc::SIGTRAP - 1)) != 0 {
                // A step trap (or one of our breakpoints, hit by a running thread) is queued behind
                // this stop: detaching now would deliver it untraced and kill the program. Let it
                // surface as a signal stop, handle it there (moving the pc back onto a
                // breakpoint's instruction), then detach.
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.stopped = false;
                }
                let _ = ptrace::cont(Pid::from_raw(tid), None);
                return;
            }
            self.at_interrupt(tid);
            self.detach_thread(tid, 0);
            return;
        }
        if group_stop {
            // Stay stopped like an untraced process until SIGCONT.
            if let Some(t) = self.threads.get_mut(&tid) {
                t.stopped = false;
            }
            // SAFETY: plain ptrace request on a tracee in group-stop; no pointers are passed.
            unsafe { libc::ptrace(libc::PTRACE_LISTEN, tid, 0, 0) };
            return;
        }
        match state {
            Some(ThreadState::New) => self.start_thread(tid),
            Some(ThreadState::Launching) => {
                let _ = ptrace::cont(Pid::from_raw(tid), None);
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.stopped = false;
                }
            }
            _ => {
                self.at_interrupt(tid);
                self.resume(tid, 0)
            }
        }
    }

    /// First stop of an attached thread or a new thread/process: start stepping it.
    pub(super) fn start_thread(&mut self, tid: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        let (pid, attach) = (t.pid, t.attached);
        if !self.procs.contains_key(&pid) {
            // A new process whose fork event has not been seen, or one we must not follow.
            if !self.opts.follow_forks {
                self.release_unfollowed(tid, pid);
                return;
            }
            self.new_process(pid, now_ns(), procfs::ppid(pid).unwrap_or(0));
        }
        if !self.opts.follow_forks && Some(pid) != self.root_pid() {
            self.release_unfollowed(tid, pid);
            return;
        }
        self.pin_thread(tid);
        if attach {
            self.undo_stop_eintr(tid);
        }
        if self.region_start(tid, pid) {
            return;
        }
        let Some(pending) = self.first_pending(tid, pid, false) else {
            self.threads.remove(&tid);
            return;
        };
        let pc = pending.pc;
        let ts = now_ns();
        self.name_thread(pid, tid, ts);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.state = ThreadState::Stepping;
        t.pending = Some(pending);
        t.syscall_ts = ts;
        let cpu = t.cpu;
        if self.out.threads == 0 {
            self.pin_tracer(tid);
        }
        self.out.threads += 1;
        let reason = if attach { TraceOnReason::Attach } else { TraceOnReason::Start };
        self.push_control(cpu, Record::TraceOn(TraceOn { ts, reason, pid: pid as u32, tid: tid as u32, pc }));
        self.resume(tid, 0);
    }

    /// A thread seized but not yet started (its interrupt stop, or its exec, still to come)
    /// stopped for a signal of the program's (or an event): it gets it as untraced, with
    /// `PTRACE_CONT`. Resumed the way a traced thread is (a step), it would stop again at the
    /// next instruction (the handler's first) with a SIGTRAP of ours that, passed on in turn,
    /// kills the program (1 attach in about 150 to a program taking a timer signal every 2 ms).
    fn pass_on_before_start(&mut self, tid: i32, sig: i32) {
        if self.detaching.is_some() {
            return self.detach_thread(tid, sig);
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = false;
        let r = ptrace::cont(Pid::from_raw(tid), Signal::try_from(sig).ok());
        self.after_resume(tid, r);
    }

    pub(super) fn root_pid(&self) -> Option<i32> {
        match self.opts.target {
            Target::Attach { pid } => Some(procfs::tgid(pid).unwrap_or(pid)),
            Target::Launch { .. } => self.launched,
        }
    }

    /// A signal-delivery stop (a step trap or one of our breakpoints is SIGTRAP).
    pub(super) fn on_signal_stop(&mut self, tid: i32, sig: i32) {
        if !self.threads.contains_key(&tid) {
            self.adopt(tid);
        }
        self.put_back_lifted(tid);
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = true;
        match t.state {
            ThreadState::Stepping => self.on_stepping_stop(tid, sig),
            ThreadState::Running => self.running_stop(tid, sig),
            // A new child's initial stop when not seized (older kernels): start it.
            ThreadState::New if sig == libc::SIGSTOP => self.start_thread(tid),
            // A signal before the attach's interrupt stop, or before a launched program's exec:
            // the program's, passed on.
            ThreadState::New | ThreadState::Launching => self.pass_on_before_start(tid, sig),
            // Its trace ended: the signal is passed on as it is let go.
            ThreadState::Finished => self.resume(tid, sig),
        }
    }
}
