//! A Linux-kernel TCP request/response pair (std::net): the peer of the
//! 64-byte RR row. The client sends `size` bytes, waits for all of them to
//! come back, and repeats; latency per transaction goes to a histogram.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Echo every connection back, one thread each, until killed. With
/// `busy`, each thread spins on a non-blocking socket instead of sleeping
/// in `read` (the kernel's best case for latency: no wake-up).
pub fn server(listen: SocketAddr, busy: bool) -> Result<()> {
    let l = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            if busy && s.set_nonblocking(true).is_err() {
                return;
            }
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if write_all(&mut s, &buf[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(_) => break,
                }
            }
        });
    }
    Ok(())
}

/// `write_all` that also spins through `WouldBlock` (non-blocking sockets).
fn write_all(s: &mut TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match s.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `read_exact` that spins through `WouldBlock`, giving up after `limit`.
fn read_exact_spin(s: &mut TcpStream, mut buf: &mut [u8], limit: Duration) -> Result<()> {
    let start = Instant::now();
    while !buf.is_empty() {
        match s.read(buf) {
            Ok(0) => bail!("the server closed before echoing"),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > limit {
                    bail!("no echo within {limit:?}");
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Run transactions for `secs` seconds; latency in microseconds. With
/// `busy`, spin on a non-blocking socket instead of sleeping in `read`.
pub fn client(connect: SocketAddr, size: usize, secs: f64, busy: bool) -> Result<Value> {
    if size == 0 {
        bail!("--size must be at least 1");
    }
    let mut s = TcpStream::connect_timeout(&connect, Duration::from_secs(5))
        .with_context(|| format!("connecting to {connect}"))?;
    s.set_nodelay(true)?;
    // A peer that vanishes (its namespace removed) must not hang us.
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_nonblocking(busy)?;
    let req = vec![0x5au8; size];
    let mut resp = vec![0u8; size];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut n: u64 = 0;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        if busy {
            write_all(&mut s, &req)?;
            read_exact_spin(&mut s, &mut resp, Duration::from_secs(5))?;
        } else {
            s.write_all(&req)?;
            s.read_exact(&mut resp)
                .context("the server closed before echoing")?;
        }
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        hist.saturating_record(ns.max(1));
        n += 1;
    }
    if resp != req {
        bail!("the echo differs from the request");
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(json!({
        "measure": "rr",
        "stack": "linux",
        "busy_poll": busy,
        "size": size,
        "transactions": n,
        "secs": wall,
        "tps": n as f64 / wall,
        "p50_us": hist.value_at_quantile(0.5) as f64 / 1e3,
        "p99_us": hist.value_at_quantile(0.99) as f64 / 1e3,
        "max_us": hist.max() as f64 / 1e3,
    }))
}
