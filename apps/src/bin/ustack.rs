//! `ustack`: the daemon and the demo.
#![forbid(unsafe_code)]

use std::net::SocketAddrV4;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use ustack_kit::bulk::{BulkRecv, BulkSend};
use ustack_kit::ping::{Pinger, PingerConfig};

use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::shard::{Steer, SteerRule};
use ustack::sim::{LinkConfig, SimNet, host_config};
use ustack::socket::udp::UdpHandle;
use ustack::{Instant, Stack};
use ustack_apps::iperf_server::IperfServer;
use ustack_apps::net::{NetArgs, NodeRunner, with_node};
use ustack_apps::report::{counters, ms};
use ustack_apps::services::Services;
use ustack_apps::stop_flag;
use ustack_apps::telemetry::{Telemetry, sibling};
use ustack_runtime::clock::Clock;
use ustack_runtime::{self as runtime, LoopConfig};

use ustack_apps::cli::ustack::*;

fn main() -> ExitCode {
    ustack_apps::print_notices();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse_from(ustack_apps::command_line("ustack", &Cli::command()));
    let result = match cli.cmd {
        Cmd::Demo(args) => demo(&args),
        Cmd::Run(args) => run(&args),
        Cmd::Send(args) => send(&args),
        Cmd::Exec(args) => exec(&args),
    };
    ustack_apps::exit("ustack", result)
}

/// `ustack exec`: check the NET flags, then become the program with the
/// preload library and the flags in its environment.
fn exec(args: &ExecArgs) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    if args.workers.is_some() && args.fork != ForkOwner::Each {
        eprintln!("error: --workers goes with --fork each");
        return Ok(ExitCode::from(2));
    }
    // The same checks the library makes before `main`, with the same words.
    args.net.net_config()?;
    // The NET words as given (without exec's own --fork, --spin, --workers, --user and --stack).
    let mut raw: Vec<String> = std::env::args()
        .skip_while(|a| a != "exec")
        .skip(1)
        .take_while(|a| a != "--")
        .collect();
    for own in ["--fork", "--spin", "--workers", "--user", "--stack"] {
        while let Some(i) = raw.iter().position(|a| a == own) {
            raw.drain(i..(i + 2).min(raw.len()));
        }
        raw.retain(|a| !a.starts_with(&format!("{own}=")));
    }
    let spec = shlex::try_join(raw.iter().map(String::as_str))
        .context("the NET flags cannot be passed on")?;
    let lib = match std::env::var_os("USTACK_PRELOAD_LIB") {
        Some(p) => std::path::PathBuf::from(p),
        None => preload_lib(&std::env::current_exe()?),
    };
    if !lib.is_file() {
        bail!(
            "{} not found (build it: cargo build --release -p ustack-preload, with the same features as ustack; or set USTACK_PRELOAD_LIB)",
            lib.display()
        );
    }
    let lib = lib.canonicalize()?;
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.into_os_string(),
    };
    let (program, rest) = args.program.split_first().context("no program to run")?;
    if let Some(path) = find_program(program) {
        match program_kind(&path) {
            ProgramKind::Go => {
                eprintln!(
                    "ustack: {program} is a Go program: Go makes its system calls itself, not through the C library, so LD_PRELOAD cannot carry its sockets (they would all be the kernel's); not started"
                );
                return Ok(ExitCode::from(2));
            }
            ProgramKind::Static => {
                let found = path.display().to_string();
                let named = if found == *program {
                    found
                } else {
                    format!("{program} ({found})")
                };
                eprintln!(
                    "ustack: {named} is statically linked: no dynamic loader runs to load the LD_PRELOAD library, so its sockets would all be the kernel's; not started"
                );
                return Ok(ExitCode::from(2));
            }
            ProgramKind::Other => {}
        }
    }
    let mut cmd = match &args.user {
        None => {
            let mut c = std::process::Command::new(program);
            c.args(rest).env("LD_PRELOAD", preload);
            c
        }
        Some(user) => {
            let caps = if args.net.xdp.is_some() {
                XDP_USER_CAPS
            } else {
                USER_CAPS
            };
            as_user(user, program, rest, &preload, caps)?
        }
    };
    let err = cmd
        .env("USTACK_NET", spec)
        .env("USTACK_PID", std::process::id().to_string())
        .env("USTACK_SPIN_US", args.spin.to_string())
        .env("USTACK_STACK", args.stack.as_deref().unwrap_or(""))
        .env(
            "USTACK_FORK",
            match (args.fork, args.workers) {
                (ForkOwner::Child, _) => "child".to_string(),
                (ForkOwner::Each, Some(n)) => format!("each:{n}"),
                _ => "parent".to_string(),
            },
        )
        .exec();
    let program = cmd.get_program().to_string_lossy().into_owned();
    eprintln!("ustack: cannot run {program}: {err}");
    Ok(ExitCode::from(
        if err.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        },
    ))
}

