//! The arc file (PI's `post -arc`): one line per block, in time order.
//! Format: docs/arc-and-report.md.

use crate::names::printable;
use crate::replay::{replay, Block, GapCause, Sink, Where};
use crate::resolve::{Location, Resolver};
use crate::threads::Names;
use crate::{PostError, Trace};
use itrace_format::{BranchKind, Lost, StopReason, TraceOff};
use std::io::Write;
use std::sync::Arc;

/// Counts of what was written.
#[derive(Clone, Debug, Default)]
pub struct ArcStats {
    pub lines: u64,
    pub instructions: u64,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    pub notes: Vec<String>,
}

const HEADER: &str = "\
# arc Field Definition:
#   1: cpu no.
#   2: K(kernel) or U(user)
#   3: last instruction type
#      0=INTRPT, 1=CALL, 2=RETURN, 3=JUMP, 4=IRET, 5=OTHER, 6=UNDEFD, 7=ALLOC
#   4: no. of instructions
#   5: @ = Call_Flow
#   6: offset (from symbol start)
#   7: symbol:module
#   8: pid_tid_pidname_threadname (pid and tid in hex)
#   9: last instruction type (string)
#  10: source file:line of the block's first instruction (0 if unknown)
";

struct ArcSink<W: Write> {
    out: W,
    stats: ArcStats,
    /// Lines not yet written to `out`, formatted by hand (a third faster than `write!` here,
    /// and arcs run to millions of lines) straight into this buffer, which goes to `out` in
    /// pieces of [`OUT_CHUNK`] bytes or more: a `BufWriter` would copy every line once more.
    buf: Vec<u8>,
    /// Field 7 (`symbol:module`, printable) of each interned function id, made at its first
    /// line: a function's names do not change, and most lines repeat a few functions.
    func_text: Vec<Vec<u8>>,
    /// The last source file written in field 10 and its escaped form (consecutive blocks are
    /// mostly in the same file).
    file_text: Option<(Arc<str>, Vec<u8>)>,
}

/// Lines are written to the output in pieces of at least this many bytes.
const OUT_CHUNK: usize = 1 << 16;

