//! One telemetry line (the JSON object the runtime's
//! `telemetry::Publisher` writes, as `utop` reads it: see [`crate`]) as
//! Prometheus metric families, with the names of
//! `tools/prometheus/README.md`.
//!
//! The input is the JSON value, not the engine's types, so the runtime's
//! endpoint (which serializes its own snapshots) and `utop --prometheus`
//! (which reads a socket, maybe of another version's stack) share one
//! converter. Missing fields are skipped, unknown counters of a known
//! layer show up under the layer's prefix, nothing panics.
//!
//! Names: `ustack_<layer>_<field>_total` for a layer's counters and
//! `ustack_<layer>_<field>` for its gauges (each field of the engine's
//! statistics declares its kind: [`ustack::stats::Metrics`]; a field this
//! build of the engine does not know, from a stack of another version, is
//! a counter); microseconds become seconds.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde_json::{Map, Value};
use ustack::node::Snapshot;
use ustack::stats::Metrics;

use super::{Family, Kind, Sample, Value as MValue};

/// Per-connection series listed at most, by default (a snapshot lists up
/// to 256; each connection is some 25 series).
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// How a line becomes families.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Connections given per-connection families (`ustack_tcp_connection_*`);
    /// the others are only in the totals.
    pub max_connections: usize,
    /// How old the snapshot is (`ustack_snapshot_age_seconds`), when known.
    pub age: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            age: None,
        }
    }
}

/// The `stack` label for a line: the first word of its `name` (the
/// program: `uping`, `ustack`, `uperf`, ...), `ustack` when it has none.
pub fn stack_label(line: &Value) -> String {
    line.get("name")
        .and_then(Value::as_str)
        .and_then(|n| n.split_whitespace().next())
        .filter(|n| !n.is_empty())
        .unwrap_or("ustack")
        .to_owned()
}

/// Families being filled in: samples of one name go to one family.
#[derive(Debug, Default)]
pub struct Families {
    list: Vec<Family>,
    index: HashMap<String, usize>,
}

impl Families {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one sample to the family `name` (made with `help` and `kind`
    /// the first time). A sample whose labels the family already has is
    /// ignored (the first one wins), so the exposition never repeats a
    /// series.
    pub fn push(&mut self, name: &str, help: &str, kind: Kind, labels: &[(&str, &str)], v: f64) {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.push_sample(
            name,
            help,
            kind,
            Sample {
                labels,
                value: MValue::Number(v),
            },
        );
    }

    /// Add a sample of any kind (see [`push`](Self::push)).
    pub fn push_sample(&mut self, name: &str, help: &str, kind: Kind, sample: Sample) {
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => {
                self.list.push(Family {
                    name: name.to_owned(),
                    help: help.to_owned(),
                    kind,
                    samples: Vec::new(),
                });
                self.index.insert(name.to_owned(), self.list.len() - 1);
                self.list.len() - 1
            }
        };
        let fam = &mut self.list[i];
        if fam.kind != kind || fam.samples.iter().any(|s| s.labels == sample.labels) {
            return;
        }
        fam.samples.push(sample);
    }

    /// The families, in the order they were first named.
    pub fn into_vec(self) -> Vec<Family> {
        self.list
    }
}

/// The families of one telemetry line: `ustack_info`, the snapshot's age,
/// pools, port, drops by reason, every layer's counters and gauges, TCP
/// totals and per-connection families (up to `opts.max_connections`),
/// shard mailboxes, the program's `app` counters and the publisher's
/// counters. No `stack` label is added here (see [`add_label`]); a line
/// merged from several shards (`shards` present) gives its port and
/// engine counters per shard, with a `shard` label.
pub fn line_families(line: &Value, opts: &Options) -> Vec<Family> {
    let mut f = Families::new();
    let version = line
        .get("version")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    f.push(
        "ustack_info",
        "Information about the stack; always 1.",
        Kind::Gauge,
        &[("version", version)],
        1.0,
    );
    if let Some(age) = opts.age {
        f.push(
            "ustack_snapshot_age_seconds",
            "Age of the telemetry snapshot this scrape was made from, in seconds.",
            Kind::Gauge,
            &[],
            age.as_secs_f64(),
        );
    }
    pools(&mut f, line);
    match line.get("shards").and_then(Value::as_array) {
        Some(shards) if !shards.is_empty() => {
            for (i, s) in shards.iter().enumerate() {
                let index = s
                    .pointer("/shard/index")
                    .and_then(Value::as_u64)
                    .unwrap_or(i as u64)
                    .to_string();
                let labels = [("shard", index.as_str())];
                port(&mut f, s, &labels);
                engine(&mut f, s, &labels);
                shard(&mut f, s, &labels);
            }
        }
        _ => {
            port(&mut f, line, &[]);
            engine(&mut f, line, &[]);
            shard(&mut f, line, &[]);
        }
    }
    connections(&mut f, line, opts.max_connections);
    app(&mut f, line);
    processes(&mut f, line);
    publisher(&mut f, line);
    f.into_vec()
}

