//! A merged read decoded on a second thread: one thread decodes the chunks (decompression,
//! the compact decoding, the merge by time) a batch ahead while the caller works on the
//! records before, so a reader uses two cores. The batches in flight are bounded: memory does
//! not grow with the trace.

use crate::reader::StreamId;
use crate::reader::{Event, EventRef, MergedRecords};
use crate::{Branch, FormatError, Record, TraceFile};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Records per batch handed from the decoding thread to the reader.
const BATCH: usize = 4096;
/// Batches decoded ahead of the reader (each about BATCH x 56 bytes).
const IN_FLIGHT: usize = 8;

/// What the decoding thread hands over: records in time order, then maybe the error that
/// ended the read (nothing follows it).
struct Batch {
    events: Vec<Item>,
    error: Option<FormatError>,
}

/// A record handed over: a branch (nearly all of them) in 56 bytes, any other record boxed (a
/// whole [`Record`] is 152 bytes: moving those cost more than decoding them).
enum Item {
    Branch { stream: StreamId, offset: u64, after_gap: bool, branch: Branch },
    Other(Box<Event>),
}

/// The records of all streams in time order, decoded here or on a second thread
/// ([`TraceFile::read_merged`]).
pub enum Merged<'a> {
    /// Decoded by the reader's own thread.
    Here(MergedRecords<'a>),
    /// Decoded ahead by a second thread.
    Ahead(Ahead<'a>),
}

/// The batches between the two threads. A mutex and condition variables, not a channel: a
/// channel's receiver spins before it sleeps, and on a machine whose other CPU is busy the
/// spinning took the CPU the decoding thread needed (0.2 to 1 s of CPU per 22 M records).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    /// A batch was queued, or the decoding thread ended.
    filled: Condvar,
    /// A batch was taken, or the reader hung up.
    taken: Condvar,
}

#[derive(Default)]
struct QueueState {
    full: VecDeque<Batch>,
    /// Emptied batches, for the decoding thread to fill again.
    spent: Vec<Vec<Item>>,
    /// The decoding thread ended: nothing more comes.
    ended: bool,
    /// The reader ended: nothing more is wanted.
    hung_up: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A thread that panicked holding the lock left the queue consistent (each change is one
        // push or pop): the other goes on, and the scope passes the panic on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `batch` when there is room; false when the reader hung up.
    fn push(&self, batch: Batch) -> bool {
        let mut st = self.lock();
        while st.full.len() >= IN_FLIGHT && !st.hung_up {
            st = self.taken.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.hung_up {
            return false;
        }
        st.full.push_back(batch);
        self.filled.notify_one();
        true
    }

    /// Give back an emptied batch and take the next, waiting for it; None after the last.
    fn pop(&self, spent: Vec<Item>) -> Option<Batch> {
        let mut st = self.lock();
        if st.spent.len() < IN_FLIGHT {
            st.spent.push(spent);
        }
        while st.full.is_empty() && !st.ended {
            st = self.filled.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let b = st.full.pop_front();
        self.taken.notify_one();
        b
    }

    fn spent(&self) -> Option<Vec<Item>> {
        self.lock().spent.pop()
    }
}

/// Tells the reader the decoding thread ended, however it ends (a panic included: the reader
/// must not wait for a batch that never comes).
struct EndGuard<'q>(&'q Queue);

impl Drop for EndGuard<'_> {
    fn drop(&mut self) {
        self.0.lock().ended = true;
        self.0.filled.notify_one();
    }
}

/// The reader's end of a read decoded on a second thread.
pub struct Ahead<'q> {
    queue: &'q Queue,
    cur: Vec<Item>,
    /// The branch handed out last, as a record to lend.
    branch: Record,
    /// The next record of `cur`.
    at: usize,
    error: Option<FormatError>,
}

impl Merged<'_> {
    /// The next record, borrowed until the next call (as [`MergedRecords::next_ref`]).
    pub fn next_ref(&mut self) -> Option<Result<EventRef<'_>, FormatError>> {
        match self {
            Merged::Here(m) => m.next_ref(),
            Merged::Ahead(a) => a.next_ref(),
        }
    }
}

