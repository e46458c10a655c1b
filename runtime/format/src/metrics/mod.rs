//! Prometheus metrics: the data model every source of metrics fills in,
//! one telemetry line as families ([`convert`]), the text exposition
//! ([`text`]) and the HTTP endpoint that serves it ([`http`]).
//!
//! Names follow Prometheus' naming guide (`ustack_` prefix, base units,
//! counters end in `_total`).

pub mod convert;
pub mod http;
pub mod text;

pub use convert::{Options, add_label, line_families};
pub use http::{Endpoint, Limits, MetricsError, ScrapeFn};
pub use text::{CONTENT_TYPE, render};

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
