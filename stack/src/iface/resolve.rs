//! Packets waiting for an address to resolve: the bounded queue ARP
//! (IPv4) and neighbor discovery (IPv6) share. Per unresolved address a
//! queue of packets (network header on, no link header), bounded per
//! address and in total, with a request rate limit and a number of
//! requests after which the address is given up and its packets dropped.
//!
//! A plain data structure: it decides when a request is due, the link
//! writes it.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use crate::time::Instant;

/// The bounds of a [`Resolving`] queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Least time between two requests for the same address.
    pub request_interval: Duration,
    /// Requests sent for one address before its pending packets are dropped.
    pub max_requests: u32,
    /// Packets held per unresolved address (the oldest is dropped beyond it).
    pub per_addr: usize,
    /// Bytes held per unresolved address (the oldest is dropped beyond it).
    pub bytes_per_addr: usize,
    /// Bytes held across all unresolved addresses (new packets are dropped beyond it).
    pub bytes_total: usize,
    /// Unresolved addresses held at once.
    pub max_addrs: usize,
}

#[derive(Debug)]
struct Waiting {
    last_request: Instant,
    requests: u32,
    packets: VecDeque<Vec<u8>>,
    bytes: usize,
}

/// What a pending queue decided about a packet to hold (`ArpCache::enqueue`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueue {
    /// Queued, and a request should go out now.
    QueuedSendRequest,
    /// Queued; a request is already outstanding.
    Queued,
    /// Dropped (queue or address cap full); counted.
    Dropped,
}

/// Packets waiting for addresses of type `A` to resolve.
#[derive(Debug)]
pub(crate) struct Resolving<A> {
    limits: Limits,
    waiting: HashMap<A, Waiting>,
    packets: usize,
    bytes: usize,
    /// Most bytes ever held (flood reports).
    pub(crate) bytes_hwm: usize,
    /// Packets dropped: queue full, or their address never resolved.
    pub(crate) dropped: u64,
    /// Addresses given up (no answer to `max_requests` requests, or
    /// pushed out by newer ones).
    pub(crate) unresolved: u64,
}

impl<A: Copy + Eq + Hash> Resolving<A> {
    /// Nothing waiting, within `limits`.
    pub(crate) fn new(limits: Limits) -> Self {
        Resolving {
            limits,
            waiting: HashMap::new(),
            packets: 0,
            bytes: 0,
            bytes_hwm: 0,
            dropped: 0,
            unresolved: 0,
        }
    }

    /// Whether a request for `a` is outstanding.
    pub(crate) fn asked(&self, a: &A) -> bool {
        self.waiting.contains_key(a)
    }

    /// Packets held now.
    pub(crate) fn packets(&self) -> usize {
        self.packets
    }

    /// `a` resolved (or was learnt): the packets that waited for it.
    pub(crate) fn resolved(&mut self, a: &A) -> VecDeque<Vec<u8>> {
        match self.waiting.remove(a) {
            Some(w) => {
                self.packets -= w.packets.len();
                self.bytes -= w.bytes;
                w.packets
            }
            None => VecDeque::new(),
        }
    }

    fn give_up(&mut self, a: &A) {
        if let Some(w) = self.waiting.remove(a) {
            self.packets -= w.packets.len();
            self.bytes -= w.bytes;
            self.dropped += w.packets.len() as u64;
            self.unresolved += 1;
        }
    }

    /// Hold `packet` until `a` resolves.
    pub(crate) fn enqueue(&mut self, now: Instant, a: A, packet: Vec<u8>) -> Enqueue {
        let l = self.limits;
        if !self.waiting.contains_key(&a) && self.waiting.len() >= l.max_addrs {
            // Full of addresses: give up on the one asked about longest ago
            // (a flood of unresolvable destinations must not lock out a
            // real neighbour, whose answer comes within a round trip).
            let oldest = (self.waiting.iter())
                .min_by_key(|(_, w)| w.last_request)
                .map(|(a, _)| *a);
            if let Some(o) = oldest {
                self.give_up(&o);
            }
        }
        if self.bytes + packet.len() > l.bytes_total
            || (!self.waiting.contains_key(&a) && self.waiting.len() >= l.max_addrs)
        {
            self.dropped += 1;
            return Enqueue::Dropped;
        }
        let w = self.waiting.entry(a).or_insert_with(|| Waiting {
            last_request: now,
            requests: 0,
            packets: VecDeque::new(),
            bytes: 0,
        });
        // Keep the newest: drop the oldest waiting packets to make room.
        while !w.packets.is_empty()
            && (w.packets.len() >= l.per_addr || w.bytes + packet.len() > l.bytes_per_addr)
        {
            if let Some(old) = w.packets.pop_front() {
                w.bytes -= old.len();
                self.bytes -= old.len();
                self.packets -= 1;
                self.dropped += 1;
            }
        }
        w.bytes += packet.len();
        self.bytes += packet.len();
        self.bytes_hwm = self.bytes_hwm.max(self.bytes);
        self.packets += 1;
        w.packets.push_back(packet);
        let first = w.requests == 0;
        if first || (now >= w.last_request + l.request_interval && w.requests < l.max_requests) {
            w.last_request = now;
            w.requests += 1;
            return Enqueue::QueuedSendRequest;
        }
        Enqueue::Queued
    }

    /// Timers: addresses whose request should be repeated now (appended
    /// to `retry`); gives up (and drops the queued packets) after
    /// `max_requests`.
    pub(crate) fn poll(&mut self, now: Instant, retry: &mut Vec<A>) {
        if self.waiting.is_empty() {
            return;
        }
        let l = self.limits;
        let mut gave_up = Vec::new();
        for (a, w) in self.waiting.iter_mut() {
            if now < w.last_request + l.request_interval {
                continue;
            }
            if w.requests >= l.max_requests {
                gave_up.push(*a);
            } else {
                w.requests += 1;
                w.last_request = now;
                retry.push(*a);
            }
        }
        for a in gave_up {
            self.give_up(&a);
        }
    }

    /// Next time [`poll`](Self::poll) has work.
    pub(crate) fn poll_at(&self) -> Option<Instant> {
        if self.waiting.is_empty() {
            return None;
        }
        self.waiting
            .values()
            .map(|w| w.last_request + self.limits.request_interval)
            .min()
    }
}
