// SPDX-License-Identifier: GPL-2.0
/*
 * itrace kernel shim: records the taken branches of user-space threads in
 * the kernel. A traced thread runs with the trap flag (TF) set; the debug
 * trap after each instruction reaches this module's die notifier, which
 * writes a branch record into the current CPU's ring when the instruction
 * just executed was a taken branch, and returns to the thread with TF still
 * set and no signal. System calls, signal delivery, fork/clone, exec and exit
 * are seen through tracepoints and a kprobe. See docs/kmod.md.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/vmalloc.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/kdebug.h>
#include <linux/kprobes.h>
#include <linux/tracepoint.h>
#include <linux/hashtable.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>
#include <linux/sched/signal.h>
#include <linux/ptrace.h>
#include <linux/task_work.h>
#include <linux/cred.h>
#include <linux/capability.h>
#include <linux/delay.h>
#include <linux/signal.h>
#include <linux/poll.h>
#include <linux/wait.h>
#include <linux/timekeeping.h>
#include <asm/debugreg.h>
#include <asm/processor-flags.h>
#include <asm/sigframe.h>

#include "itrace_kmod.h"

#define ITR_RESERVE 4096	/* normal mode: room kept for trace-off records */
#define ITR_MIN_RING (64 << 10)
#define ITR_MAX_RING (1ULL << 30)
#define ITR_MAX_CPUS 256

#define NR_MMAP 9
#define NR_MPROTECT 10
#define NR_MUNMAP 11
#define NR_MREMAP 25
#define NR_SHMAT 30
#define NR_CLONE 56
#define NR_EXECVE 59
#define NR_EXIT 60
#define NR_PRCTL 157
#define NR_EXIT_GROUP 231
#define NR_EXECVEAT 322

enum itr_state {
	ITR_ARMED_EXEC,		/* launched child: tracing starts at execve */
	ITR_ACTIVE,		/* TF set, recording */
	ITR_IDLE,		/* region mode: waiting for ITR_IOC_ON */
	ITR_ATTACHING,		/* task work queued to set TF */
	ITR_LIB,		/* region mode: in libitrace (not recorded) until resume_pc */
};

struct itr_thread {
	struct hlist_node node;
	struct task_struct *task;
	pid_t pid, tid;
	u64 last_pc;
	u32 icount;
	int sys_nr;
	u32 gen;
	enum itr_state state;
	bool stopping;		/* stop at the next trap or system call exit */
	bool fresh;		/* new thread: its first system call exit is not a return */
	bool work_queued;
	bool open;		/* a trace-on record without its trace-off */
	bool region;		/* region mode (ITR_EN_REGION): ITR_IOC_ON/OFF start and end tracing */
	u64 resume_pc;		/* ITR_LIB: where recording goes on (0: not yet known) */
	bool lib_tf;		/* ITR_LIB: TF is set (from ITR_IOC_ON until resume_pc) */
	u64 lib_pc;		/* ITR_LIB: the library entry point the thread stopped at */
	u64 maps_seen;		/* itr_maps_changes at this thread's last mapping snapshot */
	u32 nentries;
	u64 entry[ITR_MAX_ENTRIES];	/* the library's entry points (ITR_IOC_ON) */
	struct callback_head work;
	bool throttle_queued;	/* continuous mode: waits for the consumer on its way to user space */
};

static DEFINE_SPINLOCK(itr_lock);
static DEFINE_HASHTABLE(itr_threads, 8);
static atomic_t itr_nthreads = ATOMIC_INIT(0);
static u64 itr_traps;
/* Mapping system calls seen of threads not recorded at the time (region mode). */
static u64 itr_maps_changes;

/* The session: one set of rings, owned by the file that installed it. */
static void *itr_area;
static size_t itr_area_size;
static struct itr_ctl *itr_ctl;
static u32 itr_ncpu, itr_mode, itr_cfg_flags, itr_gen;
static struct file *itr_owner;
static DEFINE_MUTEX(itr_session_mutex);

static bool (*itr_ptrace_may_access)(struct task_struct *task, unsigned int mode);

/* Continuous mode: the consumer polls itr_data_wq; throttled threads wait on itr_drain_wq. */
static DECLARE_WAIT_QUEUE_HEAD(itr_data_wq);
static DECLARE_WAIT_QUEUE_HEAD(itr_drain_wq);

/* ---- rings ---- */

static inline u64 itr_now(void)
{
	return ktime_get_ns();
}

static bool itr_session_live(u32 gen)
{
	return itr_ctl && gen == itr_gen;
}

/* Append one record to stream s. Called with itr_lock held. */
static bool itr_put(unsigned int s, const void *rec, u32 len, bool control)
{
	struct itr_stream *st = &itr_ctl->stream[s];
	u8 *ring = (u8 *)itr_area + st->offset;
	u64 size = st->size, head = st->head, tail = st->tail;
	u64 off = head % size, pad = 0, need, cap = size;
	bool trace = s < itr_ncpu;

	if (off + len > size)
		pad = size - off;
	need = pad + len;
	if (itr_mode == ITR_MODE_NORMAL && trace && !control)
		cap = size - ITR_RESERVE;
	if (itr_mode == ITR_MODE_WRAP && trace) {
		while (head + need - tail > size) {
			struct itr_rec_hdr *h = (void *)(ring + tail % size);

			if (h->len == 0 || h->len > size || tail + h->len > head) {
				tail = head;
				break;
			}
			if (h->major != ITR_MAJOR_PAD)
				st->lost++;
			tail += h->len;
		}
		WRITE_ONCE(st->tail, tail);
	} else if (head + need - tail > cap) {
		st->lost++;
		if (itr_mode == ITR_MODE_NORMAL)
			WRITE_ONCE(itr_ctl->full, 1);
		return false;
	}
	if (pad) {
		struct itr_rec_hdr *h = (void *)(ring + off);

		/* pad >= 4: records and rings are multiples of 4 bytes */
		h->len = pad;
		h->major = ITR_MAJOR_PAD;
	}
	memcpy(ring + (head + pad) % size, rec, len);
	st->records++;
	smp_store_release(&st->head, head + need);
	/*
	 * Continuous mode, ring over half full: wake the consumer. Whether it runs before this
	 * thread is the scheduler's decision (wake-up preemption); a thread that fills the ring
	 * to three quarters waits for the drain (itr_maybe_throttle). The module never sets
	 * TIF_NEED_RESCHED itself: without the preempt count's bit, which only the scheduler
	 * folds in, need_resched() is true while cond_resched() never yields, and kernel loops
	 * that break out on the one and yield with the other spin for good. exit_mmap's
	 * zap_pte_range did, on a CPU that wrote the exit system call's record here: a soft
	 * lockup until the guest's time ran out (docs/kmod.md, "Continuous mode").
	 */
	if (itr_mode == ITR_MODE_CONTINUOUS && (head + need - tail) * 2 > size && (head - tail) * 2 <= size)
		wake_up_interruptible(&itr_data_wq);
	return true;
}

static unsigned int itr_cpu(void)
{
	return raw_smp_processor_id() % itr_ncpu;
}

static void itr_hdr(struct itr_rec_hdr *h, u16 len, u16 major, u32 minor)
{
	h->len = len;
	h->major = major;
	h->minor = minor;
	h->ts = itr_now();
}

static struct itr_thread *itr_find(struct task_struct *task);

