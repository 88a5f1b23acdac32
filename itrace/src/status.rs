//! The live status line of `itrace record` on a terminal: elapsed time, instructions,
//! branches, bytes written to the trace file, rate, and time left with `--duration`, redrawn on stderr a few
//! times a second, on the terminal's last row (see [`BottomRow`]). Nothing is drawn when stderr is
//! not a terminal.

use crate::size::human_size;
use itrace_format::LiveCounts;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A drawn status line; [`StatusLine::finish`] erases it.
pub struct StatusLine {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatusLine {
    /// Start drawing, when stderr is a terminal.
    pub fn start(live: Arc<LiveCounts>, duration: Option<f64>) -> StatusLine {
        let done = Arc::new(AtomicBool::new(false));
        if !std::io::stderr().is_terminal() {
            return StatusLine { done, thread: None };
        }
        let flag = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("itrace-status".into())
            .spawn(move || {
                // Signals to itrace are for the recording thread.
                crate::signals::block_in_this_thread(true);
                draw(&live, duration, &flag)
            })
            .ok();
        StatusLine { done, thread }
    }

    /// Stop drawing and erase the line.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Rows and columns of the terminal on stderr, if it says.
fn stderr_size() -> Option<(u16, u16)> {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a winsize into ws, a valid and exclusively borrowed struct.
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// `n` with a comma between groups of three digits: 1,234,567.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The parts of the status line, joined by ", ", fitted into `width` columns: whole parts only,
/// the least important dropped first (each part is `(priority, text)`, 0 most important).
fn fit(parts: &[(u8, String)], width: usize) -> String {
    let mut keep: Vec<bool> = vec![true; parts.len()];
    let len = |keep: &[bool]| {
        let kept: Vec<&(u8, String)> = parts.iter().zip(keep).filter(|(_, k)| **k).map(|(p, _)| p).collect();
        kept.iter().map(|(_, t)| t.chars().count()).sum::<usize>() + 2 * kept.len().saturating_sub(1)
    };
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(parts[i].0));
    for i in order {
        if len(&keep) <= width || keep.iter().filter(|k| **k).count() == 1 {
            break;
        }
        keep[i] = false;
    }
    let text: Vec<&str> = parts.iter().zip(&keep).filter(|(_, k)| **k).map(|((_, t), _)| t.as_str()).collect();
    let line = text.join(", ");
    // The most important part alone may still be too long: cut at a space.
    if line.chars().count() <= width {
        return line;
    }
    let mut cut = String::new();
    for word in line.split(' ') {
        if cut.chars().count() + word.chars().count() + usize::from(!cut.is_empty()) > width {
            break;
        }
        if !cut.is_empty() {
            cut.push(' ');
        }
        cut.push_str(word);
    }
    cut
}

/// The status line's text `secs` seconds in.
fn status_text(secs: f64, ins: u64, br: u64, bytes: u64, rate: &str, left: Option<f64>, width: usize) -> String {
    let mut parts = vec![(0, format!("recording {secs:.1} s"))];
    if ins > 0 || br > 0 {
        parts.push((1, format!("{} instructions", grouped(ins))));
        parts.push((2, format!("{} branches", grouped(br))));
    }
    parts.push((4, human_size(bytes)));
    parts.push((5, rate.to_string()));
    if let Some(left) = left {
        parts.push((3, format!("{left:.0} s left")));
    }
    fit(&parts, width)
}

/// Draws on the terminal's last row, kept out of the scrolling region, so that the program's own
/// output (on the same terminal) scrolls above it and never lands on or after it: each
/// redraw saves the cursor, writes the last row and puts the cursor back, in one write.
struct BottomRow {
    rows: u16,
}

impl BottomRow {
    fn write(bytes: &str) {
        use std::io::Write;
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(bytes.as_bytes());
        let _ = err.flush();
    }

    /// Reserve the last row: a new line (the screen scrolls if the cursor is at the bottom),
    /// the scrolling region set above the last row, and the cursor back where the program's
    /// output goes on.
    fn start(rows: u16) -> BottomRow {
        Self::write(&format!("\n\x1b7\x1b[1;{}r\x1b8\x1b[1A", rows - 1));
        BottomRow { rows }
    }

