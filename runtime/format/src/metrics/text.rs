//! Families in the Prometheus text exposition format 0.0.4.
//!
//! The encoding is the `prometheus` crate's `TextEncoder` (escaping of help
//! text and label values, `_bucket`/`_sum`/`_count` with the `+Inf`
//! bucket), fed with its plain `MetricFamily` model built for each scrape
//! (the crate is used without its registry and without protobuf). What the
//! encoder leaves to its caller is checked here: metric and label names
//! are validated (a family or sample with a bad one is left out, never
//! written), a name given twice is merged into one family, empty
//! families are skipped, and histogram buckets must ascend with
//! cumulative counts.

use std::collections::HashSet;

use prometheus::Encoder;
use prometheus::proto::{self, MetricType};

use super::{Family, Kind, Value};

/// The Content-Type of [`render`]'s output.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`: a valid metric name.
pub fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved): a valid
/// label name.
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn labels_ok(labels: &[(String, String)], kind: Kind) -> bool {
    labels.iter().enumerate().all(|(i, (k, _))| {
        valid_label_name(k)
            && !(kind == Kind::Histogram && k == "le")
            && !labels[..i].iter().any(|(k2, _)| k2 == k)
    })
}

fn histogram_ok(buckets: &[(f64, u64)], count: u64) -> bool {
    buckets.iter().all(|(le, _)| !le.is_nan())
        && buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        && buckets
            .last()
            .is_none_or(|&(le, c)| c <= count && (le != f64::INFINITY || c == count))
}

fn metric(s: &super::Sample, kind: Kind) -> Option<proto::Metric> {
    let mut m = proto::Metric::default();
    let labels = s
        .labels
        .iter()
        .map(|(k, v)| {
            let mut l = proto::LabelPair::default();
            l.set_name(k.clone());
            l.set_value(v.clone());
            l
        })
        .collect();
    m.set_label(labels);
    match (kind, &s.value) {
        (Kind::Counter, Value::Number(v)) => {
            let mut c = proto::Counter::default();
            c.set_value(*v);
            m.set_counter(c);
        }
        (Kind::Gauge, Value::Number(v)) => {
            let mut g = proto::Gauge::default();
            g.set_value(*v);
            m.set_gauge(g);
        }
        (
            Kind::Histogram,
            Value::Histogram {
                buckets,
                sum,
                count,
            },
        ) if histogram_ok(buckets, *count) => {
            let mut h = proto::Histogram::default();
            h.set_sample_count(*count);
            h.set_sample_sum(*sum);
            h.set_bucket(
                buckets
                    .iter()
                    .map(|&(le, c)| {
                        let mut b = proto::Bucket::default();
                        b.set_upper_bound(le);
                        b.set_cumulative_count(c);
                        b
                    })
                    .collect(),
            );
            m.set_histogram(h);
        }
        _ => return None,
    }
    Some(m)
}

