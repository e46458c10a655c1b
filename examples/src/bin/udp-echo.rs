//! A UDP echo server on the blocking front: the poll loop runs on its own
//! thread (`Builder::spawn`) and this thread answers datagrams with a
//! `recv_from` / `send_to` loop, as with `std::net::UdpSocket`.
//!
//! ```text
//! sudo udp-echo --pcap eth0 --ip 192.168.1.250/24 [--port 7]
//! echo hello | nc -u -w 1 192.168.1.250 7     # from another host
//! ```
//!
//! Runs until Ctrl-C or SIGTERM, then prints how many datagrams it echoed.

use std::io::ErrorKind;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Parser;
use ustack_examples::{NetArgs, exit, init_logging, stop_on_signal};
use ustack_runtime::blocking::UdpSocket;

/// UDP echo server on the blocking front.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    net: NetArgs,
    /// UDP port to echo on.
    #[arg(long, default_value_t = 7)]
    port: u16,
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stop = stop_on_signal()?;
    // Open the backend and start the poll loop on its own thread.
    let rt = args.net.builder()?.spawn()?;
    let mut socket = UdpSocket::bind(rt.net(), args.port)?;
    // Wake up now and then to notice Ctrl-C.
    socket.set_read_timeout(Some(Duration::from_millis(200)));
    println!(
        "udp-echo: {} on {}, echoing UDP port {}",
        args.net.address(),
        args.net.describe(),
        socket.local_port()
    );
    // Room for the largest datagram, so none is truncated.
    let mut buf = vec![0u8; 65_535];
    let (mut datagrams, mut bytes) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let (len, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue, // the timeout
            Err(e) => return Err(e.into()),
        };
        socket.send_to(&buf[..len], from)?;
        datagrams += 1;
        bytes += len as u64;
    }
    println!("udp-echo: {datagrams} datagrams ({bytes} bytes) echoed");
    drop(socket);
    rt.stop()?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    init_logging();
    exit("udp-echo", run(Args::parse()))
}