    fn draw(&mut self, text: &str) {
        let mut seq = String::new();
        if let Some((rows, _)) = stderr_size().filter(|(r, _)| *r != self.rows && *r > 2) {
            // Resized: the region follows the new height.
            seq.push_str(&format!("\x1b7\x1b[{};1H\x1b[2K\x1b[1;{}r\x1b8", self.rows.min(rows), rows - 1));
            self.rows = rows;
        }
        seq.push_str(&format!("\x1b7\x1b[{};1H\x1b[2K{text}\x1b8", self.rows));
        Self::write(&seq);
    }

    /// Erase the row and give the whole screen back to scrolling (which homes the cursor: it
    /// is saved and restored around it).
    fn finish(self) {
        Self::write(&format!("\x1b7\x1b[{};1H\x1b[2K\x1b[r\x1b8", self.rows));
    }
}

fn draw(live: &LiveCounts, duration: Option<f64>, done: &AtomicBool) {
    // A dumb terminal has no cursor addressing, and one row leaves no room for the program.
    let dumb = std::env::var("TERM").map_or(true, |t| t.is_empty() || t == "dumb");
    let Some((rows, _)) = stderr_size().filter(|(r, _)| *r > 2 && !dumb) else { return };
    let mut row = BottomRow::start(rows);
    let spinner = ['|', '/', '-', '\\'];
    let t0 = Instant::now();
    // The rate over the last few seconds, not since the start: a program's phases differ.
    let mut window: std::collections::VecDeque<(f64, u64)> = std::collections::VecDeque::new();
    let mut tick = 0usize;
    while !done.load(Ordering::Relaxed) {
        let secs = t0.elapsed().as_secs_f64();
        let ins = live.instructions.load(Ordering::Relaxed);
        let br = live.branches.load(Ordering::Relaxed);
        let bytes = live.bytes.load(Ordering::Relaxed);
        // A backend whose trace another process writes (the qemu plugin) counts bytes only.
        let measure = if ins == 0 && br == 0 { bytes } else { ins };
        if measure == ins && window.back().is_some_and(|&(_, m)| m > ins) {
            // The counts just arrived (the qemu plugin's come late): the rate starts anew.
            window.clear();
        }
        window.push_back((secs, measure));
        while window.len() > 2 && secs - window[0].0 > 3.0 {
            window.pop_front();
        }
        let rate = match (window.front(), window.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => (b.1.saturating_sub(a.1)) as f64 / (b.0 - a.0),
            _ => 0.0,
        };
        let rate = if ins == 0 && br == 0 {
            format!("{}/s", human_size(rate as u64))
        } else {
            format!("{} instructions/s", grouped(rate as u64))
        };
        let left = duration.map(|d| (d - secs).max(0.0).ceil());
        let width = stderr_size().map_or(80, |(_, c)| usize::from(c));
        // The spinner and a space, and one column free: a character in the last column leaves
        // some terminals waiting to wrap.
        let text = status_text(secs, ins, br, bytes, &rate, left, width.saturating_sub(3));
        row.draw(&format!("{} {text}", spinner[tick % spinner.len()]));
        tick += 1;
        std::thread::park_timeout(Duration::from_millis(250));
    }
    row.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(130_719), "130,719");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn fits_whole_parts_least_important_first() {
        let full =
            status_text(12.3, 1_234_567_890, 234_567_890, 512 << 20, "45,678,901 instructions/s", Some(7.0), 200);
        assert_eq!(
            full,
            "recording 12.3 s, 1,234,567,890 instructions, 234,567,890 branches, 512.0 MiB, \
             45,678,901 instructions/s, 7 s left"
        );
        // 77 columns (an 80-column terminal): the rate goes first, whole.
        let at80 = status_text(12.3, 1_234_567_890, 234_567_890, 512 << 20, "45,678,901 instructions/s", Some(7.0), 77);
        assert_eq!(at80, "recording 12.3 s, 1,234,567,890 instructions, 234,567,890 branches, 7 s left");
        assert!(at80.len() <= 77);
        let narrow = status_text(12.3, 1_234_567_890, 234_567_890, 512 << 20, "1 instructions/s", None, 40);
        assert_eq!(narrow, "recording 12.3 s");
        // Never cut inside a word, even when the first part alone is too long.
        assert_eq!(status_text(12.3, 0, 0, 10, "10 bytes/s", None, 12), "recording");
    }
}
