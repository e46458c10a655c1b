//! The command line of `uping`: its clap definition, shared by the
//! binary and the man page and completion generator (`packaging/docgen`).

use anyhow::{Result, bail};
use clap::Parser;
use ustack::iface::icmp::MAX_PING_DATA;
use ustack_runtime::config_file::ConfigArg;

use crate::net::NetArgs;

#[derive(Parser, Debug)]
#[command(
    name = "uping",
    version,
    about = "ICMP echo over ustack, with iputils ping's output"
)]
pub struct Cli {
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Stop after sending this many requests.
    #[arg(short = 'c', value_name = "COUNT", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Seconds between requests.
    #[arg(short = 'i', value_name = "INTERVAL", default_value_t = 1.0, value_parser = interval)]
    pub interval: f64,
    /// Bytes of data per request [default: 56; 1024 with --pingpong, as
    /// ibv_ud_pingpong's -s; 4096 with --rdma=rc --pingpong, as
    /// ibv_rc_pingpong's].
    #[arg(short = 's', value_name = "PACKETSIZE")]
    pub size: Option<usize>,
    /// Seconds to wait for replies after the last request when none has come
    /// back (iputils' -W); with replies in, uping waits twice the longest
    /// RTT, at least one interval, as iputils does. Mesh mode: how long each
    /// probe waits for its answer before it counts as lost. --rdma=rc
    /// --pingpong: how long an iteration may wait for a completion before
    /// the run fails [default: 10; 2 in mesh mode; 5 with --rdma=rc].
    #[arg(short = 'W', value_name = "TIMEOUT", value_parser = interval)]
    pub timeout: Option<f64>,
    /// Quiet: print only the summary.
    #[arg(short = 'q')]
    pub quiet: bool,
    /// Print the result as JSON instead.
    #[arg(long)]
    pub json: bool,
    /// RDMA (RoCEv2) instead of ICMP: `--rdma` or `--rdma=ud` pings a UD
    /// responder such as `ustack run`; `--rdma=rc` (with --pingpong) speaks
    /// ibv_rc_pingpong over RC.
    #[arg(long, value_name = "ud|rc", value_enum, num_args = 0..=1, require_equals = true,
          default_missing_value = "ud")]
    pub rdma: Option<RdmaMode>,
    /// With --rdma: the responder's QP number.
    #[arg(long, value_name = "N", default_value = crate::rdma::DEFAULT_QPN_STR, value_parser = crate::rdma::parse_qpn, requires = "rdma")]
    pub qpn: u32,
    /// With --rdma: the Q_Key (perftest's default).
    #[arg(long, value_name = "K", default_value = crate::rdma::DEFAULT_QKEY_STR, value_parser = crate::rdma::parse_u32, requires = "rdma")]
    pub qkey: u32,
    /// The traffic class of RDMA packets (perftest's --tclass): the GRH
    /// traffic class, on the wire the IPv4 TOS byte (DSCP << 2 | ECN) or
    /// the IPv6 traffic class, of --rdma's pings and ping-pongs and of mesh
    /// mode's ud probes [default: 0].
    #[arg(long, value_name = "TC", value_parser = clap::value_parser!(u8))]
    pub tclass: Option<u8>,
    /// With --rdma: use the host's RNIC through ibverbs instead of the stack
    /// (NET flags are then ignored).
    // Hidden from --help in builds without the `verbs` feature.
    #[arg(long, requires = "rdma", hide = !cfg!(feature = "verbs"))]
    pub verbs: bool,
    /// With --rdma: ping-pong with a stock `ibv_ud_pingpong` server on HOST
    /// (its TCP address exchange on --port, then -c messages of -s bytes,
    /// each echoed; use the server's -n and -s).
    /// With --rdma=rc: ping-pong with a stock `ibv_rc_pingpong` server on
    /// HOST (or, with --listen, one stock client) over RC.
    #[arg(long, requires = "rdma", conflicts_with_all = ["verbs", "pinglist"])]
    pub pingpong: bool,
    /// With --pingpong: the server's exchange port (with --listen, ours).
    #[arg(long, visible_alias = "pingpong-port", value_name = "PORT", default_value_t = ustack::wire::exchange::PINGPONG_PORT, requires = "pingpong")]
    pub port: u16,
    /// With --rdma=rc --pingpong: be the server, wait for one stock
    /// `ibv_rc_pingpong HOST` client, run its -n iterations and exit.
    #[arg(long, requires = "pingpong", conflicts_with = "host")]
    pub listen: bool,
    /// With --rdma=rc --pingpong: the InfiniBand path MTU (ibv_rc_pingpong's
    /// --mtu; both ends must use the same) [default: 1024].
    #[arg(long, value_name = "BYTES", requires = "pingpong",
          value_parser = path_mtu)]
    pub path_mtu: Option<usize>,
    /// Mesh mode: probe every target of the ping list at FILE or an
    /// http(s):// URL, one `A.B.C.D [label] [probes=icmp,ud,tcp,udp]
    /// [tcp_port=N] [udp_port=N]` per line.
    #[arg(long, value_name = "FILE|URL", conflicts_with_all = ["host", "count", "interval"])]
    pub pinglist: Option<String>,
    /// Mesh mode: re-read the ping list every S seconds and apply it when it
    /// changed (0: never).
    #[arg(long, value_name = "S", default_value_t = 30.0, value_parser = seconds, requires = "pinglist")]
    pub pinglist_refresh: f64,
    /// Mesh mode: probes per second, spread across all (target, probe) pairs.
    #[arg(long, value_name = "PPS", default_value_t = 100.0, value_parser = rate, requires = "pinglist")]
    pub rate: f64,
    /// Mesh mode: also answer the other agents' probes, as `ustack run`
    /// does: TCP and UDP echo on port 7 (discard on 9) and the RDMA UD
    /// responder on QPN 2 with the default Q_Key (the stack answers ICMP
    /// echo anyway). Frames are then read as they come.
    #[arg(long, requires = "pinglist")]
    pub responder: bool,
    /// Mesh mode: seconds to send for; 0 runs until stopped (a monitor;
    /// the table is printed at Ctrl-C).
    #[arg(long, value_name = "S", default_value_t = 10.0, value_parser = seconds, requires = "pinglist")]
    pub duration: f64,
    /// Ping over IPv4 only: HOST must be an IPv4 address (iputils' -4).
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// Ping over IPv6 only: HOST must be an IPv6 address, and the stack
    /// needs one (`--ip ADDR/LEN`) (iputils' -6). With `--pingpong`, send
    /// from our IPv6 GID (HOST, where GIDs are exchanged, stays IPv4).
    #[arg(short = '6')]
    pub ipv6: bool,
    /// The host to ping: an IPv4 or IPv6 address (ICMP or ICMPv6 echo).
    #[arg(required_unless_present_any = ["pinglist", "listen"])]
    pub host: Option<String>,
}

