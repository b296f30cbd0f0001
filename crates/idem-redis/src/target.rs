//! What a store URL names: one server or a cluster's seed nodes, and how many
//! replicas must hold each write ([`Replication`]).
//!
//! - `redis://[user:password@]host:port[/db]`: one server.
//! - `redis+cluster://[user:password@]host:port[?seeds=host:port,host:port]`: a Redis
//!   Cluster, discovered from the seed nodes (the host, then each of `seeds`); the
//!   credentials and `protocol` apply to every node, and the database is always 0.
//!
//! - `rediss://…` and `rediss+cluster://…`: the same over TLS, verified against the
//!   system's roots, or against `cacert=FILE` (PEM); `cert=FILE` and `key=FILE` present
//!   a client certificate; `insecure=true` skips every check of the server's
//!   certificate and is never implied. The files are read and checked when the store
//!   opens, and a cluster's nodes all get the same settings.
//!
//! All take `protocol` (read by the driver), `wait=N` and `wait_timeout=DURATION`
//! (`250ms`, `2s`, or a number of milliseconds). A fragment (the driver's `#insecure`)
//! is refused: the URL spells `insecure=true` out as a parameter.

use std::time::Duration;

/// The scheme of a Redis Cluster URL.
pub(crate) const CLUSTER_SCHEME: &str = "redis+cluster";

/// The scheme of a Redis Cluster URL over TLS.
pub(crate) const TLS_CLUSTER_SCHEME: &str = "rediss+cluster";

/// How long a `WAIT` may take when the URL gives `wait` and no `wait_timeout`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// The parameters every Redis URL may carry.
const PARAMETERS: &[&str] = &["protocol", "wait", "wait_timeout"];

/// What a cluster URL adds.
const CLUSTER_PARAMETERS: &[&str] = &["seeds"];

/// What a TLS URL adds.
const TLS_PARAMETERS: &[&str] = &["cacert", "cert", "key", "insecure"];

/// Writes the store makes durable against a failover: after each reservation and
/// each completion, `WAIT replicas timeout` on the connection (or, on a cluster, the
/// master of the record's slot) that wrote it, in the same round trip. Fewer replicas
/// than `replicas` acknowledging within `timeout` fails the operation with
/// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable), and a reservation
/// is released first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    /// How many replicas must acknowledge the write (at least 1).
    pub replicas: u32,
    /// How long the server waits for them.
    pub timeout: Duration,
}

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The URLs the driver opens: the one server, or every seed node of the cluster.
    pub(crate) nodes: Vec<String>,
    /// Whether the nodes are a cluster's.
    pub(crate) cluster: bool,
    /// The URL's `wait`, if any.
    pub(crate) replication: Option<Replication>,
    /// The TLS settings of a `rediss` URL; `None` for plaintext.
    pub(crate) tls: Option<TlsSettings>,
}

/// The TLS settings of a `rediss://` or `rediss+cluster://` URL, as written (the files
/// are read by [`TlsSettings::certificates`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TlsSettings {
    /// `cacert`: the CA certificates to trust instead of the system's.
    pub(crate) ca: Option<String>,
    /// `cert` and `key`: a client certificate and its key.
    pub(crate) identity: Option<(String, String)>,
    /// `insecure=true`: no check of the server's certificate at all.
    pub(crate) insecure: bool,
}

