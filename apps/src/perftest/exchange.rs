//! The engine every perftest session runs on, whatever its transport: the
//! out-of-band exchange over the stack's own TCP ([`Exchange`]), the
//! session's steps and timeouts ([`Session`]), and what a transport's data
//! phase must provide ([`Transport`]).
//!
//! Steps, as perftest's `main` takes them: the preamble (version, page and
//! cache-line size, MTU), key exchanges (`Key(0)`...), then per size a sync
//! before the data phase (`PreRun`), the data phase (`Run`) and perhaps a
//! sync after it (`AfterRun`); RC's write/read bw add a sync after the test
//! (`EndSync`) and the report exchange (`Reports`); last the close exchange
//! (a key exchange and `"done\0"`), a linger until that is acknowledged,
//! or RC's write_lat drain. The client writes then reads each message and
//! the server reads then writes (`ctx_hand_shake`,
//! `ctx_xchg_data_ethernet`). Which step follows a key exchange, a data
//! phase or a size is the transport's choice.

use std::net::{IpAddr, SocketAddrV4};
use std::time::Duration;

use anyhow::Result;
use ustack::socket::tcp::State;
use ustack::wire::exchange::{
    DONE, KEY_MSG_LEN, KeyMsg, VERSION_LEN, gid_ip, ip_gid, mtu_bytes, mtu_enum, mtu_msg,
    parse_mtu_msg, parse_version, version_msg,
};
use ustack::{Instant, Stack};

use crate::oob::{MsgConn, OobError};

/// perftest's page size (`cycle_buffer`) and cache line, as exchanged.
pub(crate) const CYCLE_BUFFER: u32 = 4096;
pub(crate) const CACHE_LINE: u32 = 64;
/// How long to wait for our last messages (close key, "done") to be
/// acknowledged before closing the connection.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// Why a session stops: a message for the user.
pub(crate) type Fail = String;

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Version,
    CycleBuffer,
    CacheLine,
    Mtu,
    Key(u8),
    PreRun,
    Run,
    AfterRun,
    EndSync,
    Reports(u8),
    Close,
    Linger,
    Drain,
    Finished,
}

impl Step {
    fn what(self) -> &'static str {
        match self {
            Step::Version => "the version exchange",
            Step::CycleBuffer | Step::CacheLine => "the system data exchange",
            Step::Mtu => "the MTU exchange",
            Step::Key(_) => "the key exchange",
            Step::PreRun => "the sync before the test",
            Step::Run => "the test",
            Step::AfterRun => "the sync after a size",
            Step::EndSync => "the sync after the test",
            Step::Reports(_) => "the report exchange",
            Step::Close => "the close exchange",
            Step::Linger | Step::Drain | Step::Finished => "closing",
        }
    }
}

/// One lock-step exchange of `len`-byte messages, as perftest's
/// `ctx_xchg_data_ethernet` and `ctx_hand_shake`: the client writes `mine`
/// (once: `wrote` remembers it) then reads, the server reads then writes.
pub(crate) fn lockstep(
    conn: &mut MsgConn,
    stack: &Stack,
    client: bool,
    wrote: &mut bool,
    mine: &[u8],
    len: usize,
) -> Result<Option<Vec<u8>>, OobError> {
    if client && !*wrote {
        conn.send(mine);
        *wrote = true;
    }
    let got = conn.recv_exact(stack, len)?;
    if got.is_some() && !client {
        conn.send(mine);
    }
    Ok(got)
}

/// The peer's version message: perftest 5.70 or later.
pub(crate) fn check_peer_version(b: &[u8]) -> Result<(), Fail> {
    match parse_version(b) {
        Some(v) if v >= 5.70 => Ok(()),
        Some(v) => Err(format!(
            "the peer's perftest version {v} is older than 5.70, which this exchange needs"
        )),
        None => Err(format!(
            "the peer is not perftest: its first message is not a version ({:?})",
            String::from_utf8_lossy(b)
        )),
    }
}

/// The MTU both sides use: the smaller of ours (`cap` bytes) and the
/// peer's message.
pub(crate) fn negotiate_mtu(b: &[u8], cap: usize) -> usize {
    let local = mtu_enum(cap);
    let curr = match parse_mtu_msg(b) {
        Some(remote) => local.min(mtu_enum(remote)),
        None => local,
    };
    mtu_bytes(curr).unwrap_or(cap).min(cap)
}