/// Where `ustack exec` looks for the preload library, beside `exe` (the
/// `ustack` binary): in the same directory (a cargo build's
/// target/release), else in `../lib/ustack/` (an installed tree: the
/// Debian package's /usr/bin/ustack and /usr/lib/ustack/). The first that
/// exists, or the first to name in the error.
fn preload_lib(exe: &std::path::Path) -> std::path::PathBuf {
    const LIB: &str = "libustack_preload.so";
    let Some(dir) = exe.parent() else {
        return LIB.into();
    };
    let beside = dir.join(LIB);
    let installed = dir.join("../lib/ustack").join(LIB);
    if !beside.is_file() && installed.is_file() {
        installed
    } else {
        beside
    }
}

/// The capabilities a program run with `ustack exec --user` keeps: the
/// ones the pcap backend needs (a packet socket, promiscuous mode and the
/// interface's offload settings).
const USER_CAPS: &str = "+net_raw,+net_admin";

/// [`USER_CAPS`] for AF_XDP: also loading the XDP program (CAP_BPF) and
/// registering the UMEM beyond the locked-memory limit (CAP_IPC_LOCK).
const XDP_USER_CAPS: &str = "+net_raw,+net_admin,+bpf,+ipc_lock";

/// `setpriv` starting `program` as `user` with `caps` ambient, the
/// preload library given to the program alone (through `env`, so neither
/// setpriv nor env loads it). Ambient capabilities survive the uid change
/// and the exec of a binary without file capabilities, and leave the
/// program's exec unprivileged in the loader's eyes (no AT_SECURE), so
/// LD_PRELOAD is honoured.
fn as_user(
    user: &str,
    program: &str,
    rest: &[String],
    preload: &std::ffi::OsStr,
    caps: &str,
) -> Result<std::process::Command> {
    // `env` would take a first word with `=` for a variable.
    if program.contains('=') {
        bail!("--user: a program name with '=' cannot be started through env: {program}");
    }
    let id = std::process::Command::new("id")
        .args(["-g", "--", user])
        .output()
        .context("run id -g")?;
    let gid = String::from_utf8_lossy(&id.stdout).trim().to_string();
    if !id.status.success() || gid.is_empty() {
        bail!("--user {user}: no such user");
    }
    let who = [
        format!("--reuid={user}"),
        format!("--regid={gid}"),
        "--init-groups".to_string(),
    ];
    // A library the user cannot read is skipped by the loader with a
    // warning, and the program would run on the kernel's sockets.
    let mut unreadable = Vec::new();
    for lib in std::env::split_paths(preload) {
        let readable = std::process::Command::new("setpriv")
            .args(&who)
            .args(["--", "test", "-r"])
            .arg(&lib)
            .status()
            .context("run setpriv (util-linux)")?;
        if !readable.success() {
            unreadable.push(lib.display().to_string());
        }
    }
    if !unreadable.is_empty() {
        bail!("--user {user} cannot read {}", unreadable.join(", "));
    }
    let mut assign = std::ffi::OsString::from("LD_PRELOAD=");
    assign.push(preload);
    let mut c = std::process::Command::new("setpriv");
    c.args(&who)
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .args(["--", "env"])
        .arg(assign)
        .arg(program)
        .args(rest)
        // Not setpriv's or env's: they would load the library themselves.
        .env_remove("LD_PRELOAD");
    Ok(c)
}

