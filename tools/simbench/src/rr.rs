//! A Linux-kernel TCP request/response pair (std::net): the peer of the
//! 64-byte RR row. The client sends `size` bytes, waits for all of them to
//! come back, and repeats; latency per transaction goes to a histogram.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Echo every connection back, one thread each, until killed.
pub fn server(listen: SocketAddr) -> Result<()> {
    let l = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
    Ok(())
}

/// Run transactions for `secs` seconds; latency in microseconds.
pub fn client(connect: SocketAddr, size: usize, secs: f64) -> Result<Value> {
    if size == 0 {
        bail!("--size must be at least 1");
    }
    let mut s = TcpStream::connect_timeout(&connect, Duration::from_secs(5))
        .with_context(|| format!("connecting to {connect}"))?;
    s.set_nodelay(true)?;
    // A peer that vanishes (its namespace removed) must not hang us.
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
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
        s.write_all(&req)?;
        s.read_exact(&mut resp)
            .context("the server closed before echoing")?;
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
        "size": size,
        "transactions": n,
        "secs": wall,
        "tps": n as f64 / wall,
        "p50_us": hist.value_at_quantile(0.5) as f64 / 1e3,
        "p99_us": hist.value_at_quantile(0.99) as f64 / 1e3,
        "max_us": hist.max() as f64 / 1e3,
    }))
}
