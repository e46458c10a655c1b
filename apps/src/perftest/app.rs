//! The perftest apps on any transport: a client (one session against a
//! perftest server), a server (perftest clients one after another), and
//! the front end that prints their lines for `uperf`.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;

use anyhow::Result;
use ustack::node::{App, Control, Node};
use ustack::phy::device::Device;
use ustack::socket::tcp::ListenHandle;
use ustack::wire::exchange::PERFTEST_PORT;
use ustack::{Instant, Stack};
use ustack_runtime::LoopConfig;

use super::exchange::{Session, SessionReport, Transport};
use crate::net::NodeRunner;
use crate::oob::MsgConn;

/// line once it finished (if its test started); whether it finished.
fn drive<T: Transport>(
    s: &mut Session<T>,
    now: Instant,
    stack: &mut Stack,
    output: &mut Vec<String>,
) -> bool {
    s.poll(now, stack);
    output.append(s.output());
    if !s.finished() {
        return false;
    }
    if s.report().started() {
        output.push(s.report().summary_line());
    }
    true
}

/// A perftest client: one session against a perftest server.
#[derive(Debug)]
pub struct Client<T: Transport> {
    cfg: T::Config,
    server: SocketAddrV4,
    session: Option<Session<T>>,
    /// Lines to print (banner, addresses, table, summary), in order.
    pub output: Vec<String>,
    /// The session's report, once it ended.
    pub report: Option<T::Report>,
}

impl<T: Transport> Client<T> {
    /// A client of the perftest server at `server`.
    pub fn new(cfg: T::Config, server: SocketAddrV4) -> Self {
        Client {
            cfg,
            server,
            session: None,
            output: Vec::new(),
            report: None,
        }
    }

    /// The session ended (see [`report`](Self::report)).
    pub fn done(&self) -> bool {
        self.report.is_some()
    }

    /// The data phase runs (the loop should busy-poll).
    pub fn in_run(&self) -> bool {
        self.session.as_ref().is_some_and(Session::in_run)
    }
}

impl<T: Transport> App for Client<T> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.report.is_some() {
            return Control::Exit;
        }
        if self.session.is_none() {
            match MsgConn::connect(now, stack, self.server) {
                Ok(conn) => {
                    self.session = Some(Session::open(
                        self.cfg.clone(),
                        true,
                        conn,
                        Some(self.server),
                    ));
                }
                Err(e) => {
                    let why = format!("{}: {e}", self.server);
                    self.report = Some(T::unconnected(&self.cfg, why));
                    return Control::Exit;
                }
            }
        }
        let Some(s) = self.session.as_mut() else {
            return Control::Continue;
        };
        if drive(s, now, stack, &mut self.output) {
            self.report = Some(s.report().clone());
            return Control::Exit;
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        match &self.session {
            None if self.report.is_none() => Some(Instant::ZERO),
            None => None,
            Some(s) => s.poll_at(),
        }
    }
}

/// The server's waiting banner, as perftest prints it.
pub const WAITING: &str = "\n************************************\n* Waiting for client to connect... *\n************************************";

/// A perftest server: perftest clients, one after another.
#[derive(Debug)]
pub struct Server<T: Transport> {
    cfg: T::Config,
    port: u16,
    one_off: bool,
    listener: Option<ListenHandle>,
    session: Option<Session<T>>,
    /// Lines to print, in order.
    pub output: Vec<String>,
    /// One report per client served.
    pub reports: Vec<T::Report>,
    /// Why a client's session failed, one line each, as they come (the
    /// server goes on with the next client unless it is one-off).
    pub errors: Vec<String>,
    /// Listening failed.
    pub error: Option<String>,
    exit: bool,
}

impl<T: Transport> Server<T> {
    /// A server on TCP `port`; with `one_off` it exits after one client.
    pub fn new(cfg: T::Config, port: u16, one_off: bool) -> Self {
        Server {
            cfg,
            port,
            one_off,
            listener: None,
            session: None,
            output: Vec::new(),
            reports: Vec::new(),
            errors: Vec::new(),
            error: None,
            exit: false,
        }
    }

    /// A session's data phase runs (the loop should busy-poll).
    pub fn in_run(&self) -> bool {
        self.session.as_ref().is_some_and(Session::in_run)
    }

    /// The server stopped (one-off done, or listening failed).
    pub fn done(&self) -> bool {
        self.exit
    }
}

