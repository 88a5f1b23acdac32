//! What a stepping recorder does with each record: store it in the per-CPU buffers, keep each
//! CPU stream's timestamps from going back (a system call's record carries its entry time,
//! which may precede other threads' records), count what was stored, and keep the first
//! write error.

use itrace_format::{Branch, Buffers, Mte, Push, Record};

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

/// The buffers of one recording, as a recording loop writes them.
pub struct Sink<'a> {
    buffers: &'a mut Buffers,
    last_ts: Vec<u64>,
    /// Per stream: branch records still to take `last_ts` instead of their own reading.
    ts_left: Vec<u32>,
    /// Branch records that share one clock reading (1: each has its own).
    share_clock: u32,
    /// Taken branches stored, and the instructions they count.
    pub branches: u64,
    pub instructions: u64,
    error: Option<String>,
}

impl<'a> Sink<'a> {
    pub fn new(buffers: &'a mut Buffers) -> Self {
        Sink {
            buffers,
            last_ts: Vec::new(),
            ts_left: Vec::new(),
            share_clock: 1,
            error: None,
            branches: 0,
            instructions: 0,
        }
    }

    /// Sparse timestamps: each stream's branch records share one clock reading for `records`
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

    /// Store a taken branch on `cpu`'s stream, its timestamp no older than the stream's last.
    pub fn branch(&mut self, cpu: usize, mut b: Branch) -> Stored {
        if cpu >= self.last_ts.len() {
            self.last_ts.resize(cpu + 1, 0);
            self.ts_left.resize(cpu + 1, 0);
        }
        if self.ts_left[cpu] > 0 {
            self.ts_left[cpu] -= 1;
            b.ts = self.last_ts[cpu];
        } else {
            b.ts = b.ts.max(self.last_ts[cpu]);
            self.ts_left[cpu] = self.share_clock - 1;
        }
        self.last_ts[cpu] = b.ts;
        match self.buffers.push_branch(cpu, &b) {
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
    /// timestamps in `bs` are set to the ones stored), in one call to the buffers. Returns how
    /// many were stored and the outcome: `Full` when a normal-mode buffer refused the next one
    /// (and so every one after it), `Failed` when the file could not be written.
    pub fn branches(&mut self, cpu: usize, bs: &mut [Branch]) -> (usize, Stored) {
        if bs.is_empty() {
            return (0, Stored::Yes);
        }
        if cpu >= self.last_ts.len() {
            self.last_ts.resize(cpu + 1, 0);
            self.ts_left.resize(cpu + 1, 0);
        }
        let (mut last, mut left) = (self.last_ts[cpu], self.ts_left[cpu]);
        for b in bs.iter_mut() {
            if left > 0 {
                left -= 1;
                b.ts = last;
            } else {
                b.ts = b.ts.max(last);
                left = self.share_clock - 1;
            }
            last = b.ts;
        }
        match self.buffers.push_branches(cpu, bs) {
            Ok(n) => {
                // As `branch` does, a refused record moves the clock too.
                (self.last_ts[cpu], self.ts_left[cpu]) = (last, left);
                self.branches += n as u64;
                self.instructions += bs[..n].iter().map(|b| b.icount as u64).sum::<u64>();
                (n, if n < bs.len() { Stored::Full } else { Stored::Yes })
            }
            Err(e) => (0, self.write_failed(e)),
        }
    }

    /// Store a control record (trace on/off, lost) on `cpu`'s stream; never refused for space.
    pub fn control(&mut self, cpu: usize, r: &Record) -> Stored {
        if let Some(left) = self.ts_left.get_mut(cpu) {
            *left = 0;
        }
        match self.buffers.push_control(cpu, r) {
            Ok(()) => Stored::Yes,
            Err(e) => self.write_failed(e),
        }
    }

    /// Store a module-table record.
    pub fn mte(&mut self, m: Mte) -> Stored {
        match self.buffers.push_mte(&Record::Mte(m)) {
            Ok(Push::Stored) => Stored::Yes,
            Ok(Push::Full) => Stored::Full,
            Err(e) => self.write_failed(e),
        }
    }

    /// Write what has waited in memory long enough (continuous mode: the oldest record
    /// half a second old), so that a recorder killed now loses at most
    /// about the last second. Recording loops call this whenever they wake, EINTR and
    /// timeouts included; it costs a clock reading when something waits, nothing otherwise.
    pub fn tick(&mut self) -> Stored {
        if self.error.is_some() {
            return Stored::Yes; // already stopping; the error is kept
        }
        match self.buffers.flush_if_due() {
            Ok(()) => Stored::Yes,
            Err(e) => self.write_failed(e),
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
        self.buffers.lost().len()
    }

    /// The buffers themselves (loss counts).
    pub fn buffers(&mut self) -> &mut Buffers {
        self.buffers
    }

    fn write_failed(&mut self, e: itrace_format::FormatError) -> Stored {
        self.error.get_or_insert_with(|| e.to_string());
        Stored::Failed
    }
}
