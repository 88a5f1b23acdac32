//! What a stepping recorder does with each record: store it in the per-CPU buffers, keep each
//! CPU stream's timestamps from going back (a system call's record carries its entry time,
//! which may precede other threads' records), count what was stored, and keep the first
//! write error.
//!
//! The buffers are written by the recording loop itself, or (continuous and wrap modes, where
//! nothing is refused for space) by a writer thread of their own ([`Sink::threaded`]): the
//! translating recorder drains rings of records faster than one thread encodes them, and the
//! encoding then runs beside the drain and the traced program instead of between them.

use itrace_format::{BatchStamp, Branch, Buffers, Hop, Mode, Mte, Push, Record, StreamTotals};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What became of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Stored {
    Yes,
    /// Normal mode: a buffer is full; the record was not stored (an MTE record was) and
    /// tracing must stop.
    Full,
    /// The trace file could not be written (the error is kept); tracing must stop.
    Failed,
}

/// Where a sink's records go.
enum Store<'a> {
    /// Into the buffers, on the recording loop's thread.
    Direct(&'a mut Buffers),
    /// To the writer thread that owns the buffers, in order.
    Threaded(Writer),
}

/// The recording loop's end of a writer thread.
struct Writer {
    /// `None` once the writer was told to finish.
    ops: Option<SyncSender<Op>>,
    /// Batches the writer has stored, given back empty to be filled again (a fresh batch of
    /// a drained ring is megabytes, mapped and faulted in anew each time).
    spare: Receiver<Vec<Hop>>,
    /// The writer's first error (it stops storing then).
    error: Arc<Mutex<Option<String>>>,
    /// The branches and instructions of the batches the writer made itself (`Op::Expand`),
    /// sent when it has stored everything and returns.
    done: Receiver<(u64, u64)>,
    /// The writer thread's id (for its priority: the recording thread's, `Sink::writer_tid`).
    tid: i32,
    /// Continuous mode: recorders may hand it chunks they encoded (`Sink::encoded`).
    continuous: bool,
    /// Ops sent and not yet done.
    pending: Arc<AtomicUsize>,
    /// Buffers of `EncodedChunk`s written, given back.
    spare_chunks: Receiver<Vec<u8>>,
}

/// What the writer thread is asked to do, in the order asked.
enum Op {
    Branches(usize, Vec<Branch>),
    /// Thread `.1`'s branches on stream `.0`, stamped by `.2`.
    Hops(usize, u32, BatchStamp, Vec<Hop>),
    Branch(usize, Branch),
    Control(usize, Record),
    Mte(Mte),
    Lost(usize, u64),
    /// Thread `.1`'s branches on stream `.0`, stamped by `.2`, made by the writer from `.3`.
    Expand(usize, u32, BatchStamp, Box<dyn HopSource>),
    /// A chunk of stream `.0` encoded by the recorder.
    Encoded(usize, EncodedChunk),
}

/// Items a recorder encoded with an encoder of its own, from a fresh state to
/// [`Encoder::finish`](itrace_format::compact::Encoder::finish): one chunk's payload, and what it
/// holds (the records are all taken branches).
pub struct EncodedChunk {
    pub payload: Vec<u8>,
    pub branches: u64,
    pub instructions: u64,
    /// The encoder's counts ([`Encoder::totals`](itrace_format::compact::Encoder::totals)).
    pub totals: StreamTotals,
}

/// A batch in a recorder's own form, whose branch records the writer thread makes itself (the
/// translating recorder's drained ring: exit ids and targets), so that the recording loop,
/// which the traced thread waits for, does not.
pub trait HopSource: Send {
    /// Make the batch's next hops into `hops`, as many as it holds at most; returns how many,
    /// and whether any are left. Into a slice, not onto a vector: a push a hop kept the vector's
    /// length in memory, a step of every hop's (a quarter of the drained ring's loop).
    fn fill(&mut self, hops: &mut [Hop]) -> (usize, bool);
}

/// A piece of [`EXPAND_PIECE`] hops to fill ([`HopSource::fill`]), in `buffer`.
fn piece_in(buffer: &mut Vec<Hop>) -> &mut [Hop] {
    buffer.resize(EXPAND_PIECE, Hop::default());
    buffer
}

/// Hops the writer makes from a `HopSource` at a time: a piece that stays in its CPU's cache
/// between being made and being encoded.
const EXPAND_PIECE: usize = 4096;

/// What the writer thread may have waiting; the recording loop waits for it beyond that. A
/// batch is a drained ring (up to 2.6 MB of records), so this bounds the memory and what a
/// killed recorder loses beyond what waits in the buffers. `./workload 2000000`: the
/// recorder's peak RSS was 19 MB without a writer thread, 27-32 MB with 4 waiting, 48-64 MB
/// with 16, as fast.
const QUEUED_OPS: usize = 4;
/// How often an idle writer thread writes what is due (continuous mode's loss bound; the
/// recording loop's own wake-ups do it when the buffers are its own).
const WRITER_TICK: Duration = Duration::from_millis(100);
/// How long the writer thread keeps its CPU after a drained ring's batch, yielding it to any
/// other thread that wants it, while it waits for the next op. Blocked, it left that CPU idle
/// between batches whenever it was done before the traced thread filled its next ring, and the
/// recording thread, woken by the traced thread's stop, went to the idle CPU (the thread
/// following it): 370 moves from CPU to CPU in a recording of `./workload 15000000` instead of
/// 5, and a tenth more time for 8 % less work. Only after a large batch: between the stops of a
/// program's start-up (translations, system calls, each draining a few records) it would spin
/// on and on.
const WRITER_SPIN: Duration = Duration::from_millis(1);
/// Ops the writer thread may have waiting or in hand and not be busy (`Sink::writer_busy`).
/// The translating recorder encodes a ring itself when the writer is busy, and gives it the
/// ring to make and encode otherwise. Measured on `./workload 15000000` (5 runs of each,
/// alternating, in three invocations): with 0 the recorder encoded about every other ring, and
/// its CPU, which the traced thread shares, bound the recording (1.98-2.14 s, the old build
/// 2.05-2.58 s beside it); 1 took 1.69-1.88 s and 2 1.68-1.76 s side by side; 2 took
/// 1.42-1.51 s and 3 1.48-1.55 s side by side (the queue holds 4).
const WRITER_BUSY: usize = 2;
/// The least batch of hops `WRITER_SPIN` follows: a ring drained because it was full, not at
/// another stop (the translating recorder's rings hold 65,536 records).
const SPIN_AFTER: usize = 16_384;

