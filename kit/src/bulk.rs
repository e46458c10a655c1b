//! Bulk TCP transfer apps: [`BulkSend`] streams a deterministic byte pattern,
//! [`BulkRecv`] checks every byte against it and keeps a CRC-32 of the stream,
//! so a transfer is verified byte-exact on both ends.

use core::net::SocketAddr;

use ustack::node::{App, Control};
use ustack::socket::tcp::{ListenHandle, State, TcpHandle};
use ustack::stack::{Error, Stack};
use ustack::time::Instant;

/// The stream repeats with this period: a prime, so it never lines up with
/// segment or buffer sizes and a misplaced segment shows as a mismatch.
const PERIOD: usize = 65_521;
/// Longest slice handed out at once.
const CHUNK: usize = 64 << 10;

fn table() -> &'static [u8] {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        // One period, then its start again, so any CHUNK-long slice from an
        // offset below PERIOD is the stream, contiguous.
        let period: Vec<u8> = (0..PERIOD as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (i as u8))
            .collect();
        period
            .iter()
            .cycle()
            .copied()
            .take(PERIOD + CHUNK)
            .collect()
    })
}

/// Byte `i` of the test stream.
pub fn pattern_byte(i: u64) -> u8 {
    table()[(i % PERIOD as u64) as usize]
}

/// Fill `buf` with the stream starting at `offset`.
pub fn fill_pattern(offset: u64, buf: &mut [u8]) {
    let t = table();
    let mut off = offset;
    for chunk in buf.chunks_mut(CHUNK) {
        let at = (off % PERIOD as u64) as usize;
        chunk.copy_from_slice(&t[at..at + chunk.len()]);
        off += chunk.len() as u64;
    }
}

/// Bytes of `buf` that differ from the stream at `offset`.
pub fn count_mismatches(offset: u64, buf: &[u8]) -> u64 {
    let t = table();
    let mut off = offset;
    let mut bad = 0;
    for chunk in buf.chunks(CHUNK) {
        let at = (off % PERIOD as u64) as usize;
        let want = &t[at..at + chunk.len()];
        if chunk != want {
            bad += chunk.iter().zip(want).filter(|(a, b)| a != b).count() as u64;
        }
        off += chunk.len() as u64;
    }
    bad
}

/// How a transfer went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Payload bytes sent (written to the stack) or received (read).
    pub bytes: u64,
    /// CRC-32 (IEEE, as `crc32fast`) of those bytes; set when finished.
    pub crc: u32,
    /// When the connection was opened (sender) or accepted (receiver).
    pub started: Option<Instant>,
    /// When every byte and the FIN were acknowledged (sender) or the
    /// stream ended (receiver).
    pub finished: Option<Instant>,
}

impl Transfer {
    /// Goodput in bits per second, once finished.
    pub fn bits_per_second(&self) -> Option<f64> {
        let secs = self
            .finished?
            .saturating_duration_since(self.started?)
            .as_secs_f64();
        (secs > 0.0).then(|| self.bytes as f64 * 8.0 / secs)
    }
}

/// Connects to `remote`, sends `total` bytes of the pattern, closes.
#[derive(Debug)]
pub struct BulkSend {
    remote: SocketAddr,
    total: u64,
    conn: Option<TcpHandle>,
    crc: crc32fast::Hasher,
    buf: Vec<u8>,
    shut: bool,
    done: bool,
    /// Progress so far; complete once [`done`](Self::done).
    pub transfer: Transfer,
    /// Why the transfer stopped early (connect refused, reset, ...), if it did.
    pub error: Option<Error>,
}

impl BulkSend {
    /// A sender that will connect to `remote` on its first poll and send
    /// `total` bytes of the pattern.
    pub fn new(remote: impl Into<SocketAddr>, total: u64) -> Self {
        BulkSend {
            remote: remote.into(),
            total,
            conn: None,
            crc: crc32fast::Hasher::new(),
            buf: vec![0; total.clamp(1, 64 << 10) as usize],
            shut: false,
            done: false,
            transfer: Transfer::default(),
            error: None,
        }
    }

    /// All bytes sent and acknowledged, FIN exchanged (or failed).
    pub fn done(&self) -> bool {
        self.done
    }

    /// The connection, once opened.
    pub fn handle(&self) -> Option<TcpHandle> {
        self.conn
    }
}

impl App for BulkSend {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.done {
            return Control::Exit;
        }
        let h = match self.conn {
            Some(h) => h,
            None => match stack.tcp().connect(now, self.remote) {
                Ok(h) => {
                    self.transfer.started = Some(now);
                    *self.conn.insert(h)
                }
                Err(e) => {
                    self.error = Some(e);
                    self.done = true;
                    return Control::Exit;
                }
            },
        };
        let status = match stack.tcp_ref().status(h) {
            Ok(s) => s,
            Err(e) => {
                self.error = Some(e);
                self.done = true;
                return Control::Exit;
            }
        };
        if let Some(e) = status.error {
            self.error = Some(Error::Tcp(e));
            self.done = true;
            let _ = stack.tcp().close(now, h);
            return Control::Exit;
        }
        while self.transfer.bytes < self.total {
            let want = (self.total - self.transfer.bytes).min(self.buf.len() as u64) as usize;
            let room = match stack.tcp_ref().status(h) {
                Ok(s) => s.writable,
                Err(_) => 0,
            };
            let n = want.min(room);
            if n == 0 {
                break;
            }
            fill_pattern(self.transfer.bytes, &mut self.buf[..n]);
            match stack.tcp().send(h, &self.buf[..n]) {
                Ok(sent) => {
                    self.crc.update(&self.buf[..sent]);
                    self.transfer.bytes += sent as u64;
                    if sent < n {
                        break;
                    }
                }
                Err(e) => {
                    self.error = Some(e);
                    self.done = true;
                    return Control::Exit;
                }
            }
        }
        // Shut down once connected: a shutdown in SYN-SENT with nothing
        // queued would drop the connection (RFC 9293 CLOSE), and an empty
        // transfer must still reach the receiver.
        if self.transfer.bytes == self.total && !self.shut && status.state != State::SynSent {
            self.shut = true;
            let _ = stack.tcp().shutdown(h);
        }
        // Done once every byte and our FIN are acknowledged.
        if self.shut
            && status.unacked == 0
            && matches!(
                status.state,
                State::FinWait2 | State::TimeWait | State::Closed
            )
        {
            self.done = true;
            self.transfer.finished = Some(now);
            self.transfer.crc = self.crc.clone().finalize();
            let _ = stack.tcp().close(now, h);
            return Control::Exit;
        }
        Control::Continue
    }
}

