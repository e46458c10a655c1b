//! One stack per queue: shared-nothing shards of one host.
//!
//! A host with N queues runs N [`Stack`](crate::Stack)s, each on its own core
//! with its own pools and connection table, all with the same MAC and IP.
//! Symmetric RSS ([`crate::shard::rss`]) puts both directions of a TCP flow on one
//! queue, so the data path never crosses cores. Three kinds of traffic
//! belong to no one core, and go through bounded mailboxes between shards
//! (`std::sync::mpsc` channels; never on the data path of a hashed flow):
//!
//! - **ARP** arrives on one queue (a NIC gives it to queue 0) but every
//!   shard needs the neighbour: the receiving shard handles it and sends a
//!   copy to each sibling, which learns from it without answering
//!   ([`Stack::receive`](crate::Stack::receive) with [`RxRole::Replica`](crate::RxRole::Replica)).
//! - **Steered traffic**: a [`SteerRule`] names frames that one shard must
//!   handle wherever they arrive (the software form of a NIC flow rule): an
//!   iperf3 server's port, whose control and data connections must meet in
//!   one shard, or the ICMP and UD replies of a ping tool running on shard 0.
//! - **Listeners** need no mail: every shard listens on the same ports, so a
//!   SYN is accepted by whichever shard its flow hashes to.
//!
//! Active opens pick a local port whose flow hashes back to the opening
//! shard ([`ShardId::owns_tcp`]).

use core::net::{IpAddr, SocketAddr};

use crate::stats::stats;
use serde::Serialize;
use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

pub mod rss;

/// Which shard of how many a stack is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShardId {
    /// This stack's queue index, `0..count`.
    pub index: usize,
    /// Queues (stacks) on the host; 1 for a single-queue host.
    pub count: usize,
}

impl ShardId {
    /// A host with one queue.
    pub const SINGLE: ShardId = ShardId { index: 0, count: 1 };

    /// Whether a TCP flow from local `port` to `remote` hashes to this shard.
    pub fn owns_tcp(&self, me: IpAddr, port: u16, remote: SocketAddr) -> bool {
        self.count <= 1
            || rss::queue_of_hash(
                rss::tcp_hash_ip(me, port, remote.ip(), remote.port()),
                self.count,
            ) == self.index
    }
}

/// Frames a [`SteerRule`] matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    /// TCP with this port at either end.
    TcpPort(u16),
    /// UDP with this port at either end.
    UdpPort(u16),
    /// Every ICMP packet.
    Icmp,
}

/// Frames matching `what` are handled by shard `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteerRule {
    /// The frames the rule matches.
    pub what: Steer,
    /// Index of the shard that handles them.
    pub to: usize,
}

/// What one shard hands another.
#[derive(Debug)]
pub enum Mail {
    /// A frame to process as if it had arrived on the recipient's queue.
    Frame(Vec<u8>),
    /// A copy of an ARP frame to learn from, never to answer.
    ArpReplica(Vec<u8>),
    /// A TCP segment no shard before this one owned; `hops` shards have
    /// seen it. The last one to see it answers it (a reset).
    Unclaimed {
        /// The whole Ethernet frame.
        frame: Vec<u8>,
        /// Shards that have seen it so far (the receiving one included).
        hops: usize,
    },
}

stats! {
    /// Counters of a shard's mailboxes.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct ShardStats {
        /// Frames sent to the sibling a steering rule names.
        counter steered_out: u64,
        /// ARP copies sent to siblings.
        counter arp_replicas_out: u64,
        /// TCP segments for no connection here passed to the next shard
        /// (the driver's flow hash put them on the wrong queue).
        counter passed_on: u64,
        /// Mail received and processed.
        counter mail_in: u64,
        /// Mail lost because a sibling's mailbox was full.
        counter mailbox_full: u64,
        /// Frames left to another process (a replicated port: every process
        /// sees every frame and handles the flows that hash to it).
        counter not_ours: u64,
    }
}

/// Where a received frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Process it here.
    Local,
    /// Process it here and send siblings a copy (ARP).
    LocalAndReplicate,
    /// Hand it to this shard.
    Forward(usize),
    /// Learn from it without answering (ARP on a replicated port, where
    /// shard 0 answers).
    Replica,
    /// Another process handles it (a replicated port).
    NotOurs,
}

/// One shard's end of the mailboxes.
#[derive(Debug)]
pub struct Shard {
    /// Which shard this is, of how many.
    pub id: ShardId,
    inbox: Receiver<Mail>,
    /// Mail in our inbox (raised by senders before they send).
    waiting: Arc<AtomicUsize>,
    /// Senders to every shard and their inbox counts, by index (our own
    /// is unused).
    peers: Vec<(SyncSender<Mail>, Arc<AtomicUsize>)>,
    steer: Vec<SteerRule>,
    /// Every process on the port sees every frame (several processes, each
    /// with its own capture of one interface): no mailboxes, and a frame
    /// that hashes elsewhere is left alone.
    replicated: bool,
    /// This shard's mailbox counters.
    pub stats: ShardStats,
}

