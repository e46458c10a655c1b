//! smoltcp's side: two `Interface`s in one thread over a tiny in-memory
//! frame queue of our own (lossless, no delay), driven by the wall clock
//! read once per iteration, never sleeping: the same loop as ustack's side.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{Result, bail};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint};

/// An MTU 1500 Ethernet frame.
const FRAME: usize = 1514;
const FLOW_PORT: u16 = 5001;
const IDLE_PORT: u16 = 6000;
const LISTEN_BASE: u16 = 20_000;
const CONNECT_BASE: u16 = 30_000;
/// Buffers of the idle sockets (their size does not change poll cost).
const IDLE_BUF: usize = 4096;

/// The wire: one frame queue per direction, plus recycled frame buffers so
/// the steady state allocates nothing. Frames move by ownership, never copied.
#[derive(Default)]
struct Wire {
    queues: [VecDeque<(Vec<u8>, usize)>; 2],
    free: Vec<Vec<u8>>,
    frames: u64,
    /// Frames with TCP payload sent by end 1 (the sender), and that payload.
    data_frames: u64,
    payload: u64,
}

struct Dev {
    wire: Rc<RefCell<Wire>>,
    /// Which end: we receive on `queues[me]`, send on `queues[1 - me]`.
    me: usize,
    /// The port fills and checks the IPv4 and TCP checksums.
    csum_offload: bool,
}

struct Rx {
    wire: Rc<RefCell<Wire>>,
    buf: Vec<u8>,
    len: usize,
}

struct Tx {
    wire: Rc<RefCell<Wire>>,
    me: usize,
}

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(&self.buf[..self.len]);
        self.wire.borrow_mut().free.push(self.buf);
        r
    }
}

/// TCP payload bytes of an Ethernet/IPv4 frame (0 if not TCP).
fn tcp_payload(f: &[u8]) -> usize {
    if f.len() < 54 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
        return 0;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let Some(&off) = f.get(14 + ihl + 12) else {
        return 0;
    };
    total.saturating_sub(ihl + usize::from(off >> 4) * 4)
}

impl phy::TxToken for Tx {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = self
            .wire
            .borrow_mut()
            .free
            .pop()
            .unwrap_or_else(|| vec![0; FRAME]);
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let r = f(&mut buf[..len]);
        let mut w = self.wire.borrow_mut();
        w.frames += 1;
        if self.me == 1 {
            let p = tcp_payload(&buf[..len]);
            if p > 0 {
                w.data_frames += 1;
                w.payload += p as u64;
            }
        }
        w.queues[1 - self.me].push_back((buf, len));
        r
    }
}

impl phy::Device for Dev {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx;

    fn receive(&mut self, _: SmolInstant) -> Option<(Rx, Tx)> {
        let (buf, len) = self.wire.borrow_mut().queues[self.me].pop_front()?;
        Some((
            Rx {
                wire: self.wire.clone(),
                buf,
                len,
            },
            Tx {
                wire: self.wire.clone(),
                me: self.me,
            },
        ))
    }

    fn transmit(&mut self, _: SmolInstant) -> Option<Tx> {
        Some(Tx {
            wire: self.wire.clone(),
            me: self.me,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = FRAME;
        if self.csum_offload {
            caps.checksum.ipv4 = phy::Checksum::None;
            caps.checksum.tcp = phy::Checksum::None;
        }
        caps
    }
}

struct Host {
    dev: Dev,
    iface: Interface,
    sockets: SocketSet<'static>,
}

fn host(wire: &Rc<RefCell<Wire>>, me: usize, now: SmolInstant, csum_offload: bool) -> Host {
    let n = u8::try_from(me + 1).unwrap_or(1);
    let mut dev = Dev {
        wire: wire.clone(),
        me,
        csum_offload,
    };
    let mut cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress([
        0x02, 0, 0, 0, 0, n,
    ])));
    cfg.random_seed = u64::from(n);
    let mut iface = Interface::new(cfg, &mut dev, now);
    iface.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::new(IpAddress::v4(10, 0, 0, n), 24));
    });
    Host {
        dev,
        iface,
        sockets: SocketSet::new(vec![]),
    }
}

fn socket(buf: usize) -> tcp::Socket<'static> {
    tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; buf]),
        tcp::SocketBuffer::new(vec![0; buf]),
    )
}

fn now(origin: std::time::Instant) -> SmolInstant {
    SmolInstant::from_micros(i64::try_from(origin.elapsed().as_micros()).unwrap_or(i64::MAX))
}

