//! The key set held, and how it is loaded again: one load at a time, which every
//! request lacking a key and the periodic refresh share.
//!
//! A token that names a key the set lacks makes the set load again, unless a load
//! ended less than [`RELOAD_INTERVAL`] ago; a load going on is joined, never queued
//! behind. Requests that joined it look again when it ends, and a `kid` still unknown
//! then is refused at once, with no load of its own ([`JwtError::UnknownKey`]) when
//! the load gave a set, or answered as unavailable ([`JwtError::KeysUnavailable`]) when
//! it failed: a key a failed load did not find may exist all the same. A request waits for a load at
//! most the ring's bound ([`DEFAULT_KEY_WAIT`]); the load goes on without it, and
//! serves those that come after.

use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use jsonwebtoken::Algorithm;
use tokio::sync::watch;
use tokio::time::Instant;

use super::keys::{JwksSource, PublicKey, Skipped, parse_jwks};
use super::{JwtError, accepted};

/// The shortest time from the end of one load of the key set to the start of another
/// that a token naming an unknown `kid` asks for.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The default bound on a request's wait for the key set to load
/// ([`JwtVerifierBuilder::key_wait`](crate::JwtVerifierBuilder::key_wait)).
pub const DEFAULT_KEY_WAIT: Duration = Duration::from_secs(5);

/// Why the key set was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadCause {
    /// When the verifier was built.
    Start,
    /// [`JwtVerifier::reload`](crate::JwtVerifier::reload): a periodic refresh, say.
    Refresh,
    /// A token named a key the set lacked.
    UnknownKey,
}

impl LoadCause {
    /// Every cause, in order.
    pub const ALL: [LoadCause; 3] = [LoadCause::Start, LoadCause::Refresh, LoadCause::UnknownKey];

    /// Its name as a metric label: `start`, `refresh`, `unknown_kid`.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadCause::Start => "start",
            LoadCause::Refresh => "refresh",
            LoadCause::UnknownKey => "unknown_kid",
        }
    }
}

/// What a verifier's key set reports, for metrics
/// ([`JwtVerifierBuilder::observer`](crate::JwtVerifierBuilder::observer)).
pub trait KeySetObserver: Send + Sync + 'static {
    /// A load of the key set ended: why it was made, and whether it gave a set (a
    /// failed one keeps the keys held).
    fn loaded(&self, cause: LoadCause, ok: bool);

    /// A request stopped waiting for a load at the bound, and was refused.
    fn wait_timed_out(&self) {}
}

/// A load's result, once it has ended: the keys in the new set, or why there is none.
type Landed = Option<Result<usize, String>>;

/// The load going on, and when the last one ended.
#[derive(Default)]
struct Loads {
    /// The load going on now, if any: what its waiters wait on.
    current: Option<watch::Receiver<Landed>>,
    /// When the last load after the start ended, for [`RELOAD_INTERVAL`].
    ended: Option<Instant>,
    /// Whether that load failed: a key it did not find may exist all the same.
    failed: bool,
    /// The keys the last load skipped, each warned about when first seen.
    skipped: Vec<Skipped>,
}

/// A key set, where to load it again, and the one load going on.
pub(super) struct KeyRing {
    pub(super) source: Box<dyn JwksSource>,
    keys: RwLock<Arc<Vec<Arc<PublicKey>>>>,
    loads: Mutex<Loads>,
    /// The longest a request waits for a load.
    wait: Duration,
    observer: Option<Arc<dyn KeySetObserver>>,
}

impl KeyRing {
    /// A ring with no key yet: [`load`](Self::load) loads them.
    pub(super) fn new(
        source: Box<dyn JwksSource>,
        wait: Duration,
        observer: Option<Arc<dyn KeySetObserver>>,
    ) -> KeyRing {
        KeyRing {
            source,
            keys: RwLock::default(),
            loads: Mutex::default(),
            wait,
            observer,
        }
    }

    fn current(&self) -> Arc<Vec<Arc<PublicKey>>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn loads(&self) -> MutexGuard<'_, Loads> {
        self.loads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The signing keys the last load skipped.
    pub(super) fn skipped(&self) -> Vec<Skipped> {
        self.loads().skipped.clone()
    }

    /// Loads the set now, whatever else is going on (the start's load); on failure the
    /// old set stays. Skipped keys not skipped before are warned about.
    pub(super) async fn load(&self, cause: LoadCause) -> Result<usize, String> {
        let loaded = async {
            let bytes = self.source.load().await?;
            parse_jwks(&bytes)
        }
        .await;
        if let Some(observer) = &self.observer {
            observer.loaded(cause, loaded.is_ok());
        }
        let set = loaded?;
        let source = self.source.describe();
        {
            let mut loads = self.loads();
            for skipped in set.skipped.iter().filter(|s| !loads.skipped.contains(s)) {
                tracing::warn!(
                    source = %source,
                    kid = skipped.kid.as_deref().unwrap_or(""),
                    alg = %skipped.alg,
                    "skipping a JWKS key of an algorithm not verified here (only RS256, ES256 \
                     and EdDSA are); tokens signed with it are refused"
                );
            }
            loads.skipped = set.skipped;
        }
        let keys: Vec<_> = set.keys.into_iter().map(Arc::new).collect();
        let n = keys.len();
        if n == 0 && cause != LoadCause::Start {
            tracing::warn!(source = %source, "the JWKS has no RS256, ES256 or EdDSA key: every token naming a key is refused until it has one");
        }
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
        Ok(n)
    }