/* Whether stream s of session gen is drained to half (or the session is gone). */
static bool itr_drained(u32 gen, unsigned int s)
{
	unsigned long flags;
	bool ok;

	spin_lock_irqsave(&itr_lock, flags);
	ok = !itr_session_live(gen) ||
	     (itr_ctl->stream[s].head - itr_ctl->stream[s].tail) * 2 <= itr_ctl->stream[s].size;
	spin_unlock_irqrestore(&itr_lock, flags);
	return ok;
}

/*
 * Continuous mode: a thread that filled its CPU's ring to three quarters
 * waits, on its way back to user space (a task work, where it may sleep),
 * until the consumer has drained the ring to half: no record is lost to a
 * consumer that falls behind. A signal ends the wait early (the program
 * stays responsive); only then can records be dropped, and they are counted.
 * The end of the session (the consumer's file closed, whatever killed it)
 * ends the wait too: itr_free_session wakes itr_drain_wq after the
 * generation changed. The work is allocated apart from the thread's entry,
 * which may be freed before the work runs (the thread exits, or stops being
 * traced, with the work queued: exit_task_work runs it after the exit
 * tracepoint).
 */
struct itr_throttle {
	struct callback_head cb;
	u32 gen;
	unsigned int stream;
};

static void itr_throttle_work(struct callback_head *cb)
{
	struct itr_throttle *w = container_of(cb, struct itr_throttle, cb);
	struct itr_thread *t;
	unsigned long flags;
	bool wait;

	spin_lock_irqsave(&itr_lock, flags);
	t = itr_find(current);
	if (t)
		t->throttle_queued = false;
	wait = t && !t->stopping && !(current->flags & PF_EXITING);
	spin_unlock_irqrestore(&itr_lock, flags);
	if (wait)
		wait_event_interruptible(itr_drain_wq, itr_drained(w->gen, w->stream));
	kfree(w);
	module_put(THIS_MODULE);
}

/* Called with itr_lock held, after a record of the current thread t went to stream s. */
static void itr_maybe_throttle(struct itr_thread *t, unsigned int s)
{
	struct itr_stream *st = &itr_ctl->stream[s];
	struct itr_throttle *w;

	if (itr_mode != ITR_MODE_CONTINUOUS || t->throttle_queued || t->task != current ||
	    (st->head - st->tail) * 4 <= st->size * 3)
		return;
	w = kmalloc(sizeof(*w), GFP_ATOMIC);
	if (!w)
		return;
	w->gen = t->gen;
	w->stream = s;
	init_task_work(&w->cb, itr_throttle_work);
	__module_get(THIS_MODULE);
	if (task_work_add(current, &w->cb, TWA_RESUME)) {
		module_put(THIS_MODULE);
		kfree(w);
		return;
	}
	t->throttle_queued = true;
}

static bool itr_branch(struct itr_thread *t, bool kernel, u8 kind, u8 flags, u16 aux, u64 from, u64 to, u32 icount)
{
	struct itr_rec_branch r;
	bool ok;

	if (!itr_session_live(t->gen))
		return true;
	itr_hdr(&r.h, sizeof(r), kernel ? ITR_MAJOR_BRANCH_KERNEL : ITR_MAJOR_BRANCH_USER,
		kind | (u32)flags << 8 | (u32)aux << 16);
	r.from = from;
	r.to = to;
	r.tid = t->tid;
	r.icount = icount;
	ok = itr_put(itr_cpu(), &r, sizeof(r), false);
	itr_maybe_throttle(t, itr_cpu());
	return ok;
}

static void itr_trace_on(struct itr_thread *t, u32 reason, u64 pc)
{
	struct itr_rec_on r;

	if (!itr_session_live(t->gen))
		return;
	itr_hdr(&r.h, sizeof(r), ITR_MAJOR_TRACE_ON, reason);
	r.pid = t->pid;
	r.tid = t->tid;
	r.pc = pc;
	t->open = true;
	itr_put(itr_cpu(), &r, sizeof(r), true);
}

static void itr_trace_off(struct itr_thread *t, u32 reason, u64 pc, s32 value)
{
	struct itr_rec_off r;

	if (!itr_session_live(t->gen))
		return;
	itr_hdr(&r.h, sizeof(r), ITR_MAJOR_TRACE_OFF, reason);
	r.pid = t->pid;
	r.tid = t->tid;
	r.pc = pc;
	r.icount = t->icount;
	r.value = value;
	t->icount = 0;
	t->open = false;
	itr_put(itr_cpu(), &r, sizeof(r), true);
}

/* MTE record with two u32 ids and a name. */
static void itr_mte_name(u32 gen, u32 minor, u32 a, u32 b, const char *name)
{
	struct {
		struct itr_rec_hdr h;
		u32 a, b;
		u16 n;
		char s[TASK_COMM_LEN + 2];
	} __packed r;
	size_t n = strnlen(name, TASK_COMM_LEN);
	u32 len = ALIGN(sizeof(r.h) + 10 + n, 4);

	if (!itr_session_live(gen))
		return;
	memset(&r, 0, sizeof(r));
	itr_hdr(&r.h, len, ITR_MAJOR_MTE, minor);
	r.a = a;
	r.b = b;
	r.n = n;
	memcpy(r.s, name, n);
	itr_put(itr_ncpu, &r, len, true);
}

static void itr_mte_clone(u32 gen, struct task_struct *parent, struct task_struct *child, bool thread)
{
	struct itr_rec_clone r;

	if (!itr_session_live(gen))
		return;
	itr_hdr(&r.h, ITR_REC_CLONE_LEN, ITR_MAJOR_MTE, ITR_MTE_CLONE);
	r.parent_pid = parent->tgid;
	r.parent_tid = parent->pid;
	r.child_pid = child->tgid;
	r.child_tid = child->pid;
	r.thread = thread;
	itr_put(itr_ncpu, &r, ITR_REC_CLONE_LEN, true);
}

/*
 * The executable mappings of mm, as segment records preceded by an unmap
 * of [0, 0): "a snapshot of pid's mappings follows" (userspace diffs
 * snapshots). Atomic context: the mmap lock is only tried.
 */
static void itr_mte_maps(u32 gen, pid_t pid, struct mm_struct *mm)
{
	static char pathbuf[PATH_MAX];
	static u8 rec[sizeof(struct itr_rec_segment) + 2 + 256 + 4];
	struct itr_rec_segment *r = (void *)rec;
	struct vm_area_struct *vma;

	if (!mm || !itr_session_live(gen) || !mmap_read_trylock(mm))
		return;
	itr_hdr(&r->h, 40, ITR_MAJOR_MTE, ITR_MTE_UNMAP);
	r->pid = pid;
	r->prot = 0;
	r->start = 0;
	r->end = 0;
	itr_put(itr_ncpu, r, 40, true);
	{
		VMA_ITERATOR(vmi, mm, 0);

		for_each_vma(vmi, vma) {
			const char *path = "";
			size_t n;
			u32 len;

			if (!(vma->vm_flags & VM_EXEC))
				continue;
			if (vma->vm_file) {
				path = d_path(&vma->vm_file->f_path, pathbuf, sizeof(pathbuf));
				if (IS_ERR(path))
					path = "";
			} else if (vma->vm_start == (unsigned long)mm->context.vdso) {
				path = "[vdso]";
			}
			n = min_t(size_t, strlen(path), 256);
			len = ALIGN(sizeof(*r) + 2 + n, 4);
			memset(rec, 0, sizeof(rec));
			itr_hdr(&r->h, len, ITR_MAJOR_MTE, ITR_MTE_SEGMENT);
			r->pid = pid;
			r->prot = 4 | ((vma->vm_flags & VM_READ) ? 1 : 0) | ((vma->vm_flags & VM_WRITE) ? 2 : 0);
			r->start = vma->vm_start;
			r->end = vma->vm_end;
			r->offset = (u64)vma->vm_pgoff << PAGE_SHIFT;
			*(u16 *)(rec + sizeof(*r)) = n;
			memcpy(rec + sizeof(*r) + 2, path, n);
			itr_put(itr_ncpu, rec, len, true);
		}
	}
	mmap_read_unlock(mm);
}