/// Mail a shard may hold before senders drop (and count) more.
pub const MAILBOX: usize = 4096;

/// The shards of a host with `count` queues, wired to each other.
pub fn shards(count: usize, steer: &[SteerRule]) -> Vec<Shard> {
    let count = count.max(1);
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..count)
        .map(|_| {
            let (tx, rx) = sync_channel(MAILBOX);
            let waiting = Arc::new(AtomicUsize::new(0));
            ((tx, waiting.clone()), (rx, waiting))
        })
        .unzip();
    receivers
        .into_iter()
        .enumerate()
        .map(|(index, (inbox, waiting))| Shard {
            id: ShardId { index, count },
            inbox,
            waiting,
            peers: senders.clone(),
            steer: steer.iter().copied().filter(|r| r.to < count).collect(),
            replicated: false,
            stats: ShardStats::default(),
        })
        .collect()
}

impl Shard {
    /// Shard `id` of a port every shard receives all frames of: `id.count`
    /// processes (or threads), each with its own capture of one interface
    /// and the same address, each handling the flows whose symmetric RSS
    /// hash names it ([`rss::frame_queue`]) and leaving the rest to the
    /// others. Shard 0 answers ARP; the others learn from it. Its stack's
    /// `Config::shard` must be `id`, so that its active opens pick ports
    /// that hash back to it.
    pub fn replicated(id: ShardId) -> Shard {
        let (_, inbox) = sync_channel(0);
        Shard {
            id,
            inbox,
            waiting: Arc::new(AtomicUsize::new(0)),
            peers: Vec::new(),
            steer: Vec::new(),
            replicated: true,
            stats: ShardStats::default(),
        }
    }

    /// Whether a segment for no connection here may go to a sibling.
    pub fn may_pass(&self) -> bool {
        self.id.count > 1 && !self.replicated
    }

    /// Decide where a frame received on this shard's queue is handled.
    pub fn route(&self, frame: &[u8]) -> Route {
        if self.id.count <= 1 {
            return Route::Local;
        }
        if self.replicated {
            let arp = frame.get(12..14) == Some(&[0x08, 0x06]);
            return match (arp, self.id.index) {
                (true, 0) => Route::Local,
                (true, _) => Route::Replica,
                _ if rss::frame_queue(frame, self.id.count) == self.id.index => Route::Local,
                _ => Route::NotOurs,
            };
        }
        if frame.get(12..14) == Some(&[0x08, 0x06]) {
            return Route::LocalAndReplicate;
        }
        match self.steered(frame) {
            Some(to) if to != self.id.index => Route::Forward(to),
            _ => Route::Local,
        }
    }

