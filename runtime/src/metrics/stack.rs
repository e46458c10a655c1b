//! A stack's metrics in its own process: the loop hands each snapshot to a
//! [`Feed`] (never waiting), and a scrape converts the latest one.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ustack::node::Snapshot;

use super::convert::{self, Options};
use super::{Family, SharedSource};
use crate::telemetry::{AppCounters, PublisherHandle};

/// The latest snapshot of each of a stack's shards, handed over by the
/// poll loop and read by the metrics endpoint.
///
/// [`publish`](Self::publish) never blocks: it clones the snapshot before
/// taking the lock with `try_lock`, and when a scrape is reading just then
/// the snapshot is skipped (the next one comes a quarter second later).
/// A scrape holds the lock only to clone `Arc`s.
#[derive(Clone, Default)]
pub struct Feed(Arc<FeedInner>);

/// When a snapshot was handed over, and the snapshot.
type Stamped = (Instant, Arc<Snapshot>);

#[derive(Default)]
struct FeedInner {
    /// Per shard (index 0 on a host with one): when and what.
    latest: Mutex<Vec<Option<Stamped>>>,
    /// The telemetry publisher's counters, when the stack has one.
    publisher: OnceLock<PublisherHandle>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("metrics::Feed")
    }
}

impl Feed {
    /// An empty feed.
    pub fn new() -> Self {
        Self::default()
    }

    /// From the poll loop: this is the stack's (or the shard's) latest
    /// snapshot. Never blocks.
    pub fn publish(&self, s: &Snapshot) {
        let (index, count) = s.shard.map_or((0, 1), |sh| (sh.index, sh.count.max(1)));
        if index >= count {
            return;
        }
        let fresh = Some((Instant::now(), Arc::new(s.clone())));
        let old = {
            let Some(mut latest) = self.0.latest.try_lock() else {
                return;
            };
            if latest.len() != count {
                latest.resize(count, None);
            }
            std::mem::replace(&mut latest[index], fresh)
        };
        drop(old);
    }

    /// Add the telemetry publisher's counters to the metrics (once).
    pub fn set_publisher(&self, p: PublisherHandle) {
        let _ = self.0.publisher.set(p);
    }

    /// The latest snapshots as one telemetry line (the JSON the publisher
    /// would write: several shards merged, with `shards`), and the age of
    /// the newest; `None` before the first snapshot.
    pub fn line(
        &self,
        name: &str,
        app: Option<AppCounters>,
    ) -> Option<(serde_json::Value, Duration)> {
        let latest: Vec<Stamped> = self.0.latest.lock().iter().flatten().cloned().collect();
        let newest = latest.iter().map(|(at, _)| *at).max()?;
        let values: Vec<Option<serde_json::Value>> = latest
            .iter()
            .map(|(_, s)| serde_json::to_value(&**s).ok())
            .collect();
        let mut line = if values.len() == 1 && latest[0].1.shard.is_none_or(|s| s.count <= 1) {
            values.into_iter().next().flatten()?
        } else {
            crate::telemetry::merge_shards(&values)
        };
        let obj = line.as_object_mut()?;
        obj.insert("name".into(), name.into());
        obj.insert("version".into(), crate::telemetry::VERSION.into());
        obj.insert("pid".into(), std::process::id().into());
        if let Some(p) = self.0.publisher.get() {
            if let Ok(v) = serde_json::to_value(p.stats()) {
                obj.insert("publisher".into(), v);
            }
        }
        crate::telemetry::add_holders(&mut line);
        let obj = line.as_object_mut()?;
        if let Some(read) = app {
            let counters: serde_json::Map<String, serde_json::Value> = read()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.into()))
                .collect();
            obj.insert("app".into(), counters.into());
        }
        Some((line, newest.elapsed()))
    }
}

/// What `--metrics` serves for a stack in this process: `ustack_up`, the
/// latest snapshot's families, and every extra [`SharedSource`], each
/// series labelled with the stack's name.
#[derive(Clone, Debug)]
pub struct StackMetrics {
    /// Where the loop leaves its snapshots.
    pub feed: Feed,
    /// The `stack` label (the program's name).
    pub name: String,
    /// The program's own counters (`ustack_app_*`).
    pub app: Option<AppCounters>,
    /// The program's own metric families.
    pub sources: Vec<SharedSource>,
    /// How lines become families.
    pub options: Options,
}

impl StackMetrics {
    /// The families of this moment.
    pub fn families(&self) -> Vec<Family> {
        let mut out = Vec::new();
        match self.feed.line(&self.name, self.app) {
            Some((line, age)) => {
                out.push(convert::up(true));
                let opts = Options {
                    age: Some(age),
                    ..self.options
                };
                out.extend(convert::line_families(&line, &opts));
            }
            None => out.push(convert::up(false)),
        }
        for s in &self.sources {
            s.0.collect(&mut out);
        }
        convert::add_label(&mut out, "stack", &self.name);
        out
    }
}

/// The name of this program (its executable's file name), for the
/// `stack` label and telemetry names.
pub fn program_name() -> String {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "ustack".into())
}

#[cfg(test)]
mod test {
    use super::*;

    /// `promtool check metrics` on `text`, when promtool is installed.
    fn promtool_check(text: &str) {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let Ok(mut child) = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        else {
            ustack_test_skip::skip(
                "promtool is not installed (apt-get install prometheus): its check left out",
            );
            return;
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
    }

    #[test]
    fn promtool_accepts_a_whole_stack_exposition() {
        // A real engine snapshot through the converter, as /metrics serves it.
        let link = ustack::sim::SimLink::new(Default::default());
        let port = link.attach(ustack::sim::host_mac(1), 64);
        let node = ustack::node::Node::new(ustack::Stack::new(ustack::sim::host_config(1)), port);
        let s = node.snapshot(ustack::Instant::ZERO);
        let feed = Feed::new();
        feed.publish(&s);
        let stack = StackMetrics {
            feed,
            name: "test".into(),
            app: Some(|| vec![("refused", 1)]),
            sources: Vec::new(),
            options: Default::default(),
        };
        let text = super::super::render(&stack.families());
        assert!(text.contains("ustack_up{stack=\"test\"} 1\n"), "{text}");
        assert!(
            text.contains("ustack_drops_total{stack=\"test\",reason=\"tcp_bad_checksum\"} 0\n"),
            "{text}"
        );
        promtool_check(&text);
    }
}
