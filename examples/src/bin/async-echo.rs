//! A TCP echo server on the async front: the poll loop runs on its own
//! thread (`Builder::spawn`), and the server is ordinary `futures` code on
//! an executor, one task per connection. Streams implement the `futures-io`
//! traits (`AsyncRead`, `AsyncWrite`; tokio's with the runtime's `tokio`
//! feature), so any code written against them works unchanged, here
//! `futures::io::copy`.
//!
//! ```text
//! sudo async-echo --pcap eth0 --ip 192.168.1.250/24 [--port 7]
//! ```
//!
//! Runs until Ctrl-C or SIGTERM, then prints what it echoed.

use std::cell::Cell;
use std::pin::pin;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::Mutex;

use clap::Parser;
use futures::channel::oneshot;
use futures::executor::{LocalPool, LocalSpawner};
use futures::future::{Either, select};
use futures::task::LocalSpawnExt;
use futures::{AsyncReadExt, AsyncWriteExt};
use ustack_examples::{NetArgs, exit, init_logging};
use ustack_runtime::aio::{TcpListener, TcpStream};

/// TCP echo server on the async front.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    net: NetArgs,
    /// TCP port to echo on.
    #[arg(long, default_value_t = 7)]
    port: u16,
}

/// Echo one connection until the peer closes its side, then close ours.
async fn echo(stream: TcpStream) -> std::io::Result<u64> {
    let (reader, mut writer) = stream.split();
    let bytes = futures::io::copy(reader, &mut writer).await?;
    writer.close().await?; // FIN after the echoed bytes
    Ok(bytes)
}

/// Accept connections forever, each echoed by a task of its own.
async fn serve(
    listener: &TcpListener,
    spawner: &LocalSpawner,
    totals: Rc<Cell<(u64, u64)>>,
) -> anyhow::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let totals = totals.clone();
        spawner.spawn_local(async move {
            match echo(stream).await {
                Ok(n) => {
                    let (conns, bytes) = totals.get();
                    totals.set((conns + 1, bytes + n));
                }
                Err(e) => eprintln!("async-echo: {peer}: {e}"),
            }
        })?;
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Ctrl-C / SIGTERM complete this future, which ends the server.
    let (tx, stopped) = oneshot::channel::<()>();
    let tx = Mutex::new(Some(tx));
    ctrlc::set_handler(move || {
        if let Some(tx) = tx.lock().ok().and_then(|mut t| t.take()) {
            let _ = tx.send(());
        }
    })?;

    // Open the backend and start the poll loop on its own thread.
    let rt = args.net.builder()?.spawn()?;
    let listener = TcpListener::bind(rt.net(), args.port, 128)?;
    println!(
        "async-echo: {} on {}, echoing TCP port {}",
        args.net.address(),
        args.net.describe(),
        args.port
    );

    // A single-threaded executor: the tasks share this thread, the stack's
    // loop wakes them when their sockets are ready.
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    let totals = Rc::new(Cell::new((0, 0)));
    let server = pin!(serve(&listener, &spawner, totals.clone()));
    if let Either::Left((result, _)) = pool.run_until(select(server, stopped)) {
        result?;
    }
    let (conns, bytes) = totals.get();
    println!("async-echo: {conns} connections, {bytes} bytes echoed");
    // Dropping the pool, listener and runtime (in that order, at the end of
    // this function) closes what is still open and stops the loop.
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    init_logging();
    exit("async-echo", run(Args::parse()))
}