/// The buffers of one recording, as a recording loop writes them.
pub struct Sink<'a> {
    store: Store<'a>,
    ncpu: usize,
    last_ts: Vec<u64>,
    /// Per thread, how its branch records share clock readings: the thread whose records came
    /// last (most calls are for the same thread as the one before) and the others.
    clock_tid: Option<u32>,
    clock: ThreadClock,
    clocks: HashMap<u32, ThreadClock>,
    /// Branch records that share one clock reading (1: each has its own).
    share_clock: u32,
    /// Taken branches stored, and the instructions they count.
    pub branches: u64,
    pub instructions: u64,
    error: Option<String>,
}

impl<'a> Sink<'a> {
    pub fn new(buffers: &'a mut Buffers) -> Self {
        let ncpu = buffers.lost().len();
        Sink::with_store(Store::Direct(buffers), ncpu)
    }

    /// A sink whose buffers are written by a thread of `scope`, when their mode never refuses
    /// a record for space (continuous and wrap); in normal mode, where a full buffer must stop
    /// tracing at the record it refused, the recording loop writes them itself.
    pub fn threaded<'scope>(scope: &'scope std::thread::Scope<'scope, '_>, buffers: &'scope mut Buffers) -> Sink<'scope>
    where
        'scope: 'a,
    {
        let ncpu = buffers.lost().len();
        if buffers.mode() == Mode::Normal {
            return Sink::with_store(Store::Direct(buffers), ncpu);
        }
        let (ops, ops_rx) = mpsc::sync_channel(QUEUED_OPS);
        let (spare_tx, spare) = mpsc::channel();
        let (chunks_tx, spare_chunks) = mpsc::channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let writer_pending = Arc::clone(&pending);
        let continuous = buffers.mode() == Mode::Continuous;
        let (done_tx, done) = mpsc::channel();
        let (tid_tx, tid_rx) = mpsc::channel();
        let error = Arc::new(Mutex::new(None));
        let writer_error = Arc::clone(&error);
        scope.spawn(move || {
            block_every_signal();
            // SAFETY: gettid has no preconditions.
            let _ = tid_tx.send(unsafe { libc::gettid() });
            let made = write_ops(buffers, &ops_rx, &spare_tx, &chunks_tx, &writer_pending, &writer_error);
            let _ = done_tx.send(made);
        });
        let tid = tid_rx.recv().unwrap_or(0);
        Sink::with_store(
            Store::Threaded(Writer { ops: Some(ops), spare, error, done, tid, continuous, pending, spare_chunks }),
            ncpu,
        )
    }

    fn with_store(store: Store<'a>, ncpu: usize) -> Self {
        Sink {
            store,
            ncpu,
            last_ts: Vec::new(),
            clock_tid: None,
            clock: ThreadClock::default(),
            clocks: HashMap::new(),
            share_clock: 1,
            error: None,
            branches: 0,
            instructions: 0,
        }
    }

    /// Sparse timestamps: each thread's branch records share one clock reading for `records`
    /// records (format 3.0 stores an unchanged time in no bytes; an exact reading at every
    /// stop cost the ptrace recorder 3 of its 4-6 bytes per branch). A control record starts
    /// a new reading.
    pub fn share_clock(mut self, records: u32) -> Self {
        self.share_clock = records.max(1);
        self
    }

    /// The newest timestamp stored on `cpu`'s stream.
    pub fn last_ts(&self, cpu: usize) -> u64 {
        self.last_ts.get(cpu).copied().unwrap_or(0)
    }

    /// The timestamp `b` is stored with on `cpu`'s stream: its own reading, no older than the
    /// stream's last; when records share readings, see [`stamp_with`]. (Each record its own
    /// reading, as the in-process, kernel and GDB recorders stamp them, stays as it was before
    /// readings were shared per thread: while their records went through the threads' clocks,
    /// the in-process recorder's calibration tests twice found a hook call more than the
    /// profiler logged, never before; the cause was not found.)
    #[inline]
    fn stamp(&mut self, cpu: usize, b: &mut Branch) {
        if cpu >= self.last_ts.len() {
            self.last_ts.resize(cpu + 1, 0);
        }
        if self.share_clock == 1 {
            // Every record its own reading: no thread's reading to keep.
            b.ts = b.ts.max(self.last_ts[cpu]);
            self.last_ts[cpu] = b.ts;
            return;
        }
        self.clock_for(b.tid);
        stamp_with(&mut self.last_ts[cpu], &mut self.clock, self.share_clock, cpu, b);
    }

    /// Make `self.clock` thread `tid`'s.
    #[inline]
    fn clock_for(&mut self, tid: u32) {
        if self.clock_tid != Some(tid) {
            if let Some(t) = self.clock_tid {
                self.clocks.insert(t, self.clock);
            }
            self.clock = self.clocks.remove(&tid).unwrap_or_default();
            self.clock_tid = Some(tid);
        }
    }

    /// [`Sink::stamp`] for each of `bs` when records share clock readings, with the stream's
    /// and the thread's clocks in registers.
    fn stamp_shared(&mut self, cpu: usize, bs: &mut [Branch]) {
        self.stamp(cpu, &mut bs[0]);
        let (mut last, mut clock, mut tid) = (self.last_ts[cpu], self.clock, bs[0].tid);
        for b in bs[1..].iter_mut() {
            if b.tid != tid {
                self.clock = clock;
                self.clock_for(b.tid);
                (clock, tid) = (self.clock, b.tid);
            }
            stamp_with(&mut last, &mut clock, self.share_clock, cpu, b);
        }
        (self.last_ts[cpu], self.clock) = (last, clock);
    }

    /// Store a taken branch on `cpu`'s stream, its timestamp no older than the stream's last.
    pub fn branch(&mut self, cpu: usize, mut b: Branch) -> Stored {
        self.stamp(cpu, &mut b);
        let pushed = match &mut self.store {
            Store::Direct(buffers) => buffers.push_branch(cpu, &b),
            Store::Threaded(_) => return self.send(Op::Branch(cpu, b), 1, b.icount as u64),
        };
        match pushed {
            Ok(Push::Stored) => {
                self.branches += 1;
                self.instructions += b.icount as u64;
                Stored::Yes
            }
            Ok(Push::Full) => Stored::Full,
            Err(e) => self.write_failed(e),
        }
    }

