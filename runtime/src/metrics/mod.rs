//! Prometheus metrics: the data model every source of metrics fills in.
//!
//! A [`MetricsSource`] hands the metrics endpoint its metric families at
//! scrape time, on the endpoint's thread, never the poll loop's: a source
//! reads state the loop has published (a snapshot behind a lock the loop
//! only ever `try_lock`s, an atomic), it does not reach into the loop.
//! The endpoint renders families in the Prometheus text format; names
//! follow Prometheus' naming guide (`ustack_` prefix, base units, counters
//! end in `_total`).

use std::fmt;
use std::sync::Arc;

/// One metric family: a name, its help text, its type and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// The metric's name, e.g. `ustack_mesh_probes_sent_total` (counters
    /// end in `_total`; histograms give the base name, without `_bucket`).
    pub name: String,
    /// One line of help text.
    pub help: String,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// One sample per label set.
    pub samples: Vec<Sample>,
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the process restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, a sum and a count.
    Histogram,
}

/// One label set's value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Label names and values, in the order they are written.
    pub labels: Vec<(String, String)>,
    /// The value, of the family's kind.
    pub value: Value,
}

/// A sample's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter's or gauge's value.
    Number(f64),
    /// A histogram: cumulative counts per upper bound (ascending, without
    /// `+Inf`, which is `count`), the sum of observations and their count.
    Histogram {
        /// (upper bound, observations at or below it), ascending.
        buckets: Vec<(f64, u64)>,
        /// Sum of all observations, in the family's unit.
        sum: f64,
        /// Number of observations.
        count: u64,
    },
}

/// Something that has metrics to add to a scrape.
pub trait MetricsSource: Send + Sync + 'static {
    /// Append this source's families to `out`. Called on the metrics
    /// endpoint's thread for every scrape; must not block on the poll loop.
    fn collect(&self, out: &mut Vec<Family>);
}

/// A shared [`MetricsSource`], as the [`Builder`](crate::Builder) keeps it.
#[derive(Clone)]
pub struct SharedSource(pub Arc<dyn MetricsSource>);

impl fmt::Debug for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MetricsSource")
    }
}

pub mod convert;
pub mod http;
pub mod stack;
pub mod text;

pub use convert::{Options, add_label, line_families};
pub use http::{Endpoint, Limits, MetricsError, ScrapeFn};
pub use stack::{Feed, StackMetrics};
pub use text::{CONTENT_TYPE, render};
