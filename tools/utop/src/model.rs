//! What utop reads: one telemetry line of a stack (see `ustack_runtime::telemetry`).
//!
//! These are utop's own structs, not the engine's: every field has a default,
//! so a utop and a stack of different versions still understand each other,
//! and the protocol counters (`stack`) stay generic JSON, so a section the
//! engine adds (the UD queue pairs, say) shows up without a change here.

use serde::Deserialize;
use serde_json::{Map, Value};

/// One snapshot of a stack, as published.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Frame {
    pub name: String,
    pub pid: u32,
    pub seq: u64,
    /// Engine time of the snapshot, nanoseconds (rates use its differences).
    pub at_ns: u64,
    pub publisher: Publisher,
    /// Protocol sections (`eth`, `arp`, `ipv4`, `icmp`, `udp`, `tcp`, `ud`,
    /// ...) and `drops`, one counter per reason.
    pub stack: Map<String, Value>,
    pub port: Port,
    pub pools: Vec<Pool>,
    pub connections: Vec<Conn>,
    pub connections_total: u64,
    /// RDMA RC queue pairs (absent when the stack has none).
    pub rc_qps: Vec<RcQp>,
    /// Each core's own figures when the stack runs one shard per core
    /// (`--cores`); the fields above are then the totals.
    pub shards: Vec<ShardFrame>,
}

/// One core's share of a multi-core stack.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ShardFrame {
    pub shard: ShardInfo,
    pub port: Port,
    pub stack: Map<String, Value>,
    pub connections_total: u64,
}

/// A shard's place and its mailbox counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ShardInfo {
    pub index: u64,
    pub count: u64,
    pub steered_out: u64,
    pub passed_on: u64,
    pub arp_replicas_out: u64,
    pub mail_in: u64,
    pub mailbox_full: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Publisher {
    pub clients: u64,
    pub skipped: u64,
    pub dropped_clients: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Port {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_missed: u64,
    pub rx_nombuf: u64,
    pub tx_errors: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Pool {
    pub name: String,
    pub capacity: u64,
    pub in_use: u64,
    pub alloc_failures: u64,
    pub buf_size: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Conn {
    pub local: String,
    pub remote: String,
    /// As the engine names it (`Established`); see [`Conn::state_label`].
    pub state: String,
    pub cwnd: u64,
    pub ssthresh: u64,
    pub snd_wnd: u64,
    pub rcv_wnd: u64,
    pub srtt_us: Option<u64>,
    pub rto_us: u64,
    pub in_flight: u64,
    pub send_queued: u64,
    pub recv_queued: u64,
    pub ooo_bytes: u64,
    pub mss: u64,
    pub congestion: String,
    pub stats: ConnStats,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ConnStats {
    pub segs_in: u64,
    pub segs_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub retransmits: u64,
}

/// An RDMA RC queue pair as telemetry shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RcQp {
    pub qpn: u64,
    /// `Init`, `Rts` or `Error`.
    pub state: String,
    pub dest: Option<RcDest>,
    pub mtu: u64,
    pub next_psn: u64,
    pub una_psn: u64,
    pub expected_psn: u64,
    pub send_outstanding: u64,
    pub recv_posted: u64,
    pub reads_outstanding: u64,
    pub cq_depth: u64,
    pub stats: RcQpStats,
}

/// The peer of an RC QP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RcDest {
    pub ip: String,
    pub qpn: u64,
}

/// An RC QP's counters (the ones utop shows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RcQpStats {
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub retransmits: u64,
    pub ack_timeouts: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub duplicates: u64,
    pub errors: u64,
}

impl Frame {
    /// Parse one telemetry line.
    pub fn parse(line: &str) -> Result<Frame, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// Whether `other` shows the same counters (sequence number, time and
    /// publisher bookkeeping aside).
    pub fn same_counters(&self, other: &Frame) -> bool {
        self.name == other.name
            && self.pid == other.pid
            && self.stack == other.stack
            && self.port == other.port
            && self.pools == other.pools
            && self.connections == other.connections
            && self.connections_total == other.connections_total
            && self.rc_qps == other.rc_qps
            && self.shards == other.shards
    }

    /// Nonzero drop counters by reason, largest first.
    pub fn drops(&self) -> Vec<(String, u64)> {
        let mut d: Vec<(String, u64)> = self
            .stack
            .get("drops")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
            .filter(|(_, v)| *v > 0)
            .collect();
        d.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        d
    }

    /// A counter of a protocol section, 0 when absent.
    pub fn counter(&self, section: &str, name: &str) -> u64 {
        self.stack
            .get(section)
            .and_then(|s| s.get(name))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }
}

impl Conn {
    /// The state as netstat prints it: `ESTABLISHED`, `SYN_SENT`, `TIME_WAIT`.
    pub fn state_label(&self) -> String {
        let mut out = String::with_capacity(self.state.len() + 2);
        for (i, c) in self.state.chars().enumerate() {
            if i > 0 && c.is_ascii_uppercase() {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    }

    /// The key that follows a connection from one snapshot to the next.
    pub fn key(&self) -> (String, String) {
        (self.local.clone(), self.remote.clone())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn state_labels_read_like_netstat() {
        let c = |s: &str| Conn {
            state: s.into(),
            ..Conn::default()
        };
        assert_eq!(c("Established").state_label(), "ESTABLISHED");
        assert_eq!(c("SynSent").state_label(), "SYN_SENT");
        assert_eq!(c("FinWait1").state_label(), "FIN_WAIT1");
        assert_eq!(c("TimeWait").state_label(), "TIME_WAIT");
    }

    #[test]
    fn unknown_and_missing_fields_are_fine() {
        let f = Frame::parse(r#"{"name":"x","future":1,"port":{"rx_packets":3}}"#).unwrap();
        assert_eq!(f.name, "x");
        assert_eq!(f.port.rx_packets, 3);
        assert!(f.pools.is_empty());
        assert!(Frame::parse("not json").is_err());
    }
}