    /// Store taken branches on `cpu`'s stream, in order, each as [`Sink::branch`] would (the
    /// timestamps in `bs` are set to the ones stored). Returns how many were stored and the
    /// outcome: `Full` when a normal-mode buffer refused the next one (and so every one after
    /// it), `Failed` when the file could not be written. With a writer thread, `bs` is handed
    /// to it and left empty.
    pub fn branches(&mut self, cpu: usize, bs: &mut Vec<Branch>) -> (usize, Stored) {
        if bs.is_empty() {
            return (0, Stored::Yes);
        }
        // `stamp` for each; shared readings with the clocks in registers (a call per record, with
        // its checks, was 7 % of the translating recorder's time when its drains came here).
        if self.share_clock == 1 {
            for b in bs.iter_mut() {
                self.stamp(cpu, b);
            }
        } else {
            self.stamp_shared(cpu, bs);
        }
        let (n, instructions) = (bs.len(), bs.iter().map(|b| b.icount as u64).sum::<u64>());
        match &mut self.store {
            Store::Direct(buffers) => {
                let pushed = buffers.push_branches(cpu, bs);
                self.stored_batch(pushed, n, instructions, |k| bs[..k].iter().map(|b| b.icount as u64).sum())
            }
            Store::Threaded(_) => {
                let batch = std::mem::take(bs);
                (n, self.send(Op::Branches(cpu, batch), n as u64, instructions))
            }
        }
    }

    /// The timestamps a batch of thread `tid`'s branch records, all read at `ts` (a drained
    /// ring: one reading at its stop), get on `cpu`'s stream: what [`Sink::stamp`] gives each
    /// of them, known before the batch is made, so that the drain writes each record once.
    /// Nothing changes until [`Sink::stamped_branches`] stores the batch.
    pub fn batch_stamp(&mut self, cpu: usize, tid: u32, ts: u64) -> BatchStamp {
        let last = self.last_ts(cpu);
        if self.share_clock == 1 {
            return BatchStamp { first: 0, first_n: 0, rest: ts.max(last) };
        }
        self.clock_for(tid);
        let c = &self.clock;
        let floor = if c.cpu == cpu { c.last } else { c.last + 1 };
        // The thread's reading goes on for the records it still has; then, as each record after
        // it takes the newer of `ts` and its thread's newest, every one takes `rest`.
        let first = floor.max(last);
        BatchStamp { first, first_n: c.left as usize, rest: ts.max(first) }
    }

    /// Whether a writer thread stores the records ([`Sink::expand`] is for such a sink).
    pub fn has_writer(&self) -> bool {
        matches!(self.store, Store::Threaded(_))
    }

    /// Thread `tid`'s `n` user-mode branches on `cpu`, stamped by `stamp` ([`Sink::batch_stamp`],
    /// the last call to the sink), that the writer thread makes from `src` and stores as
    /// [`Sink::stamped_branches`] would (without a writer thread, made and stored here). With a
    /// writer thread, their instructions are added when it is done ([`Sink::finish`]).
    pub fn expand(&mut self, cpu: usize, tid: u32, stamp: BatchStamp, n: usize, src: Box<dyn HopSource>) -> Stored {
        if n == 0 {
            return Stored::Yes;
        }
        self.after_batch(cpu, tid, stamp, n);
        if self.has_writer() {
            return self.send(Op::Expand(cpu, tid, stamp, src), 0, 0);
        }
        let (mut buffer, mut src, mut done) = (Vec::new(), src, 0);
        loop {
            let piece = piece_in(&mut buffer);
            let (n, more) = src.fill(piece);
            let hops = &piece[..n];
            let Store::Direct(buffers) = &mut self.store else { return Stored::Yes };
            let pushed = buffers.push_hops(cpu, tid, stamp.from(done), hops);
            done += n;
            let instructions = hops.iter().map(|h| h.icount as u64).sum();
            let outcome =
                self.stored_batch(pushed, n, instructions, |k| hops[..k].iter().map(|h| h.icount as u64).sum()).1;
            if outcome != Stored::Yes || !more {
                return outcome;
            }
        }
    }

    /// The clocks after a batch of `n` (> 0) records of thread `tid` on `cpu` stamped by `stamp`,
    /// as `n` calls of `stamp_with` leave them.
    fn after_batch(&mut self, cpu: usize, tid: u32, stamp: BatchStamp, n: usize) {
        debug_assert!(self.share_clock == 1 || self.clock_tid == Some(tid), "a stamp of another thread");
        let newest = stamp.ts(n - 1);
        if cpu >= self.last_ts.len() {
            self.last_ts.resize(cpu + 1, 0);
        }
        self.last_ts[cpu] = newest;
        if self.share_clock > 1 {
            // As `n` calls of `stamp_with`: `left` counts down, and at zero a record takes its
            // own reading and starts a new count.
            let share = self.share_clock as usize;
            let left = if n <= stamp.first_n { stamp.first_n - n } else { share - 1 - (n - stamp.first_n - 1) % share };
            self.clock = ThreadClock { left: left as u32, last: newest, cpu };
        }
    }

    /// Whether [`Sink::encoded`] may be used: a writer thread writes the records, each
    /// segment as a chunk (continuous mode).
    pub fn takes_chunks(&self) -> bool {
        matches!(&self.store, Store::Threaded(w) if w.continuous)
    }

    /// Whether the writer thread has more than [`WRITER_BUSY`] ops waiting or in hand: a
    /// recorder with work it could give the writer does that work itself then.
    pub fn writer_busy(&self) -> bool {
        matches!(&self.store, Store::Threaded(w) if w.pending.load(Ordering::Relaxed) > WRITER_BUSY)
    }

    /// A chunk of `cpu`'s stream that a recorder encoded itself (only when
    /// [`Sink::takes_chunks`]): the writer writes it after what it was given before, as its own
    /// chunk. Its buffer comes back through [`Sink::spare_chunk`].
    pub fn encoded(&mut self, cpu: usize, tid: u32, stamp: BatchStamp, chunk: EncodedChunk) -> Stored {
        let (branches, instructions) = (chunk.branches, chunk.instructions);
        if branches == 0 {
            return Stored::Yes;
        }
        self.after_batch(cpu, tid, stamp, branches as usize);
        self.send(Op::Encoded(cpu, chunk), branches, instructions)
    }

    /// An emptied buffer of a chunk the writer has written, if one is back.
    pub fn spare_chunk(&self) -> Option<Vec<u8>> {
        match &self.store {
            Store::Threaded(w) => w.spare_chunks.try_recv().ok(),
            Store::Direct(_) => None,
        }
    }