/// The processes sharing the stack (`processes`: a stack that several
/// processes share), each with the sockets it holds.
fn processes(f: &mut Families, line: &Value) {
    for p in line
        .get("processes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(pid), Some(role), Some(n)) = (
            p.get("pid").and_then(Value::as_u64),
            p.get("role").and_then(Value::as_str),
            p.get("sockets").and_then(num),
        ) else {
            continue;
        };
        let pid = pid.to_string();
        f.push(
            "ustack_process_sockets",
            "Sockets of the stack a process holds (a stack several processes share).",
            Kind::Gauge,
            &[("pid", pid.as_str()), ("role", role)],
            n,
        );
    }
}

/// Add `key="value"` to every sample of `families` that has no `key`
/// label yet (the `stack` label of every series the endpoint serves).
pub fn add_label(families: &mut [Family], key: &str, value: &str) {
    for fam in families {
        for s in &mut fam.samples {
            if !s.labels.iter().any(|(k, _)| k == key) {
                s.labels.insert(0, (key.to_owned(), value.to_owned()));
            }
        }
    }
}

fn num(v: &Value) -> Option<f64> {
    v.as_u64().map(|n| n as f64).or_else(|| v.as_f64())
}

fn pools(f: &mut Families, line: &Value) {
    for p in line
        .get("pools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = p.get("name").and_then(Value::as_str) else {
            continue;
        };
        let l = [("pool", name)];
        let get = |k: &str| p.get(k).and_then(num);
        if let Some(v) = get("capacity") {
            f.push(
                "ustack_pool_buffers",
                "Buffers the packet pool holds.",
                Kind::Gauge,
                &l,
                v,
            );
        }
        if let Some(v) = get("in_use") {
            f.push(
                "ustack_pool_buffers_in_use",
                "Buffers of the packet pool handed out now.",
                Kind::Gauge,
                &l,
                v,
            );
        }
        if let Some(v) = get("alloc_failures") {
            f.push(
                "ustack_pool_alloc_failures_total",
                "Buffer allocations the packet pool refused.",
                Kind::Counter,
                &l,
                v,
            );
        }
        if let Some(v) = get("buf_size") {
            f.push(
                "ustack_pool_buffer_size_bytes",
                "Size of one buffer of the packet pool, in bytes.",
                Kind::Gauge,
                &l,
                v,
            );
        }
    }
}

/// The port's counters: all counters (`ustack_port_<field>_total`).
fn port(f: &mut Families, obj: &Value, labels: &[(&str, &str)]) {
    let Some(Value::Object(port)) = obj.get("port") else {
        return;
    };
    for (k, v) in port {
        let Some(v) = num(v) else { continue };
        let kind = declared(&["port", k]);
        let Some(name) = metric_name("port", k, kind == Kind::Counter) else {
            continue;
        };
        let help = port_help(k);
        f.push(&name, &help, kind, labels, v);
    }
}

