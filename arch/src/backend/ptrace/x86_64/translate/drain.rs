//! A thread's ring drained: its records (an exit id and a target each) become branch records.
//! With a writer thread, the ring's copy goes to the writer, which makes them and encodes them
//! (`RingBatch`, a `HopSource`); when the writer is busy (continuous mode), the recording
//! thread encodes the ring itself as a chunk of its own (`Buffers::encode`). So both CPUs encode,
//! each ring on one of them: splitting one ring's work between the threads (the drain on one,
//! the encoder on the other) moved each record's bytes from one CPU to the other, which cost
//! as much as the work (docs/translate.md, "Where the time goes").

use super::super::super::engine::*;
use super::layout::*;
use crate::backend::sink::{EncodedChunk, HopSource, Stored};
use itrace_format::compact::Encoder;
use itrace_format::{now_ns, BatchStamp, Hop};
use itrace_translate_inproc::{
    encode_ring, fill_hops, prefetch_ahead, ChunkHead, RingCursor, RingExit, CHUNK_HEAD_BYTES,
};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, RwLock};

/// The drain's buffers, kept from one drain to the next (a fresh megabyte per drain was
/// mapped, faulted in and unmapped each time: most of itrace's time on a busy program).
pub(in super::super) struct Buffers {
    /// Rings' copies the writer thread is done with.
    spare_raw: Receiver<Vec<u8>>,
    give_back: Sender<Vec<u8>>,
    hops: Vec<Hop>,
    /// For the rings encoded here (`Buffers::encode`).
    encoder: Encoder,
}

impl Default for Buffers {
    fn default() -> Self {
        let (give_back, spare_raw) = channel();
        Buffers { spare_raw, give_back, hops: Vec::new(), encoder: Encoder::new() }
    }
}

/// A ring record's bytes.
const RECORD: usize = itrace_translate_inproc::RECORD_BYTES;

/// Hops made at a time from a ring encoded here: they stay in the cache until encoded.
const PIECE: usize = 4096;

impl Buffers {
    /// Encode thread `tid`'s ring `batch`, stamped by `stamp`, as one chunk's items (in
    /// `payload`, or a new buffer); `None` when it holds no branch.
    fn encode(
        &mut self,
        batch: &mut RingBatch,
        tid: u32,
        stamp: BatchStamp,
        payload: Option<Vec<u8>>,
    ) -> Option<EncodedChunk> {
        let mut payload = payload.unwrap_or_default();
        payload.clear();
        self.hops.resize(PIECE, Hop::default());
        let exits = batch.exits.read().unwrap_or_else(|e| e.into_inner());
        let done = encode_ring(
            &mut self.encoder,
            &mut payload,
            &mut self.hops,
            &exits,
            &batch.raw,
            &mut batch.cursor,
            tid,
            stamp,
        );
        drop(exits);
        if let Some(id) = done.no_exit {
            warn_no_exit(batch.tid, id);
        }
        let totals = self.encoder.totals();
        (done.branches > 0).then_some(EncodedChunk {
            payload,
            branches: done.branches,
            instructions: done.instructions,
            totals,
        })
    }
}

/// The warning of a ring record with no exit (the rest of the ring is dropped).
fn warn_no_exit(tid: i32, id: u64) {
    eprintln!("itrace: warning: thread {tid}: a cache record with no exit {id}; the rest of its ring is dropped");
}

/// A drained ring's records, and the exits they are of.
struct RingBatch {
    raw: Vec<u8>,
    /// The next record, and the instructions not yet in a branch (from the thread's count
    /// carried in from before the ring on).
    cursor: RingCursor,
    exits: Arc<RwLock<Vec<RingExit>>>,
    /// The thread, for the warning of a record with no exit.
    tid: i32,
    give_back: Sender<Vec<u8>>,
}

impl RingBatch {
    /// All its hops, onto `hops` (by pieces of [`PIECE`]).
    fn fill_all(&mut self, hops: &mut Vec<Hop>) {
        loop {
            let at = hops.len();
            hops.resize(at + PIECE, Hop::default());
            let (n, more) = self.fill(&mut hops[at..]);
            hops.truncate(at + n);
            if !more {
                return;
            }
        }
    }
}

impl HopSource for RingBatch {
    fn fill(&mut self, hops: &mut [Hop]) -> (usize, bool) {
        let exits = self.exits.read().unwrap_or_else(|e| e.into_inner());
        let f = fill_hops(&exits, &self.raw, &mut self.cursor, hops);
        if let Some(id) = f.no_exit {
            warn_no_exit(self.tid, id);
        }
        (f.made, f.more)
    }
}

