//! The GDB remote serial protocol, client side: `$payload#checksum`
//! packets, `+`/`-` acknowledgements (qemu 7.2's stub has no no-ack mode),
//! binary escapes and run-length encoding in replies, and stop replies.
//!
//! Every read has a deadline, so a silent or dead stub is an error, never a
//! hang; a malformed packet is an error, never a panic.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Largest packet accepted from a stub (a full `g` reply of any architecture fits easily).
const MAX_PACKET: usize = 1 << 20;
/// How often to resend a packet the stub rejected (`-`) before giving up.
const MAX_RESENDS: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum GdbError {
    #[error("cannot connect to the GDB stub at {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("the GDB stub closed the connection")]
    Closed,
    #[error("the GDB stub did not answer {what} within {secs} s")]
    Timeout { what: String, secs: u64 },
    #[error("reading from the GDB stub failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed packet from the GDB stub: {0}")]
    Malformed(String),
    #[error("the GDB stub rejected {what}: {reply}")]
    Rejected { what: String, reply: String },
    #[error("the GDB stub kept rejecting our packets (bad checksum)")]
    Nak,
    #[error("cannot start {qemu}: {source} (it comes with the Debian package qemu-user)")]
    Spawn { qemu: String, source: std::io::Error },
    #[error("{qemu} exited before its GDB stub accepted a connection ({status})")]
    QemuExited { qemu: String, status: std::process::ExitStatus },
}

/// Why the target stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReply {
    /// Stopped with this signal (5, SIGTRAP, after a step or at a breakpoint); `thread` when the
    /// stub said which (`T05thread:p<pid>.<tid>;` or `thread:<tid>;`), and the registers it sent
    /// along (`T05...;10:<hex>;`: gdbserver sends the pc, qemu-user sends none).
    Signal { sig: u8, thread: Option<(Option<u32>, u32)>, registers: Vec<(u32, Vec<u8>)> },
    /// `Wxx`: the process exited with this status.
    Exited(u8),
    /// `Xxx`: the process was killed by this signal.
    Killed(u8),
}

/// A connection to a stub.
pub struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    /// Deadline for a reply to an ordinary request.
    timeout: Duration,
    /// An acknowledgement owed for the last received packet, sent with the next request (one
    /// write instead of two per round trip; the stub is idle until it reads it anyway).
    ack_owed: bool,
    out: Vec<u8>,
}

fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Decode a hex string into bytes.
pub fn from_hex(s: &[u8]) -> Result<Vec<u8>, GdbError> {
    if s.len() % 2 != 0 {
        return Err(GdbError::Malformed(format!("odd-length hex data ({} characters)", s.len())));
    }
    s.chunks(2)
        .map(|p| match (hex_digit(p[0]), hex_digit(p[1])) {
            (Some(h), Some(l)) => Ok(h << 4 | l),
            _ => Err(GdbError::Malformed(format!("bad hex digits {:?}", String::from_utf8_lossy(p)))),
        })
        .collect()
}

/// Parse a hex number (at most 16 digits).
pub fn parse_hex_u64(s: &[u8]) -> Result<u64, GdbError> {
    let t = std::str::from_utf8(s).map_err(|_| GdbError::Malformed("non-ASCII number".into()))?;
    if t.is_empty() || t.len() > 16 {
        return Err(GdbError::Malformed(format!("bad hex number {t:?}")));
    }
    u64::from_str_radix(t, 16).map_err(|_| GdbError::Malformed(format!("bad hex number {t:?}")))
}

/// Undo binary escapes (`}` then byte ^ 0x20) and run-length encoding (`X*n`: X repeated n - 29 more times).
pub fn unescape(raw: &[u8]) -> Result<Vec<u8>, GdbError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'}' => {
                let b = *raw.get(i + 1).ok_or_else(|| GdbError::Malformed("escape at the end of a packet".into()))?;
                out.push(b ^ 0x20);
                i += 2;
            }
            b'*' => {
                let prev = *out.last().ok_or_else(|| GdbError::Malformed("run length without a character".into()))?;
                let n = *raw.get(i + 1).ok_or_else(|| GdbError::Malformed("run length cut short".into()))?;
                if !(b' '..=b'~').contains(&n) || n < 29 {
                    return Err(GdbError::Malformed(format!("bad run length {n:#x}")));
                }
                out.extend(std::iter::repeat_n(prev, (n - 29) as usize));
                i += 2;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
        if out.len() > MAX_PACKET {
            return Err(GdbError::Malformed("packet too large".into()));
        }
    }
    Ok(out)
}