/// A peer's key message, or why it is not one (`what`: the step).
pub(crate) fn parse_peer_key(b: &[u8], what: &str) -> Result<KeyMsg, Fail> {
    KeyMsg::parse(b).ok_or_else(|| {
        format!(
            "the peer is not perftest: expected a key message in {what}, got {:?}",
            String::from_utf8_lossy(&b[..b.len().min(40)])
        )
    })
}

/// The address of a peer's key: IPv4 for an IPv4-mapped GID, else
/// IPv6; it must be of the family of ours (`me`), as perftest requires.
pub(crate) fn peer_ip(k: &KeyMsg, me: &KeyMsg) -> Result<IpAddr, Fail> {
    let ip = gid_ip(&k.gid).ok_or("the peer's GID is all zeros: it has no RoCEv2 address")?;
    let ours = gid_ip(&me.gid).is_some_and(|m| m.is_ipv6());
    if ip.is_ipv6() != ours {
        let (theirs, mine) = if ours {
            ("IPv4", "IPv6 (--ipv6)")
        } else {
            ("IPv6", "IPv4")
        };
        return Err(format!(
            "Found Incompatibility issue with GID types: the peer's GID is {theirs} and ours {mine}; \
             give both sides the same family (perftest: -x with the GID index, --ipv6)"
        ));
    }
    Ok(ip)
}

/// The data phase of one size, as both transports count it; `E` is what
/// one transport adds.
#[derive(Debug)]
pub(crate) struct Run<E> {
    pub(crate) size: usize,
    /// Work requests posted.
    pub(crate) posted: u64,
    /// Work requests known complete (RC: a signaled completion completes
    /// every earlier one).
    pub(crate) completed: u64,
    /// Messages received (RC write_lat: counts seen).
    pub(crate) received: u64,
    /// Receives posted for this size.
    pub(crate) recv_posted: u64,
    pub(crate) tposted: Vec<Instant>,
    /// Completion times (RC: by work request, only signaled ones set).
    pub(crate) tcompleted: Vec<Instant>,
    pub(crate) first_rx: Option<Instant>,
    pub(crate) last_rx: Option<Instant>,
    /// Since when nothing moved (last send, completion or receive).
    pub(crate) waiting_since: Instant,
    pub(crate) extra: E,
}

/// How long the exchange waits: for each message, and for the TCP
/// connection (client).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Longest wait for each exchange message.
    pub exchange: Duration,
    /// Longest wait for the TCP connection.
    pub connect: Duration,
}

/// The out-of-band half of a session: perftest's messages over the
/// stack's own TCP, the current step, and the lines to print.
#[derive(Debug)]
pub struct Exchange {
    pub(crate) client: bool,
    conn: MsgConn,
    connect_to: Option<SocketAddrV4>,
    pub(crate) step: Step,
    wrote: bool,
    since: Instant,
    /// Our key message (set by the transport's setup).
    pub(crate) me: KeyMsg,
    /// Our GID is an IPv6 address (`--ipv6`, perftest's flag); a server
    /// also answers a peer whose first key carries an IPv6 GID with one.
    ipv6_gid: bool,
    /// Lines to print, in order, not yet taken.
    pub(crate) output: Vec<String>,
    timeouts: Timeouts,
    closed_at_close: Option<&'static str>,
}

impl Exchange {
    /// Move to `step`: its first message is yet to be written.
    pub(crate) fn goto(&mut self, now: Instant, step: Step) {
        self.step = step;
        self.wrote = false;
        self.since = now;
    }

    /// One lock-step exchange of `len`-byte messages: the client writes
    /// `mine` then reads, the server reads then writes.
    pub(crate) fn xchg(
        &mut self,
        stack: &Stack,
        mine: &[u8],
        len: usize,
    ) -> Result<Option<Vec<u8>>, Fail> {
        lockstep(
            &mut self.conn,
            stack,
            self.client,
            &mut self.wrote,
            mine,
            len,
        )
        .map_err(|e| self.oob_fail(&e))
    }

    /// Our GID: our IPv4 address mapped, or with `--ipv6` our IPv6
    /// address (a global one before the link-local).
    pub(crate) fn our_gid(&self, stack: &Stack) -> Result<[u8; 16], Fail> {
        crate::pingpong::our_gid_addr(stack, self.ipv6_gid, None).map(ip_gid)
    }

