//! Progress bars on stderr, drawn only when stderr is a terminal.

use std::io::IsTerminal;

/// A bar for a download of `total` bytes (a spinner when the size is not known), labelled
/// `what`; hidden when stderr is not a terminal.
pub fn download_bar(what: &str, total: Option<u64>) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(n) => (indicatif::ProgressBar::new(n), "{msg} {bytes}/{total_bytes} [{bar:40}] {eta} left"),
        None => (indicatif::ProgressBar::no_length(), "{spinner} {msg} {bytes}"),
    };
    bar.set_style(indicatif::ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    bar.set_message(format!("downloading {what}"));
    bar
}

/// Traces smaller than this read in well under a second: no bar for them.
const READ_BAR_MIN_BYTES: u64 = 8 << 20;

/// A bar for a read of `total` bytes of trace (records decoded and replayed), labelled `what`;
/// hidden when stderr is not a terminal or the trace is small enough to read in a moment.
pub fn read_bar(what: &str, total: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() || total < READ_BAR_MIN_BYTES {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} {bytes}/{total_bytes} [{bar:40}] {eta} left")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