/* Names and mappings of a thread's process, when tracing of it starts. */
static void itr_mte_start(struct itr_thread *t, struct task_struct *task, bool process)
{
	char comm[TASK_COMM_LEN];

	if (process) {
		struct task_struct *leader = task->group_leader;

		get_task_comm(comm, leader);
		itr_mte_name(t->gen, ITR_MTE_PROCESS_NAME, t->pid, task_ppid_nr(task), comm);
		itr_mte_maps(t->gen, t->pid, task->mm);
		t->maps_seen = itr_maps_changes;
	}
	get_task_comm(comm, task);
	itr_mte_name(t->gen, ITR_MTE_THREAD_NAME, t->pid, t->tid, comm);
}

/* ---- threads ---- */

static struct itr_thread *itr_find(struct task_struct *task)
{
	struct itr_thread *t;

	hash_for_each_possible(itr_threads, t, node, (unsigned long)task)
		if (t->task == task)
			return t;
	return NULL;
}

static struct itr_thread *itr_add(struct task_struct *task, enum itr_state state)
{
	struct itr_thread *t = kzalloc(sizeof(*t), GFP_ATOMIC);

	if (!t)
		return NULL;
	get_task_struct(task);
	t->task = task;
	t->pid = task->tgid;
	t->tid = task->pid;
	t->state = state;
	t->gen = itr_gen;
	t->sys_nr = -1;
	t->maps_seen = ~0ULL;	/* never snapshotted */
	hash_add(itr_threads, &t->node, (unsigned long)task);
	atomic_inc(&itr_nthreads);
	if (itr_ctl)
		itr_ctl->threads = atomic_read(&itr_nthreads);
	return t;
}

static void itr_del(struct itr_thread *t)
{
	hash_del(&t->node);
	atomic_dec(&itr_nthreads);
	if (itr_ctl)
		itr_ctl->threads = atomic_read(&itr_nthreads);
	put_task_struct(t->task);
	kfree(t);
}

/* Stop tracing the current thread t (whose user registers are regs). */
static void itr_stop_self(struct itr_thread *t, struct pt_regs *regs, u32 reason)
{
	if (t->open)
		itr_trace_off(t, reason, t->state == ITR_LIB ? t->lib_pc : regs->ip, 0);
	regs->flags &= ~X86_EFLAGS_TF;
	itr_del(t);
}

static bool itr_must_stop(struct itr_thread *t)
{
	return t->stopping || !itr_session_live(t->gen) || READ_ONCE(itr_ctl->full);
}

static u32 itr_stop_reason(struct itr_thread *t)
{
	return itr_session_live(t->gen) && READ_ONCE(itr_ctl->full) ? ITR_STOP_BUFFER_FULL : ITR_STOP_DETACHED;
}

/* ---- classification of the instruction just executed ---- */

#define ITR_SEQ (-1)

static bool itr_is_prefix(u8 b)
{
	switch (b) {
	case 0x66: case 0x67: case 0xf0: case 0xf2: case 0xf3:
	case 0x2e: case 0x36: case 0x3e: case 0x26: case 0x64: case 0x65:
		return true;
	}
	return false;
}

/*
 * What the instruction at prev, after which the thread is at pc, was: a
 * branch kind when it ended a block (taken), ITR_SEQ otherwise. Only
 * control-flow opcodes are told apart; everything else runs on in sequence.
 */
static int itr_classify(u64 prev, u64 pc)
{
	u8 b[16];
	unsigned long n = sizeof(b), room = PAGE_SIZE - (prev & (PAGE_SIZE - 1));
	unsigned int i = 0;
	u8 op;

	if (room < n && copy_from_user_nofault(b + room, (void __user *)(prev + room), n - room))
		n = room;
	if (copy_from_user_nofault(b, (void __user *)prev, min(n, room)))
		return pc == prev ? ITR_SEQ : ITR_KIND_OTHER;
	while (i < n && itr_is_prefix(b[i]))
		i++;
	if (i < n && (b[i] & 0xf0) == 0x40)
		i++;	/* REX */
	if (i >= n)
		return ITR_SEQ;
	op = b[i];
	if ((op >= 0x70 && op <= 0x7f) || (op >= 0xe0 && op <= 0xe3))
		return pc != prev + i + 2 ? ITR_KIND_CONDJUMP : ITR_SEQ;
	switch (op) {
	case 0xeb: case 0xe9: case 0xea:
		return ITR_KIND_JUMP;
	case 0xe8: case 0x9a:
		return ITR_KIND_CALL;
	case 0xc2: case 0xc3: case 0xca: case 0xcb:
		return ITR_KIND_RETURN;
	case 0xcf:
		return ITR_KIND_IRET;
	case 0xff:
		if (i + 1 < n) {
			u8 reg = (b[i + 1] >> 3) & 7;

			if (reg == 2 || reg == 3)
				return ITR_KIND_CALL;
			if (reg == 4 || reg == 5)
				return ITR_KIND_JUMP;
		}
		return ITR_SEQ;
	case 0x0f:
		if (i + 1 < n && (b[i + 1] & 0xf0) == 0x80)
			return pc != prev + i + 6 ? ITR_KIND_CONDJUMP : ITR_SEQ;
		return ITR_SEQ;
	}
	return ITR_SEQ;
}

static bool itr_is_entry(struct itr_thread *t, u64 pc)
{
	u32 i;

	for (i = 0; i < t->nentries; i++)
		if (t->entry[i] == pc)
			return true;
	return false;
}

/* One single-step trap of a traced thread. */
static void itr_step(struct itr_thread *t, struct pt_regs *regs)
{
	u64 pc = regs->ip, prev = t->last_pc;
	int kind;

	if (itr_must_stop(t)) {
		itr_stop_self(t, regs, itr_stop_reason(t));
		return;
	}
	if (!user_64bit_mode(regs)) {
		/* 32-bit code (a far jump to another code segment): not classified here */
		itr_stop_self(t, regs, ITR_STOP_DETACHED);
		return;
	}
	kind = itr_classify(prev, pc);
	if (kind != ITR_SEQ || pc != prev)
		t->icount++;	/* a rep string instruction counts once */
	t->last_pc = pc;
	if (kind != ITR_SEQ) {
		if (!itr_branch(t, false, kind, 0, 0, prev, pc, t->icount) && itr_mode == ITR_MODE_NORMAL) {
			itr_stop_self(t, regs, ITR_STOP_BUFFER_FULL);
			return;
		}
		/* continuous mode, ring full: the record was dropped and counted as lost */
		t->icount = 0;
	}
	if (itr_is_entry(t, pc)) {
		/* into libitrace (ITraceOff, a nested ITraceOn...): none of it is recorded */
		t->state = ITR_LIB;
		t->lib_pc = pc;
		t->resume_pc = 0;
		t->lib_tf = false;
		regs->flags &= ~X86_EFLAGS_TF;
	}
}