    /// One key exchange: ours for the peer's. A server reads first, so
    /// its key's GID follows the family of the client's.
    pub(crate) fn key(&mut self, stack: &Stack) -> Result<Option<KeyMsg>, Fail> {
        if !self.client {
            let got = self
                .conn
                .recv_exact(stack, KEY_MSG_LEN)
                .map_err(|e| self.oob_fail(&e))?;
            let Some(b) = got else {
                return Ok(None);
            };
            let k = parse_peer_key(&b, self.step.what())?;
            let theirs = gid_ip(&k.gid).is_some_and(|ip| ip.is_ipv6());
            if theirs != self.ipv6_gid {
                self.ipv6_gid = theirs;
                self.me.gid = self.our_gid(stack)?;
            }
            self.conn.send(&self.me.to_wire());
            return Ok(Some(k));
        }
        let mine = self.me.to_wire();
        match self.xchg(stack, &mine, KEY_MSG_LEN)? {
            Some(b) => parse_peer_key(&b, self.step.what()).map(Some),
            None => Ok(None),
        }
    }

    fn oob_fail(&self, e: &OobError) -> Fail {
        match (e, self.closed_at_close) {
            (OobError::Closed, Some(why)) if self.client && self.step == Step::Close => {
                why.to_string()
            }
            (OobError::Closed, _) => {
                format!("the peer closed the connection during {}", self.step.what())
            }
            (e, _) => format!("{} (during {})", e, self.step.what()),
        }
    }
}

/// What a perftest session's report tells the apps.
pub trait SessionReport {
    /// The data phase (or the wait for it) started.
    fn started(&self) -> bool;
    /// The reconciliation line.
    fn summary_line(&self) -> String;
    /// What failed, or which messages are missing; `None` on success.
    fn failure(&self) -> Option<String>;
    /// Records why the session failed (the first reason stays).
    fn set_error(&mut self, why: String);
}

/// Implements [`SessionReport`] for a report with the fields `started`
/// and `error` and the methods `summary_line` and `failure`.
macro_rules! session_report {
    ($report:ty) => {
        impl $crate::perftest::SessionReport for $report {
            fn started(&self) -> bool {
                self.started
            }
            fn summary_line(&self) -> String {
                <$report>::summary_line(self)
            }
            fn failure(&self) -> Option<String> {
                <$report>::failure(self)
            }
            fn set_error(&mut self, why: String) {
                self.error.get_or_insert(why);
            }
        }
    };
}
pub(crate) use session_report;

/// A perftest transport's side of a session: its settings and report, its
/// queue pair and buffers, the steps it chooses after a key exchange, a
/// data phase or a size, and the data phase itself (UD:
/// [`super::Ud`], RC: [`super::rc::Rc`]).
pub trait Transport: std::fmt::Debug + Sized {
    /// The test's settings.
    type Config: Clone + std::fmt::Debug;
    /// What one session did.
    type Report: SessionReport + Clone + std::fmt::Debug;
    /// What a client says when the server closes the connection instead
    /// of answering the close exchange (`None`: the general line).
    const CLOSED_AT_CLOSE: Option<&'static str> = None;