    /// [`Sink::branches`] for a batch of thread `tid`'s user-mode branches stamped by `stamp`
    /// ([`Sink::batch_stamp`], the last call to the sink), `instructions` their counts' sum:
    /// no pass over the batch here (two passes, the stamping and the sum, were 11 % of the
    /// translating recorder's samples, its batches being larger than the cache), and records
    /// of 24 bytes, not 40 (`Hop`). With a writer thread, `hops` is handed to it and left
    /// empty (an emptied batch of an earlier call, its room kept).
    pub fn stamped_branches(
        &mut self,
        cpu: usize,
        tid: u32,
        hops: &mut Vec<Hop>,
        stamp: BatchStamp,
        instructions: u64,
    ) -> (usize, Stored) {
        let n = hops.len();
        if n == 0 {
            return (0, Stored::Yes);
        }
        self.after_batch(cpu, tid, stamp, n);
        match &mut self.store {
            Store::Direct(buffers) => {
                let pushed = buffers.push_hops(cpu, tid, stamp, hops);
                self.stored_batch(pushed, n, instructions, |k| hops[..k].iter().map(|h| h.icount as u64).sum())
            }
            Store::Threaded(w) => {
                let batch = std::mem::replace(hops, w.spare.try_recv().unwrap_or_default());
                (n, self.send(Op::Hops(cpu, tid, stamp, batch), n as u64, instructions))
            }
        }
    }

    /// Count what the buffers stored of a batch of `n` whose counts sum to `instructions`
    /// (`partial(k)`: the sum of the first `k`'s), and say how it went.
    fn stored_batch(
        &mut self,
        pushed: Result<usize, itrace_format::FormatError>,
        n: usize,
        instructions: u64,
        partial: impl FnOnce(usize) -> u64,
    ) -> (usize, Stored) {
        match pushed {
            Ok(stored) => {
                self.branches += stored as u64;
                self.instructions += if stored == n { instructions } else { partial(stored) };
                (stored, if stored < n { Stored::Full } else { Stored::Yes })
            }
            Err(e) => (0, self.write_failed(e)),
        }
    }

    /// Store a control record (trace on/off, lost) on `cpu`'s stream; never refused for space.
    pub fn control(&mut self, cpu: usize, r: &Record) -> Stored {
        self.clock.left = 0;
        for c in self.clocks.values_mut() {
            c.left = 0;
        }
        // The stream stays in time order, as for branches: readers merge the streams by time.
        // A control record is stamped when it is made, and records stored after it may carry an
        // older reading (a system call's records, stamped at its entry and stored at its exit,
        // after the trace-off of a thread that ended meanwhile): those go on at its time. A
        // thread's own records after its trace-on follow it on any stream.
        if cpu >= self.last_ts.len() {
            self.last_ts.resize(cpu + 1, 0);
        }
        let ts = r.ts().max(self.last_ts[cpu]);
        self.last_ts[cpu] = ts;
        let mut stamped;
        let r = if ts == r.ts() {
            r
        } else {
            stamped = r.clone();
            stamped.set_ts(ts);
            &stamped
        };
        if let Record::TraceOn(on) = r {
            self.clock_for(on.tid);
            self.clock.last = self.clock.last.max(ts);
            self.clock.cpu = cpu;
        }
        // A thread's trace ends: its clock goes (a program making threads all along would
        // otherwise grow the map with every thread it ever had).
        if let Record::TraceOff(off) = r {
            if self.clock_tid == Some(off.tid) {
                (self.clock_tid, self.clock) = (None, ThreadClock::default());
            }
            self.clocks.remove(&off.tid);
        }
        let pushed = match &mut self.store {
            Store::Direct(buffers) => buffers.push_control(cpu, r),
            Store::Threaded(_) => return self.send(Op::Control(cpu, r.clone()), 0, 0),
        };
        match pushed {
            Ok(()) => Stored::Yes,
            Err(e) => self.write_failed(e),
        }
    }

    /// Store a module-table record.
    pub fn mte(&mut self, m: Mte) -> Stored {
        let pushed = match &mut self.store {
            Store::Direct(buffers) => buffers.push_mte(&Record::Mte(m)),
            Store::Threaded(_) => return self.send(Op::Mte(m), 0, 0),
        };
        match pushed {
            Ok(Push::Stored) => Stored::Yes,
            Ok(Push::Full) => Stored::Full,
            Err(e) => self.write_failed(e),
        }
    }

    /// Count `n` records of `cpu`'s stream as lost (they never reached the recorder).
    pub fn add_lost(&mut self, cpu: usize, n: u64) {
        match &mut self.store {
            Store::Direct(buffers) => buffers.add_lost(cpu, n),
            Store::Threaded(_) => {
                let _ = self.send(Op::Lost(cpu, n), 0, 0);
            }
        }
    }

    /// Write what has waited in memory long enough (continuous mode: the oldest record
    /// half a second old), so that a recorder killed now loses at most
    /// about the last second. Recording loops call this whenever they wake, EINTR and
    /// timeouts included; it costs a clock reading when something waits, nothing otherwise.
    /// (A writer thread does it on its own.)
    pub fn tick(&mut self) -> Stored {
        if self.error.is_some() {
            return Stored::Yes; // already stopping; the error is kept
        }
        let flushed = match &mut self.store {
            Store::Direct(buffers) => buffers.flush_if_due(),
            Store::Threaded(w) => {
                let e = w.error.lock().map(|e| e.clone()).unwrap_or(None);
                return self.writer_error(e);
            }
        };
        match flushed {
            Ok(()) => Stored::Yes,
            Err(e) => self.write_failed(e),
        }
    }

    /// Wait until a writer thread has stored everything it was given (the buffers are the
    /// caller's again once the thread's scope ends), and take its error. Nothing to wait for
    /// when the recording loop wrote them itself.
    pub fn finish(&mut self) {
        let Store::Threaded(w) = &mut self.store else { return };
        // Its end of the queue closed, the writer stops once it has stored what it was sent.
        drop(w.ops.take());
        if let Ok((branches, instructions)) = w.done.recv() {
            self.branches += branches;
            self.instructions += instructions;
        }
        let e = w.error.lock().map(|e| e.clone()).unwrap_or(None);
        let _ = self.writer_error(e);
    }

    /// The writer thread's id, if the buffers have one: the recording's own priority goes to it
    /// too (every record it is handed must be written before a detach ends).
    pub fn writer_tid(&self) -> Option<i32> {
        match &self.store {
            Store::Threaded(w) if w.tid > 0 => Some(w.tid),
            _ => None,
        }
    }

    /// The first error, if any: a failed write, or what a consumer reported with [`Sink::fail`].
    pub fn write_error(&self) -> Option<String> {
        self.error.clone()
    }

