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
