//! One telemetry line of a stack as a reader (utop) parses it.
//!
//! These are the reader's own structs, not the engine's: every field has a
//! default, so a reader and a stack of different versions still understand
//! each other, and the protocol counters (`stack`) stay generic JSON, so a
//! section the engine adds (the UD queue pairs, say) shows up without a
//! change here. Numbers are as the engine's telemetry gives them: counts,
//! bytes, microseconds where the name says `_us`.

use serde::Deserialize;
use serde_json::{Map, Value};

/// One snapshot of a stack, as published.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Frame {
    /// The publishing program and its address (`uping 10.0.0.1/24`).
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Line number since the publisher started (1, 2, ...).
    pub seq: u64,
    /// Engine time of the snapshot, nanoseconds (rates use its differences).
    pub at_ns: u64,
    /// The publisher's own counters.
    pub publisher: Publisher,
    /// Protocol sections (`eth`, `arp`, `ipv4`, `icmp`, `udp`, `tcp`, `ud`,
    /// ...) and `drops`, one counter per reason.
    pub stack: Map<String, Value>,
    /// The device's port counters.
    pub port: Port,
    /// Every packet pool of the device.
    pub pools: Vec<Pool>,
    /// TCP connections in slot order (at most 256).
    pub connections: Vec<Conn>,
    /// Every TCP connection that holds a slot, listed or not.
    pub connections_total: u64,
    /// RDMA RC queue pairs (absent when the stack has none).
    pub rc_qps: Vec<RcQp>,
    /// Each core's own figures when the stack runs one shard per core
    /// (`--cores`); the fields above are then the totals.
    pub shards: Vec<ShardFrame>,
    /// The processes sharing the stack (absent while one process has it).
    pub processes: Vec<Process>,
}

/// One core's share of a multi-core stack.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ShardFrame {
    /// The shard's place and mailbox counters.
    pub shard: ShardInfo,
    /// Its queue's port counters.
    pub port: Port,
    /// Its engine counters, by protocol section.
    pub stack: Map<String, Value>,
    /// Its TCP connections.
    pub connections_total: u64,
}

/// A shard's place and its mailbox counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ShardInfo {
    /// This shard's queue index, `0..count`.
    pub index: u64,
    /// Shards (queues, cores) on the host.
    pub count: u64,
    /// Frames sent to the sibling a steering rule names.
    pub steered_out: u64,
    /// TCP segments for no connection here passed to the next shard.
    pub passed_on: u64,
    /// ARP copies sent to siblings.
    pub arp_replicas_out: u64,
    /// Mail received and processed.
    pub mail_in: u64,
    /// Mail lost because a sibling's mailbox was full.
    pub mailbox_full: u64,
}

/// The publisher's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Publisher {
    /// Socket clients attached now.
    pub clients: u64,
    /// Snapshots the loop skipped because the publisher was behind.
    pub skipped: u64,
    /// Clients dropped for being slow or gone.
    pub dropped_clients: u64,
}

/// Port counters, as DPDK's `rte_eth_stats` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Port {
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Frames transmitted.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames the port dropped on receive (queue full).
    pub rx_missed: u64,
    /// Receive drops for want of a buffer.
    pub rx_nombuf: u64,
    /// Frames the port could not transmit.
    pub tx_errors: u64,
}

/// A packet pool's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Pool {
    /// The pool's name (`rx`, `tx`, a DPDK mempool's).
    pub name: String,
    /// Buffers the pool holds in all.
    pub capacity: u64,
    /// Buffers handed out now.
    pub in_use: u64,
    /// Allocations refused because every buffer was in use.
    pub alloc_failures: u64,
    /// Bytes each buffer can hold.
    pub buf_size: u64,
}

/// A TCP connection as telemetry shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Conn {
    /// Our address and port.
    pub local: String,
    /// The peer's address and port.
    pub remote: String,
    /// As the engine names it (`Established`); see [`Conn::state_label`].
    pub state: String,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Slow-start threshold, bytes.
    pub ssthresh: u64,
    /// The peer's receive window, bytes.
    pub snd_wnd: u64,
    /// Our receive window, bytes.
    pub rcv_wnd: u64,
    /// Smoothed RTT, microseconds; `None` before the first sample.
    pub srtt_us: Option<u64>,
    /// Retransmission timeout, microseconds.
    pub rto_us: u64,
    /// Bytes sent and not yet acknowledged.
    pub in_flight: u64,
    /// Bytes in the send buffer.
    pub send_queued: u64,
    /// Bytes received and not yet read.
    pub recv_queued: u64,
    /// Bytes held out of order.
    pub ooo_bytes: u64,
    /// MSS of segments sent, bytes.
    pub mss: u64,
    /// Congestion control (`newreno`, `cubic`).
    pub congestion: String,
    /// The connection's counters.
    pub stats: ConnStats,
    /// The processes holding it, when several share the stack (forked
    /// children, joined programs); empty otherwise.
    pub holders: Vec<u32>,
}

/// A process holding sockets of a stack that several processes share.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Process {
    /// Its process id.
    pub pid: u32,
    /// `owner` (it runs the stack) or `client`.
    pub role: String,
    /// How many of the stack's sockets it holds.
    pub sockets: u64,
}

/// A connection's counters (the ones a reader shows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ConnStats {
    /// Segments delivered to the connection.
    pub segs_in: u64,
    /// Segments the connection produced.
    pub segs_out: u64,
    /// Payload bytes received in order.
    pub bytes_in: u64,
    /// Payload bytes sent and acknowledged.
    pub bytes_out: u64,
    /// Segments sent again.
    pub retransmits: u64,
}

/// An RDMA RC queue pair as telemetry shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RcQp {
    /// The QP's number.
    pub qpn: u64,
    /// `Init`, `Rts` or `Error`.
    pub state: String,
    /// The connected peer, once connected.
    pub dest: Option<RcDest>,
    /// Path MTU, bytes.
    pub mtu: u64,
    /// PSN of the next request packet.
    pub next_psn: u64,
    /// Oldest PSN not yet acknowledged.
    pub una_psn: u64,
    /// PSN the responder expects next.
    pub expected_psn: u64,
    /// Send work requests not yet completed.
    pub send_outstanding: u64,
    /// Receive work requests posted.
    pub recv_posted: u64,
    /// READs waiting for their responses.
    pub reads_outstanding: u64,
    /// Completions waiting in the completion queue.
    pub cq_depth: u64,
    /// The QP's counters.
    pub stats: RcQpStats,
}

/// The peer of an RC QP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RcDest {
    /// The peer's IPv4 address.
    pub ip: String,
    /// The peer's QP number.
    pub qpn: u64,
}

/// An RC QP's counters (the ones a reader shows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RcQpStats {
    /// Packets sent.
    pub tx_packets: u64,
    /// Requests taken in sequence.
    pub rx_packets: u64,
    /// Payload bytes sent the first time.
    pub tx_bytes: u64,
    /// Payload bytes placed.
    pub rx_bytes: u64,
    /// Request packets sent again.
    pub retransmits: u64,
    /// ACK timeouts.
    pub ack_timeouts: u64,
    /// PSN-sequence NAKs sent.
    pub seq_naks_sent: u64,
    /// PSN-sequence NAKs received.
    pub seq_naks_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Requests that arrived again after they were executed.
    pub duplicates: u64,
    /// Times the QP went to the error state.
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
            && self.processes == other.processes
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