/// Set up the idle sockets, then time one flow of `bytes`.
pub fn goodput(
    idle: usize,
    bytes: u64,
    buffer: usize,
    zero_copy: bool,
    csum_offload: bool,
) -> Result<crate::Goodput> {
    let origin = std::time::Instant::now();
    let wire = Rc::new(RefCell::new(Wire::default()));
    // End 0 receives the flow (10.0.0.1), end 1 sends it (10.0.0.2).
    let mut rx = host(&wire, 0, now(origin), csum_offload);
    let mut tx = host(&wire, 1, now(origin), csum_offload);
    let server = IpAddress::v4(10, 0, 0, 1);
    let (n_listen, n_est) = (idle / 2, idle - idle / 2);
    for i in 0..n_listen {
        let mut s = socket(IDLE_BUF);
        s.listen(LISTEN_BASE + u16::try_from(i)?)?;
        rx.sockets.add(s);
    }
    let mut est_rx = Vec::with_capacity(n_est);
    for _ in 0..n_est {
        let mut s = socket(IDLE_BUF);
        s.listen(IDLE_PORT)?;
        est_rx.push(rx.sockets.add(s));
    }
    let mut est_tx = Vec::with_capacity(n_est);
    for i in 0..n_est {
        let mut s = socket(IDLE_BUF);
        let local = CONNECT_BASE + u16::try_from(i)?;
        s.connect(
            tx.iface.context(),
            IpEndpoint::new(server, IDLE_PORT),
            local,
        )?;
        est_tx.push(tx.sockets.add(s));
    }
    let mut sink = socket(buffer);
    sink.listen(FLOW_PORT)?;
    let sink = rx.sockets.add(sink);
    let step = |h: &mut Host| {
        let t = now(origin);
        h.iface.poll(t, &mut h.dev, &mut h.sockets);
    };
    // Handshakes (ARP first; smoltcp retries after its neighbor silence).
    let setup_end = origin + Duration::from_secs(120);
    loop {
        step(&mut tx);
        step(&mut rx);
        let up = |s: &SocketSet, hs: &[SocketHandle]| {
            hs.iter()
                .all(|&h| s.get::<tcp::Socket>(h).state() == tcp::State::Established)
        };
        if up(&rx.sockets, &est_rx) && up(&tx.sockets, &est_tx) {
            break;
        }
        if std::time::Instant::now() > setup_end {
            bail!("smoltcp: idle connections not established after 120 s");
        }
    }
    let mut src = socket(buffer);
    src.connect(
        tx.iface.context(),
        IpEndpoint::new(server, FLOW_PORT),
        CONNECT_BASE - 1,
    )?;
    let src = tx.sockets.add(src);
    let data = vec![0x5au8; 64 << 10];
    let mut rbuf = vec![0u8; 64 << 10];
    let (mut sent, mut got) = (0u64, 0u64);
    let (frames0, data0, payload0) = {
        let w = wire.borrow();
        (w.frames, w.data_frames, w.payload)
    };
    let t0 = std::time::Instant::now();
    let cpu0 = crate::thread_cpu_secs();
    let flow_end = t0 + Duration::from_secs(600);
    let mut iterations = 0u64;
    while got < bytes {
        iterations += 1;
        step(&mut tx);
        {
            let s = tx.sockets.get_mut::<tcp::Socket>(src);
            while sent < bytes && s.can_send() {
                let n = (bytes - sent).min(data.len() as u64) as usize;
                let r = if zero_copy {
                    // The space is claimed in place; nothing is copied in.
                    s.send(|buf| {
                        let k = buf.len().min(n);
                        (k, k)
                    })
                } else {
                    s.send_slice(&data[..n])
                };
                match r {
                    Ok(0) | Err(_) => break,
                    Ok(k) => sent += k as u64,
                }
            }
        }
        step(&mut tx);
        step(&mut rx);
        {
            let s = rx.sockets.get_mut::<tcp::Socket>(sink);
            while s.can_recv() {
                let r = if zero_copy {
                    s.recv(|buf| (buf.len(), buf.len()))
                } else {
                    s.recv_slice(&mut rbuf)
                };
                match r {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got += k as u64,
                }
            }
        }
        step(&mut rx);
        if std::time::Instant::now() > flow_end {
            bail!("smoltcp: flow moved {got} of {bytes} bytes in 600 s");
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = crate::thread_cpu_secs() - cpu0;
    let w = wire.borrow();
    let payload = w.payload - payload0;
    let retransmitted = payload.saturating_sub(got);
    Ok(crate::Goodput {
        bytes: got,
        wall_secs: wall,
        cpu_secs: cpu,
        frames: w.frames - frames0,
        data_frames: w.data_frames - data0,
        // App -> tx buffer (send_slice), tx buffer -> frame (dispatch),
        // frame -> rx buffer (process_tcp), rx buffer -> app (recv_slice);
        // the zero-copy API leaves out the first and the last.
        copied: 2 * payload + if zero_copy { 0 } else { sent + got },
        retransmits: retransmitted / 1460,
        iterations,
    })
}