    /// Starts a load for `cause` with `loads` held: the receiver its waiters wait on.
    fn start(self: &Arc<Self>, loads: &mut Loads, cause: LoadCause) -> watch::Receiver<Landed> {
        let (landed, rx) = watch::channel(None);
        loads.current = Some(rx.clone());
        let ring = self.clone();
        // A task of its own: the load goes on when the request that started it stops
        // waiting or is dropped, and ends for all who joined it.
        tokio::spawn(async move {
            // Failed, unless it ends with a set.
            let mut ended = Ended(ring.clone(), true);
            let result = ring.load(cause).await;
            if let Err(e) = &result {
                tracing::warn!(source = %ring.source.describe(), error = %e, "could not load the JWKS again; keeping the old keys");
            }
            ended.1 = result.is_err();
            drop(ended);
            let _ = landed.send(Some(result));
        });
        rx
    }

    /// The load going on, or a new one for `cause`.
    fn join_or_start(self: &Arc<Self>, cause: LoadCause) -> watch::Receiver<Landed> {
        let mut loads = self.loads();
        match &loads.current {
            Some(rx) => rx.clone(),
            None => self.start(&mut loads, cause),
        }
    }

    /// Loads the set again (a periodic refresh), or waits for the load going on; on
    /// failure the old set stays and the error is returned.
    pub(super) async fn reload(self: &Arc<Self>) -> Result<usize, String> {
        let mut rx = self.join_or_start(LoadCause::Refresh);
        let landed = match rx.wait_for(Option::is_some).await {
            Ok(landed) => landed.clone(),
            Err(_) => None,
        };
        landed.unwrap_or_else(|| Err("the load of the key set stopped".into()))
    }

    /// The key `kid` names for `alg` (without a `kid`, the only key for `alg`),
    /// loading the set again when it has no such key (see the [module](self)).
    pub(super) async fn find(
        self: &Arc<Self>,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Arc<PublicKey>, JwtError> {
        let pick = |keys: &[Arc<PublicKey>]| -> Option<Arc<PublicKey>> {
            let mut fitting = keys.iter().filter(|k| k.alg == alg);
            match kid {
                Some(kid) => fitting.find(|k| k.kid.as_deref() == Some(kid)).cloned(),
                None => match (fitting.next(), fitting.next()) {
                    (Some(only), None) => Some(only.clone()),
                    _ => None,
                },
            }
        };
        let unknown = || {
            let name = accepted(alg).unwrap_or("?");
            JwtError::UnknownKey(kid.map(str::to_owned), name)
        };
        if let Some(key) = pick(&self.current()) {
            return Ok(key);
        }
        let mut rx = {
            let mut loads = self.loads();
            // A load may have ended since the first look.
            if let Some(key) = pick(&self.current()) {
                return Ok(key);
            }
            match &loads.current {
                Some(rx) => rx.clone(),
                // A key a set just loaded lacks does not exist; one a failed load did
                // not find may.
                None if loads.ended.is_some_and(|at| at.elapsed() < RELOAD_INTERVAL) => {
                    return Err(match loads.failed {
                        true => JwtError::KeysUnavailable,
                        false => unknown(),
                    });
                }
                None => self.start(&mut loads, LoadCause::UnknownKey),
            }
        };
        let waited = tokio::time::timeout(self.wait, async {
            match rx.wait_for(Option::is_some).await {
                Ok(landed) => landed.clone(),
                Err(_) => None,
            }
        })
        .await;
        let Ok(landed) = waited else {
            if let Some(observer) = &self.observer {
                observer.wait_timed_out();
            }
            return Err(JwtError::KeysLate(self.wait));
        };
        match (pick(&self.current()), landed) {
            (Some(key), _) => Ok(key),
            (None, Some(Ok(_))) => Err(unknown()),
            // The load failed, or its task stopped: the key may exist all the same.
            (None, _) => Err(JwtError::KeysUnavailable),
        }
    }
}

/// Marks the load going on as ended when dropped, however its task ends, and whether
/// it failed (the second field; a task stopped before the end counts as failed): the set
/// is swapped first, so a request that finds no load going on finds its keys.
struct Ended(Arc<KeyRing>, bool);

impl Drop for Ended {
    fn drop(&mut self) {
        let mut loads = self.0.loads();
        loads.current = None;
        loads.ended = Some(Instant::now());
        loads.failed = self.1;
    }
}

#[cfg(test)]
mod tests;
