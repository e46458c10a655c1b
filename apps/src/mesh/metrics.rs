//! The mesh's Prometheus metrics (names in tools/prometheus/README.md,
//! "Mesh mode").
//!
//! The poll loop publishes a [`MeshSnapshot`] a few times a second with
//! [`MeshMetrics::publish`], which only ever `try_lock`s (a scrape in
//! progress makes the loop skip one publication, never wait);
//! [`MeshMetrics::collect`] renders the latest one on the metrics
//! endpoint's thread.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use ustack_runtime::metrics::{Family, Kind, MetricsSource, Sample, Value};

use super::pinglist::Probe;

/// Upper bounds (seconds) of the RTT and TCP connect histograms' buckets.
pub const RTT_BOUNDS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];

/// A Prometheus histogram with [`RTT_BOUNDS`]: fixed memory, O(16) per observation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Buckets {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    counts: [u64; 17],
    sum: f64,
}

impl Buckets {
    /// Count one observation of `secs` seconds.
    pub fn observe(&mut self, secs: f64) {
        let i = RTT_BOUNDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(RTT_BOUNDS.len());
        self.counts[i] += 1;
        self.sum += secs;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The value in the metrics data model: cumulative counts per bound.
    pub fn value(&self) -> Value {
        let mut acc = 0;
        let buckets = RTT_BOUNDS
            .iter()
            .zip(self.counts)
            .map(|(&b, c)| {
                acc += c;
                (b, acc)
            })
            .collect();
        Value::Histogram {
            buckets,
            sum: self.sum,
            count: self.count(),
        }
    }
}

/// One (target, probe) series as the loop last published it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSnapshot {
    /// The target's address.
    pub target: IpAddr,
    /// Its label in the ping list (empty when it has none).
    pub name: String,
    /// The probe.
    pub probe: Probe,
    /// Probes sent.
    pub sent: u64,
    /// Answers received (not duplicates).
    pub received: u64,
    /// Probes whose wait ran out unanswered.
    pub lost: u64,
    /// Round-trip times.
    pub rtt: Buckets,
    /// TCP: SYN to established.
    pub connect: Buckets,
    /// Whether the last probe whose wait ended was answered (none yet: `None`).
    pub up: Option<bool>,
    /// The last error, once one happened.
    pub last_error: Option<String>,
}

/// What the loop publishes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MeshSnapshot {
    /// This stack's IPv4 address (the `source` label of IPv4 targets).
    pub source: Option<Ipv4Addr>,
    /// This stack's IPv6 address (the `source` label of IPv6 targets).
    pub source6: Option<Ipv6Addr>,
    /// Every series of the ping list in force.
    pub series: Vec<SeriesSnapshot>,
    /// Targets in the ping list now.
    pub targets: usize,
    /// Ping list changes applied.
    pub reloads: u64,
}

/// The mesh's [`MetricsSource`]: register it with
/// `ustack_runtime::Builder::metrics_source`.
#[derive(Debug, Default)]
pub struct MeshMetrics {
    snap: Mutex<MeshSnapshot>,
    /// Ping list reads or parses that failed (the reload thread counts them).
    pub pinglist_errors: std::sync::Arc<AtomicU64>,
}

impl MeshMetrics {
    /// A source with nothing published yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replace the snapshot with `fill`'s, unless a scrape holds it right
    /// now (then nothing is done and false returned): never blocks.
    pub fn publish(&self, fill: impl FnOnce(&mut MeshSnapshot)) -> bool {
        match self.snap.try_lock() {
            Ok(mut s) => {
                fill(&mut s);
                true
            }
            Err(_) => false,
        }
    }