    fn steered(&self, frame: &[u8]) -> Option<usize> {
        if self.steer.is_empty() {
            return None;
        }
        let eth = EthernetFrame::new_checked(frame).ok()?;
        if eth.ethertype() != EthernetProtocol::Ipv4 {
            return None;
        }
        let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
        let proto = ip.next_header();
        // Ports sit at the same place in TCP and UDP; a non-first fragment has none.
        let ports = (ip.frag_offset() == 0)
            .then(|| ip.payload().get(..4))
            .flatten()
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u16::from_be_bytes([p[2], p[3]]),
                )
            });
        let hit = |port: u16| ports.is_some_and(|(s, d)| s == port || d == port);
        self.steer.iter().find_map(|r| {
            let matched = match r.what {
                Steer::TcpPort(p) => proto == IpProtocol::Tcp && hit(p),
                Steer::UdpPort(p) => proto == IpProtocol::Udp && hit(p),
                Steer::Icmp => proto == IpProtocol::Icmp,
            };
            matched.then_some(r.to)
        })
    }

    fn send(&mut self, to: usize, mail: Mail) -> bool {
        let Some((peer, waiting)) = self.peers.get(to) else {
            return false;
        };
        waiting.fetch_add(1, Ordering::Relaxed);
        match peer.try_send(mail) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                waiting.fetch_sub(1, Ordering::Relaxed);
                self.stats.mailbox_full += 1;
                false
            }
        }
    }

    /// Hand a frame to shard `to` (a copy: the device buffer goes back to
    /// this shard's pool).
    pub fn forward(&mut self, to: usize, frame: &[u8]) {
        if self.send(to, Mail::Frame(frame.to_vec())) {
            self.stats.steered_out += 1;
        }
    }

    /// Send every sibling a copy of an ARP frame.
    pub fn replicate_arp(&mut self, frame: &[u8]) {
        let me = self.id;
        for to in (0..me.count).filter(|&i| i != me.index) {
            if self.send(to, Mail::ArpReplica(frame.to_vec())) {
                self.stats.arp_replicas_out += 1;
            }
        }
    }

    /// Pass a segment no connection here owns to the next shard, `hops`
    /// shards having seen it.
    pub fn pass_on(&mut self, frame: &[u8], hops: usize) {
        let next = (self.id.index + 1) % self.id.count;
        let mail = Mail::Unclaimed {
            frame: frame.to_vec(),
            hops,
        };
        if self.send(next, mail) {
            self.stats.passed_on += 1;
        }
    }

    /// Mail waiting, at most `max` of it.
    pub fn take_mail(&mut self, max: usize) -> Vec<Mail> {
        let mail: Vec<Mail> = self.inbox.try_iter().take(max).collect();
        self.waiting.fetch_sub(mail.len(), Ordering::Relaxed);
        self.stats.mail_in += mail.len() as u64;
        mail
    }

    /// Whether mail is waiting.
    pub fn has_mail(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn tcp_frame(sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&40u16.to_be_bytes());
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[46] = 0x50;
        f
    }

    #[test]
    fn replicated_shards_split_every_flow_and_one_answers_arp() {
        let s: Vec<Shard> = (0..3)
            .map(|index| Shard::replicated(ShardId { index, count: 3 }))
            .collect();
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(s[0].route(&arp), Route::Local);
        assert_eq!(s[1].route(&arp), Route::Replica);
        assert_eq!(s[2].route(&arp), Route::Replica);
        let mut per_shard = [0; 3];
        for port in 40000..40300 {
            let f = tcp_frame(port, 8080);
            let owners: Vec<usize> = (0..3).filter(|&i| s[i].route(&f) == Route::Local).collect();
            assert_eq!(owners.len(), 1, "port {port}: {owners:?}");
            assert!((0..3).all(|i| i == owners[0] || s[i].route(&f) == Route::NotOurs));
            per_shard[owners[0]] += 1;
        }
        // The hash spreads flows over every process.
        assert!(per_shard.iter().all(|&n| n > 50), "{per_shard:?}");
        assert!(s.iter().all(|x| !x.may_pass()));
    }

    #[test]
    fn steers_arp_and_ruled_ports() {
        let rules = [SteerRule {
            what: Steer::TcpPort(5201),
            to: 0,
        }];
        let mut s = shards(2, &rules);
        let one = &s[1];
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(one.route(&arp), Route::LocalAndReplicate);
        assert_eq!(one.route(&tcp_frame(40000, 5201)), Route::Forward(0));
        assert_eq!(one.route(&tcp_frame(5201, 40000)), Route::Forward(0));
        assert_eq!(one.route(&tcp_frame(40000, 7)), Route::Local);
        assert_eq!(s[0].route(&tcp_frame(40000, 5201)), Route::Local);
        s[1].replicate_arp(&arp);
        s[1].forward(0, &tcp_frame(1, 5201));
        let mail = s[0].take_mail(10);
        assert_eq!(mail.len(), 2);
        assert!(matches!(mail[0], Mail::ArpReplica(_)));
        assert!(matches!(mail[1], Mail::Frame(_)));
        assert_eq!(s[0].stats.mail_in, 2);
        assert_eq!(
            (s[1].stats.arp_replicas_out, s[1].stats.steered_out),
            (1, 1)
        );
    }

    #[test]
    fn a_full_mailbox_counts_and_drops() {
        let mut s = shards(2, &[]);
        let arp = [0u8; 42];
        for _ in 0..MAILBOX + 5 {
            s[1].replicate_arp(&arp);
        }
        assert_eq!(s[1].stats.mailbox_full, 5);
        assert_eq!(s[0].take_mail(usize::MAX).len(), MAILBOX);
    }

    #[test]
    fn active_opens_own_their_flows() {
        use core::net::{Ipv4Addr, Ipv6Addr};
        let v4 = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let v6 = (
            Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1),
            Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2),
        );
        let pairs: [(IpAddr, IpAddr); 2] = [(v4.0.into(), v4.1.into()), (v6.0.into(), v6.1.into())];
        for (me, them) in pairs {
            let remote = SocketAddr::new(them, 9);
            for count in 1..=4 {
                for index in 0..count {
                    let id = ShardId { index, count };
                    let port = (49152..65535)
                        .find(|&p| id.owns_tcp(me, p, remote))
                        .unwrap();
                    // The frames of the flow, either way, reach that queue.
                    let hash = rss::tcp_hash_ip(them, 9, me, port);
                    assert_eq!(rss::queue_of_hash(hash, count), index);
                }
            }
        }
    }
}
