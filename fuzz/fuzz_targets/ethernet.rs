//! Raw frames into a stack: the whole receive path from the Ethernet header
//! down. Each input is a few frames (length-prefixed); the first byte says
//! whether to repair checksums so mutations reach the layers behind them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smoltcp::wire::{EthernetFrame, EthernetRepr};
use ustack::{Instant, VecTx};
use ustack_fuzz::{Reader, finish, fix_checksums, receive_counted, stack};

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let fix = r.u8();
    let mut s = stack();
    let mut tx = VecTx::new();
    let mut ms = 0;
    while !r.is_empty() {
        let len = usize::from(r.u16()) % 1600;
        let mut frame = r.bytes(len).to_vec();
        if let Ok(f) = EthernetFrame::new_checked(&frame[..]) {
            // smoltcp's view and repr agree with each other on any bytes.
            let repr = EthernetRepr::parse(&f).expect("a checked frame parses");
            assert_eq!(repr.ethertype, f.ethertype());
        }
        if fix & 1 == 1 {
            fix_checksums(&mut frame);
        }
        ms += u64::from(fix >> 1);
        receive_counted(&mut s, Instant::from_millis(ms), &frame, &mut tx);
    }
    finish(&mut s, tx);
});