/* A trap of a thread in the library: TF was set again by ITR_IOC_ON; recording resumes at resume_pc. */
static void itr_lib_step(struct itr_thread *t, struct pt_regs *regs)
{
	if (itr_must_stop(t)) {
		itr_stop_self(t, regs, itr_stop_reason(t));
		return;
	}
	if (regs->ip != t->resume_pc)
		return;		/* the library's and libc's way back from the ioctl */
	t->state = ITR_ACTIVE;
	t->last_pc = regs->ip;
	t->icount = 0;
	itr_trace_on(t, t->open ? ITR_ON_RESUME : ITR_ON_START, regs->ip);
}

static int itr_die(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	unsigned long *dr6, flags;
	struct itr_thread *t;
	int ret = NOTIFY_DONE;

	if (val != DIE_DEBUG || !atomic_read(&itr_nthreads) || !user_mode(args->regs))
		return NOTIFY_DONE;
	/* exc_debug_user() passes a pointer to its DR6 value */
	dr6 = (unsigned long *)args->err;
	if (!dr6 || !(*dr6 & DR_STEP))
		return NOTIFY_DONE;
	spin_lock_irqsave(&itr_lock, flags);
	t = itr_find(current);
	if (t && (t->state == ITR_ACTIVE || t->state == ITR_LIB)) {
		itr_traps++;
		if (t->state == ITR_ACTIVE)
			itr_step(t, args->regs);
		else
			itr_lib_step(t, args->regs);
		*dr6 &= ~DR_STEP;
		ret = NOTIFY_STOP;
	}
	spin_unlock_irqrestore(&itr_lock, flags);
	return ret;
}

static struct notifier_block itr_die_nb = {
	.notifier_call = itr_die,
	.priority = 1,
};

/* ---- system calls ---- */

static void itr_sys_enter(void *data, struct pt_regs *regs, long id)
{
	struct itr_thread *t;
	unsigned long flags;

	if (!atomic_read(&itr_nthreads))
		return;
	spin_lock_irqsave(&itr_lock, flags);
	t = itr_find(current);
	if (t) {
		t->sys_nr = id;
		if (t->state == ITR_ACTIVE && !itr_must_stop(t)) {
			/* the system call instruction (2 bytes) ends the block */
			itr_branch(t, false, ITR_KIND_INTRPT, ITR_BFLAG_SYSCALL, id, regs->ip - 2, 0, t->icount + 1);
			t->icount = 0;
			t->last_pc = regs->ip;
		}
	}
	spin_unlock_irqrestore(&itr_lock, flags);
}

static bool itr_changes_mappings(int nr)
{
	return nr == NR_MMAP || nr == NR_MPROTECT || nr == NR_MUNMAP || nr == NR_MREMAP || nr == NR_SHMAT;
}

static void itr_sys_exit(void *data, struct pt_regs *regs, long ret)
{
	struct itr_thread *t;
	unsigned long flags;
	bool exec;

	if (!atomic_read(&itr_nthreads))
		return;
	spin_lock_irqsave(&itr_lock, flags);
	t = itr_find(current);
	if (!t)
		goto out;
	exec = (t->sys_nr == NR_EXECVE || t->sys_nr == NR_EXECVEAT) && ret == 0;
	if (t->state == ITR_ARMED_EXEC) {
		if (!exec)
			goto out;
		if (!itr_session_live(t->gen) || !user_64bit_mode(regs)) {
			/* 64-bit programs only: itrace refuses the others before they start */
			itr_del(t);
			goto out;
		}
		t->pid = current->tgid;
		t->state = ITR_ACTIVE;
		t->last_pc = regs->ip;
		t->icount = 0;
		regs->flags |= X86_EFLAGS_TF;
		itr_mte_start(t, current, true);
		itr_trace_on(t, ITR_ON_START, regs->ip);
		goto out;
	}
	if (itr_changes_mappings(t->sys_nr))
		itr_maps_changes++;
	if (t->state == ITR_IDLE && exec) {
		itr_mte_start(t, current, true);
		goto out;
	}
	if (t->state == ITR_LIB) {
		/*
		 * Signal frames never hold TF (see itr_signal_pre): after rt_sigreturn
		 * the library's way back to resume_pc needs it again.
		 */
		if (itr_must_stop(t))
			itr_stop_self(t, regs, itr_stop_reason(t));
		else if (t->lib_tf)
			regs->flags |= X86_EFLAGS_TF;
		goto out;
	}
	if (t->state != ITR_ACTIVE)
		goto out;
	if (itr_must_stop(t)) {
		itr_stop_self(t, regs, itr_stop_reason(t));
		goto out;
	}
	if (exec && !user_64bit_mode(regs)) {
		/* a 32-bit program now: its instructions are not classified here */
		itr_stop_self(t, regs, ITR_STOP_DETACHED);
		goto out;
	}
	if (exec && t->region) {
		/*
		 * A region ends at exec (the library's entry points went with the old
		 * image); the new image may start regions of its own.
		 */
		char comm[TASK_COMM_LEN];

		get_task_comm(comm, current);
		itr_mte_name(t->gen, ITR_MTE_EXEC, t->pid, t->tid, comm);
		itr_mte_start(t, current, true);
		itr_trace_off(t, ITR_STOP_REGION_END, regs->ip, 0);
		t->state = ITR_IDLE;
		t->nentries = 0;
		regs->flags &= ~X86_EFLAGS_TF;
		goto out;
	}
	if (t->fresh) {
		/* a new thread leaving clone(): it starts here */
		t->fresh = false;
	} else {
		itr_branch(t, true, ITR_KIND_IRET, ITR_BFLAG_SYSCALL, t->sys_nr, 0, regs->ip, 0);
	}
	t->last_pc = regs->ip;
	regs->flags |= X86_EFLAGS_TF;
	if (exec) {
		char comm[TASK_COMM_LEN];

		get_task_comm(comm, current);
		itr_mte_name(t->gen, ITR_MTE_EXEC, t->pid, t->tid, comm);
		itr_mte_start(t, current, true);
	} else if (itr_changes_mappings(t->sys_nr)) {
		itr_mte_maps(t->gen, t->pid, current->mm);
		t->maps_seen = itr_maps_changes;
	} else if (t->sys_nr == NR_PRCTL) {
		itr_mte_start(t, current, false);
	}
out:
	spin_unlock_irqrestore(&itr_lock, flags);
}

/* ---- fork, exit ---- */

