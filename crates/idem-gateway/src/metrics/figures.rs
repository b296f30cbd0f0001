//! A store's own figures ([`Store::metrics`]), encoded with the gateway's.

use std::fmt;
use std::sync::Arc;

use idem_core::{MetricKind, Store};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// A store's own figures ([`Store::metrics`]), read at each scrape.
pub(super) struct StoreFigures(pub(super) Arc<dyn Store>);

impl fmt::Debug for StoreFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreFigures").finish_non_exhaustive()
    }
}

impl Collector for StoreFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        for m in self.0.metrics() {
            match m.kind {
                MetricKind::Counter => {
                    // A store names its counters with `_total`, which the encoding adds.
                    let name = m.name.strip_suffix("_total").unwrap_or(m.name);
                    let counter = ConstCounter::new(m.value);
                    counter.encode(encoder.encode_descriptor(
                        name,
                        m.help,
                        None,
                        counter.metric_type(),
                    )?)?;
                }
                MetricKind::Gauge => {
                    let gauge = ConstGauge::new(m.value);
                    gauge.encode(encoder.encode_descriptor(
                        m.name,
                        m.help,
                        None,
                        gauge.metric_type(),
                    )?)?;
                }
            }
        }
        Ok(())
    }
}

/// The log lines dropped because their reader was too slow or gone
/// ([`crate::logging::dropped_lines`]), read at each scrape: the log is the process's,
/// not one gateway's.
#[derive(Debug)]
pub(super) struct LogFigures;

impl Collector for LogFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let counter = ConstCounter::new(crate::logging::dropped_lines());
        counter.encode(encoder.encode_descriptor(
            "idem_log_lines_dropped",
            "Log lines dropped, not written, because their reader (a pipe, a log collector) \
             was too slow or gone; serving goes on, and a warning line says how many once \
             lines are written again",
            None,
            counter.metric_type(),
        )?)
    }
}