/// The file `exec` would run for `program`: the path itself when it
/// holds a slash, else the first executable file of that name on `PATH`.
fn find_program(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return Some(program.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// What `ustack exec` can tell from a program's file before it runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProgramKind {
    /// A Go program: an ELF file with Go's `.note.go.buildid` or
    /// `.go.buildinfo` section (every Go toolchain since 1.13 writes them,
    /// stripped binaries keep them). Go makes its system calls directly,
    /// so an LD_PRELOAD library never sees its sockets.
    Go,
    /// A statically linked ELF executable: no `PT_INTERP` program header,
    /// so no dynamic loader runs and `LD_PRELOAD` is never read.
    Static,
    /// Anything else: a dynamically linked program, a script (`#!`), a
    /// file that cannot be read or parsed (exec says what is wrong).
    Other,
}

/// What kind of program `path` is (see [`ProgramKind`]); the ELF file is
/// read through the `object` crate, only the parts it looks at.
fn program_kind(path: &std::path::Path) -> ProgramKind {
    use object::elf::{FileHeader32, FileHeader64};
    use object::read::{FileKind, ReadCache};
    let Ok(file) = std::fs::File::open(path) else {
        return ProgramKind::Other;
    };
    let data = ReadCache::new(file);
    let kind = match FileKind::parse(&data) {
        Ok(FileKind::Elf32) => elf_kind::<FileHeader32<object::Endianness>, _>(&data),
        Ok(FileKind::Elf64) => elf_kind::<FileHeader64<object::Endianness>, _>(&data),
        _ => Ok(ProgramKind::Other),
    };
    kind.unwrap_or(ProgramKind::Other)
}

/// [`program_kind`] of an ELF file of class `Elf`.
fn elf_kind<'data, Elf, R>(data: R) -> object::Result<ProgramKind>
where
    Elf: object::read::elf::FileHeader,
    R: object::ReadRef<'data>,
{
    use object::read::elf::{ElfFile, ProgramHeader};
    use object::{Object, elf};
    let file = ElfFile::<Elf, R>::parse(data)?;
    if [".note.go.buildid", ".go.buildinfo"]
        .iter()
        .any(|name| file.section_by_name(name).is_some())
    {
        return Ok(ProgramKind::Go);
    }
    let endian = file.endian();
    // Only what exec runs: an executable or a position-independent one.
    let e_type = file.elf_header().e_type(endian);
    if e_type != elf::ET_EXEC && e_type != elf::ET_DYN {
        return Ok(ProgramKind::Other);
    }
    let interp = file
        .elf_program_headers()
        .iter()
        .any(|p| p.p_type(endian) == elf::PT_INTERP);
    Ok(if interp {
        ProgramKind::Other
    } else {
        ProgramKind::Static
    })
}

fn loop_config(net: &NetArgs, duration: Option<f64>) -> LoopConfig {
    LoopConfig {
        duration: duration.map(Duration::from_secs_f64),
        ..net.loop_config()
    }
}

/// What `ustack run` serves: echo and discard, and the iperf3 server.
struct DaemonApps {
    services: Services,
    iperf: IperfServer,
    ud: ustack_kit::ud_ping::UdResponder,
    /// ibv_ud_pingpong's address exchange (TCP 18515) for the responder;
    /// not on a sharded run (the exchange and the UD flow it announces may
    /// hash to different cores).
    pingpong: Option<ustack_apps::pingpong::PingpongServer>,
    /// iperf3 lines held while the monitor owns the terminal.
    held: Option<Vec<String>>,
}

impl App for DaemonApps {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.services.poll(now, stack);
        self.iperf.poll(now, stack);
        self.ud.poll(now, stack);
        let mut lines: Vec<String> = self.iperf.output.drain(..).collect();
        if let Some(p) = self.pingpong.as_mut() {
            p.poll(now, stack, &mut self.ud);
            lines.append(&mut p.output);
        }
        for line in lines {
            match self.held.as_mut() {
                Some(held) => held.push(line),
                None => ustack_apps::outln!("{line}"),
            }
        }
        Control::Continue
    }
}

struct Daemon<'a> {
    args: &'a RunArgs,
    stop: Arc<AtomicBool>,
}