/// The Linux number of a signal in GDB's own numbering (the stub's stop replies and `C`/`S`
/// packets use GDB's, which differs from Linux's from 7 on: GDB's SIGUSR1 is 30).
pub fn linux_signal(gdb: u8) -> Option<u64> {
    const LINUX: [u8; 33] = [
        0, 1, 2, 3, 4, 5, 6, 0, 8, 9, 7, 11, 31, 13, 14, 15, 23, 19, 20, 18, 17, 21, 22, 29, 24, 25, 26, 27, 28, 0, 10,
        12, 30,
    ];
    LINUX.get(gdb as usize).copied().filter(|&n| n != 0).map(u64::from)
}

/// Parse a stop reply packet (`S05`, `T05thread:p1.2;...`, `W00`, `W00;process:1`, `X09`).
pub fn parse_stop_reply(p: &[u8]) -> Result<StopReply, GdbError> {
    let bad = || GdbError::Malformed(format!("unexpected stop reply {:?}", String::from_utf8_lossy(p)));
    let code = |s: &[u8]| -> Result<u8, GdbError> { Ok(from_hex(s.get(..2).ok_or_else(bad)?)?[0]) };
    match p.first() {
        Some(b'S') => Ok(StopReply::Signal { sig: code(&p[1..])?, thread: None, registers: Vec::new() }),
        Some(b'T') => {
            let sig = code(&p[1..])?;
            let mut thread = None;
            let mut registers = Vec::new();
            for field in p[3..].split(|&b| b == b';') {
                let Some(colon) = field.iter().position(|&b| b == b':') else { continue };
                let (key, value) = (&field[..colon], &field[colon + 1..]);
                if key == b"thread" {
                    thread = Some(parse_thread_id(value)?);
                } else if !key.is_empty() && key.iter().all(u8::is_ascii_hexdigit) {
                    // A register: `NN:<value in target byte order>`; other keys (core, swbreak,
                    // watch, ...) are not needed.
                    // `xx...`: unavailable; leave it out.
                    if let Ok(v) = from_hex(value) {
                        registers.push((parse_hex_u64(key)? as u32, v));
                    }
                }
            }
            Ok(StopReply::Signal { sig, thread, registers })
        }
        Some(b'W') => Ok(StopReply::Exited(code(&p[1..])?)),
        Some(b'X') => Ok(StopReply::Killed(code(&p[1..])?)),
        _ => Err(bad()),
    }
}

/// `p<pid>.<tid>` or `<tid>` (hex).
fn parse_thread_id(v: &[u8]) -> Result<(Option<u32>, u32), GdbError> {
    let num = |s: &[u8]| parse_hex_u64(s).map(|n| n as u32);
    match v.strip_prefix(b"p") {
        Some(rest) => match rest.iter().position(|&b| b == b'.') {
            Some(dot) => Ok((Some(num(&rest[..dot])?), num(&rest[dot + 1..])?)),
            None => Ok((Some(num(rest)?), num(rest)?)),
        },
        None => Ok((None, num(v)?)),
    }
}

