//! The live status line of `itrace record` on a terminal: elapsed time, instructions,
//! branches, bytes written to the trace file, rate, and time left with `--duration`, redrawn on stderr a few
//! times a second. Nothing is drawn when stderr is not a terminal.

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

fn draw(live: &LiveCounts, duration: Option<f64>, done: &AtomicBool) {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(indicatif::ProgressStyle::with_template("{spinner} {wide_msg}").expect("valid template"));
    let t0 = Instant::now();
    // The rate over the last few seconds, not since the start: a program's phases differ.
    let mut window: std::collections::VecDeque<(f64, u64)> = std::collections::VecDeque::new();
    while !done.load(Ordering::Relaxed) {
        let secs = t0.elapsed().as_secs_f64();
        let ins = live.instructions.load(Ordering::Relaxed);
        let br = live.branches.load(Ordering::Relaxed);
        let bytes = live.bytes.load(Ordering::Relaxed);
        // A backend whose trace another process writes (the qemu plugin) counts bytes only.
        let (measure, text) = if ins == 0 && br == 0 {
            (bytes, human_size(bytes))
        } else {
            (ins, format!("{ins} instructions, {br} branches, {}", human_size(bytes)))
        };
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
            format!("{rate:.0} instructions/s")
        };
        let left = duration.map(|d| format!(", {:.0} s left", (d - secs).max(0.0).ceil())).unwrap_or_default();
        bar.set_message(format!("recording {secs:.1} s: {text}, {rate}{left}"));
        bar.tick();
        std::thread::park_timeout(Duration::from_millis(250));
    }
    bar.finish_and_clear();
}