impl Drop for Ahead<'_> {
    fn drop(&mut self) {
        self.queue.lock().hung_up = true;
        self.queue.taken.notify_one();
    }
}

impl Ahead<'_> {
    fn next_ref(&mut self) -> Option<Result<EventRef<'_>, FormatError>> {
        if self.at >= self.cur.len() {
            if let Some(e) = self.error.take() {
                return Some(Err(e));
            }
            let spent = std::mem::take(&mut self.cur);
            let batch = self.queue.pop(spent)?;
            self.cur = batch.events;
            self.error = batch.error;
            self.at = 0;
            if self.cur.is_empty() {
                return self.error.take().map(Err);
            }
        }
        let item = &self.cur[self.at];
        self.at += 1;
        Some(Ok(match item {
            Item::Branch { stream, offset, after_gap, branch } => {
                match &mut self.branch {
                    Record::Branch(b) => *b = *branch,
                    other => *other = Record::Branch(*branch),
                }
                EventRef { stream: *stream, offset: *offset, record: &self.branch, after_gap: *after_gap }
            }
            Item::Other(ev) => {
                EventRef { stream: ev.stream, offset: ev.offset, record: &ev.record, after_gap: ev.after_gap }
            }
        }))
    }
}

/// Decode `merged` into batches until its end, an error, or the reader hanging up.
fn decode_ahead(mut merged: MergedRecords<'_>, queue: &Queue) {
    let _end = EndGuard(queue);
    loop {
        let mut events = queue.spent().unwrap_or_else(|| Vec::with_capacity(BATCH));
        events.clear();
        let mut error = None;
        let mut ended = false;
        while events.len() < BATCH {
            match merged.next_ref() {
                Some(Ok(ev)) => events.push(match ev.record {
                    Record::Branch(b) => {
                        Item::Branch { stream: ev.stream, offset: ev.offset, after_gap: ev.after_gap, branch: *b }
                    }
                    r => Item::Other(Box::new(Event {
                        stream: ev.stream,
                        offset: ev.offset,
                        record: r.clone(),
                        after_gap: ev.after_gap,
                    })),
                }),
                Some(Err(e)) => {
                    error = Some(e);
                    ended = true;
                    break;
                }
                None => {
                    ended = true;
                    break;
                }
            }
        }
        let empty = events.is_empty() && error.is_none();
        if !empty && !queue.push(Batch { events, error }) {
            return; // The reader stopped early (a range's end): nothing more is wanted.
        }
        if ended {
            return;
        }
    }
}

impl TraceFile {
    /// Run `read` over the records of all streams in time order (those of
    /// [`TraceFile::merged`]); with `ahead`, they are decoded on a second thread while `read`
    /// works. The records and errors are the same either way.
    pub fn read_merged<R>(&self, ahead: bool, read: impl FnOnce(&mut Merged<'_>) -> R) -> R {
        if !ahead {
            return read(&mut Merged::Here(self.merged()));
        }
        let queue = Queue::default();
        std::thread::scope(|s| {
            let merged = self.merged();
            let q = &queue;
            s.spawn(move || decode_ahead(merged, q));
            let mut m = Merged::Ahead(Ahead {
                queue: q,
                cur: Vec::new(),
                at: 0,
                branch: Record::Unknown { ts: 0, major: 0, minor: 0 },
                error: None,
            });
            let r = read(&mut m);
            // Hang up before the scope waits for the decoding thread: a push it waits in returns.
            drop(m);
            r
        })
    }
}

/// Whether reads should decode on a second thread: as the environment's `ITRACE_READ_THREADS`
/// says (1: no, more: yes), else when the machine has more than one CPU.
pub fn decode_ahead_default() -> bool {
    match std::env::var("ITRACE_READ_THREADS").ok().and_then(|v| v.trim().parse::<u32>().ok()) {
        Some(n) => n > 1,
        None => std::thread::available_parallelism().is_ok_and(|n| n.get() > 1),
    }
}