fn port_help(field: &str) -> String {
    let what = match field {
        "rx_packets" => "Frames the port received",
        "rx_bytes" => "Bytes of the frames the port received",
        "tx_packets" => "Frames the port transmitted",
        "tx_bytes" => "Bytes of the frames the port transmitted",
        "rx_missed" => "Frames the port dropped on receive (queue full)",
        "rx_nombuf" => "Receive drops for want of a buffer",
        "tx_errors" => "Frames the port could not transmit",
        "tx_retries" => "Transmits retried after a transient refusal",
        "rx_gro_frames" => "Kernel-merged (GRO/LRO) frames the port cut back into segments",
        "rx_partial_checksum" => "TCP/UDP frames whose checksum held only the pseudo-header sum",
        "rx_oversize" => "Frames too large for the port",
        _ => return format!("The port's {field} counter."),
    };
    format!("{what}.")
}

/// The kind the engine declares for the number at `path` of a snapshot
/// (see [`Snapshot`]'s [`Metrics`]); a number it does not know (a stack
/// of another version) is a counter.
fn declared(path: &[&str]) -> Kind {
    match Snapshot::kind(path) {
        Some(ustack::stats::Kind::Gauge) => Kind::Gauge,
        Some(ustack::stats::Kind::Counter) | None => Kind::Counter,
    }
}

/// A valid metric name for `ustack_<section>_<field>` (with `_total` for
/// a counter), or `None` when the field's name cannot be one.
fn metric_name(section: &str, field: &str, counter: bool) -> Option<String> {
    let mut name = format!("ustack_{section}_{field}");
    if counter && !name.ends_with("_total") {
        name.push_str("_total");
    }
    super::text::valid_metric_name(&name).then_some(name)
}

/// TCP's own names for some fields (Prometheus style: whole words).
fn tcp_rename(field: &str) -> &str {
    match field {
        "segs_in" => "segments_received",
        "segs_out" => "segments_sent",
        "bytes_in" => "received_bytes",
        "bytes_out" => "sent_bytes",
        "ooo_bytes" => "out_of_order_bytes",
        "ooo_pruned" => "out_of_order_pruned",
        "ooo_dropped" => "out_of_order_dropped",
        "established" => "established_connections",
        f => f,
    }
}

fn layer_name(section: &str) -> &str {
    match section {
        "eth" => "Ethernet",
        "arp" => "ARP",
        "ipv4" => "IPv4",
        "icmp" => "ICMP",
        "udp" => "UDP",
        "ud" => "RDMA UD",
        "rc" => "RDMA RC",
        "tcp" => "TCP",
        s => s,
    }
}

/// The engine's counters (`stack` of a snapshot): drops by reason, each
/// layer's counters and gauges, TCP's totals.
fn engine(f: &mut Families, obj: &Value, labels: &[(&str, &str)]) {
    let Some(Value::Object(stack)) = obj.get("stack") else {
        return;
    };
    if let Some(Value::Object(drops)) = stack.get("drops") {
        for (reason, v) in drops {
            let Some(v) = num(v) else { continue };
            let mut l = labels.to_vec();
            l.push(("reason", reason));
            f.push(
                "ustack_drops_total",
                "Received frames dropped, by reason (one reason per frame).",
                Kind::Counter,
                &l,
                v,
            );
        }
    }
    for (section, fields) in stack {
        let Value::Object(fields) = fields else {
            continue;
        };
        match section.as_str() {
            "drops" => {}
            "tcp" => tcp(f, fields, labels),
            _ => layer(f, section, fields, labels),
        }
    }
}

fn layer(f: &mut Families, section: &str, fields: &Map<String, Value>, labels: &[(&str, &str)]) {
    for (k, v) in fields {
        let Some(v) = num(v) else { continue };
        let gauge = declared(&["stack", section, k]) == Kind::Gauge;
        let Some(name) = metric_name(section, k, !gauge) else {
            continue;
        };
        let help = format!(
            "{} {}: {k} (telemetry stack.{section}.{k}).",
            layer_name(section),
            if gauge { "gauge" } else { "counter" }
        );
        let kind = if gauge { Kind::Gauge } else { Kind::Counter };
        f.push(&name, &help, kind, labels, v);
    }
}

