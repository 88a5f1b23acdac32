/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * itrace kernel shim: the device ABI shared by the module and userspace.
 *
 * /dev/itrace: ioctls with magic 'i', and one read-only mmap of the whole
 * trace area: [control block][CPU 0 ring]...[CPU n-1 ring][MTE ring].
 * Records in the rings have exactly the trace file's layout (see
 * docs/trace-format.md); the Rust side checks these sizes and offsets
 * (arch/src/backend/kmod.rs, test c_header_matches).
 */
#ifndef ITRACE_KMOD_H
#define ITRACE_KMOD_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/ioctl.h>
#else
#include <stdint.h>
#include <sys/ioctl.h>
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef uint64_t __u64;
typedef int32_t __s32;
#endif

#define ITR_MAGIC 0x4b525449u	/* "ITRK" little-endian */
#define ITR_VERSION 2

/* Collection modes: the trace file's codes. */
#define ITR_MODE_NORMAL 0
#define ITR_MODE_WRAP 1
#define ITR_MODE_CONTINUOUS 2

/* Record majors (docs/trace-format.md). */
#define ITR_MAJOR_MTE 0x19
#define ITR_MAJOR_BRANCH_KERNEL 0x20
#define ITR_MAJOR_BRANCH_USER 0x21
#define ITR_MAJOR_TRACE_ON 0x2e
#define ITR_MAJOR_TRACE_OFF 0x2f
#define ITR_MAJOR_LOST 0x31
/* Filler up to the end of a ring (never copied to the trace file). */
#define ITR_MAJOR_PAD 0x7f00

#define ITR_MTE_SEGMENT 0x01
#define ITR_MTE_UNMAP 0x02
#define ITR_MTE_PROCESS_NAME 0x34
#define ITR_MTE_THREAD_NAME 0x35
#define ITR_MTE_EXEC 0x36
#define ITR_MTE_CLONE 0x63

/* Branch kinds (BranchKind) and flags (branch_flags). */
#define ITR_KIND_INTRPT 0
#define ITR_KIND_CALL 1
#define ITR_KIND_RETURN 2
#define ITR_KIND_JUMP 3
#define ITR_KIND_IRET 4
#define ITR_KIND_OTHER 5
#define ITR_KIND_CONDJUMP 8
#define ITR_BFLAG_SYSCALL 1
#define ITR_BFLAG_SIGNAL 2

/* Stop reasons (StopReason). */
#define ITR_STOP_EXITED 0
#define ITR_STOP_SIGNALED 1
#define ITR_STOP_DETACHED 2
#define ITR_STOP_BUFFER_FULL 3
#define ITR_STOP_REGION_END 7

/* Trace-on reasons (TraceOnReason). */
#define ITR_ON_START 0
#define ITR_ON_ATTACH 1
#define ITR_ON_RESUME 2

/* The common 16-byte record header. */
struct itr_rec_hdr {
	__u16 len;		/* whole record, a multiple of 4 */
	__u16 major;
	__u32 minor;
	__u64 ts;		/* CLOCK_MONOTONIC, ns */
};

/* Branch record, 40 bytes: minor = kind | flags << 8 | aux << 16. */
struct itr_rec_branch {
	struct itr_rec_hdr h;
	__u64 from;
	__u64 to;
	__u32 tid;
	__u32 icount;
};

/* Trace on, 32 bytes: minor = reason. */
struct itr_rec_on {
	struct itr_rec_hdr h;
	__u32 pid;
	__u32 tid;
	__u64 pc;
};

/* Trace off, 40 bytes: minor = stop reason. */
struct itr_rec_off {
	struct itr_rec_hdr h;
	__u32 pid;
	__u32 tid;
	__u64 pc;
	__u32 icount;
	__s32 value;
};

/* Lost, 24 bytes. */
struct itr_rec_lost {
	struct itr_rec_hdr h;
	__u64 count;
};

/* MTE segment, 48 bytes + path (u16 length, bytes, padded to 4). */
struct itr_rec_segment {
	struct itr_rec_hdr h;
	__u32 pid;
	__u32 prot;
	__u64 start;
	__u64 end;
	__u64 offset;
};

