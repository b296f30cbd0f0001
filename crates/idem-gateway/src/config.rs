//! The settings of `idem serve`, resolved: the command line, then the `IDEM_*`
//! environment (both read by clap), then the `--config` TOML file (read by serde), then
//! the defaults, checked together into one [`GatewayConfig`] before anything starts.
//!
//! [`ServeArgs`] declares every setting once, for all three sources; the file takes
//! them under the same names (with `_` for `-`) and adds per-route rules (the
//! repository's `contrib/idem.toml` shows every setting at its default):
//!
//! ```toml
//! upstream = "http://127.0.0.1:3000"
//! store = "sqlite://idem.db"
//! ttl = "24h"
//!
//! [[route]]
//! method = "POST"
//! path = "/v1/orders/{id}/capture"
//! require_key = true
//! ttl = "1h"
//! ignore = ["/client_sent_at"]
//! store_headers = ["x-order-id"]
//! ```
//!
//! A new setting is declared once, in `config/settings.rs`: its flag, variable, TOML key,
//! type, help text, what it resolves to and how, its line in `check-config`, and
//! whether a reload applies it ([`SETTINGS`]). Its layering ([`ServeArgs::over`]), its
//! field of [`GatewayConfig`], the resolving ([`GatewayConfig::from_args`]), the
//! printing and the reload's comparison follow from that; tests then ask for its row in
//! the guide's settings page and its line in `contrib/idem.toml`.

mod choices;
mod declare;
pub(crate) mod diff;
mod error;
mod file;
mod jwt;
mod listeners;
mod print;
mod publish;
mod resolve;
mod routes;
mod rules;
mod secrets;
mod settings;
mod tenants;
#[cfg(test)]
mod tests;
mod toml_form;
mod upstream;
mod values;

use std::time::Duration;

pub use self::declare::{Reload, Setting};
pub use self::error::ConfigError;
pub(crate) use self::jwt::{JwtStartError, TenantSource};
pub use self::rules::{RouteRule, TenantRule};
pub(crate) use self::secrets::tenant_key;
pub use self::secrets::{TENANT_SECRET_ENV, TenantSecret};
pub use self::settings::{GatewayConfig, SETTINGS, ServeArgs};
pub(crate) use self::tenants::TenantLimits;
pub(crate) use self::upstream::Upstream;
pub use self::upstream::UpstreamProtocol;
pub(crate) use self::values::parse_tenant_headers;

use self::error::invalid;
use self::file::read_file;
use crate::route::Route;

/// The default listen address.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The default store: an SQLite file in the working directory.
pub(crate) const DEFAULT_STORE: &str = "sqlite://idem.db";
/// The default upstream timeout.
pub(crate) const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// The default time between sweeps of expired records.
pub(crate) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// How long a client connection may take to send a request's headers unless configured
/// otherwise (hyper's own default).
pub(crate) const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

impl GatewayConfig {
    /// Whether `source` names a tenant anywhere: in `tenant_from`, or a route's.
    pub fn names_source(&self, source: TenantSource) -> bool {
        self.tenant_from.contains(&source)
            || self
                .routes
                .iter()
                .any(|r| r.tenant_from.as_ref().is_some_and(|l| l.contains(&source)))
    }

    /// Whether the tenant headers name verified tenants: only the trusted proxies may set
    /// every one of them (`trusted_headers`), so no other client can make one up.
    pub(crate) fn tenant_headers_asserted(&self) -> bool {
        !self.trusted_proxies.nets().is_empty()
            && self
                .tenant_headers
                .iter()
                .all(|h| self.trusted_headers.contains(h))
    }

    /// The profile `route` answers in: its own, or the global one.
    pub(crate) fn profile_of(&self, route: &Route) -> idem_tower::Profile {
        route.profile.unwrap_or(self.profile)
    }

    /// The statuses that release the key on `route`, as the layer resolves them: the
    /// route's `release_statuses`, else the global one, else its profile's (the SPEC's
    /// protocol policies).
    pub(crate) fn release_statuses_of(&self, route: &Route) -> idem_tower::ReleaseStatuses {
        route
            .release_statuses
            .as_ref()
            .or(self.release_statuses.as_ref())
            .cloned()
            .unwrap_or_else(|| idem_tower::ReleaseStatuses::of_profile(self.profile_of(route)))
    }