impl TlsSettings {
    /// Reads and checks the files, for the driver; `None` when there are none (the
    /// system's roots, no client certificate). The reason names the parameter.
    pub(crate) fn certificates(&self) -> Result<Option<redis::TlsCertificates>, String> {
        use idem_core::open::tls::{read_ca, read_identity};
        let root_cert = self
            .ca
            .as_deref()
            .map(|path| read_ca("cacert", path))
            .transpose()?;
        let client_tls = self
            .identity
            .as_ref()
            .map(|(cert, key)| read_identity(("cert", cert), ("key", key)))
            .transpose()?
            .map(|identity| redis::ClientTlsConfig {
                client_cert: identity.cert,
                client_key: identity.key,
            });
        Ok(
            (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }
}

impl Target {
    /// Parses `url`, refusing what it could not honour; the reason, for an invalid
    /// URL error.
    pub(crate) fn parse(url: &str) -> Result<Target, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "not a URL (expected redis://HOST:PORT)".to_owned())?;
        let scheme = scheme.to_ascii_lowercase();
        let cluster = scheme == CLUSTER_SCHEME || scheme == TLS_CLUSTER_SCHEME;
        let secure = scheme == "rediss" || scheme == TLS_CLUSTER_SCHEME;
        if let Some((_, fragment)) = url.split_once('#') {
            return Err(if fragment == "insecure" {
                "#insecure: write insecure=true as a query parameter".to_owned()
            } else {
                format!("#{fragment}: a store URL takes no fragment")
            });
        }
        let mut known = PARAMETERS.to_vec();
        if cluster {
            known.extend(CLUSTER_PARAMETERS);
        }
        if secure {
            known.extend(TLS_PARAMETERS);
        }
        if let Err(why) = idem_core::open::refuse_unknown_parameters(url, &known) {
            let plaintext_tls = !secure
                && idem_core::open::refuse_unknown_parameters(
                    url,
                    &[known, TLS_PARAMETERS.to_vec()].concat(),
                )
                .is_ok();
            if plaintext_tls {
                let tls_scheme = if cluster {
                    TLS_CLUSTER_SCHEME
                } else {
                    "rediss"
                };
                return Err(format!(
                    "{} are TLS settings, and {scheme}:// is plaintext: write {tls_scheme}://",
                    TLS_PARAMETERS.join(", ")
                ));
            }
            return Err(why);
        }
        let (mut wait, mut wait_timeout, mut seeds) = (None, None, Vec::new());
        let mut tls = TlsSettings::default();
        let (mut cert, mut key) = (None, None);
        let mut driver = Vec::new();
        for pair in idem_core::open::query_pairs(url) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "wait" => {
                    let n: u32 = value
                        .parse()
                        .map_err(|_| format!("wait={value:?}: expected a number of replicas"))?;
                    wait = Some(n);
                }
                "wait_timeout" => wait_timeout = Some(parse_millis(value)?),
                "cacert" => tls.ca = Some(decode(name, value)?),
                "cert" => cert = Some(decode(name, value)?),
                "key" => key = Some(decode(name, value)?),
                "insecure" => {
                    tls.insecure = match value {
                        "" | "true" => true,
                        "false" => false,
                        _ => return Err(format!("insecure={value:?}: expected true or false")),
                    }
                }
                "seeds" => seeds.extend(
                    value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                ),
                _ => driver.push(pair),
            }
        }
        tls.identity = idem_core::open::tls::both_or_neither(
            ("cert", cert.as_deref()),
            ("key", key.as_deref()),
        )?
        .map(|(cert, key)| (cert.to_owned(), key.to_owned()));
        if tls.insecure && tls.ca.is_some() {
            return Err(
                "insecure=true checks no certificate, so cacert would not be used; \
                 give one or the other"
                    .into(),
            );
        }
        let tls = secure.then_some(tls);
        let node_scheme = if secure { "rediss" } else { "redis" };
        let fragment = if tls.as_ref().is_some_and(|t| t.insecure) {
            "#insecure"
        } else {
            ""
        };
        let replication = match (wait, wait_timeout) {
            (None | Some(0), None) => None,
            (None | Some(0), Some(_)) => {
                return Err("wait_timeout needs wait=N with N of at least 1".into());
            }
            (Some(replicas), timeout) => Some(Replication {
                replicas,
                timeout: timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT),
            }),
        };
        if replication.is_some_and(|r| r.timeout.is_zero()) {
            return Err("wait_timeout=0 would wait forever; give a bound".into());
        }
        let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
        let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
        let query = if driver.is_empty() {
            String::new()
        } else {
            format!("?{}", driver.join("&"))
        };
        if !cluster {
            let slash = if query.is_empty() || rest.contains('/') {
                ""
            } else {
                "/"
            };
            let nodes = vec![format!("{node_scheme}://{rest}{slash}{query}{fragment}")];
            return Ok(Target {
                nodes,
                cluster,
                replication,
                tls,
            });
        }
        let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
        if !matches!(db, "" | "0") {
            return Err(format!(
                "a cluster has only database 0, and the URL names /{db}"
            ));
        }
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (format!("{userinfo}@"), host),
            None => (String::new(), authority),
        };
        let mut nodes = Vec::with_capacity(1 + seeds.len());
        for addr in std::iter::once(host).chain(seeds.iter().map(String::as_str)) {
            check_address(addr)?;
            let slash = if query.is_empty() && fragment.is_empty() {
                ""
            } else {
                "/"
            };
            nodes.push(format!(
                "{node_scheme}://{userinfo}{addr}{slash}{query}{fragment}"
            ));
        }
        Ok(Target {
            nodes,
            cluster,
            replication,
            tls,
        })
    }
}

/// The value of the parameter `name`, percent-decoded (a path may hold spaces).
fn decode(name: &str, value: &str) -> Result<String, String> {
    let decoded: String = form_urlencoded::parse(format!("v={value}").as_bytes())
        .map(|(_, v)| v.into_owned())
        .next()
        .unwrap_or_default();
    if decoded.is_empty() {
        return Err(format!("{name} is empty; give the path of a PEM file"));
    }
    Ok(decoded)
}