/// `families` in the text format. What cannot be written validly (see the
/// module doc) is left out and logged at debug level; the rest is always
/// written.
pub fn render(families: &[Family]) -> String {
    let mut out: Vec<proto::MetricFamily> = Vec::with_capacity(families.len());
    let mut seen: HashSet<(usize, Vec<(String, String)>)> = HashSet::new();
    for fam in families {
        if !valid_metric_name(&fam.name) {
            tracing::debug!("metrics: left out {:?}: not a valid metric name", fam.name);
            continue;
        }
        let kind = match fam.kind {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
            Kind::Histogram => MetricType::HISTOGRAM,
        };
        let at = match out.iter().position(|m| m.name() == fam.name) {
            Some(i) if out[i].get_field_type() == kind => i,
            Some(_) => {
                tracing::debug!(
                    "metrics: left out {:?}: its type differs from a family of the same name",
                    fam.name
                );
                continue;
            }
            None => {
                let mut mf = proto::MetricFamily::default();
                mf.set_name(fam.name.clone());
                mf.set_help(fam.help.replace('\n', " "));
                mf.set_field_type(kind);
                out.push(mf);
                out.len() - 1
            }
        };
        for s in &fam.samples {
            if !labels_ok(&s.labels, fam.kind) {
                tracing::debug!("metrics: left out a sample of {}: bad labels", fam.name);
                continue;
            }
            let mut key = s.labels.clone();
            key.sort();
            if seen.contains(&(at, key.clone())) {
                continue;
            }
            if let Some(m) = metric(s, fam.kind) {
                seen.insert((at, key));
                out[at].mut_metric().push(m);
            }
        }
    }
    out.retain(|m| !m.get_metric().is_empty());
    let mut buf = Vec::new();
    match prometheus::TextEncoder::new().encode(&out, &mut buf) {
        Ok(()) => String::from_utf8_lossy(&buf).into_owned(),
        // Only empty or unnamed families fail, and none are left.
        Err(e) => {
            tracing::warn!("metrics: cannot encode: {e}");
            String::new()
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::metrics::Sample;

    fn fam(name: &str, kind: Kind, samples: Vec<Sample>) -> Family {
        Family {
            name: name.into(),
            help: format!("Help of {name}\nwith a \\ and a newline."),
            kind,
            samples,
        }
    }

    fn num(labels: &[(&str, &str)], v: f64) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            value: Value::Number(v),
        }
    }

    fn sample_families() -> Vec<Family> {
        vec![
            fam(
                "ustack_a_total",
                Kind::Counter,
                vec![num(&[("x", "q\"uo\\te\nnl")], 1.0), num(&[("x", "b")], 2.0)],
            ),
            // The same name again (another source): merged, not repeated.
            fam(
                "ustack_a_total",
                Kind::Counter,
                vec![num(&[("x", "c")], 3.0), num(&[("x", "b")], 9.0)],
            ),
            // The same name with another type: left out.
            fam("ustack_a_total", Kind::Gauge, vec![num(&[("x", "d")], 4.0)]),
            fam("bad-name", Kind::Gauge, vec![num(&[], 1.0)]),
            fam("ustack_empty", Kind::Gauge, vec![]),
            fam(
                "ustack_g",
                Kind::Gauge,
                vec![
                    num(&[("__reserved", "1")], 1.0),
                    num(&[("1bad", "1")], 1.0),
                    num(&[("ok", "1")], 5.5),
                ],
            ),
            fam(
                "ustack_rtt_seconds",
                Kind::Histogram,
                vec![
                    Sample {
                        labels: vec![("target".into(), "10.0.0.2".into())],
                        value: Value::Histogram {
                            buckets: vec![(0.001, 1), (0.01, 3), (1.0, 4)],
                            sum: 0.5,
                            count: 5,
                        },
                    },
                    // Not cumulative: left out.
                    Sample {
                        labels: vec![("target".into(), "10.0.0.3".into())],
                        value: Value::Histogram {
                            buckets: vec![(0.001, 3), (0.01, 1)],
                            sum: 0.5,
                            count: 5,
                        },
                    },
                    // A number in a histogram family: left out.
                    num(&[("target", "10.0.0.4")], 1.0),
                ],
            ),
        ]
    }

    #[test]
    fn renders_escaped_validated_text_with_cumulative_buckets() {
        let text = render(&sample_families());
        let expected = "\
# HELP ustack_a_total Help of ustack_a_total with a \\\\ and a newline.
# TYPE ustack_a_total counter
ustack_a_total{x=\"q\\\"uo\\\\te\\nnl\"} 1
ustack_a_total{x=\"b\"} 2
ustack_a_total{x=\"c\"} 3
# HELP ustack_g Help of ustack_g with a \\\\ and a newline.
# TYPE ustack_g gauge
ustack_g{ok=\"1\"} 5.5
# HELP ustack_rtt_seconds Help of ustack_rtt_seconds with a \\\\ and a newline.
# TYPE ustack_rtt_seconds histogram
ustack_rtt_seconds_bucket{target=\"10.0.0.2\",le=\"0.001\"} 1
ustack_rtt_seconds_bucket{target=\"10.0.0.2\",le=\"0.01\"} 3
ustack_rtt_seconds_bucket{target=\"10.0.0.2\",le=\"1\"} 4
ustack_rtt_seconds_bucket{target=\"10.0.0.2\",le=\"+Inf\"} 5
ustack_rtt_seconds_sum{target=\"10.0.0.2\"} 0.5
ustack_rtt_seconds_count{target=\"10.0.0.2\"} 5
";
        assert_eq!(text, expected);
        assert!(
            valid_metric_name("ustack_a:b_1") && !valid_metric_name("1a") && !valid_metric_name("")
        );
        assert!(valid_label_name("le") && !valid_label_name("__x") && !valid_label_name("a-b"));
    }

    /// `promtool check metrics` on `text`; false (with a note) without it.
    fn promtool_check(text: &str) -> bool {
        use std::io::Write;
        let child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            ustack_test_skip::skip(
                "promtool is not installed (apt-get install prometheus): its check left out",
            );
            return false;
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics failed:\n{}{}\n--- input ---\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        true
    }

    #[test]
    fn promtool_accepts_a_whole_stack_exposition() {
        // A real engine snapshot through the converter, as /metrics serves
        // it (the runtime's `StackMetrics` adds its own families: its test
        // checks those).
        let link = ustack::sim::SimLink::new(Default::default());
        let port = link.attach(ustack::sim::host_mac(1), 64);
        let node = ustack::node::Node::new(ustack::Stack::new(ustack::sim::host_config(1)), port);
        let s = node.snapshot(ustack::Instant::ZERO);
        let mut families = vec![crate::metrics::convert::up(true)];
        let line = serde_json::to_value(&s).unwrap();
        families.extend(crate::metrics::line_families(&line, &Default::default()));
        crate::metrics::add_label(&mut families, "stack", "test");
        let text = render(&families);
        assert!(text.contains("ustack_up{stack=\"test\"} 1\n"), "{text}");
        assert!(
            text.contains("ustack_drops_total{stack=\"test\",reason=\"tcp_bad_checksum\"} 0\n"),
            "{text}"
        );
        promtool_check(&text);
        promtool_check(&render(&sample_families()));
    }
}
