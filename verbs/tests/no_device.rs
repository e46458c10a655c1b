//! Without an RNIC, opening the verbs transport says so clearly.

use ustack::socket::ud::UdError;
use ustack_verbs::{VerbsConfig, VerbsUd};

fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn reports_no_rdma_device() {
    if has_rdma_device() {
        ustack_test_skip::skip_test!(
            "this host has an RDMA device (/sys/class/infiniband): no-device answers not checked"
        );
    }
    let err = VerbsUd::open(&VerbsConfig::default()).unwrap_err();
    assert_eq!(err, UdError::NoDevice);
    assert_eq!(err.to_string(), "no RDMA device");
    // A named device that does not exist is the same answer.
    let named = VerbsConfig {
        device: Some("mlx5_99".into()),
        ..VerbsConfig::default()
    };
    assert_eq!(VerbsUd::open(&named).unwrap_err(), UdError::NoDevice);
}
