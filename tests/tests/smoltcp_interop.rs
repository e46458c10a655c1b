//! Interop with an independent TCP: a smoltcp interface on the same sim link
//! exchanges data both ways with a ustack peer, byte-exact (CRC compared).

use std::net::SocketAddrV4;
use std::time::Duration;

use smoltcp::iface::{Config as SmolConfig, Interface, SocketSet};
use smoltcp::phy::{Device as SmolDevice, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use ustack::node::App;
use ustack::phy::device::Device;
use ustack::phy::pool::PacketBuf;
use ustack::sim::{LinkConfig, SimNet, SimPort, host_config, host_mac};
use ustack::{Instant, SlabBuf};
use ustack_kit::bulk::{BulkRecv, BulkSend, fill_pattern, pattern_byte};

/// smoltcp's device trait over a sim port.
struct SmolPort {
    port: SimPort,
    now: Instant,
}

struct Rx(SlabBuf);
struct Tx<'a>(&'a mut SmolPort);

impl RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0.as_ref())
    }
}

impl TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = self.0.port.alloc_tx().expect("sim pool has room");
        assert!(buf.set_len(len));
        let r = f(buf.as_mut());
        let now = self.0.now;
        self.0.port.tx_burst(now, &mut vec![buf]);
        r
    }
}

impl SmolDevice for SmolPort {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: SmolInstant) -> Option<(Rx, Tx<'_>)> {
        let mut v = Vec::with_capacity(1);
        self.port.rx_burst(self.now, &mut v, 1);
        let buf = v.pop()?;
        Some((Rx(buf), Tx(self)))
    }

    fn transmit(&mut self, _: SmolInstant) -> Option<Tx<'_>> {
        Some(Tx(self))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = 1514;
        caps
    }
}

struct Smol {
    dev: SmolPort,
    iface: Interface,
    sockets: SocketSet<'static>,
    handle: smoltcp::iface::SocketHandle,
}

fn smol_host(net: &SimNet) -> Smol {
    let mac = host_mac(3);
    let mut dev = SmolPort {
        port: net.link.attach(mac, 4096),
        now: Instant::ZERO,
    };
    let cfg = SmolConfig::new(HardwareAddress::Ethernet(EthernetAddress(mac.0)));
    let mut iface = Interface::new(cfg, &mut dev, SmolInstant::ZERO);
    iface.update_ip_addrs(|a| {
        a.push(IpCidr::new(IpAddress::v4(10, 0, 0, 3), 24)).unwrap();
    });
    let sock = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 65_536]),
        tcp::SocketBuffer::new(vec![0; 65_536]),
    );
    let mut sockets = SocketSet::new(vec![]);
    let handle = sockets.add(sock);
    Smol {
        dev,
        iface,
        sockets,
        handle,
    }
}

fn smol_now(t: Instant) -> SmolInstant {
    SmolInstant::from_micros(t.as_micros() as i64)
}

/// Step the ustack node(s) and smoltcp together on virtual time until `done`.
fn run(
    net: &mut SimNet,
    smol: &mut Smol,
    app: &mut dyn App,
    mut smol_app: impl FnMut(&mut tcp::Socket, &mut smoltcp::iface::Context) -> bool,
    limit: Duration,
) -> bool {
    let end = net.now + limit;
    while net.now < end {
        let busy = net.step(&mut [&mut *app]);
        smol.dev.now = net.now;
        let changed = smol
            .iface
            .poll(smol_now(net.now), &mut smol.dev, &mut smol.sockets);
        let done = smol_app(
            smol.sockets.get_mut::<tcp::Socket>(smol.handle),
            smol.iface.context(),
        );
        if done {
            return true;
        }
        if busy || changed == smoltcp::iface::PollResult::SocketStateChanged {
            continue;
        }
        let smol_at = smol
            .iface
            .poll_delay(smol_now(net.now), &smol.sockets)
            .map(|d| net.now + Duration::from_micros(d.total_micros()));
        let wake = [
            net.next_wakeup(&[&mut *app]),
            smol_at,
            smol.dev.port.poll_at(),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > net.now)
        .min()
        .unwrap_or(net.now + Duration::from_millis(1));
        net.now = wake.min(net.now + Duration::from_millis(10));
    }
    false
}

const BYTES: u64 = 4 << 20;

fn link() -> LinkConfig {
    LinkConfig {
        delay: Duration::from_micros(100),
        loss: 0.001,
        seed: 21,
        ..LinkConfig::default()
    }
}

#[test]
fn smoltcp_client_to_ustack_server() {
    let mut net = SimNet::new(link());
    net.add(host_config(1));
    let mut smol = smol_host(&net);
    let mut server = BulkRecv::new(5001, 4);
    let mut sent = 0u64;
    let mut connected = false;
    let mut buf = vec![0u8; 16 << 10];
    let mut crc = crc32fast::Hasher::new();
    let ok = run(
        &mut net,
        &mut smol,
        &mut server,
        |s, cx| {
            if !connected {
                s.connect(cx, (IpAddress::v4(10, 0, 0, 1), 5001), 49_500)
                    .unwrap();
                connected = true;
            }
            while s.can_send() && sent < BYTES {
                let n = ((BYTES - sent) as usize).min(buf.len());
                fill_pattern(sent, &mut buf[..n]);
                let k = s.send_slice(&buf[..n]).unwrap();
                crc.update(&buf[..k]);
                sent += k as u64;
                if k < n {
                    break;
                }
            }
            if sent == BYTES && s.send_queue() == 0 {
                s.close();
            }
            !s.is_open()
        },
        Duration::from_secs(600),
    );
    assert!(ok, "smoltcp client did not finish");
    // Let the last ACKs and the server's close settle.
    run(
        &mut net,
        &mut smol,
        &mut server,
        |_, _| false,
        Duration::from_secs(2),
    );
    assert_eq!(server.errors, vec![]);
    assert_eq!(server.corrupt_bytes, 0);
    assert_eq!(server.completed.len(), 1);
    assert_eq!(server.completed[0].bytes, BYTES);
    assert_eq!(server.completed[0].crc, crc.finalize());
}

#[test]
fn ustack_client_to_smoltcp_server() {
    let mut net = SimNet::new(link());
    net.add(host_config(1));
    let mut smol = smol_host(&net);
    let mut client = BulkSend::new(SocketAddrV4::new("10.0.0.3".parse().unwrap(), 5002), BYTES);
    let mut got = 0u64;
    let mut bad = 0u64;
    let mut listening = false;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 16 << 10];
    let ok = run(
        &mut net,
        &mut smol,
        &mut client,
        |s, _| {
            if !listening {
                s.listen(5002).unwrap();
                listening = true;
            }
            while s.can_recv() {
                let n = s.recv_slice(&mut buf).unwrap();
                for (k, b) in buf[..n].iter().enumerate() {
                    if *b != pattern_byte(got + k as u64) {
                        bad += 1;
                    }
                }
                crc.update(&buf[..n]);
                got += n as u64;
            }
            if !s.may_recv() && s.state() == tcp::State::CloseWait {
                s.close();
            }
            got == BYTES
                && matches!(
                    s.state(),
                    tcp::State::Closed | tcp::State::LastAck | tcp::State::TimeWait
                )
        },
        Duration::from_secs(600),
    );
    assert!(ok, "transfer to smoltcp did not finish: got {got}");
    run(
        &mut net,
        &mut smol,
        &mut client,
        |_, _| false,
        Duration::from_secs(2),
    );
    assert_eq!(bad, 0);
    assert_eq!(client.error, None);
    assert!(client.done());
    assert_eq!(client.transfer.crc, crc.finalize());
}