/// A seed `host:port`, checked enough that a typo is refused before connecting.
fn check_address(addr: &str) -> Result<(), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("seed node {addr:?}: expected HOST:PORT"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("seed node {addr:?}: expected HOST:PORT"));
    }
    Ok(())
}

/// `250ms`, `2s` or `250` (milliseconds).
fn parse_millis(value: &str) -> Result<Duration, String> {
    let bad = || format!("wait_timeout={value:?}: expected a duration such as 250ms or 2s");
    let (number, scale) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1000)
    } else {
        (value, 1)
    };
    let n: u64 = number.trim().parse().map_err(|_| bad())?;
    Ok(Duration::from_millis(n.checked_mul(scale).ok_or_else(bad)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_url_keeps_what_the_driver_reads_and_drops_the_rest() {
        let t = Target::parse("redis://:pw@127.0.0.1:6379/2?protocol=resp3&wait=1").unwrap();
        assert_eq!(t.nodes, ["redis://:pw@127.0.0.1:6379/2?protocol=resp3"]);
        assert!(!t.cluster);
        assert_eq!(
            t.replication,
            Some(Replication {
                replicas: 1,
                timeout: DEFAULT_WAIT_TIMEOUT
            })
        );
        let t = Target::parse("redis://127.0.0.1:6379?wait=2&wait_timeout=2s").unwrap();
        assert_eq!(t.nodes, ["redis://127.0.0.1:6379"]);
        assert_eq!(t.replication.unwrap().timeout, Duration::from_secs(2));
        let t = Target::parse("redis://127.0.0.1:6379").unwrap();
        assert_eq!(t.nodes, ["redis://127.0.0.1:6379"]);
        assert_eq!(t.replication, None);
    }

    #[test]
    fn a_cluster_url_names_every_seed_with_the_same_credentials() {
        let t = Target::parse(
            "redis+cluster://u:pw@10.0.0.1:7000/?seeds=10.0.0.2:7000,10.0.0.3:7001\
             &protocol=resp3&wait=1&wait_timeout=250ms",
        )
        .unwrap();
        assert!(t.cluster);
        assert_eq!(
            t.nodes,
            [
                "redis://u:pw@10.0.0.1:7000/?protocol=resp3",
                "redis://u:pw@10.0.0.2:7000/?protocol=resp3",
                "redis://u:pw@10.0.0.3:7001/?protocol=resp3",
            ]
        );
        assert_eq!(t.replication.unwrap().timeout, Duration::from_millis(250));
        let t = Target::parse("redis+cluster://127.0.0.1:7000").unwrap();
        assert_eq!(t.nodes, ["redis://127.0.0.1:7000"]);
    }

    #[test]
    fn a_tls_url_keeps_its_settings_and_names_tls_nodes() {
        let t = Target::parse("rediss://:pw@db.internal:6380/1?cacert=%2Fetc%2Fidem%2Fca%20x.pem")
            .unwrap();
        assert_eq!(t.nodes, ["rediss://:pw@db.internal:6380/1"]);
        let tls = t.tls.unwrap();
        assert_eq!(tls.ca.as_deref(), Some("/etc/idem/ca x.pem"));
        assert!(!tls.insecure);
        let t = Target::parse("rediss://h:6380?insecure=true").unwrap();
        assert_eq!(t.nodes, ["rediss://h:6380#insecure"]);
        assert!(t.tls.unwrap().insecure);
        let t = Target::parse(
            "rediss+cluster://u:pw@10.0.0.1:7000/?seeds=10.0.0.2:7000&cert=/c.pem&key=/k.pem",
        )
        .unwrap();
        assert!(t.cluster);
        assert_eq!(
            t.nodes,
            ["rediss://u:pw@10.0.0.1:7000", "rediss://u:pw@10.0.0.2:7000"]
        );
        assert_eq!(
            t.tls.unwrap().identity,
            Some(("/c.pem".to_owned(), "/k.pem".to_owned()))
        );
        assert_eq!(Target::parse("redis://h:1").unwrap().tls, None);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused() {
        for (url, why) in [
            ("redis://h:1?seeds=h:2", "unknown parameter \"seeds\""),
            ("redis+cluster://h:1/3", "only database 0"),
            ("redis+cluster://h:1?seeds=h", "expected HOST:PORT"),
            ("redis+cluster://h:1?seeds=h:x", "expected HOST:PORT"),
            ("redis://h:1?wait=one", "number of replicas"),
            ("redis://h:1?wait=1&wait_timeout=soon", "such as 250ms"),
            ("redis://h:1?wait=1&wait_timeout=0", "wait forever"),
            ("redis://h:1?wait_timeout=1s", "needs wait=N"),
        ] {
            let e = Target::parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
