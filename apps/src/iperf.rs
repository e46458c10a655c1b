//! The iperf3 3.x wire protocol (as in Debian 12's iperf3 3.12) for `uperf`:
//! state bytes, the cookie, length-prefixed JSON, and iperf3-style units.

/// Cookie: 36 characters and a NUL.
pub const COOKIE_LEN: usize = 37;
/// Largest JSON message accepted.
pub const MAX_JSON: usize = 64 << 10;

pub const TEST_START: u8 = 1;
pub const TEST_RUNNING: u8 = 2;
pub const TEST_END: u8 = 4;
pub const PARAM_EXCHANGE: u8 = 9;
pub const CREATE_STREAMS: u8 = 10;
pub const CLIENT_TERMINATE: u8 = 12;
pub const EXCHANGE_RESULTS: u8 = 13;
pub const DISPLAY_RESULTS: u8 = 14;
pub const IPERF_DONE: u8 = 16;
pub const ACCESS_DENIED: u8 = 0xff;
/// The server failed: followed by iperf3's error code (`i_errno`) and
/// `errno`, each a big-endian i32; the client prints iperf3's text for the
/// code (`iperf3: error - ...`).
pub const SERVER_ERROR: u8 = 0xfe;
/// iperf3's `IEUNIMP`: "an option you are trying to set is not implemented yet".
pub const IEUNIMP: i32 = 13;
/// Linux errno values sent beside the code (what was refused).
pub const EPROTONOSUPPORT: i32 = 93;
pub const EOPNOTSUPP: i32 = 95;

/// A test the server will not run, and the error state a stock client
/// understands for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Our words for it (the server's own output).
    pub reason: String,
    /// iperf3's `i_errno`.
    pub code: i32,
    /// `errno` beside it.
    pub errno: i32,
}

impl Refusal {
    /// The bytes on the control connection: `SERVER_ERROR`, code, errno.
    pub fn wire(&self) -> Vec<u8> {
        let mut v = vec![SERVER_ERROR];
        v.extend(self.code.to_be_bytes());
        v.extend(self.errno.to_be_bytes());
        v
    }
}

/// Test parameters a client sends.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub reverse: bool,
    pub parallel: usize,
    pub time: f64,
    pub len: usize,
    /// Seconds at the start not counted (iperf3's `-O`).
    pub omit: f64,
}

/// A test the server does not run (UDP, `--bidir`), as the error state a
/// stock iperf3 client prints.
pub fn refusal(json: &[u8]) -> Option<Refusal> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let flag = |k: &str| v.get(k).is_some_and(|x| x.as_bool() != Some(false));
    if v.get("tcp").is_none() && v.get("udp").is_some() {
        return Some(Refusal {
            reason: "UDP tests are not supported (TCP only)".into(),
            code: IEUNIMP,
            errno: EPROTONOSUPPORT,
        });
    }
    if flag("bidirectional") {
        return Some(Refusal {
            reason: "--bidir is not supported (one direction per test: -R for reverse)".into(),
            code: IEUNIMP,
            errno: EOPNOTSUPP,
        });
    }
    None
}

/// Parse the client's parameter JSON (flags are tested by presence; unknown keys ignored).
pub fn parse_params(json: &[u8]) -> Result<Params, String> {
    if let Some(r) = refusal(json) {
        return Err(r.reason);
    }
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("bad parameter JSON: {e}"))?;
    let flag = |k: &str| v.get(k).is_some_and(|x| x.as_bool() != Some(false));
    let parallel = v
        .get("parallel")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(1)
        .clamp(1, 128) as usize;
    let len = v
        .get("len")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(128 << 10)
        .clamp(1, 1 << 20) as usize;
    Ok(Params {
        reverse: flag("reverse"),
        parallel,
        time: v
            .get("time")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(10.0),
        len,
        omit: v
            .get("omit")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
            .clamp(0.0, 600.0),
    })
}

/// Stream ids as iperf3 numbers them: 1, 3, 4, 5, ... (2 is skipped).
pub fn stream_id(index: usize) -> u32 {
    if index == 0 { 1 } else { index as u32 + 2 }
}

/// A length-prefixed JSON message.
pub fn frame_json(v: &serde_json::Value) -> Vec<u8> {
    let body = v.to_string().into_bytes();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

/// Take one length-prefixed JSON message off the front of `buf`, if complete.
pub fn take_json(buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_JSON {
        return Err(format!(
            "JSON message of {len} bytes is over the {MAX_JSON}-byte limit"
        ));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let msg = buf[4..4 + len].to_vec();
    buf.drain(..4 + len);
    Ok(Some(msg))
}

/// Bytes in iperf3's 1024-based units ("1.10 GBytes").
pub fn fmt_bytes(b: u64) -> String {
    unit(b as f64, 1024.0, "Bytes")
}

/// Bits per second in iperf3's 1000-based units ("9.42 Gbits/sec").
pub fn fmt_rate(bps: f64) -> String {
    unit(bps, 1000.0, "bits/sec")
}

fn unit(mut v: f64, k: f64, suffix: &str) -> String {
    let mut prefix = "";
    for p in ["K", "M", "G", "T"] {
        if v < k * 1.0 - 0.5 {
            break;
        }
        v /= k;
        prefix = p;
    }
    let num = if v < 9.995 {
        format!("{v:4.2}")
    } else if v < 99.95 {
        format!("{v:4.1}")
    } else {
        format!("{v:4.0}")
    };
    format!("{num} {prefix}{suffix}")
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn params_from_iperf3_312() {
        let p = parse_params(br#"{"tcp":true,"omit":0,"time":10,"num":0,"blockcount":0,"parallel":1,"len":131072,"pacing_timer":1000,"client_version":"3.12"}"#).unwrap();
        assert_eq!(
            p,
            Params {
                reverse: false,
                parallel: 1,
                time: 10.0,
                len: 131_072,
                omit: 0.0,
            }
        );
        let p = parse_params(br#"{"tcp":true,"time":2,"parallel":4,"reverse":true,"len":1000}"#)
            .unwrap();
        assert!(p.reverse);
        assert_eq!(p.parallel, 4);
        assert!(parse_params(br#"{"udp":true}"#).is_err());
        assert!(parse_params(b"not json").is_err());
    }

    #[test]
    fn json_framing() {
        let mut buf = frame_json(&serde_json::json!({"a": 1}));
        buf.push(7);
        let msg = take_json(&mut buf).unwrap().unwrap();
        assert_eq!(msg, br#"{"a":1}"#);
        assert_eq!(buf, vec![7]);
        let mut short = vec![0, 0, 0, 10, 1];
        assert_eq!(take_json(&mut short).unwrap(), None);
        let mut huge = (u32::MAX).to_be_bytes().to_vec();
        assert!(take_json(&mut huge).is_err());
    }

    #[test]
    fn units_like_iperf3() {
        assert_eq!(fmt_bytes(1_181_116_006), "1.10 GBytes");
        assert_eq!(fmt_bytes(52_428_800), "50.0 MBytes");
        assert_eq!(fmt_rate(9.42e9), "9.42 Gbits/sec");
        assert_eq!(fmt_rate(941e6), " 941 Mbits/sec");
        assert_eq!(stream_id(0), 1);
        assert_eq!(stream_id(1), 3);
        assert_eq!(stream_id(2), 4);
    }
}