/// Listens on `port`, accepts connections, verifies and counts what arrives.
#[derive(Debug)]
pub struct BulkRecv {
    port: u16,
    backlog: usize,
    listener: Option<ListenHandle>,
    conns: Vec<(TcpHandle, u64, crc32fast::Hasher, Option<Instant>)>,
    buf: Vec<u8>,
    /// Completed transfers, one per connection, in completion order.
    pub completed: Vec<Transfer>,
    /// Bytes that differed from the pattern (must stay 0).
    pub corrupt_bytes: u64,
    /// Errors met: listening failed, or a connection ended abnormally.
    pub errors: Vec<Error>,
    /// A slow reader: at most this many bytes per interval, if set.
    slow: Option<(usize, std::time::Duration)>,
    next_read: Instant,
}

impl BulkRecv {
    /// A receiver that will listen on `port` with `backlog` on its first poll.
    pub fn new(port: u16, backlog: usize) -> Self {
        BulkRecv {
            port,
            backlog,
            listener: None,
            conns: Vec::new(),
            buf: vec![0; 64 << 10],
            completed: Vec::new(),
            corrupt_bytes: 0,
            errors: Vec::new(),
            slow: None,
            next_read: Instant::ZERO,
        }
    }

    /// Read only `bytes` every `every` (to drive the sender into zero windows).
    pub fn slow_reader(mut self, bytes: usize, every: std::time::Duration) -> Self {
        self.slow = Some((bytes, every));
        self
    }

    /// Connections accepted and still open.
    pub fn open(&self) -> usize {
        self.conns.len()
    }
}

impl App for BulkRecv {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let l = match self.listener {
            Some(l) => l,
            None => match stack.tcp().listen(self.port, self.backlog) {
                Ok(l) => *self.listener.insert(l),
                Err(e) => {
                    self.errors.push(e);
                    return Control::Exit;
                }
            },
        };
        while let Ok(Some(h)) = stack.tcp().accept(l) {
            self.conns.push((h, 0, crc32fast::Hasher::new(), Some(now)));
        }
        let mut budget_all = usize::MAX;
        if let Some((bytes, every)) = self.slow {
            if now < self.next_read {
                budget_all = 0;
            } else {
                budget_all = bytes;
                self.next_read = now + every;
            }
        }
        let mut i = 0;
        while i < self.conns.len() {
            let (h, ref mut got, ref mut crc, _) = self.conns[i];
            let mut budget = budget_all;
            let mut finished = false;
            loop {
                let want = self.buf.len().min(budget);
                if want == 0 {
                    break;
                }
                match stack.tcp().recv(h, &mut self.buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.corrupt_bytes += count_mismatches(*got, &self.buf[..n]);
                        crc.update(&self.buf[..n]);
                        *got += n as u64;
                        budget -= n;
                    }
                    Err(e) => {
                        self.errors.push(e);
                        finished = true;
                        break;
                    }
                }
            }
            if stack.tcp_ref().status(h).is_ok_and(|s| s.eof) {
                finished = true;
            }
            if finished {
                let (h, got, crc, started) = self.conns.swap_remove(i);
                self.completed.push(Transfer {
                    bytes: got,
                    crc: crc.finalize(),
                    started,
                    finished: Some(now),
                });
                let _ = stack.tcp().close(now, h);
            } else {
                i += 1;
            }
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        self.slow.map(|_| self.next_read)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn pattern_slices_agree_with_bytes() {
        let mut buf = vec![0u8; 200_000];
        fill_pattern(123_456, &mut buf);
        for (k, b) in buf.iter().enumerate() {
            assert_eq!(*b, pattern_byte(123_456 + k as u64));
        }
        assert_eq!(count_mismatches(123_456, &buf), 0);
        buf[70_000] ^= 1;
        assert_eq!(count_mismatches(123_456, &buf), 1);
        // Shifted by one byte, almost everything differs.
        assert!(count_mismatches(123_457, &buf) > 190_000);
        // The worst offset (just below a period) with the longest chunk.
        let mut edge = vec![0u8; CHUNK];
        fill_pattern(PERIOD as u64 - 1, &mut edge);
        assert_eq!(count_mismatches(PERIOD as u64 - 1, &edge), 0);
        assert_eq!(edge[1], pattern_byte(0));
        // The stream is periodic.
        assert_eq!(pattern_byte(5), pattern_byte(5 + PERIOD as u64));
        let mut wrap = vec![0u8; 10];
        fill_pattern(PERIOD as u64 - 5, &mut wrap);
        assert_eq!(
            wrap[5..],
            buf[..0]
                .iter()
                .chain(table()[..5].iter())
                .copied()
                .collect::<Vec<_>>()[..]
        );
    }
}