static void itr_fork(void *data, struct task_struct *parent, struct task_struct *child)
{
	struct itr_thread *pt, *t;
	unsigned long flags;
	bool thread = child->tgid == parent->tgid, follow;

	if (!atomic_read(&itr_nthreads))
		return;
	spin_lock_irqsave(&itr_lock, flags);
	pt = itr_find(parent);
	if (!pt || pt->state == ITR_ARMED_EXEC || pt->state == ITR_ATTACHING)
		goto out;
	follow = itr_session_live(pt->gen) && !pt->stopping &&
		(thread ? !(itr_cfg_flags & ITR_CFG_NO_FOLLOW_THREADS) : !!(itr_cfg_flags & ITR_CFG_FOLLOW_FORKS));
	/* a child of a thread in the library starts outside any region */
	t = follow ? itr_add(child, pt->state == ITR_LIB ? ITR_IDLE : pt->state) : NULL;
	if (!t || t->state != ITR_ACTIVE) {
		/* not recorded: never leave it a trap flag it cannot handle */
		task_pt_regs(child)->flags &= ~X86_EFLAGS_TF;
		if (!t)
			goto out;
	}
	t->gen = pt->gen;
	t->region = pt->region;
	t->nentries = pt->nentries;
	memcpy(t->entry, pt->entry, sizeof(t->entry));
	itr_mte_clone(t->gen, parent, child, thread);
	if (!thread) {
		char comm[TASK_COMM_LEN];

		get_task_comm(comm, child);
		itr_mte_name(t->gen, ITR_MTE_PROCESS_NAME, t->pid, parent->tgid, comm);
		itr_mte_maps(t->gen, t->pid, child->mm);
	}
	if (t->state == ITR_ACTIVE) {
		char comm[TASK_COMM_LEN];

		t->fresh = true;
		t->last_pc = task_pt_regs(child)->ip;
		t->sys_nr = pt->sys_nr;
		get_task_comm(comm, child);
		itr_mte_name(t->gen, ITR_MTE_THREAD_NAME, t->pid, t->tid, comm);
		itr_trace_on(t, ITR_ON_START, t->last_pc);
	}
out:
	spin_unlock_irqrestore(&itr_lock, flags);
}

static void itr_exit(void *data, struct task_struct *p)
{
	struct itr_thread *t;
	unsigned long flags;

	if (!atomic_read(&itr_nthreads))
		return;
	spin_lock_irqsave(&itr_lock, flags);
	t = itr_find(p);
	if (t) {
		if (t->open) {
			int code = p->exit_code;
			struct pt_regs *regs = task_pt_regs(p);

			if (code & 0x7f)
				itr_trace_off(t, ITR_STOP_SIGNALED, regs->ip, code & 0x7f);
			else
				itr_trace_off(t, ITR_STOP_EXITED, regs->ip, (code >> 8) & 0xff);
		}
		if (t->work_queued)
			t->stopping = true;	/* its task work still runs at exit, and frees it */
		else
			itr_del(t);
	}
	spin_unlock_irqrestore(&itr_lock, flags);
}

/* ---- signals: signal_setup_done() runs once a handler's frame is set up ---- */

struct itr_frame_fix {
	struct callback_head cb;
	unsigned long __user *flags;
};

/* The frame's page could not be written without a fault: done where faults may be taken. */
static void itr_frame_fix_work(struct callback_head *cb)
{
	struct itr_frame_fix *f = container_of(cb, struct itr_frame_fix, cb);
	unsigned long v;

	if (current->mm && !get_user(v, f->flags) && (v & X86_EFLAGS_TF))
		put_user(v & ~X86_EFLAGS_TF, f->flags);
	kfree(f);
	module_put(THIS_MODULE);
}

/*
 * Clear TF in the flags the signal frame just set up at regs->sp saved:
 * rt_sigreturn restores them, and a thread that stopped being traced while
 * in its handler (the session ended, the module was unloaded) would come
 * back from it with a trap flag nobody handles, and die of SIGTRAP. So TF
 * lives only in pt_regs; a traced thread gets it again at the system call
 * exit of rt_sigreturn (itr_sys_exit). The frame was written an instant ago,
 * so the nofault write succeeds unless the page went away meanwhile; then a
 * task work, which runs before the thread reaches user space (the handler),
 * writes it with faults allowed. ia32 frames are left alone: only 64-bit
 * code is traced.
 */
static void itr_frame_clear_tf(struct ksignal *ksig, struct pt_regs *regs)
{
	size_t off = offsetof(struct rt_sigframe, uc.uc_mcontext.flags);
	unsigned long __user *uflags;
	struct itr_frame_fix *f;
	unsigned long v;

	if (ksig->ka.sa.sa_flags & SA_IA32_ABI)
		return;
#ifdef CONFIG_X86_X32_ABI
	if (ksig->ka.sa.sa_flags & SA_X32_ABI)
		off = offsetof(struct rt_sigframe_x32, uc.uc_mcontext.flags);
#endif
	uflags = (unsigned long __user *)(regs->sp + off);
	if (!copy_from_user_nofault(&v, uflags, sizeof(v))) {
		if (!(v & X86_EFLAGS_TF))
			return;
		v &= ~X86_EFLAGS_TF;
		if (!copy_to_user_nofault(uflags, &v, sizeof(v)))
			return;
	}
	f = kmalloc(sizeof(*f), GFP_ATOMIC);
	if (!f) {
		pr_warn_ratelimited("pid %d: no memory to clear TF in a signal frame\n", current->pid);
		return;
	}
	f->flags = uflags;
	init_task_work(&f->cb, itr_frame_fix_work);
	__module_get(THIS_MODULE);
	if (task_work_add(current, &f->cb, TWA_RESUME)) {
		module_put(THIS_MODULE);
		kfree(f);
	}
}

static int itr_signal_pre(struct kprobe *p, struct pt_regs *kregs)
{
	int failed = (int)kregs->di;
	struct ksignal *ksig = (struct ksignal *)kregs->si;
	struct pt_regs *regs;
	struct itr_thread *t;
	unsigned long flags;

	if (failed || !atomic_read(&itr_nthreads))
		return 0;
	regs = task_pt_regs(current);
	spin_lock_irqsave(&itr_lock, flags);
	t = itr_find(current);
	if (t && (t->state == ITR_ACTIVE || (t->state == ITR_LIB && t->lib_tf)))
		itr_frame_clear_tf(ksig, regs);
	if (t && t->state == ITR_ACTIVE) {
		if (itr_must_stop(t)) {
			itr_stop_self(t, regs, itr_stop_reason(t));
		} else {
			u16 sig = ksig->sig;

			itr_branch(t, false, ITR_KIND_INTRPT, ITR_BFLAG_SIGNAL, sig, t->last_pc, 0, t->icount);
			t->icount = 0;
			itr_branch(t, true, ITR_KIND_IRET, ITR_BFLAG_SIGNAL, sig, 0, regs->ip, 0);
			t->last_pc = regs->ip;
			/* the kernel clears TF for the handler; the frame keeps the old flags */
			regs->flags |= X86_EFLAGS_TF;
		}
	}
	spin_unlock_irqrestore(&itr_lock, flags);
	return 0;
}

static struct kprobe itr_signal_kp = {
	.symbol_name = "signal_setup_done",
	.pre_handler = itr_signal_pre,
};

/* ---- attaching to running threads: a task work sets TF in the thread itself ---- */

static bool itr_restart_code(long ax)
{
	return ax == -512 || ax == -513 || ax == -514 || ax == -516;
}

/*
 * Tracing of an attached thread starts: TF set in its saved user registers,
 * which only the thread itself (task == current) or, for a stopped one,
 * the holder of its siglock may write. Called with itr_lock held.
 */
static void itr_activate(struct itr_thread *t, struct task_struct *task, struct pt_regs *regs)
{
	u64 pc = regs->ip;

	/* in an interrupted system call that will restart: it runs again */
	if ((long)regs->orig_ax >= 0 && itr_restart_code(regs->ax))
		pc -= 2;
	t->state = ITR_ACTIVE;
	t->last_pc = pc;
	t->icount = 0;
	regs->flags |= X86_EFLAGS_TF;
	itr_mte_start(t, task, task->pid == task->tgid);
	itr_trace_on(t, ITR_ON_ATTACH, pc);
}