impl NodeRunner for Daemon<'_> {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let tui = self.args.tui && ustack_apps::telemetry::can_show_tui();
        if self.args.tui && !tui {
            tracing::warn!("--tui needs a terminal on stdout: counters are printed at exit");
        }
        let name = format!("ustack {}", node.stack.config().ip);
        let tele = Telemetry::open(self.args.net.telemetry.as_deref(), &name, tui)?;
        let mut services = DaemonApps {
            services: Services::new(),
            iperf: IperfServer::new(5201, false),
            ud: ustack_kit::ud_ping::UdResponder::default(),
            pingpong: Some(ustack_apps::pingpong::PingpongServer::new(
                ustack::wire::exchange::PINGPONG_PORT,
            )),
            held: tui.then(Vec::new),
        };
        ustack_apps::outln!(
            "ustack: {} ({}) on {}; answering ARP and ping, TCP echo on 7, discard on 9, iperf3 on 5201, RDMA UD responder on qpn 2 (qkey 0x11111111, ibv_ud_pingpong exchange on 18515)",
            node.stack.config().ip,
            node.stack.mac(),
            self.args.net.describe()
        );
        let clock = Clock::new();
        let cfg = loop_config(&self.args.net, self.args.duration);
        let mut last = None;
        let stop = self.stop.clone();
        let monitor = tui.then(|| tele.spawn_tui(&name, stop.clone())).flatten();
        let result = runtime::run(
            &mut node,
            &mut services,
            &cfg,
            &clock,
            || stop.load(Ordering::Relaxed),
            |s| {
                tele.publish(s);
                last = Some(s.clone());
            },
        );
        drop(tele); // ends the monitor, removes the socket
        if let Some(m) = monitor {
            let _ = m.join();
        }
        for line in services.held.take().unwrap_or_default() {
            ustack_apps::outln!("{line}");
        }
        if let Some(s) = &last {
            ustack_apps::out!(
                "{}",
                counters(&format!("ustack {}", node.stack.config().ip), s)
            );
        }
        let iperf_tests = services.iperf.finished.len();
        let (echo, iperf) = (&services.services, &services.iperf);
        ustack_apps::outln!(
            "tcp services: {} bytes in, {} echoed; {iperf_tests} iperf3 tests",
            echo.bytes_in,
            echo.bytes_echoed
        );
        for (bytes, crc) in &echo.discarded {
            ustack_apps::outln!("tcp discard: {bytes} bytes, crc32 {crc:08x}");
        }
        ustack_apps::outln!("{}", ustack_apps::rdma::responder_line(&services.ud));
        if let Some(e) = echo.error.as_ref().or(iperf.error.as_ref()) {
            bail!("{e}");
        }
        result?;
        Ok(ExitCode::SUCCESS)
    }
}

fn run(args: &RunArgs) -> Result<ExitCode> {
    let stop = stop_flag()?;
    if args.net.cores.is_some() {
        return run_sharded(args, &stop);
    }
    with_node(&args.net, Daemon { args, stop })
}