    /// Whether recording must stop for an error.
    pub fn failed(&self) -> bool {
        self.error.is_some()
    }

    /// Keep `e` as the error that ends the recording, unless one came first.
    pub fn fail(&mut self, e: impl ToString) {
        self.error.get_or_insert_with(|| e.to_string());
    }

    /// The number of CPU streams.
    pub fn streams(&self) -> usize {
        self.ncpu
    }

    /// Hand `op` to the writer thread (waiting while it has [`QUEUED_OPS`] to do), counting
    /// what it stores; `Failed` once it has failed.
    fn send(&mut self, op: Op, branches: u64, instructions: u64) -> Stored {
        let Store::Threaded(w) = &mut self.store else { unreachable!("only a threaded sink sends") };
        let e = w.error.lock().map(|e| e.clone()).unwrap_or(None);
        if e.is_some() || self.error.is_some() {
            return self.writer_error(e);
        }
        w.pending.fetch_add(1, Ordering::Relaxed);
        if w.ops.as_ref().is_none_or(|ops| ops.send(op).is_err()) {
            return self.writer_error(Some("the trace's writer thread ended".into()));
        }
        self.branches += branches;
        self.instructions += instructions;
        Stored::Yes
    }

    fn writer_error(&mut self, e: Option<String>) -> Stored {
        match e {
            Some(e) => {
                self.error.get_or_insert(e);
                Stored::Failed
            }
            None if self.error.is_some() => Stored::Failed,
            None => Stored::Yes,
        }
    }

    fn write_failed(&mut self, e: itrace_format::FormatError) -> Stored {
        self.error.get_or_insert_with(|| e.to_string());
        Stored::Failed
    }
}

/// How a thread's branch records share clock readings.
#[derive(Clone, Copy, Debug, Default)]
struct ThreadClock {
    /// Records still to take `last` instead of their own reading.
    left: u32,
    /// The thread's newest timestamp.
    last: u64,
    /// The stream of its newest record.
    cpu: usize,
}

/// The timestamp `b` (of the thread of `clock`) is stored with on stream `cpu`, whose newest is
/// `last`: its own clock reading, or while the thread's records share a reading, its newest
/// timestamp; never older than the stream's newest or the thread's.
///
/// A thread that moved to another CPU goes on at least a nanosecond after its newest record on
/// the one it left: readers merge the streams by time, and the new stream's last shared reading
/// (another thread's) may be older, or the same (a tie that the merge may break either way). Its
/// sharing goes on as it was, so that a thread's records get the same readings whether or not it
/// moved (tests compare traces of a program, record for record, with records of the file's other
/// stream placed among them by time).
#[inline(always)]
fn stamp_with(last: &mut u64, clock: &mut ThreadClock, share_clock: u32, cpu: usize, b: &mut Branch) {
    let floor = if clock.cpu == cpu { clock.last } else { clock.last + 1 };
    clock.cpu = cpu;
    if clock.left > 0 {
        clock.left -= 1;
        b.ts = floor.max(*last);
    } else {
        b.ts = b.ts.max(floor).max(*last);
        clock.left = share_clock - 1;
    }
    clock.last = b.ts;
    *last = b.ts;
}