/// Append `v` in decimal, right-aligned to `width`.
fn push_dec(buf: &mut Vec<u8>, v: u64, width: usize) {
    let digits = v.checked_ilog10().map_or(1, |d| d as usize + 1);
    let end = push_field(buf, digits, width);
    let mut v = v;
    for d in buf[end - digits..end].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Append a field of `digits` characters right-aligned to `width`, spaces for now (the caller
/// writes the digits, from the end): its end. Digits are written in place, not made in an
/// array and copied: a copy right after the bytes' stores stalls (a fifth of an arc's time).
fn push_field(buf: &mut Vec<u8>, digits: usize, width: usize) -> usize {
    const MOST: usize = 24;
    let start = buf.len();
    let len = digits.max(width);
    if len <= MOST {
        // A fixed-size append is a few stores; a variable-size one a call to memset.
        buf.extend_from_slice(&[b' '; MOST]);
        buf.truncate(start + len);
    } else {
        buf.resize(start + len, b' ');
    }
    start + len
}

/// Append a source file name for field 10, which is read from the right of the line:
/// whitespace (and control characters) in it are written as `\x20`-style escapes.
fn push_source_file(buf: &mut Vec<u8>, file: &str) {
    for c in file.chars() {
        if c.is_whitespace() || c.is_control() {
            let mut tmp = [0u8; 4];
            for byte in c.encode_utf8(&mut tmp).bytes() {
                buf.extend_from_slice(format!("\\x{byte:02x}").as_bytes());
            }
        } else {
            let mut tmp = [0u8; 4];
            buf.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
        }
    }
}

/// Append `v` in lower-case hex, right-aligned to `width`.
fn push_hex(buf: &mut Vec<u8>, v: u64, width: usize) {
    let digits = (64 - v.leading_zeros() as usize).div_ceil(4).max(1);
    let end = push_field(buf, digits, width);
    let mut v = v;
    for d in buf[end - digits..end].iter_mut().rev() {
        *d = b"0123456789abcdef"[(v & 15) as usize];
        v >>= 4;
    }
}

/// Append fields 1 to 6 of an arc line and the space after them.
fn push_head(buf: &mut Vec<u8>, cpu: u16, ku: u8, kind: BranchKind, count: u32, offset: u64) {
    buf.push(b' ');
    push_dec(buf, cpu as u64, 2);
    buf.extend_from_slice(&[b' ', ku, b' ', b'0' + kind.arc_code(), b' ', b' ']);
    push_dec(buf, count as u64, 5);
    buf.extend_from_slice(b" @ ");
    push_hex(buf, offset, 4);
    buf.push(b' ');
}

/// Append `symbol:module` (field 7), each printable.
fn push_symbol_module(buf: &mut Vec<u8>, symbol: &str, module: &str) {
    buf.extend_from_slice(printable(symbol).as_bytes());
    buf.push(b':');
    buf.extend_from_slice(printable(module).as_bytes());
}

/// Append fields 8 and 9 and the spaces before and after them.
fn push_label_kind(buf: &mut Vec<u8>, label: &str, kind: BranchKind) {
    buf.extend_from_slice(b"   ");
    buf.extend_from_slice(label.as_bytes());
    buf.push(b' ');
    buf.extend_from_slice(kind.arc_name().as_bytes());
    buf.push(b' ');
}

impl<W: Write> ArcSink<W> {
    /// Count a line and append its fields 1 to 6.
    fn start_line(&mut self, cpu: u16, ku: u8, kind: BranchKind, count: u32, offset: u64) {
        self.stats.lines += 1;
        self.stats.instructions += count as u64;
        push_head(&mut self.buf, cpu, ku, kind, count, offset);
    }

    /// One arc line of a user block at `l`: `" %2d %s %d  %5d @ %4x %s:%s   %s %s %s:%d"` (or
    /// `0` for the last field).
    fn user_line(
        &mut self,
        cpu: u16,
        kind: BranchKind,
        count: u32,
        l: &Location,
        label: &str,
    ) -> Result<(), PostError> {
        self.start_line(cpu, b'U', kind, count, l.offset);
        let b = &mut self.buf;
        let i = l.func as usize;
        if i >= self.func_text.len() {
            self.func_text.resize(i + 1, Vec::new());
        }
        let text = &mut self.func_text[i];
        if text.is_empty() {
            push_symbol_module(text, &l.symbol, &l.module);
        }
        b.extend_from_slice(text);
        push_label_kind(b, label, kind);
        match &l.file {
            Some(f) if l.line != 0 => {
                let cached = self.file_text.as_ref().is_some_and(|(name, _)| Arc::ptr_eq(name, f));
                if !cached {
                    let mut text = Vec::new();
                    push_source_file(&mut text, f);
                    self.file_text = Some((f.clone(), text));
                }
                b.extend_from_slice(&self.file_text.as_ref().expect("set above").1);
                b.push(b':');
                push_dec(b, l.line as u64, 0);
            }
            _ => b.push(b'0'),
        }
        b.push(b'\n');
        self.write_full_chunk()
    }

    /// Write the buffered lines once there are [`OUT_CHUNK`] bytes of them.
    fn write_full_chunk(&mut self) -> Result<(), PostError> {
        if self.buf.len() >= OUT_CHUNK {
            self.write_buffered()?;
        }
        Ok(())
    }

    /// Write all buffered lines.
    fn write_buffered(&mut self) -> Result<(), PostError> {
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// One arc line of a kernel block named `name`.
    fn kernel_line(
        &mut self,
        cpu: u16,
        kind: BranchKind,
        count: u32,
        name: &str,
        label: &str,
    ) -> Result<(), PostError> {
        self.start_line(cpu, b'K', kind, count, 0);
        let b = &mut self.buf;
        push_symbol_module(b, name, "[kernel]");
        push_label_kind(b, label, kind);
        b.extend_from_slice(b"0\n");
        self.write_full_chunk()
    }
}

impl<W: Write> Sink for ArcSink<W> {
    fn block(&mut self, b: &Block, names: &mut Names, _res: &mut Resolver) -> Result<(), PostError> {
        let label = names.label(b.branch.tid);
        match &b.loc {
            Where::User(l) => self.user_line(b.cpu, b.branch.kind, b.branch.icount, l, label),
            Where::Kernel(name) => self.kernel_line(b.cpu, b.branch.kind, b.branch.icount, name, label),
        }
    }

    fn trace_off(
        &mut self,
        off: &TraceOff,
        partial: Option<&Location>,
        at: &Location,
        names: &mut Names,
    ) -> Result<(), PostError> {
        let here = format!("{}+{:#x}:{} ({:#x})", printable(&at.symbol), at.offset, printable(&at.module), off.pc);
        let label = names.label(off.tid).to_string();
        if let Some(l) = partial {
            // The last block never reached a branch.
            self.user_line(0, BranchKind::Other, off.icount, l, &label)?;
        }
        let why = match off.reason {
            StopReason::Exited => format!("exited with status {}", off.value),
            StopReason::Signaled => format!("killed by {} at {here}", signal_name(off.value)),
            StopReason::Detached => format!("detached at {here}"),
            StopReason::BufferFull => format!("trace buffer full at {here} (normal mode): tracing stopped"),
            StopReason::WriteError => format!("trace file write failed at {here}"),
            StopReason::Vanished => "thread ended (exec in another thread, or killed)".to_string(),
            StopReason::TracerError => format!("tracer error (errno {})", off.value),
            StopReason::RegionEnd => format!("region ended at {here}"),
        };
        writeln!(self.buf, "# end of trace for {label}: {why}")?;
        Ok(())
    }

    fn lost(&mut self, cpu: u16, lost: &Lost) -> Result<(), PostError> {
        writeln!(self.buf, "# cpu {cpu}: {} older records were overwritten (wrap mode) before this point", lost.count)?;
        Ok(())
    }

    fn gap(&mut self, cpu: u16, tids: &[u32], cause: GapCause) -> Result<(), PostError> {
        match cause {
            GapCause::Damaged => {
                writeln!(self.buf, "# cpu {cpu}: records lost to a damaged chunk of the trace before this point")?
            }
            GapCause::StreamCut => {
                let tids: Vec<String> = tids.iter().map(u32::to_string).collect();
                writeln!(
                    self.buf,
                    "# cpu {cpu}: what thread {} did on it before this point may be lost (the trace was cut and its \
                     records end earlier)",
                    tids.join(",")
                )?
            }
        }
        Ok(())
    }
}

fn signal_name(sig: i32) -> String {
    crate::names::signal(sig as u16).trim_start_matches("signal_").to_string()
}

/// Write the arc of `trace` to `out`.
pub fn write_arc<W: Write>(trace: &Trace, out: W, progress: &mut dyn FnMut(u64)) -> Result<ArcStats, PostError> {
    let mut sink = ArcSink {
        out,
        stats: ArcStats::default(),
        buf: Vec::with_capacity(OUT_CHUNK + 4096),
        func_text: Vec::new(),
        file_text: None,
    };
    let h = trace.header();
    sink.out.write_all(HEADER.as_bytes())?;
    writeln!(
        sink.out,
        "# trace {} arch {} mode {} step {} cpus {}",
        trace.path().display(),
        h.arch,
        h.mode,
        h.step_method,
        h.ncpu
    )?;
    let (_, res) = replay(trace, true, &mut sink, progress)?;
    sink.write_buffered()?;
    sink.stats.notes = res.notes().to_vec();
    if let Some(s) = trace.summary() {
        let lost = crate::summary_lost(s);
        writeln!(
            sink.out,
            "# total: {} instructions in {} lines, {lost} records lost",
            sink.stats.instructions, sink.stats.lines
        )?;
    }
    sink.out.flush()?;
    Ok(sink.stats)
}

#[cfg(test)]
mod tests {
    #[test]
    fn source_files_stay_one_field() {
        let mut b = Vec::new();
        super::push_source_file(&mut b, "/src/my dir/a\tb.c");
        assert_eq!(String::from_utf8(b).unwrap(), "/src/my\\x20dir/a\\x09b.c");
    }

    #[test]
    fn hand_formatting_matches_pi_printf() {
        for (v, w) in [
            (0u64, 2usize),
            (7, 2),
            (12, 2),
            (123, 2),
            (0, 5),
            (99999, 5),
            (123456, 5),
            (u64::MAX, 0),
            (42, 30),
            (u64::MAX, 23),
        ] {
            let mut b = Vec::new();
            super::push_dec(&mut b, v, w);
            assert_eq!(String::from_utf8(b).unwrap(), format!("{v:>w$}"));
            let mut b = Vec::new();
            super::push_hex(&mut b, v, w.max(4));
            assert_eq!(String::from_utf8(b).unwrap(), format!("{v:>w$x}", w = w.max(4)));
        }
    }
}
