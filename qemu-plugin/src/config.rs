//! The plugin's arguments (`-plugin libitrace_qemu.so,key=value,...`), as
//! `itrace record --backend qemu` writes them.

use itrace_format::{Arch, Mode};
use std::path::PathBuf;

/// Everything the plugin is told by the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Trace file to write (`out=`).
    pub out: PathBuf,
    /// Where to report "ok", errors and the end totals to itrace (`status=`).
    pub status: Option<PathBuf>,
    /// A file whose appearance asks the plugin to end the trace while the program runs on
    /// untraced (`ctl=`; itrace creates it on Ctrl-C, SIGTERM or `--duration`).
    pub ctl: Option<PathBuf>,
    /// A file the writer rewrites a few times a second with the instructions and branches
    /// written so far, for itrace's status line (`live=`).
    pub live: Option<PathBuf>,
    /// A file holding the encoded recording record (where the trace came from) that itrace
    /// made, written first in the MTE stream (`origin=`).
    pub origin: Option<PathBuf>,
    pub arch: Arch,
    pub mode: Mode,
    pub buffer_size: usize,
    pub segment_size: usize,
    pub mte_size: usize,
    /// Trace streams in the file: one per vCPU (guest thread) index below it.
    pub streams: usize,
    /// Prefix where the dynamic loader of a foreign program lives (qemu's `-L`).
    pub sysroot: Option<PathBuf>,
    /// The process name for the module table (`name=`).
    pub name: String,
    /// zstd level to compress chunks with (`compress=`), if any.
    pub compress: Option<i32>,
    /// Only check that qemu loads the plugin and accepts its API version, then refuse to run.
    pub probe: bool,
}

/// Parse `key=value` arguments.
pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Config, String> {
    let mut c = Config {
        out: PathBuf::new(),
        status: None,
        ctl: None,
        live: None,
        origin: None,
        arch: Arch::X86_64,
        mode: Mode::Continuous,
        buffer_size: 64 << 20,
        segment_size: 1 << 20,
        mte_size: 8 << 20,
        streams: 64,
        sysroot: None,
        name: "qemu".into(),
        probe: false,
        compress: None,
    };
    let num = |k: &str, v: &str| v.parse::<usize>().map_err(|_| format!("plugin argument {k}={v}: not a number"));
    for a in args {
        let a = a.as_ref();
        let (k, v) = a.split_once('=').ok_or_else(|| format!("plugin argument '{a}' is not key=value"))?;
        match k {
            "out" => c.out = PathBuf::from(v),
            "status" => c.status = Some(PathBuf::from(v)),
            "ctl" => c.ctl = Some(PathBuf::from(v)),
            "live" => c.live = Some(PathBuf::from(v)),
            "origin" => c.origin = Some(PathBuf::from(v)),
            "arch" => {
                c.arch = [Arch::X86_64, Arch::I386, Arch::Ppc64le, Arch::Ppc64, Arch::S390x]
                    .into_iter()
                    .find(|x| x.name() == v)
                    .ok_or_else(|| format!("plugin argument arch={v}: unknown architecture"))?
            }
            "mode" => {
                c.mode = [Mode::Normal, Mode::Wrap, Mode::Continuous]
                    .into_iter()
                    .find(|m| m.name() == v)
                    .ok_or_else(|| format!("plugin argument mode={v}: unknown mode"))?
            }
            "bufsize" => c.buffer_size = num(k, v)?,
            "segsize" => c.segment_size = num(k, v)?,
            "mtesize" => c.mte_size = num(k, v)?,
            "streams" => c.streams = num(k, v)?.clamp(1, crate::MAX_VCPUS),
            "sysroot" => c.sysroot = Some(PathBuf::from(v)),
            "name" => c.name = v.to_string(),
            "compress" => {
                c.compress = Some(v.parse().map_err(|_| format!("plugin argument compress={v}: not a zstd level"))?)
            }
            "probe" => c.probe = v == "on" || v == "1" || v == "true",
            _ => return Err(format!("unknown plugin argument '{k}'")),
        }
    }
    if c.out.as_os_str().is_empty() && !c.probe {
        return Err("plugin argument out=PATH (the trace file) is missing".into());
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_itrace_writes() {
        let c = parse(&["out=/tmp/t.itr", "arch=ppc64", "mode=wrap", "bufsize=8192", "streams=4"]).unwrap();
        assert_eq!(c.out, PathBuf::from("/tmp/t.itr"));
        assert_eq!((c.arch, c.mode, c.buffer_size, c.streams), (Arch::Ppc64, Mode::Wrap, 8192, 4));
        assert!(parse(&["out=x", "bogus=1"]).unwrap_err().contains("unknown plugin argument 'bogus'"));
        assert!(parse(&["arch=x86_64"]).unwrap_err().contains("out=PATH"));
        assert!(parse(&["out=x", "bufsize=lots"]).is_err());
        assert!(parse(&["probe=on"]).unwrap().probe);
    }
}