/// `ustack run --cores LIST`: the services on every core (echo, discard and
/// the UD responder answer on the core a flow hashes to); iperf3's port is
/// steered to the first core, where its control and data connections meet.
fn run_sharded(args: &RunArgs, stop: &AtomicBool) -> Result<ExitCode> {
    if args.tui {
        tracing::warn!("--tui is not shown with --cores: watch with `utop --telemetry PATH`");
    }
    let cores = args.net.cores.clone().map(|c| c.0).unwrap_or_default();
    let ip = args.net.config()?.ip;
    let name = format!("ustack {ip}");
    let tele = Telemetry::open(args.net.telemetry.as_deref(), &name, false)?;
    ustack_apps::outln!(
        "ustack: {ip} on {} with {} cores {cores:?}; answering ARP and ping, TCP echo on 7, discard on 9, iperf3 on 5201 (core {}), RDMA UD responder on qpn 2 (qkey 0x11111111)",
        args.net.describe(),
        cores.len(),
        cores[0],
    );
    let steer = [SteerRule {
        what: Steer::TcpPort(5201),
        to: 0,
    }];
    let results = ustack_apps::net::run_sharded(
        &args.net,
        &steer,
        args.duration.map(Duration::from_secs_f64),
        stop,
        tele.publisher(),
        |shard| DaemonApps {
            services: Services::new(),
            // Every shard listens (steering brings 5201 to shard 0); only
            // shard 0's server prints.
            iperf: IperfServer::new(5201, false),
            ud: ustack_kit::ud_ping::UdResponder::default(),
            pingpong: None,
            held: (shard.index != 0).then(Vec::new),
        },
    )?;
    drop(tele);
    let (mut bytes_in, mut echoed, mut tests) = (0, 0, 0);
    for (i, ((apps, last), core)) in results.iter().zip(&cores).enumerate() {
        if let Some(s) = last {
            ustack_apps::out!(
                "{}",
                counters(&format!("ustack {ip} core {core} (shard {i})"), s)
            );
        }
        bytes_in += apps.services.bytes_in;
        echoed += apps.services.bytes_echoed;
        tests += apps.iperf.finished.len();
        for (bytes, crc) in &apps.services.discarded {
            ustack_apps::outln!("tcp discard: {bytes} bytes, crc32 {crc:08x} (core {core})");
        }
    }
    ustack_apps::outln!("tcp services: {bytes_in} bytes in, {echoed} echoed; {tests} iperf3 tests");
    for (apps, _) in &results {
        if let Some(e) = apps.services.error.as_ref().or(apps.iperf.error.as_ref()) {
            bail!("{e}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

struct Sender<'a> {
    args: &'a SendArgs,
    stop: Arc<AtomicBool>,
}

impl NodeRunner for Sender<'_> {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        let mut app = BulkSend::new(self.args.to, self.args.bytes);
        let clock = Clock::new();
        let started = clock.now();
        let cfg = loop_config(&self.args.net, Some(self.args.timeout));
        let stop = self.stop.clone();
        runtime::run(
            &mut node,
            &mut app,
            &cfg,
            &clock,
            || stop.load(Ordering::Relaxed),
            |_| {},
        )?;
        if let Some(e) = app.error {
            bail!("{}: {e}", self.args.to);
        }
        if !app.done() {
            let to = self.args.to;
            let now = clock.now();
            let stack = &node.stack;
            let cfg = stack.config();
            let hop = if cfg.ip.contains_addr(to.ip()) {
                Some(*to.ip())
            } else {
                cfg.gateway
            };
            let resolved = hop.is_some_and(|h| {
                stack
                    .addr_ref()
                    .neighbours(now)
                    .iter()
                    .any(|(ip, _)| *ip == h)
            });
            let connected = app.transfer.started.is_some()
                && app.handle().is_some_and(|h| {
                    stack
                        .tcp_ref()
                        .status(h)
                        .is_ok_and(|s| s.state != ustack::socket::tcp::State::SynSent)
                });
            let why = match (resolved, connected) {
                (false, _) => format!(
                    "no ARP reply from {}: nothing was sent (is the host up, on this link and in {}?)",
                    hop.map_or("-".into(), |h| h.to_string()),
                    cfg.ip.network()
                ),
                (true, false) => format!(
                    "no answer to the connection request (SYN){}",
                    ustack_apps::bad_checksum_hint(stack)
                ),
                (true, true) => format!(
                    "{} of {} bytes written to the connection",
                    app.transfer.bytes, self.args.bytes
                ),
            };
            let elapsed = now.saturating_duration_since(started).as_secs_f64();
            if stop.load(Ordering::Relaxed) {
                // Ctrl-C or SIGTERM: say so, not "not finished after TIMEOUT".
                eprintln!("ustack: {to}: interrupted after {elapsed:.1} s: {why}");
                return Ok(ExitCode::from(1));
            }
            bail!("{to}: not finished after {} s: {why}", self.args.timeout);
        }
        let t = app.transfer;
        let secs = t
            .finished
            .zip(t.started)
            .map_or(0.0, |(f, s)| f.saturating_duration_since(s).as_secs_f64());
        ustack_apps::outln!(
            "sent {} bytes to {} in {:.3} s = {:.3} Gbit/s, crc32 {:08x}, {} retransmits",
            t.bytes,
            self.args.to,
            secs,
            t.bits_per_second().unwrap_or(0.0) / 1e9,
            t.crc,
            node.stack.stats().tcp.retransmits
        );
        Ok(ExitCode::SUCCESS)
    }
}

fn send(args: &SendArgs) -> Result<ExitCode> {
    let stop = stop_flag()?;
    with_node(&args.net, Sender { args, stop })
}

/// Echoes UDP datagrams back (port 7).
struct UdpEcho {
    h: Option<UdpHandle>,
    buf: Vec<u8>,
}

impl App for UdpEcho {
    fn poll(&mut self, _: Instant, stack: &mut Stack) -> Control {
        let h = match self.h {
            Some(h) => h,
            None => match stack.udp().bind(7) {
                Ok(h) => *self.h.insert(h),
                Err(_) => return Control::Exit,
            },
        };
        while let Ok(Some((n, from))) = stack.udp().recv_from(h, &mut self.buf) {
            // A full send queue drops the echo, as a UDP server would.
            let _ = stack.udp().send_to(h, from, &self.buf[..n]);
        }
        Control::Continue
    }
}

/// Sends a numbered datagram every interval and counts the echoes.
struct UdpProbe {
    dst: SocketAddrV4,
    h: Option<UdpHandle>,
    interval: Duration,
    next: Instant,
    sent: u64,
    echoed: u64,
    buf: Vec<u8>,
}

impl App for UdpProbe {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let h = match self.h {
            Some(h) => h,
            None => match stack.udp().bind(0) {
                Ok(h) => *self.h.insert(h),
                Err(_) => return Control::Exit,
            },
        };
        if now >= self.next {
            let msg = self.sent.to_be_bytes();
            if stack.udp().send_to(h, self.dst, &msg).is_ok() {
                self.sent += 1;
            }
            self.next = now + self.interval;
        }
        while let Ok(Some((n, _))) = stack.udp().recv_from(h, &mut self.buf) {
            if n == 8 {
                self.echoed += 1;
            }
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        Some(self.next)
    }
}

/// The apps of host A: a pinger, a UDP probe and a TCP bulk sender.
struct HostA {
    pinger: Pinger,
    probe: UdpProbe,
    bulk: Option<BulkSend>,
    ud: ustack_kit::ud_ping::UdPinger,
}

impl App for HostA {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let _ = self.pinger.poll(now, stack);
        let _ = self.ud.poll(now, stack);
        if let Some(b) = self.bulk.as_mut() {
            b.poll(now, stack);
        }
        self.probe.poll(now, stack)
    }
    fn poll_at(&self) -> Option<Instant> {
        let b = ustack::time::earliest(
            self.bulk.as_ref().and_then(App::poll_at),
            self.ud.next_wakeup(),
        );
        ustack::time::earliest(
            ustack::time::earliest(self.pinger.poll_at(), self.probe.poll_at()),
            b,
        )
    }
}

