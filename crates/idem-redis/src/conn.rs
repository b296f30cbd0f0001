//! [`Conn`]: the store's connection, to one server or to a Redis Cluster.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::cluster::Cluster;

/// One multiplexed, reconnecting connection: a [`ConnectionManager`] to one server, or
/// the cluster client, which discovers the slots from the seed nodes, follows `MOVED`
/// and `ASK`, and reconnects to each node. Both are cheap to clone and shared by the
/// clones. Every command the store sends names one record key (or none), so the
/// cluster client sends it to the master of that key's slot; a pipeline goes whole to
/// the slot of its first keyed command, which is how `WAIT` reaches the node that
/// took the write. A cluster command that times out also has the connection made
/// afresh (see [`Cluster`]).
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(Arc<Cluster>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => {
                let cluster = Arc::clone(c);
                Box::pin(async move {
                    let outcome = cluster.conn().req_packed_command(cmd).await;
                    cluster.observe(&outcome);
                    outcome
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => {
                let cluster = Arc::clone(c);
                Box::pin(async move {
                    let outcome = cluster
                        .conn()
                        .req_packed_commands(pipeline, offset, count)
                        .await;
                    cluster.observe(&outcome);
                    outcome
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.conn().get_db(),
        }
    }
}

impl Conn {
    /// Whether this is a cluster's connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// How many times a cluster's connection was made afresh after a timeout (0 for
    /// one server, whose connection manager reconnects by itself).
    pub(crate) fn renewed(&self) -> u64 {
        match self {
            Conn::Single(_) => 0,
            Conn::Cluster(c) => c.renewed(),
        }
    }

    /// Sends a keyless command to one node: the server, or any master of the cluster
    /// (the cluster client would send `INFO` to every master and merge the answers).
    pub(crate) async fn one_node(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
                c.route(cmd, routing).await
            }
        }
    }

    /// The `host:port` of each master of the cluster, sorted, from `CLUSTER NODES`
    /// (masters marked failed left out); empty for one server.
    pub(crate) async fn masters(&self) -> RedisResult<Vec<(String, u16)>> {
        if !self.is_cluster() {
            return Ok(Vec::new());
        }
        let text: String = redis::from_redis_value(
            self.one_node(&redis::cmd("CLUSTER").arg("NODES").clone())
                .await?,
        )?;
        Ok(masters_of(&text))
    }

    /// Sends `cmd` to the node at `host:port` of the cluster (to the server for one).
    pub(crate) async fn at_node(&self, node: &(String, u16), cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: node.0.clone(),
                    port: node.1,
                });
                c.route(cmd, routing).await
            }
        }
    }
}

/// The masters in the text of `CLUSTER NODES`: lines of `id host:port@bus[,hostname]
/// flags master …`; a master flagged `fail` (or without an address) is left out.
fn masters_of(text: &str) -> Vec<(String, u16)> {
    let mut masters: Vec<(String, u16)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = fields.nth(1)?;
            let flags = fields.next()?;
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            let address = address.split(['@', ',']).next()?;
            let (host, port) = address.rsplit_once(':')?;
            let port: u16 = port.parse().ok()?;
            (!host.is_empty() && port != 0).then(|| (host.to_owned(), port))
        })
        .collect();
    masters.sort();
    masters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masters_are_read_from_cluster_nodes() {
        let text = "\
e7d1 127.0.0.1:30004@40004 slave 67ed 0 1 4 connected
67ed 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
292f 127.0.0.1:30002@40002,node-2 master - 0 1 2 connected 5461-10922
9fd3 127.0.0.1:30003@40003 master,fail - 0 1 3 disconnected
c4b0 :0@0 master,noaddr - 0 1 3 disconnected
";
        assert_eq!(
            masters_of(text),
            [
                ("127.0.0.1".to_owned(), 30001),
                ("127.0.0.1".to_owned(), 30002)
            ]
        );
    }
}
