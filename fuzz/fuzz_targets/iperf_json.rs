//! uperf's iperf3 control channel: length-prefixed JSON messages taken off
//! a byte stream, and the client's parameter JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustack_apps::iperf::{MAX_JSON, parse_params, take_json};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = parse_params(data) {
        assert!((1..=128).contains(&p.parallel));
        assert!((1..=1 << 20).contains(&p.len));
    }
    let mut buf = data.to_vec();
    let mut taken = 0;
    while let Ok(Some(msg)) = take_json(&mut buf) {
        assert!(msg.len() <= MAX_JSON);
        taken += 4 + msg.len();
        let _ = parse_params(&msg);
    }
    assert_eq!(taken + buf.len(), data.len());
});