/// The apps of host B: UDP echo and a TCP bulk receiver.
struct HostB {
    echo: UdpEcho,
    bulk: BulkRecv,
    ud: ustack_kit::ud_ping::UdResponder,
}

impl App for HostB {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        self.bulk.poll(now, stack);
        self.ud.poll(now, stack);
        self.echo.poll(now, stack)
    }
}

fn demo(args: &DemoArgs) -> Result<ExitCode> {
    let tui = !args.no_tui && ustack_apps::telemetry::can_show_tui();
    let link = LinkConfig {
        loss: args.loss / 100.0,
        delay: Duration::from_secs_f64(args.delay / 1e3),
        seed: args.seed,
        ..LinkConfig::default()
    };
    let mut net = SimNet::new(link);
    let a = net.add(host_config(1));
    let b = net.add(host_config(2));
    let b_ip = net.nodes[b].stack.ip();
    let a_ip = net.nodes[a].stack.ip();
    let tele_a = Telemetry::open(args.telemetry.as_deref(), &format!("demo A {a_ip}"), tui)?;
    let path_b = args.telemetry.as_deref().map(|p| sibling(p, "b"));
    let tele_b = Telemetry::open(path_b.as_deref(), &format!("demo B {b_ip}"), false)?;

    let interval = Duration::from_secs_f64(args.interval / 1e3);
    let mut ping_cfg = PingerConfig::new(b_ip);
    ping_cfg.interval = interval;
    ping_cfg.timeout = Duration::from_secs(1).max(interval * 2);
    let mut host_a = HostA {
        pinger: Pinger::new(ping_cfg).quiet(),
        probe: UdpProbe {
            dst: SocketAddrV4::new(b_ip, 7),
            h: None,
            interval,
            next: Instant::ZERO,
            sent: 0,
            echoed: 0,
            buf: vec![0; 2048],
        },
        bulk: (args.tcp_mib > 0)
            .then(|| BulkSend::new(SocketAddrV4::new(b_ip, 5001), args.tcp_mib << 20)),
        ud: {
            let dst = ustack::socket::ud::UdAddr {
                ip: b_ip.into(),
                qpn: ustack::socket::ud::RESPONDER_QPN,
            };
            let mut c = ustack_kit::ud_ping::UdPingerConfig::new(dst);
            c.interval = interval;
            c.timeout = Duration::from_secs(1).max(interval * 2);
            ustack_kit::ud_ping::UdPinger::new(c).quiet()
        },
    };
    let mut host_b = HostB {
        echo: UdpEcho {
            h: None,
            buf: vec![0; 65_536],
        },
        bulk: BulkRecv::new(5001, 4),
        ud: ustack_kit::ud_ping::UdResponder::default(),
    };

    ustack_apps::outln!(
        "ustack demo: {a_ip} <-> {b_ip} on the sim link (loss {}% and delay {} ms each way), {} s",
        args.loss,
        args.delay,
        args.duration
    );
    let clock = Clock::new();
    let total = Duration::from_secs_f64(args.duration);
    let mut elapsed = Duration::ZERO;
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = tui
        .then(|| tele_a.spawn_tui(&format!("ustack demo, host A {a_ip}"), stop.clone()))
        .flatten();
    let (stats_interval, mut next_stats) = (LoopConfig::default().stats_interval, clock.now());
    while elapsed < total && !stop.load(Ordering::Relaxed) {
        let slice = Duration::from_secs(1).min(total - elapsed);
        ustack_runtime::poll::run_sim_realtime(
            &mut net,
            &clock,
            slice,
            &mut [&mut host_a, &mut host_b],
            |n| {
                if n.now >= next_stats && (tele_a.enabled() || tele_b.enabled()) {
                    tele_a.publish(&n.nodes[a].snapshot(n.now));
                    tele_b.publish(&n.nodes[b].snapshot(n.now));
                    next_stats = n.now + stats_interval;
                }
                stop.load(Ordering::Relaxed)
            },
        );
        elapsed += slice;
        if monitor.is_some() {
            continue; // the monitor owns the terminal
        }
        let s = host_a.pinger.summary();
        let tcp = tcp_progress(&host_a, &net);
        ustack_apps::outln!(
            "[{:5.1}s] ping {}/{} replies ({:.1}% loss) rtt avg {} ms | udp echo {}/{}{tcp}",
            elapsed.as_secs_f64(),
            s.received,
            s.transmitted,
            s.loss_percent(),
            ms(s.rtt.avg()),
            host_a.probe.echoed,
            host_a.probe.sent
        );
    }
    drop((tele_a, tele_b)); // ends the monitor, removes the sockets
    if let Some(m) = monitor {
        let _ = m.join();
    }
    // Let replies in flight arrive before the summary: host A sends nothing
    // new, and its outstanding pings get up to a second (more than the
    // link's round trip) to be answered, even on a loaded machine.
    let grace = Duration::from_millis(200) + Duration::from_secs_f64(args.delay * 2.0 / 1e3);
    let mut host_a_tail = host_a;
    host_a_tail.pinger.stop_sending();
    let give_up = clock.now() + Duration::from_secs(1) + grace;
    loop {
        ustack_runtime::poll::run_sim_realtime(
            &mut net,
            &clock,
            grace,
            &mut [&mut (), &mut host_b],
            |n| n.link.in_flight() == 0,
        );
        let _ = host_a_tail
            .pinger
            .poll(clock.now(), &mut net.nodes[a].stack);
        let s = host_a_tail.pinger.summary();
        if s.received + s.errors >= s.transmitted || clock.now() >= give_up {
            break;
        }
    }
    host_a_tail.poll(clock.now(), &mut net.nodes[a].stack);

    let s = host_a_tail.pinger.summary();
    ustack_apps::outln!();
    ustack_apps::outln!("--- {b_ip} ping statistics ---");
    ustack_apps::outln!(
        "{} packets transmitted, {} received, {}% packet loss",
        s.transmitted,
        s.received,
        fmt_loss(s.loss_percent())
    );
    if s.rtt.count > 0 {
        ustack_apps::outln!(
            "rtt min/avg/max/mdev = {}/{}/{}/{} ms",
            ms(s.rtt.min),
            ms(s.rtt.avg()),
            ms(s.rtt.max),
            ms(s.rtt.mdev())
        );
    }
    ustack_apps::outln!(
        "udp echo: {} sent, {} echoed",
        host_a_tail.probe.sent,
        host_a_tail.probe.echoed
    );
    let u = host_a_tail.ud.summary();
    let p = |q| u.percentile(q).map(ms).unwrap_or_else(|| "-".into());
    ustack_apps::outln!(
        "rdma ud ping: {} sent, {} answered, {}% loss, rtt p50/p99 {}/{} ms (RoCEv2 UD to qpn {})",
        u.transmitted,
        u.received,
        fmt_loss(u.loss_percent()),
        p(0.5),
        p(0.99),
        ustack::socket::ud::RESPONDER_QPN
    );
    if let Some(b) = host_a_tail.bulk.as_ref() {
        match (b.done(), host_b.bulk.completed.first()) {
            (true, Some(t)) => {
                let ok = t.bytes == b.transfer.bytes
                    && t.crc == b.transfer.crc
                    && host_b.bulk.corrupt_bytes == 0;
                ustack_apps::outln!(
                    "tcp: {} MiB in {:.3} s = {:.2} Gbit/s goodput, {} retransmits, {}",
                    t.bytes >> 20,
                    b.transfer
                        .finished
                        .zip(b.transfer.started)
                        .map_or(0.0, |(f, s)| f.saturating_duration_since(s).as_secs_f64()),
                    b.transfer.bits_per_second().unwrap_or(0.0) / 1e9,
                    net.nodes[a].stack.stats().tcp.retransmits,
                    if ok {
                        "byte-exact (CRC-32 matches)"
                    } else {
                        "MISMATCH"
                    }
                );
                if !ok {
                    bail!(
                        "tcp transfer was not byte-exact: received {} bytes crc {:08x} ({} corrupt, errors {:?}), sent {} bytes crc {:08x}",
                        t.bytes,
                        t.crc,
                        host_b.bulk.corrupt_bytes,
                        host_b.bulk.errors,
                        b.transfer.bytes,
                        b.transfer.crc
                    );
                }
            }
            _ => ustack_apps::outln!(
                "tcp: transfer not finished within the run ({} of {} MiB sent); try a longer --duration or a smaller --tcp-mib",
                b.transfer.bytes >> 20,
                args.tcp_mib
            ),
        }
    }
    let link = net.link.stats();
    ustack_apps::outln!(
        "sim link: {} frames sent, {} delivered, {} lost",
        link.sent,
        link.delivered,
        link.lost
    );
    ustack_apps::outln!();
    let now = clock.now();
    ustack_apps::out!(
        "{}",
        counters(&format!("host A {a_ip}"), &net.nodes[a].snapshot(now))
    );
    ustack_apps::out!(
        "{}",
        counters(&format!("host B {b_ip}"), &net.nodes[b].snapshot(now))
    );
    // Frames still on the wire hold buffers; everything else must be back.
    let in_flight = net.link.in_flight();
    let in_use = net.pools_in_use();
    if in_use > in_flight {
        bail!("buffer leak: {in_use} buffers in use with {in_flight} frames in flight");
    }
    if s.transmitted == 0 {
        return Err(anyhow::anyhow!("no ping was sent")).context("demo did not run");
    }
    Ok(if s.received > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn tcp_progress(a: &HostA, net: &SimNet) -> String {
    let Some(b) = a.bulk.as_ref() else {
        return String::new();
    };
    let secs = b.transfer.started.map_or(0.0, |s| {
        b.transfer
            .finished
            .unwrap_or(net.now)
            .saturating_duration_since(s)
            .as_secs_f64()
    });
    let acked = b.transfer.bytes.saturating_sub(
        b.handle()
            .and_then(|h| net.nodes[0].stack.tcp_ref().status(h).ok())
            .map_or(0, |s| s.unacked as u64),
    );
    let gbps = if secs > 0.0 {
        acked as f64 * 8.0 / secs / 1e9
    } else {
        0.0
    };
    let tag = if b.done() { " done" } else { "" };
    format!(" | tcp {} MiB {gbps:.2} Gbit/s{tag}", acked >> 20)
}

fn fmt_loss(p: f64) -> String {
    if p == p.trunc() {
        format!("{p:.0}")
    } else {
        format!("{p:.3}")
    }
}

#[cfg(test)]
mod test {
    use super::{ProgramKind, preload_lib, program_kind};

    #[test]
    fn the_preload_library_is_found_beside_ustack_or_installed() {
        let root = tempfile::tempdir().expect("a temp dir");
        let bin = root.path().join("usr/bin");
        let lib = root.path().join("usr/lib/ustack");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&lib).unwrap();
        let exe = bin.join("ustack");
        // Neither: the one beside is named.
        assert_eq!(preload_lib(&exe), bin.join("libustack_preload.so"));
        std::fs::write(lib.join("libustack_preload.so"), b"").unwrap();
        assert_eq!(
            preload_lib(&exe),
            bin.join("../lib/ustack/libustack_preload.so")
        );
        // A build's own library beside the binary comes first.
        std::fs::write(bin.join("libustack_preload.so"), b"").unwrap();
        assert_eq!(preload_lib(&exe), bin.join("libustack_preload.so"));
    }

    #[test]
    fn dynamic_programs_scripts_and_other_files_are_run() {
        // This test binary is Rust, linked dynamically: an ELF with an
        // interpreter and without Go's sections.
        let me = std::env::current_exe().expect("the test binary");
        assert_eq!(program_kind(&me), ProgramKind::Other);
        let dir = tempfile::tempdir().expect("a temp dir");
        let text = dir.path().join("script.sh");
        std::fs::write(&text, "#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(program_kind(&text), ProgramKind::Other);
        let short = dir.path().join("short");
        std::fs::write(&short, b"\x7fELF").unwrap();
        assert_eq!(program_kind(&short), ProgramKind::Other);
        assert_eq!(
            program_kind(&dir.path().join("missing")),
            ProgramKind::Other
        );
    }
}