    /// A sentence for each explicit `release_statuses` (a route's, or the global one
    /// where the global profile or a route without a list of its own uses it) that
    /// contradicts its profile's rule for an upstream 5xx.
    fn release_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let mut judge = |whose: String, set: &idem_tower::ReleaseStatuses, profile| {
            if let Some(why) = set.contradicts(profile) {
                warnings.push(format!("{whose} under the {profile} profile {why}"));
            }
        };
        if let Some(set) = &self.release_statuses {
            judge("release_statuses".to_owned(), set, self.profile);
        }
        for route in &self.routes {
            let profile = self.profile_of(route);
            let whose = format!("the route {}'s release_statuses", route.template.as_str());
            match (&route.release_statuses, &self.release_statuses) {
                (Some(own), _) => judge(whose, own, profile),
                // The global list was judged under the global profile already.
                (None, Some(global)) if profile != self.profile => judge(whose, global, profile),
                (None, _) => {}
            }
        }
        warnings
    }

    /// Settings that work as written but probably do not do what was meant, each as a
    /// sentence; `serve` logs them as warnings at start, `check-config` prints them.
    /// The upstream's host is looked up (a name that does not resolve is one).
    pub async fn warnings(&self) -> Vec<String> {
        let mut warnings = self.release_warnings();
        let lease = humantime::format_duration(self.lease);
        if self.ttl < self.lease {
            warnings.push(format!(
                "ttl {} is shorter than the lease {lease}: a record can expire while its \
                 attempt still runs, and a retry then executes again",
                humantime::format_duration(self.ttl)
            ));
        }
        if self.max_wait > self.lease {
            warnings.push(format!(
                "max_wait {} is longer than the lease {lease}: no duplicate waits longer \
                 than the lease, so the excess is never used",
                humantime::format_duration(self.max_wait)
            ));
        }
        if let Some(timeout) = crate::store::operation_timeout(&self.store)
            && self.lease < 2 * timeout
        {
            warnings.push(format!(
                "lease {lease} is not comfortably above the store's operation timeout {}: \
                 a reservation the store confirms half a lease or more after it was asked \
                 is not executed (503 reservation-late), so a store that is slow but \
                 within its timeout refuses keyed requests; make the lease over twice the \
                 timeout",
                humantime::format_duration(timeout)
            ));
        }
        let authority = &self.upstream.authority;
        let port = authority
            .port_u16()
            .unwrap_or(if self.upstream.is_tls() { 443 } else { 80 });
        let lookup = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::net::lookup_host((authority.host().trim_matches(['[', ']']), port)),
        )
        .await;
        match lookup.map(|found| found.map(|mut addrs| addrs.next().is_some())) {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => warnings.push(format!(
                "the upstream host {} resolves to no address",
                authority.host()
            )),
            Ok(Err(e)) => warnings.push(format!(
                "the upstream host {} does not resolve ({e}); requests will get 502 until it does",
                authority.host()
            )),
            Err(_) => warnings.push(format!(
                "looking up the upstream host {} took over 2 s",
                authority.host()
            )),
        }
        warnings
    }

    /// Resolves the command line (and environment) over the `--config` file it names.
    pub fn resolve(args: &ServeArgs) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::from_args(GatewayConfig::layered(args)?)
    }

    /// The command line (and environment) over the `--config` file it names, before
    /// the defaults: what [`resolve`](Self::resolve) checks and completes.
    pub fn layered(args: &ServeArgs) -> Result<ServeArgs, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => ServeArgs::default(),
        };
        Ok(args.clone().over(file))
    }

    /// [`layered`](Self::layered) and [`resolve`](Self::resolve) from one read of the
    /// file: the settings as layered, for what names files (`check-config`'s output, a
    /// reload's comparison), and the configuration they resolve to.
    pub fn resolve_layered(args: &ServeArgs) -> Result<(ServeArgs, GatewayConfig), ConfigError> {
        let layered = GatewayConfig::layered(args)?;
        let config = GatewayConfig::from_args(layered.clone())?;
        Ok((layered, config))
    }

    /// Resolves the command line (and environment) over a file already read.
    pub fn merge(args: &ServeArgs, file: ServeArgs) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::from_args(args.clone().over(file))
    }

    /// The checks across settings, of what they resolved to.
    fn check(&self) -> Result<(), ConfigError> {
        let client_ca = self.tls.as_ref().and_then(|tls| tls.client_ca.as_ref());
        if self.names_source(TenantSource::Cert) && client_ca.is_none() {
            return Err(invalid(
                "tenant_from",
                "names cert (globally or on a route), but tls_client_ca is not set, so no \
                 client certificate is asked for",
            ));
        }
        self.check_published()
    }
}