impl Drop for RingBatch {
    fn drop(&mut self) {
        let _ = self.give_back.send(std::mem::take(&mut self.raw));
    }
}

/// [`counted`] for a ring of which `no_branch` records are of exits of no branch (`NO_BRANCH`):
/// its other records are branches, and what the last one leaves is found from the end. `None`
/// for a ring whose end does not add up (a record with no exit, more records of no branch than
/// counted): it is read whole ([`counted`]). Not seen here: a record with no exit before the last branch (the program
/// wrote over its ring), and an exiting thread drained inside a stub of no branch, between its
/// count and its record (it cannot be stepped out). The count is then too high by the records
/// after that one, or by one, and only the thread's clock after the ring (`Sink::expand`)
/// takes it: the writer's records are the ring's as before.
fn branches_of(exits: &[RingExit], raw: &[u8], no_branch: u64, carry_in: u32) -> Option<(usize, u32)> {
    let records = raw.len() / RECORD;
    let branches = records.checked_sub(no_branch as usize)?;
    let mut icount = 0u32;
    for (k, r) in raw.chunks_exact(RECORD).enumerate().rev() {
        let id = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
        let e = exits.get(id as usize)?;
        if e.branch {
            return Some((branches, icount));
        }
        if records - k > no_branch as usize {
            return None;
        }
        icount = icount.wrapping_add(e.hop.icount);
    }
    (branches == 0).then(|| (0, icount.wrapping_add(carry_in)))
}

/// The branches a ring's records make ([`RingBatch`] makes them: the same count), and the
/// instructions they leave to the next ring (those of its exits of no branch after its last
/// branch, with `carry_in`, the thread's count before the ring, when it has no branch). A
/// record with no exit ends the ring, as there.
fn counted(exits: &[RingExit], raw: &[u8], carry_in: u32) -> (usize, u32) {
    let (mut n, mut icount) = (0, carry_in);
    for (i, r) in raw.chunks_exact(RECORD).enumerate() {
        prefetch_ahead(raw, i * RECORD);
        let id = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
        let Some(e) = exits.get(id as usize) else { break };
        icount = icount.wrapping_add(e.hop.icount);
        if e.branch {
            n += 1;
            icount = 0;
        }
    }
    (n, icount)
}