fn tcp_help(field: &str) -> Option<&'static str> {
    Some(match field {
        "retransmits" => "TCP segments retransmitted.",
        "connections" => "Live TCP connections, in any state including TIME_WAIT.",
        "time_wait" => "TCP connections in TIME_WAIT (small records, without buffers).",
        "segs_in" => "Well-formed TCP segments received.",
        "segs_out" => "TCP segments sent.",
        "resets_sent" => "TCP RST segments sent.",
        "resets_received" => "Acceptable TCP RST segments that closed a connection.",
        "active_opens" => "TCP connections opened by the program (connect).",
        "passive_opens" => "TCP connections opened by a listener.",
        "established" => "TCP handshakes completed.",
        "bytes_in" => "TCP payload bytes received in order, over every connection.",
        "bytes_out" => "TCP payload bytes sent and acknowledged, over every connection.",
        _ => return None,
    })
}

fn tcp(f: &mut Families, fields: &Map<String, Value>, labels: &[(&str, &str)]) {
    let mut seen = BTreeSet::new();
    for (k, v) in fields {
        let Some(v) = num(v) else { continue };
        let gauge = declared(&["stack", "tcp", k]) == Kind::Gauge;
        let Some(name) = metric_name("tcp", tcp_rename(k), !gauge) else {
            continue;
        };
        let help = tcp_help(k).map_or_else(
            || {
                format!(
                    "TCP {}: {k} (telemetry stack.tcp.{k}).",
                    if gauge { "gauge" } else { "counter" }
                )
            },
            str::to_owned,
        );
        let kind = if gauge { Kind::Gauge } else { Kind::Counter };
        f.push(&name, &help, kind, labels, v);
        seen.insert(name);
    }
    // Per-connection counters summed over every connection, live and
    // closed; those the table counts itself (segments, retransmits) are
    // already there.
    let Some(Value::Object(totals)) = fields.get("totals") else {
        return;
    };
    for (k, v) in totals {
        let Some(v) = num(v) else { continue };
        let kind = declared(&["stack", "tcp", "totals", k]);
        let Some(name) = metric_name("tcp", tcp_rename(k), kind == Kind::Counter) else {
            continue;
        };
        if seen.contains(&name) {
            continue;
        }
        let help = tcp_help(k).map_or_else(
            || format!("TCP connections' {k}, summed over every connection (telemetry stack.tcp.totals.{k})."),
            str::to_owned,
        );
        f.push(&name, &help, kind, labels, v);
    }
}

/// A shard's mailbox counters (`ustack_shard_<field>_total`).
fn shard(f: &mut Families, obj: &Value, labels: &[(&str, &str)]) {
    let Some(Value::Object(s)) = obj.get("shard") else {
        return;
    };
    for (k, v) in s {
        if k == "index" || k == "count" {
            continue; // the `shard` label
        }
        let Some(v) = num(v) else { continue };
        let kind = declared(&["shard", k]);
        let Some(name) = metric_name("shard", k, kind == Kind::Counter) else {
            continue;
        };
        let help = format!("Shard mailbox counter: {k}.");
        f.push(&name, &help, kind, labels, v);
    }
}

/// `SynSent` -> `SYN_SENT`, as `ss` and utop write states.
fn state_label(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for (i, c) in s.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.extend(c.to_uppercase());
    }
    out
}

