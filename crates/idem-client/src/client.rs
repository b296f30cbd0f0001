//! The client: an HTTP client, a retry policy, a classifier and a retry budget shared by
//! every operation made from it.

use std::fmt;
use std::sync::Arc;

use http::Method;
use idem_core::{SharedClock, SystemClock};

use crate::budget::BudgetState;
use crate::policy::Jitter;
use crate::{
    BudgetStats, Classify, DefaultClassifier, Error, Operation, Result, RetryBudget, RetryPolicy,
    Sleep, TokioSleeper,
};

/// Makes [`Operation`]s and sends them with retries. Cheap to clone; clones share the
/// connection pool and the retry budget.
///
/// ```no_run
/// # async fn run() -> Result<(), idem_client::Error> {
/// let client = idem_client::Client::new();
/// let charge = client
///     .post("http://127.0.0.1:8080/v1/charges")
///     .json(&serde_json::json!({"amount": 1000, "currency": "eur"}));
/// let outcome = charge.send().await?;
/// println!("{} (replayed: {}, attempts: {})", outcome.status(), outcome.replayed(), outcome.attempts());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) http: reqwest::Client,
    pub(crate) policy: RetryPolicy,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) sleeper: Arc<dyn Sleep>,
    pub(crate) clock: SharedClock,
    pub(crate) budget: BudgetState,
    pub(crate) jitter: Jitter,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("policy", &self.inner.policy)
            .field("budget", &self.inner.budget.stats())
            .finish_non_exhaustive()
    }
}

impl Default for Client {
    fn default() -> Client {
        Client::new()
    }
}

impl Client {
    /// A client with the default policy, budget and classifier.
    ///
    /// # Panics
    ///
    /// When the HTTP client cannot be initialised (as `reqwest::Client::new` does); use
    /// [`Client::builder`] to handle that as an error.
    pub fn new() -> Client {
        Client::builder()
            .build()
            .expect("the HTTP client could not be initialised")
    }

    /// A builder to configure the client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A new operation with a fresh random key (UUIDv4). The key is fixed now: every
    /// attempt of every [`send`](Operation::send) of this operation carries it.
    pub fn operation(&self, method: Method, url: impl AsRef<str>) -> Operation {
        Operation::new(self.clone(), method, url.as_ref())
    }

    /// A new `POST` operation; see [`operation`](Self::operation).
    pub fn post(&self, url: impl AsRef<str>) -> Operation {
        self.operation(Method::POST, url)
    }

    /// A new `PATCH` operation; see [`operation`](Self::operation).
    pub fn patch(&self, url: impl AsRef<str>) -> Operation {
        self.operation(Method::PATCH, url)
    }

    /// A new `PUT` operation; see [`operation`](Self::operation).
    pub fn put(&self, url: impl AsRef<str>) -> Operation {
        self.operation(Method::PUT, url)
    }

    /// A new `DELETE` operation; see [`operation`](Self::operation).
    pub fn delete(&self, url: impl AsRef<str>) -> Operation {
        self.operation(Method::DELETE, url)
    }

    /// The retry policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.inner.policy
    }

    /// What the retry budget has counted since the client was built.
    pub fn budget_stats(&self) -> BudgetStats {
        self.inner.budget.stats()
    }

    /// The underlying HTTP client.
    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }
}

/// Configures a [`Client`].
#[derive(Default)]
pub struct ClientBuilder {
    http: Option<reqwest::Client>,
    policy: RetryPolicy,
    budget: RetryBudget,
    classifier: Option<Arc<dyn Classify>>,
    sleeper: Option<Arc<dyn Sleep>>,
    clock: Option<SharedClock>,
    seed: Option<u64>,
    /// PEM certificates trusted beyond the system's roots.
    #[cfg(feature = "rustls")]
    roots: Vec<Vec<u8>>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("policy", &self.policy)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Uses this HTTP client: for its TLS roots, proxies, timeouts and default headers.
    /// Credentials belong in its default headers: they are sent on every attempt but,
    /// unlike an operation's own headers, never written to the journal.
    ///
    /// Without it the client is reqwest's default with redirects off: a redirected
    /// `POST` would be re-sent elsewhere or turned into a `GET`, neither of which is
    /// the operation; the 3xx answer is returned instead. With the `rustls` feature
    /// (the default) its TLS is rustls on ring, trusting the system's roots and those
    /// of [`add_root_certificate_pem`](Self::add_root_certificate_pem).
    ///
    /// A client given here that speaks TLS needs a rustls configuration of its own
    /// (`reqwest::ClientBuilder::tls_backend_preconfigured`), or a rustls crypto
    /// provider installed for the process, since idem-client brings none to reqwest.
    pub fn http(mut self, http: reqwest::Client) -> ClientBuilder {
        self.http = Some(http);
        self
    }

    /// Sets the retry policy of every operation.
    pub fn policy(mut self, policy: RetryPolicy) -> ClientBuilder {
        self.policy = policy;
        self
    }

    /// Sets the retry budget shared by all operations.
    pub fn budget(mut self, budget: RetryBudget) -> ClientBuilder {
        self.budget = budget;
        self
    }

    /// Replaces the [`DefaultClassifier`].
    pub fn classifier(mut self, classifier: impl Classify) -> ClientBuilder {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// Replaces the tokio sleeper that waits between attempts (tests pass a
    /// [`ManualSleeper`](crate::ManualSleeper)).
    pub fn sleeper(mut self, sleeper: impl Sleep) -> ClientBuilder {
        self.sleeper = Some(Arc::new(sleeper));
        self
    }

    /// Replaces the system clock that deadlines, `Retry-After` dates and the budget's
    /// window read.
    pub fn clock(mut self, clock: SharedClock) -> ClientBuilder {
        self.clock = Some(clock);
        self
    }

    /// Seeds the jitter's random generator, so the waits are the same on every run.
    /// Without it the seed comes from the operating system.
    pub fn seed(mut self, seed: u64) -> ClientBuilder {
        self.seed = Some(seed);
        self
    }

    /// Trusts the CA certificates in `pem` (one or more PEM blocks) for `https://`
    /// URLs besides the system's roots: a private CA in front of an internal API. A
    /// `pem` that holds no certificate fails [`build`](Self::build). Ignored when
    /// [`http`](Self::http) gives the HTTP client.
    #[cfg(feature = "rustls")]
    pub fn add_root_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> ClientBuilder {
        self.roots.push(pem.into());
        self
    }

    /// Builds the client.
    pub fn build(self) -> Result<Client> {
        let http = match self.http {
            Some(http) => http,
            None => {
                let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
                #[cfg(feature = "rustls")]
                let http = http.tls_backend_preconfigured(crate::tls::client_config(&self.roots)?);
                http.build()
                    .map_err(|e| Error::Build(format!("the HTTP client failed to start: {e}")))?
            }
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                policy: self.policy,
                classifier: self
                    .classifier
                    .unwrap_or_else(|| Arc::new(DefaultClassifier)),
                sleeper: self.sleeper.unwrap_or_else(|| Arc::new(TokioSleeper)),
                budget: BudgetState::new(self.budget, clock.clone()),
                clock,
                jitter: Jitter::new(self.seed),
            }),
        })
    }
}
