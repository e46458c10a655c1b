//! TCP echo (7) and discard (9), and UDP echo (7), served by `ustack run`
//! (beside iperf3 on 5201).

use ustack::node::{App, Control};
use ustack::socket::tcp::{ListenHandle, TcpHandle};
use ustack::socket::udp::UdpHandle;
use ustack::{Instant, Stack};

struct Conn {
    h: TcpHandle,
    echo: bool,
    /// Echo bytes read but not yet written back.
    pending: Vec<u8>,
    sent: usize,
    /// Discard: CRC-32 and count of the bytes received.
    crc: crc32fast::Hasher,
    got: u64,
}

/// TCP echo and discard servers, and the UDP echo.
#[derive(Default)]
pub struct Services {
    echo: Option<ListenHandle>,
    udp_echo: Option<UdpHandle>,
    discard: Option<ListenHandle>,
    conns: Vec<Conn>,
    buf: Vec<u8>,
    /// Bytes received over all connections.
    pub bytes_in: u64,
    /// Bytes echoed back.
    pub bytes_echoed: u64,
    /// UDP datagrams echoed back (a full send queue drops the echo, as a
    /// UDP server would).
    pub udp_echoed: u64,
    /// Listening failed (a port in use): the reason.
    pub error: Option<String>,
    /// (bytes, CRC-32) of each discard connection the peer finished cleanly.
    pub discarded: Vec<(u64, u32)>,
}

impl core::fmt::Debug for Services {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Services")
            .field("conns", &self.conns.len())
            .finish()
    }
}

impl Services {
    pub fn new() -> Self {
        Services {
            buf: vec![0; 64 << 10],
            ..Default::default()
        }
    }

    fn listen(&mut self, stack: &mut Stack) {
        if self.echo.is_some() || self.error.is_some() {
            return;
        }
        match (stack.tcp().listen(7, 128), stack.tcp().listen(9, 128)) {
            (Ok(e), Ok(d)) => {
                self.echo = Some(e);
                self.discard = Some(d);
            }
            (Err(e), _) | (_, Err(e)) => self.error = Some(format!("cannot listen: {e}")),
        }
        match stack.udp().bind(7) {
            Ok(h) => self.udp_echo = Some(h),
            Err(e) => self.error = Some(format!("cannot bind UDP port 7: {e}")),
        }
    }

    /// Send every waiting datagram on UDP port 7 back to its source.
    fn udp_echo(&mut self, stack: &mut Stack) {
        let Some(h) = self.udp_echo else { return };
        while let Ok(Some((n, from))) = stack.udp().recv_from(h, &mut self.buf) {
            // Longer datagrams than the buffer (64 KiB) cannot arrive.
            let n = n.min(self.buf.len());
            if stack.udp().send_to(h, from, &self.buf[..n]).is_ok() {
                self.udp_echoed += 1;
            }
        }
    }
}

impl App for Services {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.listen(stack);
        self.udp_echo(stack);
        for (l, echo) in [(self.echo, true), (self.discard, false)] {
            let Some(l) = l else { continue };
            while let Ok(Some(h)) = stack.tcp().accept(l) {
                if echo {
                    // An echo answers each request at once (a latency
                    // probe waits on it): no Nagle hold behind the
                    // previous answer's ACK.
                    let _ = stack.tcp().set_nodelay(h, true);
                }
                self.conns.push(Conn {
                    h,
                    echo,
                    pending: Vec::new(),
                    sent: 0,
                    crc: crc32fast::Hasher::new(),
                    got: 0,
                });
            }
        }
        let buf = &mut self.buf;
        let (bytes_in, bytes_echoed) = (&mut self.bytes_in, &mut self.bytes_echoed);
        let discarded = &mut self.discarded;
        self.conns.retain_mut(|c| {
            // Write back what is pending before reading more (backpressure).
            while c.sent < c.pending.len() {
                match stack.tcp().send(c.h, &c.pending[c.sent..]) {
                    Ok(0) => break,
                    Ok(n) => {
                        c.sent += n;
                        *bytes_echoed += n as u64;
                    }
                    Err(_) => {
                        let _ = stack.tcp().abort(c.h);
                        return false;
                    }
                }
            }
            if c.sent == c.pending.len() {
                c.pending.clear();
                c.sent = 0;
                loop {
                    match stack.tcp().recv(c.h, buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            *bytes_in += n as u64;
                            if !c.echo {
                                c.crc.update(&buf[..n]);
                                c.got += n as u64;
                            }
                            if c.echo {
                                c.pending.extend_from_slice(&buf[..n]);
                                break;
                            }
                        }
                        Err(_) => {
                            let _ = stack.tcp().close(now, c.h);
                            return false;
                        }
                    }
                }
            }
            match stack.tcp_ref().status(c.h) {
                Ok(s) if s.eof && c.pending.is_empty() => {
                    // The peer is done and everything was echoed: close our side.
                    if !c.echo {
                        discarded.push((c.got, c.crc.clone().finalize()));
                    }
                    let _ = stack.tcp().close(now, c.h);
                    false
                }
                Ok(s) if s.error.is_some() || s.closed() => {
                    let _ = stack.tcp().close(now, c.h);
                    false
                }
                Ok(_) => true,
                Err(_) => false,
            }
        });
        Control::Continue
    }
}