impl Session<'_> {
    /// The chunks thread `tid` encoded itself (`unit::self_encode`), in the order it made them,
    /// to the sink; and the count it carries after the last of them.
    fn xl_collect(&mut self, tid: i32, pid: i32, state: u64, cpu: usize) {
        self.xl_carry_out(tid);
        let Some(c) = self.cache_of(pid) else { return };
        let Ok(out_len) = c.read_u64(pid, state + XL_OUT_LEN as u64) else { return };
        let out_len = out_len as usize;
        if out_len > 0 {
            let mut out = vec![0u8; out_len.min(OUT_BYTES as usize)];
            if c.read_readable(pid, state + OUT as u64, &mut out).is_err()
                || c.write(pid, state + XL_OUT_LEN as u64, &0u64.to_le_bytes()).is_err()
            {
                return;
            }
            let app_tid = self.threads.get(&tid).map_or(0, |t| t.tid as u32);
            let mut at = 0;
            while at + CHUNK_HEAD_BYTES <= out.len() {
                // SAFETY: CHUNK_HEAD_BYTES bytes read unaligned into a ChunkHead, whose fields
                // are all integers (any bytes are a value of it).
                let head: ChunkHead = unsafe { out.as_ptr().add(at).cast::<ChunkHead>().read_unaligned() };
                let start = at + CHUNK_HEAD_BYTES;
                let Some(payload) = out.get(start..start + head.len as usize) else { break };
                at = start + (head.len as usize).div_ceil(8) * 8;
                let mut counted = itrace_format::compact::Counted {
                    records: head.records,
                    bytes: head.bytes,
                    first_ts: head.first_ts,
                    last_ts: head.last_ts,
                };
                // Its timestamp, as the sink stamps a ring drained now: the newest reading its
                // thread and stream allow, so that the stream stays in time order.
                let ts = self.sink.batch_stamp(cpu, app_tid, now_ns()).rest;
                let Some(payload) = itrace_format::compact::restamp_chunk(payload, ts, &mut counted) else {
                    eprintln!(
                        "itrace: warning: thread {tid}: a chunk it encoded does not start with a new edge; dropped"
                    );
                    continue;
                };
                let chunk = EncodedChunk {
                    payload,
                    branches: head.branches,
                    instructions: head.instructions,
                    totals: itrace_format::compact::totals_of(&counted),
                };
                let stamp = BatchStamp { first: ts, first_n: usize::MAX, rest: ts };
                self.arch.xl_stats.rings_encoded_by_threads += 1;
                let stored = self.sink.encoded(cpu, app_tid, stamp, chunk);
                self.after_store(stored);
            }
        }
    }

    /// Turn the records in the thread's ring into branch records, and empty it.
    pub(super) fn drain(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.arch.xl.drained_ns = now_ns();
        let (pid, state, cpu) = (t.pid, t.arch.xl.state, t.cpu);
        if state == 0 {
            return;
        }
        if super::unit::self_encode() {
            self.xl_collect(tid, pid, state, cpu);
        }
        let Some(c) = self.cache_of(pid) else { return };
        let Ok(off) = c.read_u64(pid, state + RING_OFF as u64) else { return };
        let n = ((off as i64 + RING_BYTES) / RECORD_BYTES).clamp(0, RING_RECORDS) as usize;
        if n == 0 {
            return;
        }
        let Ok(no_branch) = c.read_u64(pid, state + NO_BRANCH as u64) else { return };
        let mut raw = self.arch.xl_buffers.spare_raw.try_recv().unwrap_or_default();
        raw.resize(n * RECORD_BYTES as usize, 0);
        let Some(c) = self.cache_of(pid) else { return };
        if c.read_readable(pid, state + RING as u64, &mut raw).is_err() {
            let _ = self.arch.xl_buffers.give_back.send(raw);
            return;
        }
        let _ = match no_branch {
            0 => c.write(pid, state + RING_OFF as u64, &(-RING_BYTES).to_le_bytes()),
            _ => c.empty_ring(pid, state),
        };
        let exits = c.exits.shared();
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.stop_ts = now_ns();
        let (ts, app_tid, carry_in) = (t.stop_ts, t.tid as u32, t.icount);
        let give_back = self.arch.xl_buffers.give_back.clone();
        // The timestamps as the sink stores them (its threads' clocks, as for records stored one
        // by one: the stepping recorders' traces and this one's put MTE records at the same
        // places among the branches).
        let stamp = self.sink.batch_stamp(cpu, app_tid, ts);
        if self.sink.has_writer() {
            let mut batch = RingBatch { raw, cursor: RingCursor { at: 0, icount: carry_in }, exits, tid, give_back };
            let stored = if self.sink.takes_chunks() && self.sink.writer_busy() {
                // The writer has work: this ring is encoded here, as a chunk of its own, while
                // the writer does the rest.
                let chunk = self.arch.xl_buffers.encode(&mut batch, app_tid, stamp, self.sink.spare_chunk());
                t.icount = batch.cursor.icount;
                match chunk {
                    Some(chunk) => self.sink.encoded(cpu, app_tid, stamp, chunk),
                    None => Stored::Yes,
                }
            } else {
                let exits = batch.exits.read().unwrap_or_else(|e| e.into_inner());
                let (n, carried) = branches_of(&exits, &batch.raw, no_branch, carry_in).unwrap_or_else(|| {
                    self.arch.xl_stats.rings_counted_whole += 1;
                    counted(&exits, &batch.raw, carry_in)
                });
                drop(exits);
                t.icount = carried;
                self.sink.expand(cpu, app_tid, stamp, n, Box::new(batch))
            };
            self.after_store(stored);
            return;
        }
        // No writer thread (normal mode, where a full buffer refuses a record): the hops made
        // here, so that the refused one is known.
        let mut hops = std::mem::take(&mut self.arch.xl_buffers.hops);
        hops.clear();
        let mut batch = RingBatch { raw, cursor: RingCursor { at: 0, icount: carry_in }, exits, tid, give_back };
        batch.fill_all(&mut hops);
        t.icount = batch.cursor.icount;
        drop(batch);
        let instructions = hops.iter().map(|h| h.icount as u64).sum();
        self.push_stamped_branches(cpu, app_tid, &mut hops, stamp, instructions);
        self.arch.xl_buffers.hops = hops;
    }
}

#[cfg(test)]
mod tests {
    use super::super::cache::ring_exit_of;
    use super::super::unit::Exit;
    use super::*;
    use itrace_format::BranchKind;

    fn record(id: u64, target: u64) -> [u8; 16] {
        let mut r = [0; 16];
        r[..8].copy_from_slice(&id.to_le_bytes());
        r[8..].copy_from_slice(&target.to_le_bytes());
        r
    }

