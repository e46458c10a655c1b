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

pub mod stack;

pub use stack::{Feed, StackMetrics};
// The data model, the converter of telemetry lines, the text format and
// the endpoint live in the telemetry-format crate (shared with `utop`).
pub use ustack_telemetry_format::metrics::{
    CONTENT_TYPE, Endpoint, Family, Kind, Limits, MetricsError, Options, Sample, ScrapeFn, Value,
    add_label, convert, http, line_families, render, text,
};