impl Connection {
    /// Connect to `addr` (`HOST:PORT`), giving up after `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Connection, GdbError> {
        let err = |source| GdbError::Connect { addr: addr.to_string(), source };
        let mut last = std::io::Error::new(ErrorKind::NotFound, "no address");
        for sa in addr.to_socket_addrs().map_err(err)? {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(stream) => return Connection::new(stream, timeout),
                Err(e) => last = e,
            }
        }
        Err(err(last))
    }

    /// Use an open stream.
    pub fn new(stream: TcpStream, timeout: Duration) -> Result<Connection, GdbError> {
        // One small packet per step each way: never wait to coalesce.
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            buf: vec![0; 1 << 16],
            pos: 0,
            len: 0,
            timeout,
            ack_owed: false,
            out: Vec::with_capacity(256),
        })
    }

    /// Read one byte, waiting until `deadline` (None: forever, checking `interrupt` to send ^C).
    fn read_byte(&mut self, deadline: Option<Instant>, what: &str) -> Result<u8, GdbError> {
        if self.pos < self.len {
            self.pos += 1;
            return Ok(self.buf[self.pos - 1]);
        }
        loop {
            let wait = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_millis(200),
            };
            if wait.is_zero() {
                return Err(GdbError::Timeout { what: what.to_string(), secs: self.timeout.as_secs() });
            }
            self.stream.set_read_timeout(Some(wait))?;
            match self.stream.read(&mut self.buf) {
                Ok(0) => return Err(GdbError::Closed),
                Ok(n) => {
                    self.len = n;
                    self.pos = 1;
                    return Ok(self.buf[0]);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if deadline.is_none() {
                        return Err(GdbError::Timeout { what: what.to_string(), secs: 0 });
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                    return Err(GdbError::Closed)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn write_all(&mut self, data: &[u8]) -> Result<(), GdbError> {
        self.stream.write_all(data).map_err(|e| match e.kind() {
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset => GdbError::Closed,
            _ => e.into(),
        })
    }

    /// Send a packet and wait for the stub's acknowledgement.
    pub fn send(&mut self, payload: &[u8]) -> Result<(), GdbError> {
        let sum = payload.iter().fold(0u8, |s, &b| s.wrapping_add(b));
        self.out.clear();
        if std::mem::take(&mut self.ack_owed) {
            self.out.push(b'+');
        }
        self.out.push(b'$');
        self.out.extend_from_slice(payload);
        self.out.extend_from_slice(format!("#{sum:02x}").as_bytes());
        let what = format!("packet {:?}", String::from_utf8_lossy(&payload[..payload.len().min(40)]));
        for _ in 0..=MAX_RESENDS {
            let packet = std::mem::take(&mut self.out);
            let r = self.write_all(&packet);
            self.out = packet;
            r?;
            let deadline = Instant::now() + self.timeout;
            loop {
                match self.read_byte(Some(deadline), &what)? {
                    b'+' => return Ok(()),
                    b'-' => break,
                    // Stray bytes before the ack (a late reply to an interrupt): skip them.
                    _ => {}
                }
            }
            // Resend without the ack we already delivered.
            if self.out.first() == Some(&b'+') {
                self.out.remove(0);
            }
        }
        Err(GdbError::Nak)
    }

    /// Send the acknowledgement we owe now (before waiting a long time, or leaving).
    pub fn flush_ack(&mut self) -> Result<(), GdbError> {
        if std::mem::take(&mut self.ack_owed) {
            self.write_all(b"+")?;
        }
        Ok(())
    }

    /// Receive one packet. `deadline` None waits as long as it takes, sending ^C once when
    /// `interrupt` becomes set.
    fn recv_until(&mut self, deadline: Option<Instant>, interrupt: Option<&AtomicBool>) -> Result<Vec<u8>, GdbError> {
        let what = "a reply";
        let mut interrupted = false;
        loop {
            // Find the start of a packet.
            let b = match self.read_byte(deadline, what) {
                Ok(b) => b,
                Err(GdbError::Timeout { secs: 0, .. }) if deadline.is_none() => {
                    if let Some(flag) = interrupt {
                        if !interrupted && flag.load(Ordering::Relaxed) {
                            interrupted = true;
                            self.write_all(&[0x03])?;
                        }
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            if b != b'$' {
                continue; // acks and noise between packets
            }
            // Once a packet has begun, its rest must follow promptly.
            let deadline = Some(deadline.unwrap_or_else(|| Instant::now() + self.timeout));
            let mut raw = Vec::new();
            let mut sum = 0u8;
            loop {
                let c = self.read_byte(deadline, what)?;
                if c == b'#' {
                    break;
                }
                if raw.len() >= MAX_PACKET {
                    return Err(GdbError::Malformed("packet too large".into()));
                }
                sum = sum.wrapping_add(c);
                raw.push(c);
            }
            let hi = self.read_byte(deadline, what)?;
            let lo = self.read_byte(deadline, what)?;
            let expected = match (hex_digit(hi), hex_digit(lo)) {
                (Some(h), Some(l)) => h << 4 | l,
                _ => return Err(GdbError::Malformed("bad checksum digits".into())),
            };
            if expected != sum {
                // Ask for it again.
                self.write_all(b"-")?;
                continue;
            }
            self.ack_owed = true;
            return unescape(&raw);
        }
    }

    /// Receive a reply within the request timeout.
    pub fn recv(&mut self) -> Result<Vec<u8>, GdbError> {
        let deadline = Instant::now() + self.timeout;
        self.recv_until(Some(deadline), None)
    }

    /// Receive a stop reply after `c`, however long the program runs; ^C when `interrupt` is set.
    pub fn recv_stop_waiting(&mut self, interrupt: &AtomicBool) -> Result<StopReply, GdbError> {
        self.flush_ack()?;
        loop {
            let p = self.recv_until(None, Some(interrupt))?;
            // `O` packets carry the program's console output (hex); not a stop.
            if p.first() == Some(&b'O') && p.len() > 1 {
                continue;
            }
            return parse_stop_reply(&p);
        }
    }

    /// Send a request and return the reply.
    pub fn request(&mut self, payload: &[u8]) -> Result<Vec<u8>, GdbError> {
        self.send(payload)?;
        self.recv()
    }

    /// A request whose reply must be `OK`.
    pub fn request_ok(&mut self, payload: &[u8]) -> Result<(), GdbError> {
        let r = self.request(payload)?;
        if r == b"OK" {
            Ok(())
        } else {
            Err(GdbError::Rejected {
                what: String::from_utf8_lossy(payload).into_owned(),
                reply: if r.is_empty() { "not supported".into() } else { String::from_utf8_lossy(&r).into_owned() },
            })
        }
    }

    /// Read a whole `qXfer:OBJECT:read:ANNEX` object.
    pub fn qxfer(&mut self, object: &str, annex: &str) -> Result<Vec<u8>, GdbError> {
        let mut data = Vec::new();
        loop {
            let q = format!("qXfer:{object}:read:{annex}:{:x},{:x}", data.len(), 0xf00);
            let r = self.request(q.as_bytes())?;
            match r.first() {
                Some(b'm') => data.extend_from_slice(&r[1..]),
                Some(b'l') => {
                    data.extend_from_slice(&r[1..]);
                    return Ok(data);
                }
                _ => {
                    return Err(GdbError::Rejected {
                        what: q,
                        reply: if r.is_empty() { "not supported".into() } else { String::from_utf8_lossy(&r).into() },
                    })
                }
            }
            if data.len() > MAX_PACKET {
                return Err(GdbError::Malformed(format!("qXfer {object} {annex} too large")));
            }
        }
    }

    /// Read target memory (`m`), at most `len` bytes; may return fewer near unmapped memory.
    pub fn read_memory(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, GdbError> {
        let r = self.request(format!("m{addr:x},{len:x}").as_bytes())?;
        if r.first() == Some(&b'E') && r.len() == 3 {
            return Ok(Vec::new());
        }
        from_hex(&r)
    }

    /// Send raw bytes outside a packet (^C).
    pub fn interrupt(&mut self) -> Result<(), GdbError> {
        self.flush_ack()?;
        self.write_all(&[0x03])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn gdb_signal_numbers_to_linux() {
        // include/gdb/signals.def against Linux's asm/signal.h
        assert_eq!(linux_signal(5), Some(5)); // TRAP
        assert_eq!(linux_signal(10), Some(7)); // BUS
        assert_eq!(linux_signal(11), Some(11)); // SEGV
        assert_eq!(linux_signal(20), Some(17)); // CHLD
        assert_eq!(linux_signal(30), Some(10)); // USR1
        assert_eq!(linux_signal(31), Some(12)); // USR2
        assert_eq!(linux_signal(7), None); // EMT: none on Linux
        assert_eq!(linux_signal(200), None);
    }

    #[test]
    fn parses_stop_replies() {
        assert_eq!(parse_stop_reply(b"S05").unwrap(), StopReply::Signal { sig: 5, thread: None, registers: vec![] });
        assert_eq!(
            parse_stop_reply(b"T05thread:p1a.1b;").unwrap(),
            StopReply::Signal { sig: 5, thread: Some((Some(0x1a), 0x1b)), registers: vec![] }
        );
        assert_eq!(
            parse_stop_reply(b"T0bthread:2f;").unwrap(),
            StopReply::Signal { sig: 11, thread: Some((None, 0x2f)), registers: vec![] }
        );
        // gdbserver's form (after run-length decoding): registers, thread, core, swbreak.
        assert_eq!(
            parse_stop_reply(b"T0506:0000000000000000;10:0010400000000000;thread:p73e6.73e6;core:1;swbreak:;").unwrap(),
            StopReply::Signal {
                sig: 5,
                thread: Some((Some(0x73e6), 0x73e6)),
                registers: vec![(6, vec![0; 8]), (0x10, vec![0, 0x10, 0x40, 0, 0, 0, 0, 0])],
            }
        );
        assert_eq!(parse_stop_reply(b"W00").unwrap(), StopReply::Exited(0));
        assert_eq!(parse_stop_reply(b"W01;process:12").unwrap(), StopReply::Exited(1));
        assert_eq!(parse_stop_reply(b"X09").unwrap(), StopReply::Killed(9));
        for bad in [&b""[..], b"T", b"Wz", b"Q05", b"T05thread:p;"] {
            assert!(parse_stop_reply(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unescapes_and_expands_runs() {
        assert_eq!(unescape(b"a}\x03b").unwrap(), b"a#b");
        assert_eq!(unescape(b"0* ").unwrap(), b"0000"); // ' ' = 32: 3 more
        assert!(unescape(b"*!").is_err());
        assert!(unescape(b"ab}").is_err());
        assert!(unescape(b"a*\x01").is_err());
        assert!(from_hex(b"abc").is_err());
        assert!(from_hex(b"zz").is_err());
        assert_eq!(from_hex(b"00ff").unwrap(), vec![0, 255]);
    }

    /// A fake stub on a socket: checks our packets and acks, answers with canned bytes.
    fn fake_stub(script: Vec<(&'static [u8], &'static [u8])>) -> (Connection, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            for (expect, reply) in script {
                let mut got = vec![0u8; expect.len()];
                s.read_exact(&mut got).unwrap();
                assert_eq!(got, expect, "{:?}", String::from_utf8_lossy(&got));
                s.write_all(reply).unwrap();
            }
        });
        let c = Connection::connect(&addr.to_string(), Duration::from_secs(2)).unwrap();
        (c, h)
    }

    #[test]
    fn round_trip_with_acks_resend_and_bad_checksum() {
        let (mut c, h) = fake_stub(vec![
            // Rejected once, then accepted; the reply's checksum is wrong the first time.
            (b"$g#67", b"-"),
            (b"$g#67", b"+$1234#00"),
            (b"-", b"$1234#ca"),
            // The next request carries the ack of the previous reply.
            (b"+$?#3f", b"+$W00#b7"),
        ]);
        assert_eq!(c.request(b"g").unwrap(), b"1234");
        assert_eq!(parse_stop_reply(&c.request(b"?").unwrap()).unwrap(), StopReply::Exited(0));
        h.join().unwrap();
    }

    #[test]
    fn closed_and_silent_stubs_are_errors() {
        let (mut c, h) = fake_stub(vec![(b"$g#67", b"+")]);
        // The stub hangs up after the ack, before replying.
        assert!(matches!(c.request(b"g"), Err(GdbError::Closed)));
        h.join().unwrap();

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = Connection::connect(&l.local_addr().unwrap().to_string(), Duration::from_millis(200)).unwrap();
        let _keep = l.accept().unwrap();
        assert!(matches!(c.request(b"g"), Err(GdbError::Timeout { .. })));
    }

    #[test]
    fn refused_connection_is_an_error() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = Connection::connect(&format!("127.0.0.1:{port}"), Duration::from_secs(1)).err().unwrap();
        assert!(e.to_string().starts_with("cannot connect to the GDB stub at 127.0.0.1:"), "{e}");
    }
}
