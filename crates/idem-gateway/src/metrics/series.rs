//! [`Series`]: one metric's series by label set, listed in label order, and the label
//! sets the gateway's metrics use.
//!
//! prometheus-client's own `Family` keeps its series in a hash map, so each scrape
//! could list them in another order; listed in order, two scrapes read side by side.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder,
};
use prometheus_client::metrics::{MetricType, TypedMetric};

use super::ListenerKind;

/// One metric's series, by label set, in the label set's order.
pub(super) struct Series<L, M> {
    series: Arc<RwLock<BTreeMap<L, M>>>,
    new: fn() -> M,
}

impl<L, M> Clone for Series<L, M> {
    fn clone(&self) -> Self {
        Series {
            series: self.series.clone(),
            new: self.new,
        }
    }
}

impl<L, M> fmt::Debug for Series<L, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Series").finish_non_exhaustive()
    }
}

impl<L: Ord, M: Default> Series<L, M> {
    pub(super) fn new() -> Self {
        Series::with(M::default)
    }
}

impl<L: Ord, M> Series<L, M> {
    /// Series made by `new` when their label set is first seen.
    pub(super) fn with(new: fn() -> M) -> Self {
        Series {
            series: Arc::default(),
            new,
        }
    }

    /// Calls `f` on the series of `labels`, made first if need be. The common case, a
    /// series that exists, takes only the read lock.
    pub(super) fn at(&self, labels: L, f: impl FnOnce(&M)) {
        if let Some(m) = self.series.read().expect("metrics lock").get(&labels) {
            return f(m);
        }
        let mut all = self.series.write().expect("metrics lock");
        f(all.entry(labels).or_insert_with(self.new));
    }

    /// Makes the series of `labels`, so that it is listed (at zero) before it is used.
    pub(super) fn touch(&self, labels: L) {
        self.at(labels, |_| ());
    }
}

impl<L, M> EncodeMetric for Series<L, M>
where
    L: EncodeLabelSet + Ord,
    M: EncodeMetric + TypedMetric,
{
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        for (labels, m) in self.series.read().expect("metrics lock").iter() {
            m.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// `outcome`: [`idem_tower::Outcome::as_str`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ByOutcome {
    pub(super) outcome: &'static str,
}

/// `op` and `ok`: one store call and whether it succeeded.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct StoreCall {
    pub(super) op: &'static str,
    pub(super) ok: bool,
}

/// `op` and `kind`: a failed store call and [`idem_core::StoreError::label`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct StoreFailure {
    pub(super) op: &'static str,
    pub(super) kind: &'static str,
}

/// `kind`: how an upstream call failed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ByKind {
    pub(super) kind: &'static str,
}

/// `cause`: why the JWKS was loaded, [`idem_jwt::LoadCause::as_str`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ByCause {
    pub(super) cause: &'static str,
}

/// `op`: a key write.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ByOp {
    pub(super) op: &'static str,
}

/// `ended`: how a duplicate's wait for an in-progress attempt ended.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ByWaitEnd {
    pub(super) ended: &'static str,
}

/// `reason`: why an outcome is ambiguous, [`idem_core::Ambiguity::as_str`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ByReason {
    pub(super) reason: &'static str,
}

/// `listener`: `proxy` or `admin`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ByListener {
    pub(super) listener: Listener,
}

/// A listener as a label value, ordered as [`ListenerKind::ALL`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Listener(ListenerKind);

impl Ord for Listener {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.index().cmp(&other.0.index())
    }
}

impl PartialOrd for Listener {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl EncodeLabelValue for Listener {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        fmt::Write::write_str(encoder, self.0.as_str())
    }
}

pub(super) fn by_listener(listener: ListenerKind) -> ByListener {
    ByListener {
        listener: Listener(listener),
    }
}