    /// A ring's records against hops worked out by hand: counts carried through an exit of no
    /// branch (and from before the ring) into the next branch, whose key then says nothing,
    /// an indirect exit's target from the record, what is left to the next ring, and a record
    /// with no exit ending the ring.
    #[test]
    fn a_rings_records_make_the_hops_worked_out_by_hand() {
        let exits = [
            Exit { from: 0x10, to: 0x20, kind: Some(BranchKind::Jump), count: 3, indirect: false, key: 41 },
            Exit { from: 0x18, to: 0x18, kind: None, count: 256, indirect: false, key: 42 },
            Exit { from: 0x30, to: 0, kind: Some(BranchKind::Return), count: 2, indirect: true, key: 43 },
        ];
        let raw: Vec<u8> = [record(1, 0), record(0, 0), record(2, 0x99), record(0, 7), record(1, 0)].concat();
        let want = vec![
            Hop::new(0x10, 0x20, 5 + 256 + 3, BranchKind::Jump, 0),
            Hop::new(0x30, 0x99, 2, BranchKind::Return, 43),
            Hop::new(0x10, 0x20, 3, BranchKind::Jump, 41),
        ];
        let exits = Arc::new(RwLock::new(exits.iter().map(ring_exit_of).collect::<Vec<_>>()));
        for piece in [1, 2, 100] {
            let (give_back, back) = channel();
            let mut batch = RingBatch {
                raw: raw.clone(),
                cursor: RingCursor { at: 0, icount: 5 },
                exits: Arc::clone(&exits),
                tid: 1,
                give_back,
            };
            let (mut hops, mut buffer) = (Vec::new(), vec![Hop::default(); piece]);
            loop {
                let (n, more) = batch.fill(&mut buffer);
                hops.extend_from_slice(&buffer[..n]);
                if !more {
                    break;
                }
            }
            assert_eq!(hops, want, "pieces of {piece}");
            assert_eq!(batch.cursor.icount, 256, "pieces of {piece}");
            assert_eq!(counted(&exits.read().unwrap(), &raw, 5), (3, 256));
            drop(batch);
            assert_eq!(back.recv().unwrap(), raw, "the copy is given back");
        }
        // Only exits of no branch: all of it goes on, with what came before.
        let none = [record(1, 0), record(1, 0)].concat();
        assert_eq!(counted(&exits.read().unwrap(), &none, 5), (0, 5 + 512));
        // The same from the count of records of no branch and the ring's end.
        let exits_now = exits.read().unwrap();
        assert_eq!(branches_of(&exits_now, &raw, 2, 5), Some((3, 256)));
        assert_eq!(branches_of(&exits_now, &none, 2, 5), Some((0, 5 + 512)));
        // A count that does not add up at the end (fewer than the records of no branch there,
        // more than the records, records of no branch only but fewer), or a record with no
        // exit at the end: the ring is to be read whole.
        for wrong in [0, 9] {
            assert_eq!(branches_of(&exits_now, &raw, wrong, 5), None, "{wrong} of no branch");
        }
        assert_eq!(branches_of(&exits_now, &none, 1, 5), None);
        let tail = [record(0, 0), record(9, 0)].concat();
        assert_eq!(branches_of(&exits_now, &tail, 0, 0), None);
        drop(exits_now);
        // A record with no exit: the rest is dropped.
        let bad = [record(0, 0), record(9, 0), record(0, 0)].concat();
        let (give_back, _back) = channel();
        let mut batch =
            RingBatch { raw: bad.clone(), cursor: RingCursor::default(), exits: Arc::clone(&exits), tid: 1, give_back };
        let mut hops = vec![Hop::default(); 100];
        assert_eq!(batch.fill(&mut hops), (1, false));
        assert_eq!(hops[..1], [Hop::new(0x10, 0x20, 3, BranchKind::Jump, 41)]);
        assert_eq!(counted(&exits.read().unwrap(), &bad, 0), (1, 0));
        assert_eq!(batch.cursor.icount, 0);
        // All of a ring, by pieces, after what the vector held.
        let mut batch = RingBatch {
            raw: raw.clone(),
            cursor: RingCursor { at: 0, icount: 5 },
            exits: Arc::clone(&exits),
            tid: 1,
            give_back: channel().0,
        };
        let mut all = vec![Hop::default()];
        batch.fill_all(&mut all);
        assert_eq!(all[1..], want);
    }
}
