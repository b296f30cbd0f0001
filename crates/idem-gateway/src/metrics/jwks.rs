//! The JWKS's loads (`--jwt-jwks-url`, `--jwt-jwks-file`) by cause, those that failed,
//! and the requests that stopped waiting for one at `--jwt-jwks-wait`: the verifier
//! reports them as its [`KeySetObserver`].

use idem_jwt::{KeySetObserver, LoadCause};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::Metrics;
use super::series::{ByCause, Series};

/// The counters, each cause's series listed from the start at zero.
#[derive(Debug)]
pub(super) struct JwksCounters {
    loads: Series<ByCause, Counter>,
    failures: Series<ByCause, Counter>,
    wait_timeouts: Counter,
}

impl JwksCounters {
    pub(super) fn new() -> JwksCounters {
        let c = JwksCounters {
            loads: Series::new(),
            failures: Series::new(),
            wait_timeouts: Counter::default(),
        };
        for cause in LoadCause::ALL {
            let cause = ByCause {
                cause: cause.as_str(),
            };
            c.loads.touch(cause.clone());
            c.failures.touch(cause);
        }
        c
    }

    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "idem_jwks_fetches",
            "Loads of the JWKS by cause (start, refresh, unknown_kid); one goes on at a \
             time, shared by every request whose token names a key the gateway lacks",
            self.loads.clone(),
        );
        r.register(
            "idem_jwks_fetch_failures",
            "Loads of the JWKS that failed (after their tries) or gave no key set, by \
             cause; the keys held stay",
            self.failures.clone(),
        );
        r.register(
            "idem_jwks_wait_timeouts",
            "Keyed requests refused (401) because the JWKS did not load within \
             --jwt-jwks-wait",
            self.wait_timeouts.clone(),
        );
    }
}

impl KeySetObserver for Metrics {
    fn loaded(&self, cause: LoadCause, ok: bool) {
        let cause = ByCause {
            cause: cause.as_str(),
        };
        self.jwks.loads.at(cause.clone(), |c| {
            c.inc();
        });
        if !ok {
            self.jwks.failures.at(cause, |c| {
                c.inc();
            });
        }
    }

    fn wait_timed_out(&self) {
        self.jwks.wait_timeouts.inc();
    }
}