static void itr_attach_work(struct callback_head *cb)
{
	struct itr_thread *t;
	struct pt_regs *regs = task_pt_regs(current);
	unsigned long flags;

	spin_lock_irqsave(&itr_lock, flags);
	t = itr_find(current);
	if (t && &t->work == cb) {
		t->work_queued = false;
		if (t->state == ITR_ATTACHING && !itr_must_stop(t) && user_64bit_mode(regs)) {
			itr_activate(t, current, regs);
		} else if (t->state == ITR_ATTACHING) {
			itr_del(t);
		}
	}
	spin_unlock_irqrestore(&itr_lock, flags);
	module_put(THIS_MODULE);
}

/* ---- permissions ---- */

/* Whether the caller could ptrace task (ptrace_may_access, or its core without LSMs). */
static bool itr_may_trace(struct task_struct *task)
{
	const struct cred *cred = current_cred(), *tcred;
	bool ok;

	if (itr_ptrace_may_access)
		return itr_ptrace_may_access(task, PTRACE_MODE_ATTACH_REALCREDS);
	if (same_thread_group(task, current))
		return true;
	rcu_read_lock();
	tcred = __task_cred(task);
	ok = uid_eq(cred->uid, tcred->euid) && uid_eq(cred->uid, tcred->suid) && uid_eq(cred->uid, tcred->uid) &&
	     gid_eq(cred->gid, tcred->egid) && gid_eq(cred->gid, tcred->sgid) && gid_eq(cred->gid, tcred->gid);
	rcu_read_unlock();
	if (ok && task->mm && get_dumpable(task->mm) != SUID_DUMP_USER)
		ok = false;
	return ok || capable(CAP_SYS_PTRACE);
}

/* ---- the device ---- */

/*
 * A thread stopped by job control (SIGSTOP, SIGTSTP, SIGTTIN...) when
 * tracing ends would keep TF in its saved registers, and stay known to the
 * module, until it is continued: its trap flag is cleared here instead, with
 * a trace-off while the session lives. This is safe because it cannot run:
 * JOBCTL_STOPPED is set and cleared only under its siglock, which is held
 * here, and a woken thread takes that lock again (get_signal) before it goes
 * on towards user space; nothing else writes a stopped thread's pt_regs but
 * ptrace, and a ptrace-stopped thread is left alone (its tracer may be
 * changing its registers): it turns TF off itself when it runs again, as a
 * thread blocked in a system call or running does. Lock order: itr_lock,
 * then siglock (no itrace hook runs under a siglock). Called with itr_lock
 * held; true when t can go.
 */
/*
 * lock_task_sighand(), whose __lock_task_sighand() is not exported: sighand
 * structs are freed by RCU (SLAB_TYPESAFE_BY_RCU), so the pointer is taken
 * and checked again under the lock; NULL once the task has released it.
 */
static struct sighand_struct *itr_lock_sighand(struct task_struct *task, unsigned long *flags)
{
	struct sighand_struct *sh;

	rcu_read_lock();
	for (;;) {
		sh = rcu_dereference(task->sighand);
		if (!sh)
			break;
		spin_lock_irqsave(&sh->siglock, *flags);
		if (likely(sh == rcu_access_pointer(task->sighand)))
			break;
		spin_unlock_irqrestore(&sh->siglock, *flags);
	}
	rcu_read_unlock();
	return sh;
}

static bool itr_stop_stopped(struct itr_thread *t)
{
	struct task_struct *task = t->task;
	struct sighand_struct *sh;
	unsigned long flags;
	bool done = false;

	sh = itr_lock_sighand(task, &flags);
	if (!sh)
		return false;
	if (task_is_stopped(task) && !task_is_traced(task) && !(task->flags & PF_EXITING)) {
		struct pt_regs *regs = task_pt_regs(task);

		if (t->open)
			itr_trace_off(t, itr_stop_reason(t), t->state == ITR_LIB ? t->lib_pc : regs->ip, 0);
		regs->flags &= ~X86_EFLAGS_TF;
		done = true;
	}
	spin_unlock_irqrestore(&sh->siglock, flags);
	return done;
}

/*
 * A thread stopped by job control when it is attached: its attach task work
 * would only run once it is continued (and its entry, with the module
 * reference the work holds, would stay until then, even if itrace is gone);
 * it is attached here instead, under its siglock as in itr_stop_stopped.
 * Called with itr_lock held; true when done.
 */
static bool itr_attach_stopped(struct itr_thread *t)
{
	struct task_struct *task = t->task;
	struct sighand_struct *sh;
	unsigned long flags;
	bool done = false;

	sh = itr_lock_sighand(task, &flags);
	if (!sh)
		return false;
	if (task_is_stopped(task) && !task_is_traced(task) && !(task->flags & PF_EXITING) &&
	    user_64bit_mode(task_pt_regs(task))) {
		itr_activate(t, task, task_pt_regs(task));
		done = true;
	}
	spin_unlock_irqrestore(&sh->siglock, flags);
	return done;
}

static void itr_stop_all(u32 gen)
{
	struct itr_thread *t;
	struct hlist_node *tmp;
	unsigned long flags;
	int bkt;

	spin_lock_irqsave(&itr_lock, flags);
	hash_for_each_safe(itr_threads, bkt, tmp, t, node) {
		if (t->gen != gen)
			continue;
		if (t->state == ITR_ACTIVE || t->state == ITR_LIB) {
			/* it turns TF off itself at its next trap (or ITR_IOC_ON/OFF) */
			t->stopping = true;
			if (itr_stop_stopped(t))
				itr_del(t);
		} else if (!t->work_queued) {
			itr_del(t);		/* no trap flag set: nothing to undo */
		} else {
			t->stopping = true;
		}
	}
	spin_unlock_irqrestore(&itr_lock, flags);
}

static void itr_free_session(void)
{
	itr_stop_all(itr_gen);
	spin_lock_irq(&itr_lock);
	itr_ctl = NULL;
	itr_owner = NULL;
	itr_gen++;
	spin_unlock_irq(&itr_lock);
	wake_up_interruptible_all(&itr_drain_wq);
	vfree(itr_area);
	itr_area = NULL;
	itr_area_size = 0;
}

static long itr_install(struct file *file, struct itr_config __user *arg)
{
	struct itr_config cfg;
	size_t ctl_size, total;
	unsigned int i, ncpu = min_t(unsigned int, nr_cpu_ids, ITR_MAX_CPUS);
	void *area;

	if (copy_from_user(&cfg, arg, sizeof(cfg)))
		return -EFAULT;
	if (cfg.mode > ITR_MODE_CONTINUOUS || cfg.flags & ~(ITR_CFG_FOLLOW_FORKS | ITR_CFG_NO_FOLLOW_THREADS))
		return -EINVAL;
	if (cfg.buffer_size < ITR_MIN_RING || cfg.buffer_size > ITR_MAX_RING ||
	    cfg.mte_size < ITR_MIN_RING || cfg.mte_size > ITR_MAX_RING)
		return -EINVAL;
	cfg.buffer_size = PAGE_ALIGN(cfg.buffer_size);
	cfg.mte_size = PAGE_ALIGN(cfg.mte_size);
	ctl_size = PAGE_ALIGN(sizeof(struct itr_ctl) + (ncpu + 1) * sizeof(struct itr_stream));
	if (check_mul_overflow((size_t)cfg.buffer_size, (size_t)ncpu, &total) ||
	    check_add_overflow(total, ctl_size + (size_t)cfg.mte_size, &total) || total > (8ULL << 30))
		return -EINVAL;
	if (itr_area)
		return -EBUSY;
	area = vmalloc_user(total);
	if (!area)
		return -ENOMEM;
	spin_lock_irq(&itr_lock);
	itr_area = area;
	itr_area_size = total;
	itr_ncpu = ncpu;
	itr_mode = cfg.mode;
	itr_cfg_flags = cfg.flags;
	itr_gen++;
	itr_ctl = area;
	itr_ctl->magic = ITR_MAGIC;
	itr_ctl->version = ITR_VERSION;
	itr_ctl->ncpu = ncpu;
	itr_ctl->mode = cfg.mode;
	itr_ctl->map_size = total;
	for (i = 0; i <= ncpu; i++) {
		itr_ctl->stream[i].offset = ctl_size + (u64)i * cfg.buffer_size;
		itr_ctl->stream[i].size = i < ncpu ? cfg.buffer_size : cfg.mte_size;
	}
	itr_owner = file;
	spin_unlock_irq(&itr_lock);
	return 0;
}

