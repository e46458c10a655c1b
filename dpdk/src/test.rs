//! The EAL initialises once per process, so everything that needs it runs in
//! one test function, on virtual devices and without hugepages:
//! `net_null` (generates frames on receive, frees on transmit) and
//! `net_ring` (transmit loops back to receive, the same mbufs).

use super::*;
use ustack::Instant;
use ustack::phy::device::Device;
use ustack::phy::pool::{PacketBuf, Pool};

const EAL_ARGS: &str = "--no-huge -m 128 --no-pci --no-shconf --vdev=net_null0 --vdev=net_ring0";

fn pool_counters(eal: &Eal) {
    let pool = MbufPool::new(eal, "unit-pool", 64, 0, None).unwrap();
    let base = pool.stats();
    assert_eq!(
        (base.capacity, base.in_use, base.alloc_failures),
        (64, 0, 0)
    );
    assert_eq!(base.buf_size, 2048);
    let mut held: Vec<Mbuf> = (0..64).map(|_| pool.alloc().unwrap()).collect();
    assert!(pool.alloc().is_none());
    let s = pool.stats();
    assert_eq!((s.in_use, s.alloc_failures), (64, 1));

    // The frame is the data room: set_len, write, read back; append/prepend.
    let m = &mut held[0];
    assert_eq!(m.len(), 0);
    assert!(m.capacity() >= 2048);
    assert!(!m.set_len(m.capacity() + 1));
    assert!(m.set_len(60));
    m.as_mut().copy_from_slice(&[0xab; 60]);
    assert_eq!(m.as_ref(), &[0xab; 60][..]);
    let room = m.headroom();
    m.prepend(2).unwrap().copy_from_slice(&[1, 2]);
    assert_eq!(m.headroom(), room - 2);
    m.append(1).unwrap()[0] = 9;
    assert_eq!(m.len(), 63);
    assert_eq!(&m.as_ref()[..3], &[1, 2, 0xab]);
    assert_eq!(m.as_ref()[62], 9);
    assert!(m.prepend(u16::MAX).is_none());

    drop(held);
    assert_eq!(pool.in_use(), 0, "every mbuf back after drop");

    // A leaked mbuf shows in the counter (what the netns tests rely on).
    let raw = pool.alloc().unwrap().into_raw();
    assert_eq!(pool.in_use(), 1);
    // SAFETY: `raw` came from into_raw and is freed exactly once.
    unsafe { dpdk_sys::ustack_pktmbuf_free(raw) };
    assert_eq!(pool.in_use(), 0);

    assert!(matches!(
        MbufPool::new(eal, "unit-pool", 8, 0, None),
        Err(DpdkError::Pool { .. })
    ));
}

fn null_port(eal: &Eal) {
    let mut cfg = DpdkPortConfig::new(0);
    cfg.mbufs = 511;
    let mut dev = DpdkPort::open(eal, &cfg).unwrap();
    assert_eq!(dev.port().info().driver, "net_null");
    assert!(dev.caps().busy_poll_only);
    let base = dev.pool().in_use();
    let now = Instant::ZERO;

    let mut q = Vec::new();
    for i in 0..40u8 {
        let mut b = dev.alloc_tx().unwrap();
        assert!(b.set_len(60));
        b.as_mut().fill(i);
        q.push(b);
    }
    assert_eq!(dev.tx_burst(now, &mut q), 40);
    assert!(q.is_empty());

    let mut rx = Vec::new();
    let n = dev.rx_burst(now, &mut rx, 32);
    assert_eq!(n, 32, "net_null always has frames");
    assert!(rx.iter().all(|m| m.len() == 64));
    assert_eq!(dev.pool().in_use(), base + 32);
    drop(rx);
    assert_eq!(dev.pool().in_use(), base);

    let p = dev.port_stats();
    assert_eq!((p.tx_packets, p.rx_packets), (40, 32));
    // net_null counts packets, not bytes.
    let mut pools = Vec::new();
    dev.pool_stats(&mut pools);
    assert_eq!(pools[0].in_use, base);
    assert_eq!(pools[0].capacity, 511);
    assert!(!dev.port().xstats().is_empty());
    assert!(dev.port().link().is_some());
}

fn ring_port_loops_back(eal: &Eal) {
    let mut dev = DpdkPort::open(eal, &DpdkPortConfig::new(1)).unwrap();
    assert_eq!(dev.port().info().driver, "net_ring");
    let now = Instant::ZERO;
    let mut q = Vec::new();
    for i in 0..100u32 {
        let mut b = dev.alloc_tx().unwrap();
        assert!(b.set_len(64 + i as usize));
        for (k, x) in b.as_mut().iter_mut().enumerate() {
            *x = (k as u32 * 7 + i) as u8;
        }
        q.push(b);
    }
    let sent = dev.tx_burst(now, &mut q);
    assert_eq!(sent, 100);
    let mut rx = Vec::new();
    while dev.rx_burst(now, &mut rx, 32) > 0 {}
    assert_eq!(rx.len(), 100);
    for (i, m) in rx.iter().enumerate() {
        assert_eq!(m.len(), 64 + i);
        assert!(
            m.as_ref()
                .iter()
                .enumerate()
                .all(|(k, &x)| x == (k as u32 * 7 + i as u32) as u8)
        );
    }
    drop(rx);
    assert_eq!(dev.pool().in_use(), 0);
}

#[test]
fn eal_pools_and_ports_on_virtual_devices() {
    let eal = match Eal::init(EAL_ARGS) {
        Ok(e) => e,
        Err(DpdkError::EalInit { reason, .. }) if reason.contains("ermission") => {
            eprintln!("skipped: EAL needs more privileges here ({reason})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert!(matches!(
        Eal::init(EAL_ARGS),
        Err(DpdkError::AlreadyInitialized)
    ));
    assert_eq!(eal.port_count(), 2);
    pool_counters(&eal);
    null_port(&eal);
    ring_port_loops_back(&eal);
    // Closing a vdev port releases it, so none is left.
    let err = DpdkPort::open(&eal, &DpdkPortConfig::new(7)).unwrap_err();
    assert!(
        matches!(
            err,
            DpdkError::NoSuchPort {
                port: 7,
                available: 0
            }
        ),
        "{err}"
    );
    assert!(matches!(
        Eal::init("--vdev 'unbalanced"),
        Err(DpdkError::BadArgs(_))
    ));
}