/* MTE clone: 36 bytes are written (sizeof is 40, padded to 8). */
#define ITR_REC_CLONE_LEN 36
struct itr_rec_clone {
	struct itr_rec_hdr h;
	__u32 parent_pid;
	__u32 parent_tid;
	__u32 child_pid;
	__u32 child_tid;
	__u32 thread;
};

/*
 * The control block at offset 0 of the mapping. Streams 0..ncpu-1 are the
 * CPUs' rings, stream ncpu the MTE ring. Positions count bytes forever; a
 * record starts at pos % size. The kernel writes head (after the record's
 * bytes, with a release barrier) and, in wrap mode, tail; userspace moves
 * tail with ITR_IOC_CONSUME.
 */
struct itr_stream {
	__u64 head;
	__u64 tail;
	__u64 lost;		/* records dropped or overwritten */
	__u64 records;		/* records written */
	__u64 offset;		/* where the ring starts in the mapping */
	__u64 size;		/* ring bytes */
	__u64 pad[2];
};

struct itr_ctl {
	__u32 magic;
	__u32 version;
	__u32 ncpu;
	__u32 mode;
	__u64 map_size;		/* bytes to mmap */
	__u32 full;		/* normal mode: a ring filled, tracing stopped */
	__u32 threads;		/* threads traced now */
	__u64 pad[4];
	struct itr_stream stream[];	/* at offset 64 */
};

/* ITR_IOC_INSTALL: allocate the rings. */
struct itr_config {
	__u32 mode;
	__u32 flags;		/* ITR_CFG_* */
	__u64 buffer_size;	/* bytes per CPU ring, 64K..1G */
	__u64 mte_size;		/* bytes of MTE ring, 64K..1G */
};
#define ITR_CFG_FOLLOW_FORKS 1
#define ITR_CFG_NO_FOLLOW_THREADS 2

/* ITR_IOC_ENABLE: trace pid (a whole process) or tid (one thread). */
struct itr_target {
	__s32 pid;		/* 0: the caller */
	__u32 flags;		/* ITR_EN_* */
};
#define ITR_EN_TID 1		/* only this thread */
#define ITR_EN_ON_EXEC 2	/* the caller: start at its next successful execve */
#define ITR_EN_REGION 4		/* armed: tracing starts at ITR_IOC_ON */

/*
 * ITR_IOC_ON: the calling thread's region (ITR_EN_REGION) starts, or goes
 * on, at resume_pc: the module sets TF on the way back from the ioctl and
 * ignores the traps before resume_pc (the library's own return path), so
 * the trace begins there. entry[] are the library's entry points
 * (ITraceOn, ITraceOff, ...): a traced thread that reaches one stops being
 * recorded there, until its next ITR_IOC_ON (resume at the return address)
 * or ITR_IOC_OFF (the region ends at the entry point).
 */
#define ITR_MAX_ENTRIES 8
struct itr_on {
	__u64 resume_pc;
	__u32 nentries;
	__u32 pad;
	__u64 entry[ITR_MAX_ENTRIES];
};

/* ITR_IOC_CONSUME: userspace has read stream up to tail. */
struct itr_consume {
	__u32 stream;
	__u32 pad;
	__u64 tail;
};

/* ITR_IOC_STATUS. */
struct itr_status {
	__u32 version;
	__u32 installed;
	__u32 ncpu;
	__u32 mode;
	__u32 threads;
	__u32 full;
	__u64 map_size;
	__u64 traps;		/* debug traps handled since load */
};

#define ITR_IOC_STATUS _IOR('i', 1, struct itr_status)
#define ITR_IOC_INSTALL _IOW('i', 2, struct itr_config)
#define ITR_IOC_REMOVE _IO('i', 3)
#define ITR_IOC_ENABLE _IOW('i', 4, struct itr_target)
#define ITR_IOC_ON _IOW('i', 5, struct itr_on)
#define ITR_IOC_OFF _IO('i', 6)
#define ITR_IOC_STOP _IO('i', 7)
#define ITR_IOC_CONSUME _IOW('i', 8, struct itr_consume)

#endif /* ITRACE_KMOD_H */
