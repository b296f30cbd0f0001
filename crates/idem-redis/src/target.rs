//! What a store URL names: one server or a cluster's seed nodes, and how many
//! replicas must hold each write ([`Replication`]).
//!
//! - `redis://[user:password@]host:port[/db]`: one server.
//! - `redis+cluster://[user:password@]host:port[?seeds=host:port,host:port]`: a Redis
//!   Cluster, discovered from the seed nodes (the host, then each of `seeds`); the
//!   credentials and `protocol` apply to every node, and the database is always 0.
//!
//! Both take `protocol` (read by the driver), `wait=N` and `wait_timeout=DURATION`
//! (`250ms`, `2s`, or a number of milliseconds).

use std::time::Duration;

/// The scheme of a Redis Cluster URL.
pub(crate) const CLUSTER_SCHEME: &str = "redis+cluster";

/// How long a `WAIT` may take when the URL gives `wait` and no `wait_timeout`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// The parameters every Redis URL may carry.
pub(crate) const PARAMETERS: &[&str] = &["protocol", "wait", "wait_timeout"];

/// The parameters a cluster URL may carry.
pub(crate) const CLUSTER_PARAMETERS: &[&str] = &["protocol", "wait", "wait_timeout", "seeds"];

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
}

impl Target {
    /// Parses `url`, refusing what it could not honour; the reason, for an invalid
    /// URL error.
    pub(crate) fn parse(url: &str) -> Result<Target, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "not a URL (expected redis://HOST:PORT)".to_owned())?;
        let cluster = scheme.eq_ignore_ascii_case(CLUSTER_SCHEME);
        let known = if cluster {
            CLUSTER_PARAMETERS
        } else {
            PARAMETERS
        };
        idem_core::open::refuse_unknown_parameters(url, known)?;
        let (mut wait, mut wait_timeout, mut seeds) = (None, None, Vec::new());
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
            let nodes = vec![format!("{scheme}://{rest}{slash}{query}")];
            return Ok(Target {
                nodes,
                cluster,
                replication,
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
            let slash = if query.is_empty() { "" } else { "/" };
            nodes.push(format!("redis://{userinfo}{addr}{slash}{query}"));
        }
        Ok(Target {
            nodes,
            cluster,
            replication,
        })
    }
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