fn connections(f: &mut Families, line: &Value, max: usize) {
    let total = line
        .get("connections_total")
        .and_then(num)
        .or_else(|| line.pointer("/stack/tcp/connections").and_then(num));
    if let Some(v) = total {
        // The engine's own gauge of this name (per shard on a sharded
        // host) comes first when the line has it.
        if !f.index.contains_key("ustack_tcp_connections") {
            f.push(
                "ustack_tcp_connections",
                "Live TCP connections, in any state including TIME_WAIT.",
                Kind::Gauge,
                &[],
                v,
            );
        }
    }
    let conns = line.get("connections").and_then(Value::as_array);
    for c in conns.into_iter().flatten().take(max) {
        let (Some(local), Some(remote)) = (
            c.get("local").and_then(Value::as_str),
            c.get("remote").and_then(Value::as_str),
        ) else {
            continue;
        };
        let state = state_label(c.get("state").and_then(Value::as_str).unwrap_or("unknown"));
        let l = [
            ("local", local),
            ("remote", remote),
            ("state", state.as_str()),
        ];
        const BYTES: [(&str, &str, &str); 9] = [
            ("cwnd", "cwnd_bytes", "Congestion window"),
            ("ssthresh", "ssthresh_bytes", "Slow-start threshold"),
            ("snd_wnd", "send_window_bytes", "The peer's receive window"),
            ("rcv_wnd", "receive_window_bytes", "Our receive window"),
            (
                "in_flight",
                "in_flight_bytes",
                "Bytes sent and not yet acknowledged",
            ),
            (
                "send_queued",
                "send_queued_bytes",
                "Bytes in the send buffer",
            ),
            (
                "recv_queued",
                "receive_queued_bytes",
                "Bytes received and not yet read",
            ),
            ("ooo_bytes", "out_of_order_bytes", "Bytes held out of order"),
            ("mss", "mss_bytes", "MSS of segments sent"),
        ];
        for (field, suffix, what) in BYTES {
            if let Some(v) = c.get(field).and_then(num) {
                let name = format!("ustack_tcp_connection_{suffix}");
                let help = format!("{what}, in bytes (per connection).");
                f.push(&name, &help, Kind::Gauge, &l, v);
            }
        }
        const MICROS: [(&str, &str, &str); 3] = [
            ("srtt_us", "srtt_seconds", "Smoothed round-trip time"),
            ("rttvar_us", "rttvar_seconds", "Round-trip time variation"),
            ("rto_us", "rto_seconds", "Retransmission timeout"),
        ];
        for (field, suffix, what) in MICROS {
            if let Some(v) = c.get(field).and_then(num) {
                let name = format!("ustack_tcp_connection_{suffix}");
                let help = format!("{what}, in seconds (per connection).");
                f.push(&name, &help, Kind::Gauge, &l, v / 1e6);
            }
        }
        let Some(Value::Object(stats)) = c.get("stats") else {
            continue;
        };
        for (k, v) in stats {
            let Some(v) = num(v) else { continue };
            let kind = declared(&["connections", "stats", k]);
            let counter = kind == Kind::Counter;
            let Some(name) = metric_name("tcp_connection", tcp_rename(k), counter) else {
                continue;
            };
            let help = format!("The connection's {k} counter.");
            f.push(&name, &help, kind, &l, v);
        }
    }
}

/// The program's own counters (`app`): `ustack_app_<name>_total`.
fn app(f: &mut Families, line: &Value) {
    let Some(Value::Object(app)) = line.get("app") else {
        return;
    };
    for (k, v) in app {
        let Some(v) = num(v) else { continue };
        let clean: String = k
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let Some(name) = metric_name("app", &clean, true) else {
            continue;
        };
        let help = format!("The program's own counter {k}.");
        f.push(&name, &help, Kind::Counter, &[], v);
    }
}

/// The telemetry publisher's counters.
fn publisher(f: &mut Families, line: &Value) {
    let Some(p) = line.get("publisher") else {
        return;
    };
    if let Some(v) = p.get("clients").and_then(num) {
        f.push(
            "ustack_telemetry_clients",
            "Clients attached to the telemetry socket.",
            Kind::Gauge,
            &[],
            v,
        );
    }
    if let Some(v) = p.get("skipped").and_then(num) {
        f.push(
            "ustack_telemetry_snapshots_skipped_total",
            "Snapshots the poll loop skipped because the telemetry publisher was behind.",
            Kind::Counter,
            &[],
            v,
        );
    }
    if let Some(v) = p.get("dropped_clients").and_then(num) {
        f.push(
            "ustack_telemetry_clients_dropped_total",
            "Telemetry clients dropped for being slow or gone.",
            Kind::Counter,
            &[],
            v,
        );
    }
}