static long itr_enable(struct file *file, struct itr_target __user *arg)
{
	struct itr_target tg;
	struct task_struct *task, *th;
	struct itr_thread *t;
	long ret = 0;

	if (copy_from_user(&tg, arg, sizeof(tg)))
		return -EFAULT;
	if (tg.flags & ~(ITR_EN_TID | ITR_EN_ON_EXEC | ITR_EN_REGION) || tg.pid < 0)
		return -EINVAL;
	if (file != itr_owner || !itr_ctl)
		return -EPERM;
	if (tg.flags & ITR_EN_ON_EXEC) {
		/* the caller itself (a launched child before execve) */
		if (tg.pid != 0 && tg.pid != current->pid)
			return -EINVAL;
		spin_lock_irq(&itr_lock);
		if (itr_find(current))
			ret = -EBUSY;
		else if (!itr_add(current, (tg.flags & ITR_EN_REGION) ? ITR_IDLE : ITR_ARMED_EXEC))
			ret = -ENOMEM;
		if (!ret && (tg.flags & ITR_EN_REGION)) {
			/* region mode: idle until ITraceOn; names and mappings come at exec */
			t = itr_find(current);
			t->fresh = false;
			t->region = true;
		}
		spin_unlock_irq(&itr_lock);
		return ret;
	}
	if (tg.pid) {
		rcu_read_lock();
		task = get_pid_task(find_vpid(tg.pid), PIDTYPE_PID);
		rcu_read_unlock();
	} else {
		task = get_task_struct(current);
	}
	if (!task)
		return -ESRCH;
	if (!itr_may_trace(task) || (task->flags & PF_KTHREAD)) {
		put_task_struct(task);
		return -EPERM;
	}
	spin_lock_irq(&itr_lock);
	for_each_thread(task, th) {
		if ((tg.flags & ITR_EN_TID) && th != task)
			continue;
		if (itr_find(th) || (th->flags & PF_EXITING))
			continue;
		t = itr_add(th, (tg.flags & ITR_EN_REGION) ? ITR_IDLE : ITR_ATTACHING);
		if (!t) {
			ret = -ENOMEM;
			break;
		}
		t->region = tg.flags & ITR_EN_REGION;
		if (t->state == ITR_IDLE || itr_attach_stopped(t))
			continue;
		init_task_work(&t->work, itr_attach_work);
		__module_get(THIS_MODULE);
		if (task_work_add(th, &t->work, TWA_SIGNAL)) {
			module_put(THIS_MODULE);
			itr_del(t);
			continue;
		}
		t->work_queued = true;
	}
	spin_unlock_irq(&itr_lock);
	put_task_struct(task);
	return ret;
}

/*
 * ITraceOn/ITraceOff of the calling thread (region mode; see struct itr_on).
 * on: an idle thread's region starts at resume_pc, a thread stopped at a
 * library entry point goes on at resume_pc. off: the region ends where the
 * thread entered the library.
 */
static long itr_on_off(struct itr_on __user *arg)
{
	struct pt_regs *regs = task_pt_regs(current);
	struct itr_thread *t;
	struct itr_on on;
	long ret = 0;
	u32 i;

	if (arg) {
		if (copy_from_user(&on, arg, sizeof(on)))
			return -EFAULT;
		if (on.nentries > ITR_MAX_ENTRIES || on.pad || !on.resume_pc || on.resume_pc >= TASK_SIZE_MAX)
			return -EINVAL;
		for (i = 0; i < on.nentries; i++)
			if (on.entry[i] >= TASK_SIZE_MAX)
				return -EINVAL;
	}
	spin_lock_irq(&itr_lock);
	t = itr_find(current);
	if (!t || t->state == ITR_ARMED_EXEC || t->state == ITR_ATTACHING) {
		ret = -ENOENT;
	} else if (itr_must_stop(t)) {
		/* the session ended or a buffer filled: the thread is no longer traced */
		itr_stop_self(t, regs, itr_stop_reason(t));
		ret = -ENOENT;
	} else if (arg && (t->state == ITR_IDLE || t->state == ITR_LIB)) {
		if (t->state == ITR_IDLE) {
			/* mappings made while untraced (libraries loaded...) are snapshotted now */
			itr_mte_start(t, current, t->maps_seen != itr_maps_changes);
			t->state = ITR_LIB;
		}
		t->resume_pc = on.resume_pc;
		t->nentries = on.nentries;
		memcpy(t->entry, on.entry, sizeof(t->entry));
		t->lib_tf = true;
		regs->flags |= X86_EFLAGS_TF;
	} else if (!arg && t->state == ITR_LIB) {
		if (t->open)
			itr_trace_off(t, ITR_STOP_REGION_END, t->lib_pc, 0);
		t->state = ITR_IDLE;
		regs->flags &= ~X86_EFLAGS_TF;
	} else if (!arg && t->state == ITR_ACTIVE) {
		/* a raw ioctl from traced code: its system call record was written at entry */
		itr_trace_off(t, ITR_STOP_REGION_END, regs->ip, 0);
		t->state = ITR_IDLE;
		regs->flags &= ~X86_EFLAGS_TF;
	}
	spin_unlock_irq(&itr_lock);
	return ret;
}

static long itr_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	long ret;

	switch (cmd) {
	case ITR_IOC_STATUS: {
		struct itr_status st = { .version = ITR_VERSION };

		spin_lock_irq(&itr_lock);
		st.threads = atomic_read(&itr_nthreads);
		st.traps = itr_traps;
		if (itr_ctl && file == itr_owner) {
			st.installed = 1;
			st.ncpu = itr_ncpu;
			st.mode = itr_mode;
			st.full = itr_ctl->full;
			st.map_size = itr_area_size;
		}
		spin_unlock_irq(&itr_lock);
		return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
	}
	case ITR_IOC_ON:
		return itr_on_off(uarg);
	case ITR_IOC_OFF:
		return itr_on_off(NULL);
	}
	mutex_lock(&itr_session_mutex);
	switch (cmd) {
	case ITR_IOC_INSTALL:
		ret = itr_install(file, uarg);
		break;
	case ITR_IOC_ENABLE:
		ret = itr_enable(file, uarg);
		break;
	case ITR_IOC_STOP:
		ret = file == itr_owner ? (itr_stop_all(itr_gen), 0) : -EPERM;
		break;
	case ITR_IOC_REMOVE:
		if (file != itr_owner) {
			ret = -EPERM;
			break;
		}
		itr_stop_all(itr_gen);
		ret = 0;
		break;
	case ITR_IOC_CONSUME: {
		struct itr_consume c;

		ret = -EFAULT;
		if (copy_from_user(&c, uarg, sizeof(c)))
			break;
		ret = -EPERM;
		if (file != itr_owner)
			break;
		ret = -EINVAL;
		if (c.stream > itr_ncpu || c.pad)
			break;
		spin_lock_irq(&itr_lock);
		if (c.tail >= itr_ctl->stream[c.stream].tail && c.tail <= itr_ctl->stream[c.stream].head &&
		    (itr_mode != ITR_MODE_WRAP || c.stream == itr_ncpu)) {
			WRITE_ONCE(itr_ctl->stream[c.stream].tail, c.tail);
			ret = 0;
		}
		spin_unlock_irq(&itr_lock);
		wake_up_interruptible(&itr_drain_wq);
		break;
	}
	default:
		ret = -ENOTTY;
	}
	mutex_unlock(&itr_session_mutex);
	return ret;
}