    /// A copy of the latest snapshot.
    pub fn snapshot(&self) -> MeshSnapshot {
        self.snap.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn family(name: &str, help: &str, kind: Kind, samples: Vec<Sample>) -> Family {
    Family {
        name: name.into(),
        help: help.into(),
        kind,
        samples,
    }
}

impl MetricsSource for MeshMetrics {
    fn collect(&self, out: &mut Vec<Family>) {
        let s = self.snapshot();
        let source = s.source.map(|a| a.to_string()).unwrap_or_default();
        let source6 = s.source6.map(|a| a.to_string()).unwrap_or_default();
        let labels = |x: &SeriesSnapshot| {
            let (from, family) = match x.target {
                IpAddr::V4(_) => (&source, "ipv4"),
                IpAddr::V6(_) => (&source6, "ipv6"),
            };
            vec![
                ("source".to_string(), from.clone()),
                ("target".to_string(), x.target.to_string()),
                ("target_name".to_string(), x.name.clone()),
                ("probe".to_string(), x.probe.as_str().to_string()),
                ("family".to_string(), family.to_string()),
            ]
        };
        let per_series = |f: &dyn Fn(&SeriesSnapshot) -> Option<Value>| -> Vec<Sample> {
            s.series
                .iter()
                .filter_map(|x| {
                    f(x).map(|value| Sample {
                        labels: labels(x),
                        value,
                    })
                })
                .collect()
        };
        let n = |v: u64| Some(Value::Number(v as f64));
        out.push(family(
            "ustack_mesh_probes_sent_total",
            "Mesh probes sent.",
            Kind::Counter,
            per_series(&|x| n(x.sent)),
        ));
        out.push(family(
            "ustack_mesh_probes_received_total",
            "Mesh probe answers received (not duplicates).",
            Kind::Counter,
            per_series(&|x| n(x.received)),
        ));
        out.push(family(
            "ustack_mesh_probes_lost_total",
            "Mesh probes unanswered when their wait ran out.",
            Kind::Counter,
            per_series(&|x| n(x.lost)),
        ));
        out.push(family(
            "ustack_mesh_rtt_seconds",
            "Mesh probe round-trip times.",
            Kind::Histogram,
            per_series(&|x| Some(x.rtt.value())),
        ));
        out.push(family(
            "ustack_mesh_tcp_connect_seconds",
            "TCP probe: SYN to established.",
            Kind::Histogram,
            per_series(&|x| (x.probe == Probe::Tcp).then(|| x.connect.value())),
        ));
        out.push(family(
            "ustack_mesh_target_up",
            "1 when the last probe's wait ended with an answer, 0 when it ended without.",
            Kind::Gauge,
            per_series(&|x| x.up.map(|u| Value::Number(if u { 1.0 } else { 0.0 }))),
        ));
        let errors = s
            .series
            .iter()
            .filter_map(|x| {
                let e = x.last_error.as_ref()?;
                let mut l = labels(x);
                l.push(("error".into(), e.clone()));
                Some(Sample {
                    labels: l,
                    value: Value::Number(1.0),
                })
            })
            .collect();
        out.push(family(
            "ustack_mesh_last_error_info",
            "The last error of a mesh series, as the label error.",
            Kind::Gauge,
            errors,
        ));
        let plain = |v: f64| {
            vec![Sample {
                labels: vec![("source".into(), source.clone())],
                value: Value::Number(v),
            }]
        };
        out.push(family(
            "ustack_mesh_targets",
            "Targets in the ping list now.",
            Kind::Gauge,
            plain(s.targets as f64),
        ));
        out.push(family(
            "ustack_mesh_pinglist_reloads_total",
            "Ping list changes applied.",
            Kind::Counter,
            plain(s.reloads as f64),
        ));
        out.push(family(
            "ustack_mesh_pinglist_errors_total",
            "Ping list reads or parses that failed (the old list stays).",
            Kind::Counter,
            plain(self.pinglist_errors.load(Ordering::Relaxed) as f64),
        ));
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let mut b = Buckets::default();
        for s in [0.000_005, 0.00001, 0.00003, 0.0007, 0.0007, 2.0] {
            b.observe(s);
        }
        let Value::Histogram {
            buckets,
            sum,
            count,
        } = b.value()
        else {
            panic!("not a histogram")
        };
        assert_eq!(count, 6);
        assert!((sum - 2.001_445).abs() < 1e-9, "{sum}");
        assert_eq!(buckets.len(), 16);
        let at = |bound: f64| buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!(at(0.00001), 2, "the bound itself is in its bucket");
        assert_eq!(at(0.000025), 2);
        assert_eq!(at(0.00005), 3);
        assert_eq!(at(0.0005), 3);
        assert_eq!(at(0.001), 5);
        assert_eq!(at(1.0), 5, "2 s is only in +Inf (the count)");
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        );
    }

    fn series(probe: Probe) -> SeriesSnapshot {
        SeriesSnapshot {
            target: Ipv4Addr::new(10, 0, 0, 2).into(),
            name: "a".into(),
            probe,
            sent: 10,
            received: 7,
            lost: 2,
            rtt: Buckets::default(),
            connect: Buckets::default(),
            up: None,
            last_error: None,
        }
    }

    #[test]
    fn collect_renders_every_family() {
        let m = MeshMetrics::new();
        let mut tcp = series(Probe::Tcp);
        tcp.connect.observe(0.0002);
        tcp.up = Some(false);
        tcp.last_error = Some("connection refused".into());
        let mut icmp = series(Probe::Icmp);
        icmp.up = Some(true);
        icmp.rtt.observe(0.00004);
        assert!(m.publish(|s| {
            s.source = Some(Ipv4Addr::new(10, 0, 0, 1));
            s.series = vec![icmp, tcp];
            s.targets = 1;
            s.reloads = 3;
        }));
        m.pinglist_errors.fetch_add(2, Ordering::Relaxed);
        let mut out = Vec::new();
        m.collect(&mut out);
        let get = |name: &str| out.iter().find(|f| f.name == name).unwrap();
        let lost = get("ustack_mesh_probes_lost_total");
        assert_eq!(lost.kind, Kind::Counter);
        assert_eq!(lost.samples.len(), 2);
        assert_eq!(lost.samples[0].value, Value::Number(2.0));
        assert_eq!(
            lost.samples[1].labels,
            vec![
                ("source".to_string(), "10.0.0.1".to_string()),
                ("target".to_string(), "10.0.0.2".to_string()),
                ("target_name".to_string(), "a".to_string()),
                ("probe".to_string(), "tcp".to_string()),
                ("family".to_string(), "ipv4".to_string()),
            ]
        );
        let connect = get("ustack_mesh_tcp_connect_seconds");
        assert_eq!(
            connect.samples.len(),
            1,
            "only tcp series have a connect time"
        );
        let Value::Histogram { count, .. } = &connect.samples[0].value else {
            panic!()
        };
        assert_eq!(*count, 1);
        let up = get("ustack_mesh_target_up");
        assert_eq!(up.samples[0].value, Value::Number(1.0));
        assert_eq!(up.samples[1].value, Value::Number(0.0));
        let err = get("ustack_mesh_last_error_info");
        assert_eq!(err.samples.len(), 1);
        assert_eq!(
            err.samples[0].labels.last().unwrap(),
            &("error".to_string(), "connection refused".to_string())
        );
        assert_eq!(
            get("ustack_mesh_targets").samples[0].value,
            Value::Number(1.0)
        );
        assert_eq!(
            get("ustack_mesh_pinglist_reloads_total").samples[0].value,
            Value::Number(3.0)
        );
        assert_eq!(
            get("ustack_mesh_pinglist_errors_total").samples[0].value,
            Value::Number(2.0)
        );
        assert_eq!(get("ustack_mesh_rtt_seconds").kind, Kind::Histogram);
    }

    #[test]
    fn ipv6_targets_carry_the_ipv6_source_and_family() {
        let m = MeshMetrics::new();
        let mut six = series(Probe::Udp);
        six.target = "fd77::3".parse().unwrap();
        assert!(m.publish(|s| {
            s.source = Some(Ipv4Addr::new(10, 0, 0, 1));
            s.source6 = Some("fd77::1".parse().unwrap());
            s.series = vec![series(Probe::Udp), six];
        }));
        let mut out = Vec::new();
        m.collect(&mut out);
        let sent = out
            .iter()
            .find(|f| f.name == "ustack_mesh_probes_sent_total")
            .unwrap();
        let label = |i: usize, k: &str| {
            let l = &sent.samples[i].labels;
            l.iter().find(|(n, _)| n == k).unwrap().1.clone()
        };
        assert_eq!(
            (label(0, "source"), label(0, "family")),
            ("10.0.0.1".into(), "ipv4".into())
        );
        assert_eq!(
            (label(1, "source"), label(1, "family")),
            ("fd77::1".into(), "ipv6".into())
        );
        assert_eq!(label(1, "target"), "fd77::3");
    }

    #[test]
    fn publish_never_waits_for_a_scrape() {
        let m = MeshMetrics::new();
        let held = m.snap.lock().unwrap();
        assert!(!m.publish(|s| s.targets = 9));
        drop(held);
        assert!(m.publish(|s| s.targets = 9));
        assert_eq!(m.snapshot().targets, 9);
    }
}
