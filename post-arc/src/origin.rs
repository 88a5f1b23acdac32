//! Where a trace came from: the recording record (MTE minor 0x44) that the recorders write
//! first, with the header's start time as the date.

use itrace_format::{Mte, Record, STREAM_MTE};

use crate::Trace;

/// itrace's version and command line, the working directory, date, host, kernel and CPU model
/// of a recording.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Origin {
    pub version: String,
    pub args: Vec<String>,
    pub cwd: String,
    pub host: String,
    pub kernel: String,
    pub cpu: String,
    /// When recording started, UTC: `2026-11-27 03:10:12 UTC`.
    pub date: String,
}

/// The origin of `trace`: `None` for a trace recorded without it (by an older itrace).
pub fn origin(trace: &Trace) -> Option<Origin> {
    // Written first in the MTE stream: a few records are enough to look at.
    let found = trace.stream(STREAM_MTE).take(4).find_map(|r| match r {
        Ok((_, Record::Mte(m @ Mte::Recording { .. }))) => Some(m),
        _ => None,
    })?;
    let Mte::Recording { version, args, cwd, host, kernel, cpu, .. } = found else { return None };
    let date = utc_date(trace.header().start_realtime_ns / 1_000_000_000);
    Some(Origin { version, args, cwd, host, kernel, cpu, date })
}

impl Origin {
    /// The command line, arguments with spaces or quotes in single quotes.
    pub fn command(&self) -> String {
        let quote = |a: &String| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        };
        self.args.iter().map(quote).collect::<Vec<_>>().join(" ")
    }

    /// One line: command, directory, date, host and itrace version.
    pub fn line(&self) -> String {
        format!(
            "recorded by `{}` in {}, {}, on {} (itrace {})",
            self.command(),
            self.cwd,
            self.date,
            self.host,
            self.version
        )
    }
}

/// `secs` since the epoch as `YYYY-MM-DD HH:MM:SS UTC` (the proleptic Gregorian calendar).
pub fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::utc_date;

    #[test]
    fn dates_as_date_prints_them() {
        // `date -u -d @SECS '+%F %T UTC'`.
        assert_eq!(utc_date(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc_date(1_795_747_812), "2026-11-27 02:50:12 UTC");
        assert_eq!(utc_date(4_102_444_799), "2099-12-31 23:59:59 UTC");
    }
}
