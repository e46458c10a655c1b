//! `utop`: attach to a running stack's telemetry socket and show its pools,
//! ports, protocols and TCP connections.
#![forbid(unsafe_code)]

use std::io::{BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use ustack_telemetry_format::socket as telemetry;
use utop::{Monitor, Update, feed};

/// How long `--once` waits for the first snapshot.
const FIRST_WAIT: Duration = Duration::from_secs(5);
/// How long `--once` waits for a second snapshot (for rates).
const SECOND_WAIT: Duration = Duration::from_secs(1);

use utop::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("utop: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<ExitCode> {
    if let Some(addr) = cli.prometheus {
        let path = match &cli.telemetry {
            Some(p) => telemetry::resolve(p),
            None => choose(true)?,
        };
        let sidecar = utop::prometheus::Sidecar::start(path.clone(), addr)?;
        eprintln!(
            "utop: metrics of {} on http://{}/metrics",
            path.display(),
            sidecar.local_addr()
        );
        // Serves until the process is killed.
        loop {
            std::thread::park();
        }
    }
    let path = match &cli.telemetry {
        Some(p) => telemetry::resolve(p),
        None => choose(cli.once)?,
    };
    if !cli.once && !std::io::stdout().is_terminal() {
        bail!("stdout is not a terminal: use --once for a text frame");
    }
    let stream = feed::attach(&path)?;
    let source = path.display().to_string();
    let monitor = Monitor::new(source.clone()).with_debug_draw(cli.debug_draw);
    if cli.once {
        return once(stream, monitor, &path, cli.width);
    }
    let updates = feed::follow(path.clone(), stream);
    let m = utop::term::run(&updates, monitor, false)?;
    if let utop::monitor::Status::Gone(why) = m.status() {
        eprintln!("utop: {why}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--once`: one frame (two snapshots when the stack sends them in time, for
/// rates), printed as text.
fn once(
    stream: std::os::unix::net::UnixStream,
    mut m: Monitor,
    path: &Path,
    width: u16,
) -> Result<ExitCode> {
    let mut r = BufReader::new(stream);
    let p = path.display();
    let Some(first) = feed::read_frame(&mut r, FIRST_WAIT).with_context(|| format!("{p}"))? else {
        eprintln!("utop: stack at {p} exited");
        return Ok(ExitCode::from(1));
    };
    m.on_update(Update::Frame(Box::new(first)));
    match feed::read_frame(&mut r, SECOND_WAIT) {
        Ok(Some(second)) => m.on_update(Update::Frame(Box::new(second))),
        Ok(None) => eprintln!("utop: stack at {p} exited after one snapshot"),
        Err(_) => {} // no second snapshot in time: print without rates
    }
    let mut out = std::io::stdout().lock();
    match out
        .write_all(m.text_frame(width).as_bytes())
        .and_then(|()| out.flush())
    {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // `utop --once | head`: quiet, with the status a SIGPIPE death gets
        // from the shell (128 + 13), as the ustack binaries do.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::from(141)),
        Err(e) => Err(e.into()),
    }
}

/// No `--telemetry`: the one live stack in the default directory, or a
/// choice when there are several.
fn choose(once: bool) -> Result<PathBuf> {
    let dir = telemetry::default_dir();
    let hint = "start one with `--telemetry NAME`, or give utop --telemetry PATH";
    let found = match telemetry::discover(&dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "no running stack found: {} does not exist ({hint})",
                dir.display()
            )
        }
        Err(e) => bail!("cannot list {}: {e}", dir.display()),
    };
    match found.len() {
        0 => bail!("no running stack found in {} ({hint})", dir.display()),
        1 => Ok(found.into_iter().next().unwrap_or_default()),
        n => {
            let list: Vec<String> = found
                .iter()
                .enumerate()
                .map(|(i, p)| format!("  {}. {}", i + 1, p.display()))
                .collect();
            if once || !std::io::stdin().is_terminal() {
                bail!(
                    "{n} stacks running in {}; choose one with --telemetry PATH:\n{}",
                    dir.display(),
                    list.join("\n")
                );
            }
            eprintln!(
                "{n} stacks running in {}:\n{}",
                dir.display(),
                list.join("\n")
            );
            eprint!("which one [1-{n}]? ");
            let mut answer = String::new();
            std::io::stdin().read_line(&mut answer)?;
            let i: usize = answer
                .trim()
                .parse()
                .ok()
                .filter(|i| (1..=n).contains(i))
                .with_context(|| format!("'{}' is not a number from 1 to {n}", answer.trim()))?;
            Ok(found[i - 1].clone())
        }
    }
}
