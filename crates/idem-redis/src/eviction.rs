//! [`EvictionRisk`]: the server memory settings under which Redis may drop records,
//! read when the store connects.

use crate::conn::Conn;

/// A server whose memory settings let it drop keys when it runs out of memory: with a
/// `maxmemory` bound, every `maxmemory-policy` but `noeviction` may evict records (all
/// of them carry a TTL, so the `volatile-*` policies too). A dropped record in progress
/// lets a duplicate execute while the first still runs; a dropped completed one lets a
/// retry execute again. With `noeviction`, writes fail once memory is full and the store
/// answers [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) instead: it fails closed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EvictionRisk {
    /// The server's `maxmemory`, in bytes.
    pub maxmemory: u64,
    /// The server's `maxmemory-policy`.
    pub policy: String,
}

impl EvictionRisk {
    /// The risk the text of `INFO memory` shows, if any.
    fn from_info(info: &str) -> Option<EvictionRisk> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let maxmemory: u64 = field("maxmemory")?.parse().ok()?;
        let policy = field("maxmemory_policy")?;
        (maxmemory > 0 && policy != "noeviction").then(|| EvictionRisk {
            maxmemory,
            policy: policy.to_owned(),
        })
    }
}

/// Reads the server's memory settings and warns when they let it evict records.
/// Servers that do not allow `INFO` (some managed ones rename it) are not checked.
/// On a cluster it reads one master's, taking the nodes to be configured alike.
pub(crate) async fn eviction_risk(conn: &Conn) -> Option<EvictionRisk> {
    let info = conn
        .one_node(redis::cmd("INFO").arg("memory"))
        .await
        .and_then(|v| Ok(redis::from_redis_value::<String>(v)?));
    let info: String = match info {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!(error = %e, "could not read the Redis server's memory settings");
            return None;
        }
    };
    let risk = EvictionRisk::from_info(&info)?;
    tracing::warn!(
        maxmemory = risk.maxmemory,
        policy = %risk.policy,
        "the Redis server may evict idempotency records when its memory is full, and a \
         retry of an evicted key executes again; set maxmemory-policy noeviction"
    );
    Some(risk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_memory_bound_with_an_evicting_policy_is_a_risk() {
        let info = |max: &str, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1061072\r\nmaxmemory:{max}\r\n\
                 maxmemory_human:1.00G\r\nmaxmemory_policy:{policy}\r\n\
                 allocator_frag_ratio:1.19\r\n"
            )
        };
        assert_eq!(
            EvictionRisk::from_info(&info("1073741824", "allkeys-lru")),
            Some(EvictionRisk {
                maxmemory: 1_073_741_824,
                policy: "allkeys-lru".into()
            })
        );
        // Every record has a TTL, so the volatile policies may take them too.
        assert!(EvictionRisk::from_info(&info("1073741824", "volatile-ttl")).is_some());
        assert_eq!(
            EvictionRisk::from_info(&info("1073741824", "noeviction")),
            None
        );
        // No bound: nothing is evicted, whatever the policy.
        assert_eq!(EvictionRisk::from_info(&info("0", "allkeys-lru")), None);
        // Fields missing or unreadable (an INFO edited by a proxy): no claim either way.
        assert_eq!(
            EvictionRisk::from_info("# Memory\r\nused_memory:1\r\n"),
            None
        );
        assert_eq!(EvictionRisk::from_info(&info("lots", "allkeys-lru")), None);
    }
}
