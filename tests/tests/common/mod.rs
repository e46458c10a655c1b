//! Pieces the sim integration tests share.
#![allow(dead_code)]

use std::net::SocketAddrV4;

use ustack::node::{App, Control};
use ustack::sim::host_config;
use ustack::{Instant, Stack};
use ustack_kit::bulk::BulkSend;

/// Opens `total` transfers of `bytes` each, at most `per_poll` new ones per iteration.
pub struct ManyClients {
    pub dst: SocketAddrV4,
    pub total: usize,
    pub bytes: u64,
    pub per_poll: usize,
    pub clients: Vec<BulkSend>,
}

impl App for ManyClients {
    fn poll(&mut self, now: Instant, stack: &mut Stack) -> Control {
        let room = self.total - self.clients.len();
        for _ in 0..room.min(self.per_poll) {
            self.clients.push(BulkSend::new(self.dst, self.bytes));
        }
        for c in self.clients.iter_mut().filter(|c| !c.done()) {
            c.poll(now, stack);
        }
        Control::Continue
    }
    fn poll_at(&self) -> Option<Instant> {
        (self.clients.len() < self.total).then_some(Instant::ZERO)
    }
}

/// Sim host `n` with 8 KiB socket buffers (many connections, little memory).
pub fn small_buffers(n: u8) -> ustack::Config {
    let mut c = host_config(n);
    c.tcp.send_buffer = 8 << 10;
    c.tcp.recv_buffer = 8 << 10;
    c
}