static int itr_mmap(struct file *file, struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start;
	int ret = -EPERM;

	mutex_lock(&itr_session_mutex);
	if (file != itr_owner || !itr_area)
		goto out;
	ret = -EINVAL;
	if (vma->vm_pgoff != 0 || len > itr_area_size)
		goto out;
	ret = -EACCES;
	if (vma->vm_flags & (VM_WRITE | VM_EXEC))
		goto out;
	vma->vm_flags &= ~(VM_MAYWRITE | VM_MAYEXEC);
	ret = remap_vmalloc_range(vma, itr_area, 0);
out:
	mutex_unlock(&itr_session_mutex);
	return ret;
}

/* The session owner's poll: readable when a ring (continuous mode) is over half full. */
static __poll_t itr_poll(struct file *file, poll_table *wait)
{
	__poll_t mask = 0;
	unsigned int i;

	poll_wait(file, &itr_data_wq, wait);
	spin_lock_irq(&itr_lock);
	if (itr_ctl && file == itr_owner && itr_mode == ITR_MODE_CONTINUOUS)
		for (i = 0; i <= itr_ncpu; i++)
			if ((itr_ctl->stream[i].head - itr_ctl->stream[i].tail) * 2 > itr_ctl->stream[i].size)
				mask |= EPOLLIN | EPOLLRDNORM;
	spin_unlock_irq(&itr_lock);
	return mask;
}

static int itr_release(struct inode *inode, struct file *file)
{
	mutex_lock(&itr_session_mutex);
	if (file == itr_owner)
		itr_free_session();
	mutex_unlock(&itr_session_mutex);
	return 0;
}

static const struct file_operations itr_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = itr_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = itr_mmap,
	.poll = itr_poll,
	.release = itr_release,
	.llseek = noop_llseek,
};

static struct miscdevice itr_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "itrace",
	.fops = &itr_fops,
	.mode = 0666,
};

/* ---- tracepoints ---- */

struct itr_tp {
	const char *name;
	void *probe;
	struct tracepoint *tp;
};

static struct itr_tp itr_tps[] = {
	{ "sys_enter", itr_sys_enter },
	{ "sys_exit", itr_sys_exit },
	{ "sched_process_fork", itr_fork },
	{ "sched_process_exit", itr_exit },
};

static void itr_find_tp(struct tracepoint *tp, void *priv)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(itr_tps); i++)
		if (!strcmp(tp->name, itr_tps[i].name))
			itr_tps[i].tp = tp;
}

static void itr_unregister_tps(void)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(itr_tps); i++)
		if (itr_tps[i].tp)
			tracepoint_probe_unregister(itr_tps[i].tp, itr_tps[i].probe, NULL);
	tracepoint_synchronize_unregister();
}

static void itr_resolve_ptrace_may_access(void)
{
	struct kprobe kp = { .symbol_name = "ptrace_may_access" };

	/* not exported: find it through a kprobe, as other out-of-tree modules do */
	if (register_kprobe(&kp) == 0) {
		itr_ptrace_may_access = (void *)kp.addr;
		unregister_kprobe(&kp);
	}
}

static int __init itr_init(void)
{
	unsigned int i;
	int ret;

	for_each_kernel_tracepoint(itr_find_tp, NULL);
	for (i = 0; i < ARRAY_SIZE(itr_tps); i++) {
		if (!itr_tps[i].tp) {
			pr_err("tracepoint %s not found\n", itr_tps[i].name);
			return -ENOENT;
		}
	}
	itr_resolve_ptrace_may_access();
	ret = register_die_notifier(&itr_die_nb);
	if (ret)
		return ret;
	ret = register_kprobe(&itr_signal_kp);
	if (ret)
		goto err_die;
	for (i = 0; i < ARRAY_SIZE(itr_tps); i++) {
		ret = tracepoint_probe_register(itr_tps[i].tp, itr_tps[i].probe, NULL);
		if (ret) {
			while (i--)
				tracepoint_probe_unregister(itr_tps[i].tp, itr_tps[i].probe, NULL);
			tracepoint_synchronize_unregister();
			goto err_kp;
		}
	}
	ret = misc_register(&itr_dev);
	if (ret)
		goto err_tp;
	pr_info("loaded (ptrace_may_access %s)\n", itr_ptrace_may_access ? "found" : "emulated");
	return 0;
err_tp:
	itr_unregister_tps();
err_kp:
	unregister_kprobe(&itr_signal_kp);
err_die:
	unregister_die_notifier(&itr_die_nb);
	return ret;
}

/*
 * Unload with threads still traced: each running thread turns its trap
 * flag off at its next trap (within one instruction); a thread that stays
 * off-CPU (blocked in a system call) gets TF cleared in its saved user
 * registers, which are restored only when it returns.
 */
static void __exit itr_exit_module(void)
{
	struct itr_thread *t;
	struct hlist_node *tmp;
	int bkt, i;

	misc_deregister(&itr_dev);
	spin_lock_irq(&itr_lock);
	hash_for_each(itr_threads, bkt, t, node)
		t->stopping = true;
	spin_unlock_irq(&itr_lock);
	for (i = 0; i < 100 && atomic_read(&itr_nthreads); i++) {
		spin_lock_irq(&itr_lock);
		hash_for_each_safe(itr_threads, bkt, tmp, t, node) {
			bool tf = t->state == ITR_ACTIVE || t->state == ITR_LIB;

			if (!tf && !t->work_queued)
				itr_del(t);
			else if (tf && i >= 10 && !READ_ONCE(t->task->on_cpu))
				task_pt_regs(t->task)->flags &= ~X86_EFLAGS_TF;
		}
		spin_unlock_irq(&itr_lock);
		msleep(10);
		if (i >= 20) {
			/* cleared long enough ago: no trap of theirs can still come */
			spin_lock_irq(&itr_lock);
			hash_for_each_safe(itr_threads, bkt, tmp, t, node)
				if (!(task_pt_regs(t->task)->flags & X86_EFLAGS_TF) && !t->work_queued)
					itr_del(t);
			spin_unlock_irq(&itr_lock);
		}
	}
	itr_unregister_tps();
	unregister_kprobe(&itr_signal_kp);
	unregister_die_notifier(&itr_die_nb);
	spin_lock_irq(&itr_lock);
	hash_for_each_safe(itr_threads, bkt, tmp, t, node)
		itr_del(t);
	spin_unlock_irq(&itr_lock);
	vfree(itr_area);
	pr_info("unloaded\n");
}

module_init(itr_init);
module_exit(itr_exit_module);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("itrace: in-kernel branch tracing of user-space threads");