/// The writer thread: store each op in order until the recording loop's end is closed; write
/// what is due when idle. After the first error nothing more is stored (the recording stops).
fn write_ops(
    buffers: &mut Buffers,
    ops: &Receiver<Op>,
    spare: &mpsc::Sender<Vec<Hop>>,
    spare_chunks: &mpsc::Sender<Vec<u8>>,
    pending: &AtomicUsize,
    error: &Mutex<Option<String>>,
) -> (u64, u64) {
    let mut failed = false;
    // What it made of `Op::Expand`s and stored: branches, instructions.
    let (mut branches, mut instructions) = (0u64, 0u64);
    let mut piece_buffer = Vec::with_capacity(EXPAND_PIECE);
    // Until when the thread keeps its CPU between ops (`WRITER_SPIN`).
    let mut spin_until: Option<Instant> = None;
    loop {
        let op = match ops.try_recv() {
            Ok(op) => Ok(op),
            Err(TryRecvError::Disconnected) => return (branches, instructions),
            Err(TryRecvError::Empty) if spin_until.is_some_and(|t| Instant::now() < t) => {
                std::thread::yield_now();
                continue;
            }
            Err(TryRecvError::Empty) => ops.recv_timeout(WRITER_TICK),
        };
        let op = match op {
            Ok(op) => op,
            Err(RecvTimeoutError::Timeout) => {
                if !failed {
                    if let Err(e) = buffers.flush_if_due() {
                        failed = keep_error(error, e);
                    }
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return (branches, instructions),
        };
        // Done with it however it goes (an op after an error is dropped).
        let _done = Done(pending);
        if failed {
            continue;
        }
        let bulk = match &op {
            Op::Hops(_, _, _, batch) => batch.len() >= SPIN_AFTER,
            Op::Expand(..) | Op::Encoded(..) => true,
            _ => false,
        };
        spin_until = bulk.then(|| Instant::now() + WRITER_SPIN);
        let r = match op {
            Op::Branches(cpu, batch) => buffers.push_branches(cpu, &batch).map(drop),
            Op::Hops(cpu, tid, stamp, mut batch) => {
                let r = buffers.push_hops(cpu, tid, stamp, &batch).map(drop);
                batch.clear();
                let _ = spare.send(batch);
                r
            }
            Op::Branch(cpu, b) => buffers.push_branch(cpu, &b).map(drop),
            Op::Control(cpu, r) => buffers.push_control(cpu, &r),
            Op::Mte(m) => buffers.push_mte(&Record::Mte(m)).map(drop),
            Op::Lost(cpu, n) => {
                buffers.add_lost(cpu, n);
                Ok(())
            }
            Op::Encoded(cpu, mut c) => {
                let r = buffers.push_encoded_counted(
                    cpu,
                    &c.payload,
                    c.branches,
                    c.branches,
                    c.instructions,
                    Some(&c.totals),
                );
                c.payload.clear();
                let _ = spare_chunks.send(c.payload);
                r
            }
            Op::Expand(cpu, tid, stamp, mut src) => {
                // The batch's branches stored so far (the next piece's first record's index).
                let mut done = 0;
                loop {
                    let piece = piece_in(&mut piece_buffer);
                    let (n, more) = src.fill(piece);
                    let piece = &piece[..n];
                    match buffers.push_hops(cpu, tid, stamp.from(done), piece) {
                        Ok(stored) => {
                            done += stored;
                            branches += stored as u64;
                            instructions += piece[..stored].iter().map(|h| h.icount as u64).sum::<u64>();
                        }
                        Err(e) => break Err(e),
                    }
                    if !more {
                        break Ok(());
                    }
                }
            }
        };
        if let Err(e) = r {
            failed = keep_error(error, e);
        }
    }
}

/// An op the writer thread is done with, when dropped (`Writer::pending`).
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The writer thread takes no signal: a process-directed one (Ctrl-C, SIGTERM, the duration's
/// SIGALRM) must reach the recording thread, whose waits it interrupts.
fn block_every_signal() {
    // SAFETY: `set` is initialised by sigfillset before use; pthread_sigmask changes only the
    // calling thread's mask (SIGKILL and SIGSTOP cannot be blocked and are left out by it).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn keep_error(error: &Mutex<Option<String>>, e: itrace_format::FormatError) -> bool {
    if let Ok(mut slot) = error.lock() {
        slot.get_or_insert_with(|| e.to_string());
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use itrace_format::{
        Arch, BranchKind, BufferConfig, Endian, FileHeader, StepMethod, StopReason, Summary, TraceFile, TraceOff,
        TraceWriter, FLAG_ICOUNT, VERSION_MAJOR, VERSION_MINOR,
    };

    fn branch(i: u64) -> Branch {
        let kind = if i % 3 == 0 { BranchKind::CondJump } else { BranchKind::Call };
        let from = 0x400000 + (i % 40) * 16;
        Branch { icount: (i % 13) as u32 + 1, ..Branch::user(1000 + i, 7, from, from + 0x100, kind, 0, 0) }
    }

    /// Every record of the file, in order, and the summary's per-CPU counts.
    fn read(path: &std::path::Path) -> (Vec<String>, Vec<u64>, Vec<u64>) {
        let t = TraceFile::open(path).unwrap();
        let records = t.merged().map(|e| format!("{:?}", e.unwrap().record)).collect();
        let s = t.summary().unwrap();
        (records, s.records.clone(), s.lost.clone())
    }

    /// Continuous-mode buffers of `ncpu` streams writing a translated x86_64 trace to `path`.
    fn continuous_buffers(path: &std::path::Path, ncpu: u16) -> Buffers {
        let header =
            FileHeader::starting_now(Arch::X86_64, Mode::Continuous, StepMethod::Translated, ncpu, FLAG_ICOUNT, 0, 0);
        let w = TraceWriter::create(path, &header).unwrap();
        let ncpu = ncpu as usize;
        let cfg =
            BufferConfig { mode: Mode::Continuous, ncpu, buffer_size: 0, segment_size: 1 << 16, mte_size: 1 << 20 };
        Buffers::new(cfg, w).unwrap()
    }

    /// A user jump of thread `tid` at time `ts` from `from`.
    fn jump_at(ts: u64, tid: u32, from: u64) -> Branch {
        Branch::user(ts, tid, from, from + 0x10, BranchKind::Jump, 0, 0)
    }

    /// The sources of thread `tid`'s branch records in the file at `path`, merged by time.
    fn thread_sources(path: &std::path::Path, tid: u32) -> Vec<u64> {
        let t = TraceFile::open(path).unwrap();
        t.merged()
            .filter_map(|e| match e.unwrap().record {
                Record::Branch(b) if b.tid == tid => Some(b.from),
                _ => None,
            })
            .collect()
    }

    /// A thread that moves to another CPU's stream goes on after its records on the one it
    /// left: with the stream's last shared reading (another thread's, older), the file, merged
    /// by time, put its later records first.
    #[test]
    fn a_moved_thread_stays_in_order() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("moved.itr");
        let mut buffers = continuous_buffers(&path, 2);
        {
            let mut sink = Sink::new(&mut buffers).share_clock(4);
            // Thread 8 on CPU 0 at time 50: that reading is CPU 0's for 3 more records.
            assert_eq!(sink.branch(0, jump_at(50, 8, 0x100)), Stored::Yes);
            // Thread 7 on CPU 1 at 100 (a reading for 3 more records), then moved to CPU 0,
            // where it goes on at 200, 300, 400 and 500.
            assert_eq!(sink.branch(1, jump_at(100, 7, 0x200)), Stored::Yes);
            let mut stamps = Vec::new();
            for (i, ts) in [200, 300, 400, 500].into_iter().enumerate() {
                assert_eq!(sink.branch(0, jump_at(ts, 7, 0x300 + 0x10 * i as u64)), Stored::Yes);
                stamps.push(sink.last_ts(0));
            }
            // A nanosecond after its record on CPU 1, then that reading shared, then its own.
            assert_eq!(stamps, [101, 101, 101, 500]);
        }
        buffers.finish(Summary::default()).unwrap();
        let thread7 = thread_sources(&path, 7);
        assert_eq!(thread7, [0x200, 0x300, 0x310, 0x320, 0x330], "thread 7's records in the file's order by time");
    }

    /// A control record stamped later than records stored after it on its stream (a system
    /// call's records are stamped at its entry and stored at its exit: a thread that ended
    /// meanwhile put its trace-off between) keeps the stream in time order. Before, thread 7's
    /// record went into the stream older than the trace-off before it, and its next record, on
    /// the other CPU, was merged before it (xl_rseq's main once counted a loop's 5 instructions
    /// in the wrong block).
    #[test]
    fn a_control_record_keeps_its_stream_in_time_order() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("control.itr");
        let mut buffers = continuous_buffers(&path, 2);
        {
            let mut sink = Sink::new(&mut buffers).share_clock(4);
            assert_eq!(sink.branch(0, jump_at(100, 7, 0x100)), Stored::Yes);
            let off = TraceOff { ts: 500, reason: StopReason::Exited, pid: 7, tid: 9, icount: 0, pc: 0x900, value: 0 };
            assert_eq!(sink.control(0, &Record::TraceOff(off)), Stored::Yes);
            // Made at 200 (a system call's entry), stored now; then the thread on CPU 1 at 300.
            assert_eq!(sink.branch(0, jump_at(200, 7, 0x200)), Stored::Yes);
            assert_eq!(sink.branch(1, jump_at(300, 7, 0x300)), Stored::Yes);
        }
        buffers.finish(Summary::default()).unwrap();
        let t = TraceFile::open(&path).unwrap();
        for cpu in 0..2 {
            let stamps: Vec<u64> = t.stream(cpu).map(|r| r.unwrap().1.ts()).collect();
            assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "stream {cpu} goes back in time: {stamps:?}");
        }
        assert_eq!(thread_sources(&path, 7), [0x100, 0x200, 0x300], "thread 7's records in the file's order by time");
    }

    /// A batch stamped ahead ([`Sink::batch_stamp`], [`Sink::stamped_branches`], as the
    /// translating recorder's drain stores a ring) gives the file and the counts that storing
    /// its records one by one gives: the same timestamps for every record of every batch, with
    /// threads moving between streams, older readings, shared readings running out in the
    /// middle of a batch, control records between, and one reading a record.
    #[test]
    fn a_batch_stamped_ahead_is_stored_as_its_records_one_by_one() {
        let d = tempfile::tempdir().unwrap();
        for share in [1, 4, 64] {
            let mut files = Vec::new();
            let mut counts = Vec::new();
            for batched in [false, true] {
                let path = d.path().join(format!("{share}-{batched}.itr"));
                let mut buffers = continuous_buffers(&path, 2);
                {
                    let mut sink = Sink::new(&mut buffers).share_clock(share);
                    // A small LCG: the same choices for both files.
                    let mut seed = 0x2545_F491_4F6C_DD1Du64;
                    let mut next = |m: u64| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (seed >> 33) % m
                    };
                    let mut ts: u64 = 1000;
                    for round in 0..400u64 {
                        let (cpu, tid) = (next(2) as usize, 7 + next(3) as u32);
                        // Mostly later readings, sometimes an older one (a stream's newest is later).
                        ts = if next(5) == 0 { ts.saturating_sub(next(50)) } else { ts + next(100) };
                        if next(10) == 0 {
                            let off = TraceOff {
                                ts,
                                reason: StopReason::Exited,
                                pid: 7,
                                tid: 99,
                                icount: 0,
                                pc: 1,
                                value: 0,
                            };
                            assert_eq!(sink.control(cpu, &Record::TraceOff(off)), Stored::Yes);
                            continue;
                        }
                        let n = next(150) as usize;
                        let hop = |i: usize| {
                            let (from, icount) = (0x1000 + 16 * (i as u64 % 9), (i % 7) as u32 + 1);
                            Hop::new(from, 0x2000 + round, icount, BranchKind::Jump, (i % 63) as u32 + 1)
                        };
                        if batched {
                            let stamp = sink.batch_stamp(cpu, tid, ts);
                            let mut hops: Vec<Hop> = (0..n).map(hop).collect();
                            let instructions = hops.iter().map(|h| h.icount as u64).sum();
                            assert_eq!(
                                sink.stamped_branches(cpu, tid, &mut hops, stamp, instructions),
                                (n, Stored::Yes)
                            );
                        } else {
                            for i in 0..n {
                                let b = Branch {
                                    icount: (i % 7) as u32 + 1,
                                    ..Branch::user(
                                        ts,
                                        tid,
                                        0x1000 + 16 * (i as u64 % 9),
                                        0x2000 + round,
                                        BranchKind::Jump,
                                        0,
                                        0,
                                    )
                                };
                                assert_eq!(sink.branch(cpu, b), Stored::Yes);
                            }
                        }
                    }
                    counts.push((sink.branches, sink.instructions));
                }
                buffers.finish(Summary::default()).unwrap();
                files.push(read(&path));
            }
            assert_eq!(counts[0], counts[1], "share {share}: branches and instructions counted");
            let (one_by_one, batched) = (&files[0].0, &files[1].0);
            assert_eq!(one_by_one.len(), batched.len(), "share {share}: records");
            for (i, (a, b)) in one_by_one.iter().zip(batched).enumerate() {
                assert_eq!(a, b, "share {share}: record {i}");
            }
        }
    }

    /// The clocks of threads whose trace ended are dropped: a program that makes thread after
    /// thread keeps the sink's memory constant.
    #[test]
    fn a_finished_thread_leaves_no_clock() {
        let d = tempfile::tempdir().unwrap();
        let mut buffers = continuous_buffers(&d.path().join("threads.itr"), 1);
        let mut sink = Sink::new(&mut buffers).share_clock(64);
        for tid in 100..1100u32 {
            let ts = 1000 + tid as u64;
            assert_eq!(sink.branch(0, Branch::user(ts, tid, 0x1000, 0x1010, BranchKind::Jump, 0, 0)), Stored::Yes);
            let off = TraceOff { ts, reason: StopReason::Exited, pid: 100, tid, icount: 0, pc: 0x1010, value: 0 };
            assert_eq!(sink.control(0, &Record::TraceOff(off)), Stored::Yes);
        }
        assert_eq!((sink.clocks.len(), sink.clock_tid), (0, None), "clocks left after 1,000 threads ended");
    }

    /// The same calls, through a sink writing the buffers itself and through one with a writer
    /// thread, give the same file: the same records in the same order, the same counts.
    #[test]
    fn a_writer_thread_stores_what_the_recording_loop_would() {
        let d = tempfile::tempdir().unwrap();
        for mode in [Mode::Continuous, Mode::Wrap] {
            let mut files = Vec::new();
            for threaded in [false, true] {
                let path = d.path().join(format!("{mode}-{threaded}.itr"));
                let header = FileHeader {
                    endian: Endian::native(),
                    version_major: VERSION_MAJOR,
                    version_minor: VERSION_MINOR,
                    arch: Arch::X86_64,
                    mode,
                    step_method: StepMethod::Translated,
                    ncpu: 2,
                    flags: FLAG_ICOUNT,
                    buffer_size: 0,
                    segment_size: 0,
                    start_realtime_ns: 1,
                    start_monotonic_ns: 2,
                };
                let w = TraceWriter::create(&path, &header).unwrap();
                let cfg = BufferConfig { mode, ncpu: 2, buffer_size: 3000, segment_size: 1000, mte_size: 1 << 20 };
                let mut buffers = Buffers::new(cfg, w).unwrap();
                let (branches, instructions) = std::thread::scope(|scope| {
                    let mut sink = if threaded { Sink::threaded(scope, &mut buffers) } else { Sink::new(&mut buffers) }
                        .share_clock(4);
                    let (mut batch, mut hops) = (Vec::new(), Vec::new());
                    for i in 0..2000u64 {
                        let cpu = (i / 500) as usize % 2;
                        match i % 250 {
                            0 => assert_eq!(
                                sink.mte(Mte::ProcessName { ts: 1000 + i, pid: 7, ppid: 1, name: format!("p{i}") }),
                                Stored::Yes
                            ),
                            1 => {
                                let off = TraceOff {
                                    ts: 1000 + i,
                                    reason: StopReason::Exited,
                                    pid: 7,
                                    tid: 7,
                                    icount: 3,
                                    pc: i,
                                    value: 0,
                                };
                                assert_eq!(sink.control(cpu, &Record::TraceOff(off)), Stored::Yes);
                            }
                            2 => sink.add_lost(cpu, i),
                            n if n < 100 => assert_eq!(sink.branch(cpu, branch(i)), Stored::Yes),
                            // A drained ring's batch of thread 7's branches, stamped ahead.
                            n if n < 150 => {
                                let b = branch(i);
                                let hop = Hop::new(b.from, b.to, b.icount, b.kind, 0);
                                hops.push(hop);
                                if hops.len() == 23 || n == 149 {
                                    let stamp = sink.batch_stamp(cpu, 7, b.ts);
                                    let (n, sum) = (hops.len(), hops.iter().map(|h| h.icount as u64).sum());
                                    assert_eq!(sink.stamped_branches(cpu, 7, &mut hops, stamp, sum), (n, Stored::Yes));
                                    hops.clear();
                                }
                            }
                            _ => {
                                batch.push(branch(i));
                                if batch.len() == 37 || i % 250 == 249 {
                                    let n = batch.len();
                                    assert_eq!(sink.branches(cpu, &mut batch), (n, Stored::Yes));
                                    batch.clear();
                                }
                            }
                        }
                    }
                    sink.finish();
                    assert_eq!(sink.write_error(), None);
                    (sink.branches, sink.instructions)
                });
                buffers.finish(Summary::default()).unwrap();
                files.push((read(&path), branches, instructions));
            }
            assert_eq!(files[0], files[1], "{mode}");
            assert!(files[0].0 .0.len() > 100, "{mode}: {} records", files[0].0 .0.len());
        }
    }

    /// Hops in pieces, as a drained ring gives them.
    struct Hops(Vec<Hop>, usize);

    impl HopSource for Hops {
        fn fill(&mut self, hops: &mut [Hop]) -> (usize, bool) {
            let end = (self.1 + hops.len()).min(self.0.len());
            let n = end - self.1;
            hops[..n].copy_from_slice(&self.0[self.1..end]);
            self.1 = end;
            (n, end < self.0.len())
        }
    }

    /// Rings of hops, given to the writer thread to make (`Sink::expand`) or encoded by the
    /// caller as chunks of their own (`Sink::encoded`), with branch, control and MTE records
    /// between them, store the records that the same rings stored on the recording thread
    /// do, with the same counts.
    #[test]
    fn rings_made_by_the_writer_or_encoded_apart_store_the_same_records() {
        let d = tempfile::tempdir().unwrap();
        for mode in [Mode::Continuous, Mode::Wrap] {
            let mut files = Vec::new();
            // 0: no writer thread; 1: every ring made by the writer; 2: every other ring
            // encoded apart (continuous mode only).
            for way in 0..3 {
                if way == 2 && mode != Mode::Continuous {
                    continue;
                }
                let path = d.path().join(format!("{mode}-{way}.itr"));
                let header = FileHeader::starting_now(Arch::X86_64, mode, StepMethod::Translated, 2, FLAG_ICOUNT, 0, 0);
                let w = TraceWriter::create(&path, &header).unwrap();
                let cfg = BufferConfig { mode, ncpu: 2, buffer_size: 1 << 20, segment_size: 5000, mte_size: 1 << 20 };
                let mut buffers = Buffers::new(cfg, w).unwrap();
                let (branches, instructions) = std::thread::scope(|scope| {
                    let mut sink = if way == 0 { Sink::new(&mut buffers) } else { Sink::threaded(scope, &mut buffers) }
                        .share_clock(64);
                    assert_eq!(sink.takes_chunks(), way > 0 && mode == Mode::Continuous);
                    let mut enc = itrace_format::compact::Encoder::new();
                    for ring in 0..60u64 {
                        let cpu = (ring / 20) as usize % 2;
                        let tid = 7 + (ring % 3) as u32;
                        let n = [0, 1, 700, 3000, 9000][ring as usize % 5];
                        let hops: Vec<Hop> = (0..n)
                            .map(|i| {
                                let at = (i * 7 + ring) % 50;
                                let kind = if at % 3 == 0 { BranchKind::Return } else { BranchKind::Jump };
                                let to =
                                    if kind == BranchKind::Return { 0x500000 + (i % 4) * 8 } else { 0x400100 + at };
                                Hop::new(0x400000 + at * 16, to, (at % 5) as u32 + 1, kind, at as u32 + 1)
                            })
                            .collect();
                        let stamp = sink.batch_stamp(cpu, tid, 10_000 + ring * 100);
                        let stored = if way == 2 && ring % 2 == 1 {
                            enc.reset();
                            let mut payload = sink.spare_chunk().unwrap_or_default();
                            let instructions = enc.hops(&mut payload, &hops, tid, stamp, 0);
                            enc.finish(&mut payload);
                            let totals = enc.totals();
                            if hops.is_empty() {
                                Stored::Yes
                            } else {
                                sink.encoded(
                                    cpu,
                                    tid,
                                    stamp,
                                    EncodedChunk { payload, branches: n, instructions, totals },
                                )
                            }
                        } else {
                            sink.expand(cpu, tid, stamp, hops.len(), Box::new(Hops(hops, 0)))
                        };
                        assert_eq!(stored, Stored::Yes);
                        // Between rings: an engine's branch, a thread's end, a module.
                        assert_eq!(sink.branch(cpu, jump_at(10_000 + ring * 100 + 50, tid, 0x401000)), Stored::Yes);
                        if ring % 7 == 0 {
                            let off = TraceOff {
                                ts: 10_000 + ring * 100 + 60,
                                reason: StopReason::Exited,
                                pid: 7,
                                tid,
                                icount: 3,
                                pc: ring,
                                value: 0,
                            };
                            assert_eq!(sink.control(cpu, &Record::TraceOff(off)), Stored::Yes);
                            assert_eq!(
                                sink.mte(Mte::ProcessName {
                                    ts: 10_000 + ring * 100 + 70,
                                    pid: 7,
                                    ppid: 1,
                                    name: format!("r{ring}")
                                }),
                                Stored::Yes
                            );
                        }
                    }
                    sink.finish();
                    assert_eq!(sink.write_error(), None);
                    (sink.branches, sink.instructions)
                });
                buffers.finish(Summary::default()).unwrap();
                files.push((read(&path), branches, instructions));
            }
            for f in &files[1..] {
                assert!(f == &files[0], "{mode}: the files differ");
            }
            assert!(files[0].1 > 100_000, "{mode}: {} branches", files[0].1);
        }
    }
}