impl<T: Transport> App for Server<T> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        if self.exit {
            return Control::Exit;
        }
        let Some(l) = self.listener else {
            match stack.tcp().listen(self.port, 1) {
                Ok(l) => {
                    self.listener = Some(l);
                    self.output.push(WAITING.to_string());
                }
                Err(e) => {
                    self.error = Some(format!("listening on TCP port {}: {e}", self.port));
                    self.exit = true;
                    return Control::Exit;
                }
            }
            return Control::Continue;
        };
        if self.session.is_none() {
            if let Ok(Some(h)) = stack.tcp().accept(l) {
                let conn = MsgConn::accepted(stack, h);
                self.session = Some(Session::open(self.cfg.clone(), false, conn, None));
            }
        }
        let Some(s) = self.session.as_mut() else {
            return Control::Continue;
        };
        if drive(s, now, stack, &mut self.output) {
            if let Some(e) = s.report().failure() {
                let name = T::test_name(&self.cfg);
                self.errors.push(format!("perftest {name} server: {e}"));
            }
            self.reports.push(s.report().clone());
            self.session = None;
            if self.one_off {
                stack.tcp().unlisten(l);
                self.exit = true;
                return Control::Exit;
            }
            self.output.push(WAITING.to_string());
        }
        Control::Continue
    }

    fn poll_at(&self) -> Option<Instant> {
        match &self.session {
            _ if self.exit => None,
            Some(s) => s.poll_at(),
            None => None,
        }
    }
}

// ------------------------------------------------------------ front end

/// Where `uperf --rdma --perftest` (or `--rdma rc`) runs.
#[derive(Debug, Clone)]
pub enum PerftestRole {
    /// Connect to the perftest server at this address.
    Client(SocketAddrV4),
    /// Listen on this TCP port; `one_off` exits after one client.
    Server {
        /// TCP port.
        port: u16,
        /// Exit after one client.
        one_off: bool,
    },
}

/// Runs a perftest test on a node.
#[derive(Debug)]
pub struct User<T: Transport> {
    /// The test's settings.
    pub cfg: T::Config,
    /// Client or server.
    pub role: PerftestRole,
    /// The poll loop's settings.
    pub lcfg: LoopConfig,
}

/// Prints an app's lines as they come; busy-polls during data phases (the
/// latency figures are taken on the loop's clock).
struct Front<A> {
    app: A,
}

trait PerftestApp: App {
    fn lines(&mut self) -> Vec<String>;
    fn error_lines(&mut self) -> Vec<String> {
        Vec::new()
    }
    fn busy(&self) -> bool;
}

impl<T: Transport> PerftestApp for Client<T> {
    fn lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.output)
    }
    fn busy(&self) -> bool {
        self.in_run()
    }
}

impl<T: Transport> PerftestApp for Server<T> {
    fn lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.output)
    }
    fn error_lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.errors)
    }
    fn busy(&self) -> bool {
        self.in_run()
    }
}

impl<A: PerftestApp> Front<A> {
    fn print(&mut self) {
        for line in self.app.lines() {
            crate::outln!("{line}");
        }
        for e in self.app.error_lines() {
            eprintln!("uperf: error - {e}");
        }
    }
}

impl<A: PerftestApp> App for Front<A> {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let c = self.app.poll(now, stack);
        self.print();
        c
    }
    fn poll_at(&self) -> Option<Instant> {
        if self.app.busy() {
            Some(Instant::ZERO)
        } else {
            self.app.poll_at()
        }
    }
}

impl<T: Transport> NodeRunner for User<T> {
    type Output = ExitCode;
    type Error = anyhow::Error;
    fn run<D>(self, mut node: Node<D>) -> Result<ExitCode>
    where
        D: Device + Send + 'static,
        D::Buf: Send,
    {
        T::check(&self.cfg, &node.stack)?;
        let name = T::test_name(&self.cfg);
        match self.role {
            PerftestRole::Client(server) => {
                let mut front = Front {
                    app: Client::<T>::new(self.cfg, server),
                };
                crate::run_app(&mut node, &mut front, &self.lcfg, None)?;
                front.print();
                match front.app.report.as_ref().map(|r| r.failure()) {
                    Some(None) => Ok(ExitCode::SUCCESS),
                    Some(Some(e)) => {
                        eprintln!("uperf: error - perftest {name} client: {e}");
                        Ok(ExitCode::from(1))
                    }
                    None => {
                        eprintln!("uperf: error - perftest {name} client: interrupted");
                        Ok(ExitCode::from(1))
                    }
                }
            }
            PerftestRole::Server { port, one_off } => {
                let mut front = Front {
                    app: Server::<T>::new(self.cfg, port, one_off),
                };
                crate::run_app(&mut node, &mut front, &self.lcfg, None)?;
                front.print();
                if let Some(e) = &front.app.error {
                    eprintln!("uperf: error - {e}");
                    return Ok(ExitCode::from(1));
                }
                // One-off: the client's test decides; otherwise the server
                // ran until stopped and said what failed as it went.
                let failed = front.app.reports.iter().any(|r| r.failure().is_some());
                Ok(if one_off && (failed || front.app.reports.is_empty()) {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                })
            }
        }
    }
}

/// The IPv4 address and port of a perftest server.
pub fn server_addr(host: Ipv4Addr, port: Option<u16>) -> SocketAddrV4 {
    SocketAddrV4::new(host, port.unwrap_or(PERFTEST_PORT))
}
