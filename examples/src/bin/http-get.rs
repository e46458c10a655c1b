//! An HTTP/1.0 GET client on the blocking front: the stack's poll loop runs
//! on a thread of its own (`Builder::spawn`), and this thread uses a
//! `std::io::Read + Write` stream on it, as it would a `std::net::TcpStream`.
//!
//! ```text
//! sudo http-get --pcap eth0 --ip 192.168.1.250/24 --gw 192.168.1.1 http://192.168.1.10:8000/file > file
//! ```
//!
//! The body goes to stdout, the status line to stderr. Exit status 0 on
//! `200`, 1 on any other status, 2 on an error (bad URL, no connection,
//! timeout). The host must be an IPv4 address: ustack has no resolver.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use ustack_examples::{NetArgs, exit, init_logging};
use ustack_runtime::blocking;

/// HTTP/1.0 GET on the blocking front.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    net: NetArgs,
    /// Seconds to wait for the connection and for each read.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// The URL: `http://A.B.C.D/PATH` or `http://A.B.C.D:PORT/PATH`.
    url: String,
}

/// The server's address, the Host header and the path of `url`.
fn parse_url(url: &str) -> anyhow::Result<(SocketAddrV4, String, String)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("'{url}' is not an http:// URL (https is not supported)");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse().with_context(|| format!("bad port in '{url}'"))?,
        ),
        None => (authority, 80),
    };
    let ip: Ipv4Addr = host
        .parse()
        .with_context(|| format!("'{host}' is not an IPv4 address (ustack has no DNS resolver)"))?;
    Ok((
        SocketAddrV4::new(ip, port),
        authority.to_string(),
        path.to_string(),
    ))
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (server, host, path) = parse_url(&args.url)?;
    let timeout = Duration::from_secs(args.timeout);
    // Open the backend and start the poll loop on its own thread.
    let rt = args.net.builder()?.spawn()?;

    // Connect, waiting at most the timeout for the handshake.
    let mut stream = blocking::TcpStream::connect_timeout(rt.net(), server, Some(timeout))
        .with_context(|| format!("connecting to {server}"))?;
    stream.set_read_timeout(Some(timeout));

    // HTTP/1.0: one request, and the server closes the connection after
    // the body, so the body is everything up to the end of the stream.
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: ustack-http-get\r\nConnection: close\r\n\r\n"
    )?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .context("reading the status line")?;
    eprintln!("{}", status.trim_end());
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if !status.starts_with("HTTP/") || code.len() != 3 {
        bail!("not an HTTP response: {:?}", status.trim_end());
    }
    // Skip the headers, up to the empty line.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
    }
    std::io::copy(&mut reader, &mut std::io::stdout().lock()).context("reading the body")?;

    // Closing sends our FIN; stopping lets it leave first.
    drop(reader);
    rt.stop()?;
    Ok(if code == "200" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    init_logging();
    exit("http-get", run(Args::parse()))
}