    /// The transport's side of a new session.
    fn new(cfg: Self::Config, client: bool) -> Self;
    /// The client's report when it could not connect: `why`.
    fn unconnected(cfg: &Self::Config, why: String) -> Self::Report {
        let mut t = Self::new(cfg.clone(), true);
        t.report_mut().set_error(why);
        t.report().clone()
    }
    /// The test's name (`send_bw`, ...), for the error lines.
    fn test_name(cfg: &Self::Config) -> String;
    /// Refuse settings perftest would refuse, before touching the network.
    fn check(cfg: &Self::Config, stack: &Stack) -> Result<()>;
    /// The exchange's waits.
    fn timeouts(cfg: &Self::Config) -> Timeouts;
    /// Our GID is IPv6 (`--ipv6`).
    fn ipv6_gid(cfg: &Self::Config) -> bool;
    /// How long the current step may wait where that is not the exchange
    /// timeout (the peer's data phase, a drain).
    fn step_wait(&self, x: &Exchange) -> Option<Duration>;
    /// Once the MTU is known: the sizes, the QP and buffers, our key
    /// (`x.me`), the banner; then to the first key exchange.
    fn setup(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
        mtu: usize,
    ) -> Result<(), Fail>;
    /// The peer's key of exchange `i` came.
    fn on_key(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &mut Stack,
        i: u8,
        k: KeyMsg,
    ) -> Result<(), Fail>;
    /// The sync before a size's data phase is done: start it.
    fn start_run(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail>;
    /// One turn of the data phase.
    fn run_turn(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail>;
    /// The sync after a size is done: the next size, or the end.
    fn next_size(&mut self, x: &mut Exchange, now: Instant, stack: &mut Stack) -> Result<(), Fail>;
    /// Exchange `i` of the bw report (RC write/read bw).
    fn report_exchange(
        &mut self,
        x: &mut Exchange,
        now: Instant,
        stack: &Stack,
        i: u8,
    ) -> Result<(), Fail> {
        let _ = (x, now, stack, i);
        Ok(())
    }
    /// The close exchange is done ("done" is on its way).
    fn on_close(&mut self, x: &mut Exchange) {
        let _ = x;
    }
    /// When the data phase gives up without progress.
    fn run_deadline(&self) -> Option<Instant>;
    /// The session ends: free the QP and buffers (noting their state).
    fn release(&mut self, stack: &mut Stack);
    /// What the session did so far.
    fn report(&self) -> &Self::Report;
    /// The same, to record a failure.
    fn report_mut(&mut self) -> &mut Self::Report;
}

/// One perftest connection, either side (driven by
/// [`Client`](super::Client) and [`Server`](super::Server)): the exchange
/// and the transport's side.
#[derive(Debug)]
pub struct Session<T: Transport> {
    x: Exchange,
    t: T,
    started: bool,
}

impl<T: Transport> Session<T> {
    /// A session over `conn`: the client's (connected to `to`) or the
    /// server's.
    pub fn open(cfg: T::Config, client: bool, conn: MsgConn, to: Option<SocketAddrV4>) -> Self {
        let x = Exchange {
            client,
            conn,
            connect_to: to,
            step: Step::Version,
            wrote: false,
            since: Instant::ZERO,
            me: KeyMsg::default(),
            ipv6_gid: T::ipv6_gid(&cfg),
            output: Vec::new(),
            timeouts: T::timeouts(&cfg),
            closed_at_close: T::CLOSED_AT_CLOSE,
        };
        Session {
            x,
            t: T::new(cfg, client),
            started: false,
        }
    }

    /// One turn of the session.
    pub fn poll(&mut self, now: Instant, stack: &mut Stack) {
        if self.x.step == Step::Finished {
            return;
        }
        if !self.started {
            self.started = true;
            self.x.since = now;
        }
        if let Err(why) = self.turn(now, stack) {
            self.t.report_mut().set_error(why);
            self.end(now, stack);
        }
    }

    /// When the session wants its next turn.
    pub fn poll_at(&self) -> Option<Instant> {
        match self.x.step {
            Step::Finished => None,
            Step::Run => self.t.run_deadline(),
            _ => Some(self.x.since + self.step_timeout()),
        }
    }

    /// The session ended (its report is final).
    pub fn finished(&self) -> bool {
        self.x.step == Step::Finished
    }

    /// The data phase runs (the loop should busy-poll).
    pub fn in_run(&self) -> bool {
        self.x.step == Step::Run
    }

    /// Lines to print, in order, not yet taken.
    pub fn output(&mut self) -> &mut Vec<String> {
        &mut self.x.output
    }

    /// What the session did so far.
    pub fn report(&self) -> &T::Report {
        self.t.report()
    }

    /// How long the current exchange step may wait.
    fn step_timeout(&self) -> Duration {
        match self.x.step {
            Step::Linger => LINGER,
            _ => self
                .t
                .step_wait(&self.x)
                .unwrap_or(self.x.timeouts.exchange),
        }
    }

    fn end(&mut self, now: Instant, stack: &mut Stack) {
        self.t.release(stack);
        let _ = self.x.conn.poll(stack);
        let _ = stack.tcp().close(now, self.x.conn.handle());
        self.x.step = Step::Finished;
    }

    fn turn(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let closing = |s: Step| matches!(s, Step::Linger | Step::Drain);
        if let Err(e) = self.x.conn.poll(stack) {
            if closing(self.x.step) {
                // The peer is gone after the close exchange: nothing lost.
                self.end(now, stack);
                return Ok(());
            }
            return Err(self.x.oob_fail(&e));
        }
        if let Some(to) = self.x.connect_to {
            let syn_sent = stack
                .tcp_ref()
                .status(self.x.conn.handle())
                .is_ok_and(|s| s.state == State::SynSent);
            if syn_sent {
                let limit = self.x.timeouts.connect;
                if now >= self.x.since + limit {
                    return Err(format!(
                        "connecting to {to} timed out after {} ms: is a perftest server there?{}",
                        limit.as_millis(),
                        crate::bad_checksum_hint(stack)
                    ));
                }
                return Ok(());
            }
            self.x.connect_to = None;
            self.x.since = now;
        }
        // Several steps can complete in one turn (messages already here).
        loop {
            let step = self.x.step;
            self.step_once(now, stack)?;
            if self.x.step == step || self.x.step == Step::Finished {
                break;
            }
            if let Err(e) = self.x.conn.poll(stack) {
                return Err(self.x.oob_fail(&e));
            }
        }
        if !matches!(self.x.step, Step::Run | Step::Finished)
            && now >= self.x.since + self.step_timeout()
        {
            if closing(self.x.step) {
                self.end(now, stack);
                return Ok(());
            }
            return Err(format!(
                "no answer from the peer within {} s during {}",
                self.step_timeout().as_secs(),
                self.x.step.what()
            ));
        }
        Ok(())
    }

    fn step_once(&mut self, now: Instant, stack: &mut Stack) -> Result<(), Fail> {
        let (x, t) = (&mut self.x, &mut self.t);
        match x.step {
            Step::Version => {
                if let Some(b) = x.xchg(stack, &version_msg(), VERSION_LEN)? {
                    check_peer_version(&b)?;
                    x.goto(now, Step::CycleBuffer);
                }
            }
            Step::CycleBuffer => {
                if x.xchg(stack, &CYCLE_BUFFER.to_be_bytes(), 4)?.is_some() {
                    x.goto(now, Step::CacheLine);
                }
            }
            Step::CacheLine => {
                if x.xchg(stack, &CACHE_LINE.to_be_bytes(), 4)?.is_some() {
                    x.goto(now, Step::Mtu);
                }
            }
            Step::Mtu => {
                let cap = stack.ud_max_msg();
                if let Some(b) = x.xchg(stack, &mtu_msg(cap), 2)? {
                    t.setup(x, now, stack, negotiate_mtu(&b, cap))?;
                }
            }
            Step::Key(i) => {
                if let Some(k) = x.key(stack)? {
                    t.on_key(x, now, stack, i, k)?;
                }
            }
            Step::PreRun => {
                if x.key(stack)?.is_some() {
                    t.start_run(x, now, stack)?;
                }
            }
            Step::Run => t.run_turn(x, now, stack)?,
            Step::AfterRun => {
                if x.key(stack)?.is_some() {
                    t.next_size(x, now, stack)?;
                }
            }
            Step::EndSync => {
                if x.key(stack)?.is_some() {
                    x.goto(now, Step::Reports(0));
                }
            }
            Step::Reports(i) => t.report_exchange(x, now, stack, i)?,
            Step::Close => {
                if x.key(stack)?.is_some() {
                    x.conn.send(DONE);
                    t.on_close(x);
                    x.goto(now, Step::Linger);
                }
            }
            Step::Linger => {
                let acked = stack
                    .tcp_ref()
                    .status(x.conn.handle())
                    .map_or(true, |s| s.unacked == 0 || s.closed());
                if x.conn.flushed() && acked {
                    self.end(now, stack);
                }
            }
            Step::Drain => {
                // The peer's close (it exited) ends the wait early.
                let gone = stack
                    .tcp_ref()
                    .status(x.conn.handle())
                    .map_or(true, |s| s.eof || s.closed());
                if gone {
                    self.end(now, stack);
                }
            }
            Step::Finished => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn key(ip: IpAddr) -> KeyMsg {
        KeyMsg {
            gid: ip_gid(ip),
            ..KeyMsg::default()
        }
    }

    #[test]
    fn the_peers_gid_must_be_of_our_family() {
        let v4: IpAddr = Ipv4Addr::new(10, 77, 0, 3).into();
        let v6: IpAddr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 3).into();
        let (me4, me6) = (
            key(Ipv4Addr::new(10, 77, 0, 2).into()),
            key(Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2).into()),
        );
        assert_eq!(peer_ip(&key(v4), &me4), Ok(v4));
        assert_eq!(peer_ip(&key(v6), &me6), Ok(v6));
        let e = peer_ip(&key(v6), &me4).unwrap_err();
        assert!(e.contains("the peer's GID is IPv6 and ours IPv4"), "{e}");
        let e = peer_ip(&key(v4), &me6).unwrap_err();
        assert!(e.contains("the peer's GID is IPv4 and ours IPv6"), "{e}");
        assert!(peer_ip(&KeyMsg::default(), &me4).is_err());
    }
}