/// `ustack_up`: 1 when the families come from a snapshot, 0 when there is
/// none yet (or the stack went away).
pub fn up(value: bool) -> Family {
    Family {
        name: "ustack_up".into(),
        help: "1 when a telemetry snapshot of the stack is at hand, 0 when not.".into(),
        kind: Kind::Gauge,
        samples: vec![Sample {
            labels: Vec::new(),
            value: MValue::Number(if value { 1.0 } else { 0.0 }),
        }],
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use ustack::node::Snapshot;
    use ustack::phy::pool::PoolStats;

    fn snapshot() -> Snapshot {
        let mut s = Snapshot {
            at_ns: 1,
            stack: Default::default(),
            port: Default::default(),
            pools: vec![PoolStats {
                name: "rx \"main\"\\q\nx".into(),
                capacity: 8192,
                in_use: 3,
                alloc_failures: 2,
                buf_size: 2048,
            }],
            connections: Vec::new(),
            connections_total: 0,
            offloads: Default::default(),
            shard: None,
            rc_qps: Vec::new(),
        };
        s.stack.tcp.retransmits = 5;
        s.stack.tcp.segs_in = 11;
        s.stack.tcp.connections = 3;
        s.stack.arp.entries = 4;
        s.stack.icmp.tx_echo_replies = 9;
        s.port.rx_packets = 12;
        s
    }

    /// A line as the publisher writes it, with `n` connections listed.
    fn line(n: usize) -> Value {
        let mut v = serde_json::to_value(snapshot()).unwrap();
        let conns: Vec<Value> = (0..n)
            .map(|i| {
                serde_json::json!({
                    "local": "10.0.0.1:5001",
                    "remote": format!("10.0.0.2:{}", 40000 + i),
                    "state": "SynSent",
                    "cwnd": 14600, "srtt_us": 1500, "rto_us": 200000,
                    "stats": {"retransmits": 1, "bytes_in": 100}
                })
            })
            .collect();
        v["connections_total"] = n.into();
        v["connections"] = conns.into();
        v["name"] = "uping 10.0.0.1/24".into();
        v["publisher"] = serde_json::json!({"clients": 1, "skipped": 2, "dropped_clients": 0});
        v["app"] = serde_json::json!({"refused-calls": 3});
        v
    }

    fn find<'a>(f: &'a [Family], name: &str) -> &'a Family {
        f.iter().find(|f| f.name == name).unwrap_or_else(|| {
            panic!(
                "no {name} in {:?}",
                f.iter().map(|f| &f.name).collect::<Vec<_>>()
            )
        })
    }

    fn value(f: &Family, labels: &[(&str, &str)]) -> f64 {
        let s = f
            .samples
            .iter()
            .find(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(k2, v2)| k2 == k && v2 == v))
            })
            .unwrap_or_else(|| panic!("{} has no {labels:?}: {:?}", f.name, f.samples));
        match s.value {
            MValue::Number(v) => v,
            MValue::Histogram { .. } => panic!("a histogram"),
        }
    }

    #[test]
    fn names_types_and_values_of_a_known_snapshot() {
        let opts = Options {
            age: Some(Duration::from_millis(250)),
            ..Options::default()
        };
        let f = line_families(&line(2), &opts);
        let retx = find(&f, "ustack_tcp_retransmits_total");
        assert_eq!((retx.kind, value(retx, &[])), (Kind::Counter, 5.0));
        let segs = find(&f, "ustack_tcp_segments_received_total");
        assert_eq!(value(segs, &[]), 11.0);
        let conns = find(&f, "ustack_tcp_connections");
        assert_eq!((conns.kind, value(conns, &[])), (Kind::Gauge, 3.0));
        assert_eq!(find(&f, "ustack_arp_entries").kind, Kind::Gauge);
        assert_eq!(find(&f, "ustack_arp_entries_hwm").kind, Kind::Gauge);
        assert_eq!(
            value(find(&f, "ustack_icmp_tx_echo_replies_total"), &[]),
            9.0
        );
        assert_eq!(value(find(&f, "ustack_port_rx_packets_total"), &[]), 12.0);
        assert_eq!(value(find(&f, "ustack_snapshot_age_seconds"), &[]), 0.25);
        assert_eq!(
            value(find(&f, "ustack_info"), &[("version", "unknown")]),
            1.0
        );
        // Every drop reason, zero or not.
        let drops = find(&f, "ustack_drops_total");
        assert_eq!(drops.samples.len(), ustack::stats::DropReason::ALL.len());
        assert_eq!(value(drops, &[("reason", "tcp_bad_checksum")]), 0.0);
        let pool = find(&f, "ustack_pool_buffers_in_use");
        assert_eq!(value(pool, &[("pool", "rx \"main\"\\q\nx")]), 3.0);
        assert_eq!(
            value(find(&f, "ustack_pool_alloc_failures_total"), &[]),
            2.0
        );
        // Per connection: labels, seconds from microseconds, counters.
        let srtt = find(&f, "ustack_tcp_connection_srtt_seconds");
        assert_eq!(
            value(
                srtt,
                &[
                    ("remote", "10.0.0.2:40001"),
                    ("state", "SYN_SENT"),
                    ("local", "10.0.0.1:5001")
                ]
            ),
            0.0015
        );
        let retx = find(&f, "ustack_tcp_connection_retransmits_total");
        assert_eq!((retx.kind, retx.samples.len()), (Kind::Counter, 2));
        assert_eq!(
            find(&f, "ustack_tcp_connection_received_bytes_total").kind,
            Kind::Counter
        );
        assert_eq!(value(find(&f, "ustack_app_refused_calls_total"), &[]), 3.0);
        assert_eq!(
            value(find(&f, "ustack_telemetry_snapshots_skipped_total"), &[]),
            2.0
        );
        assert_eq!(value(find(&f, "ustack_telemetry_clients"), &[]), 1.0);
        // Names are valid, counters end in _total and nothing else does.
        for fam in &f {
            assert!(
                super::super::text::valid_metric_name(&fam.name),
                "{}",
                fam.name
            );
            assert!(!fam.help.is_empty(), "{}", fam.name);
            assert_eq!(
                fam.kind == Kind::Counter,
                fam.name.ends_with("_total"),
                "{}",
                fam.name
            );
            assert!(
                !fam.name.contains("_us_") && !fam.name.ends_with("_us"),
                "{}",
                fam.name
            );
        }
        assert_eq!(stack_label(&line(0)), "uping");
        assert_eq!(stack_label(&serde_json::json!({})), "ustack");
    }

    /// Every number under `v` by its path (list elements passed over).
    fn numbers(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        match v {
            Value::Number(_) => out.push(path.clone()),
            Value::Object(m) => {
                for (k, v) in m {
                    path.push(k.clone());
                    numbers(v, path, out);
                    path.pop();
                }
            }
            Value::Array(a) => a.iter().for_each(|v| numbers(v, path, out)),
            _ => {}
        }
    }

    #[test]
    fn every_number_of_a_snapshot_has_a_declared_kind() {
        use ustack::stats::Kind as Declared;
        let mut s = snapshot();
        s.shard = Some(ustack::node::ShardSnapshot {
            index: 0,
            count: 2,
            stats: Default::default(),
        });
        let mut v = serde_json::to_value(&s).unwrap();
        v["connections"] = serde_json::json!([{
            "local": "10.0.0.1:1", "remote": "10.0.0.2:2", "state": "Established",
            "stats": serde_json::to_value(ustack::stats::ConnStats::default()).unwrap(),
        }]);
        let mut paths = Vec::new();
        for section in ["stack", "port", "pools", "shard", "connections"] {
            let mut path = vec![section.to_owned()];
            numbers(&v[section], &mut path, &mut paths);
        }
        // The labels: a shard's place.
        paths.retain(|p| p[0] != "shard" || !matches!(p[1].as_str(), "index" | "count"));
        assert!(paths.len() > 150, "{}", paths.len());
        let f = line_families(&v, &Options::default());
        for p in &paths {
            let p: Vec<&str> = p.iter().map(String::as_str).collect();
            let kind = Snapshot::kind(&p);
            assert!(kind.is_some(), "no declared kind for {}", p.join("."));
            // A layer's field is a family of its declared kind.
            if let ["stack", section, field] = p[..] {
                let field = if section == "tcp" {
                    tcp_rename(field)
                } else {
                    field
                };
                let (suffix, kind) = match kind {
                    Some(Declared::Gauge) => ("", Kind::Gauge),
                    _ => ("_total", Kind::Counter),
                };
                let name = format!("ustack_{section}_{field}{suffix}");
                let name = name.replace("_total_total", "_total");
                if section != "drops" {
                    assert_eq!(find(&f, &name).kind, kind, "{name}");
                }
            }
        }
        // The pools' names are given one by one: their kinds agree.
        for (field, name) in [
            ("capacity", "ustack_pool_buffers"),
            ("in_use", "ustack_pool_buffers_in_use"),
            ("alloc_failures", "ustack_pool_alloc_failures_total"),
            ("buf_size", "ustack_pool_buffer_size_bytes"),
        ] {
            let declared = match Snapshot::kind(&["pools", field]) {
                Some(Declared::Gauge) => Kind::Gauge,
                _ => Kind::Counter,
            };
            assert_eq!(find(&f, name).kind, declared, "{name}");
        }
    }

    #[test]
    fn processes_sharing_the_stack_are_gauges_by_pid_and_role() {
        let mut l = line(1);
        l["processes"] = serde_json::json!([
            {"pid": 100, "role": "owner", "sockets": 2},
            {"pid": 101, "role": "client", "sockets": 3},
        ]);
        let f = line_families(&l, &Options::default());
        let p = find(&f, "ustack_process_sockets");
        assert_eq!(p.kind, Kind::Gauge);
        assert_eq!(value(p, &[("pid", "100"), ("role", "owner")]), 2.0);
        assert_eq!(value(p, &[("pid", "101"), ("role", "client")]), 3.0);
        // A single process: no such family.
        let f = line_families(&line(1), &Options::default());
        assert!(!f.iter().any(|x| x.name == "ustack_process_sockets"));
    }

    #[test]
    fn connections_are_listed_up_to_the_cap() {
        let opts = Options {
            max_connections: 10,
            age: None,
        };
        let f = line_families(&line(300), &opts);
        assert_eq!(
            find(&f, "ustack_tcp_connection_cwnd_bytes").samples.len(),
            10
        );
        // The host's count is still the whole count.
        assert!(
            f.iter()
                .all(|fam| fam.name != "ustack_snapshot_age_seconds")
        );
        let f = line_families(&line(3), &opts);
        assert_eq!(
            find(&f, "ustack_tcp_connection_cwnd_bytes").samples.len(),
            3
        );
    }

    #[test]
    fn shards_are_labelled_and_stack_is_added_everywhere() {
        let mut v = line(0);
        let mut one = serde_json::json!({"port": {"rx_packets": 4}, "stack": {"tcp": {"retransmits": 1}}, "shard": {"index": 1, "count": 2, "mail_in": 6}});
        let zero = serde_json::json!({"port": {"rx_packets": 3}, "stack": {"tcp": {"retransmits": 2}}, "shard": {"index": 0, "count": 2, "mail_in": 5}});
        one["connections_total"] = 1.into();
        v["shards"] = serde_json::json!([zero, one]);
        let mut f = line_families(&v, &Options::default());
        add_label(&mut f, "stack", "ustack");
        let rx = find(&f, "ustack_port_rx_packets_total");
        assert_eq!(value(rx, &[("shard", "0")]), 3.0);
        assert_eq!(value(rx, &[("shard", "1")]), 4.0);
        assert_eq!(
            value(find(&f, "ustack_shard_mail_in_total"), &[("shard", "1")]),
            6.0
        );
        assert!(
            f.iter()
                .flat_map(|f| &f.samples)
                .all(|s| s.labels.iter().any(|(k, v)| k == "stack" && v == "ustack"))
        );
    }

    #[test]
    fn junk_lines_give_what_they_can_and_never_panic() {
        for junk in [
            serde_json::json!(null),
            serde_json::json!([1, 2]),
            serde_json::json!({"stack": 5, "port": [], "pools": {"a": 1}, "connections": [1, {"local": 3}], "shards": [null, 4]}),
            serde_json::json!({"stack": {"tcp": {"bad name!": 1, "totals": 7}, "weird layer": {"x": 1}}}),
        ] {
            let f = line_families(&junk, &Options::default());
            assert_eq!(f[0].name, "ustack_info");
            let text = super::super::text::render(&f);
            assert!(!text.contains("bad name"), "{text}");
        }
    }
}