/// What `--rdma` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RdmaMode {
    /// Unreliable Datagram (the default of a bare `--rdma`).
    Ud,
    /// Reliable Connected (ibv_rc_pingpong with --pingpong).
    Rc,
}

/// What the flags mean together.
impl Cli {
    /// `-s`, or its default: 56, or ibv_ud_pingpong's 1024 with --pingpong,
    /// or ibv_rc_pingpong's 4096 with --rdma=rc --pingpong.
    pub fn size(&self) -> usize {
        self.size.unwrap_or(match (self.pingpong, self.rdma) {
            (true, Some(RdmaMode::Rc)) => crate::pingpong_rc::DEFAULT_SIZE,
            (true, _) => 1024,
            _ => 56,
        })
    }

    /// Whether this is RC (`--rdma=rc`).
    pub fn rc(&self) -> bool {
        self.rdma == Some(RdmaMode::Rc)
    }

    /// Combinations clap cannot express, as one line each.
    pub fn check(&self) -> Result<()> {
        if self.rc() && !self.pingpong {
            bail!("--rdma=rc speaks ibv_rc_pingpong only: add --pingpong (and HOST, or --listen)");
        }
        if self.listen && !self.rc() {
            bail!(
                "--listen is the ibv_rc_pingpong server (--rdma=rc --pingpong --listen); \
                 ibv_ud_pingpong clients are served by `ustack run`"
            );
        }
        // clap lets `requires = "pinglist"` pass when HOST (which the ping
        // list conflicts with) is given: said here.
        if self.pinglist.is_none() && self.responder {
            bail!("--responder answers other mesh agents: use it with --pinglist");
        }
        if self.tclass.is_some() && self.rdma.is_none() && self.pinglist.is_none() {
            bail!("--tclass marks RDMA packets: use it with --rdma or --pinglist (ud probes)");
        }
        if self.path_mtu.is_some() && !self.rc() {
            bail!("--path-mtu is for --rdma=rc (a UD message is sized by the link)");
        }
        if !self.rc() && self.size() > MAX_PING_DATA {
            bail!(
                "invalid -s value: '{}': out of range: 0 <= value <= {MAX_PING_DATA}",
                self.size()
            );
        }
        Ok(())
    }
}

/// An InfiniBand path MTU: 256, 512, 1024, 2048 or 4096.
pub fn path_mtu(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v @ (256 | 512 | 1024 | 2048 | 4096)) => Ok(v),
        _ => Err(format!(
            "'{s}' is not an InfiniBand MTU (256, 512, 1024, 2048 or 4096)"
        )),
    }
}

/// Mesh mode's probes per second, 0.1 to 10,000,000.
pub fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=10_000_000.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}' is not a rate from 0.1 to 10000000 per second"
        )),
    }
}

/// A number of seconds, 0 or more.
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a number of seconds (0 or more)")),
    }
}

/// A positive number of seconds (at least 10 us).
pub fn interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.000_01 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}
