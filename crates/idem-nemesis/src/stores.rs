//! The stores a run breaks, each private to the run (never the machine's shared
//! servers): a PostgreSQL server to restart, a Redis server with two replicas to fail
//! over (with and without `?wait=1`), a Redis Cluster whose master is killed, a
//! MariaDB server to crash and restart.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_test_support::{MariaDbServer, PgServer, RedisCluster};

/// Which store a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// A private PostgreSQL server.
    Postgres,
    /// A private Redis server with replicas; replication is asynchronous.
    Redis,
    /// The same with `?wait=1`: each write is held by a replica before it counts.
    RedisWait,
    /// A private Redis Cluster: three masters, one replica each.
    RedisCluster,
    /// A private MariaDB server (the MySQL store).
    MySql,
}

impl StoreKind {
    /// Every kind.
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Postgres,
        StoreKind::Redis,
        StoreKind::RedisWait,
        StoreKind::RedisCluster,
        StoreKind::MySql,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
            StoreKind::RedisWait => "redis?wait=1",
            StoreKind::RedisCluster => "redis-cluster",
            StoreKind::MySql => "mysql",
        }
    }

    /// What its failover nemesis does.
    pub fn failover(self) -> &'static str {
        match self {
            StoreKind::Postgres => "PostgreSQL restarted (immediate shutdown, WAL recovery)",
            StoreKind::Redis | StoreKind::RedisWait => {
                "master killed, a replica promoted, the store's address moved to it"
            }
            StoreKind::RedisCluster => "a master killed, its replica promoted by the cluster",
            StoreKind::MySql => "MariaDB killed (SIGKILL) and restarted (InnoDB crash recovery)",
        }
    }
}

/// How long a cluster node may be silent before it is failed.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// A running store.
#[derive(Debug)]
pub struct Store {
    kind: StoreKind,
    pg: Option<PgServer>,
    mysql: Option<MariaDbServer>,
    redis: Option<RedisCluster>,
    /// Where connections to each forwarded port go now.
    targets: HashMap<u16, Arc<Mutex<SocketAddr>>>,
    /// The ports the gateways reach, in their URL's order.
    ports: Vec<u16>,
    /// Redis: the master now, the replicas now.
    master: u16,
    replicas: Vec<u16>,
}

impl Store {
    /// Starts one (blocking: run it off the runtime's threads), a Redis server with
    /// `replicas` replicas (one failover spends one); why not, when the machine lacks
    /// the server's binaries.
    pub fn start(kind: StoreKind, replicas: usize) -> Result<Store, String> {
        let mut mysql = None;
        let (pg, redis, ports, master, replicas) = match kind {
            StoreKind::Postgres => {
                let pg = PgServer::start_plaintext()?;
                let port = pg.port();
                (Some(pg), None, vec![port], 0, vec![])
            }
            StoreKind::MySql => {
                let server = MariaDbServer::start()?;
                let port = server.port();
                mysql = Some(server);
                (None, None, vec![port], 0, vec![])
            }
            StoreKind::Redis | StoreKind::RedisWait => {
                let set = RedisCluster::start_replicated(replicas.max(1))?;
                let all = set.ports().to_vec();
                (None, Some(set), vec![all[0]], all[0], all[1..].to_vec())
            }
            StoreKind::RedisCluster => {
                let cluster = RedisCluster::start(3, 1, NODE_TIMEOUT)?;
                let all = cluster.ports().to_vec();
                (None, Some(cluster), all, 0, vec![])
            }
        };
        let targets = ports
            .iter()
            .map(|&p| {
                (
                    p,
                    Arc::new(Mutex::new(SocketAddr::from(([127, 0, 0, 1], p)))),
                )
            })
            .collect();
        Ok(Store {
            kind,
            pg,
            mysql,
            redis,
            targets,
            ports,
            master,
            replicas,
        })
    }

    /// Its kind.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// The URL a gateway opens it by: loopback addresses, which every host forwards
    /// to the root namespace's.
    pub fn url(&self) -> String {
        match (self.kind, &self.pg, &self.redis) {
            (StoreKind::Postgres, Some(pg), _) => pg.url("sslmode=disable"),
            (StoreKind::MySql, _, _) => self.mysql.as_ref().expect("mariadb").url(),
            (StoreKind::RedisWait, _, Some(r)) => format!("{}?wait=1&wait_timeout=1s", r.url()),
            (_, _, Some(r)) => r.url(),
            _ => unreachable!("a store has its server"),
        }
    }

    /// The ports a host must forward.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Where the connections to `port` go now.
    pub fn target(&self, port: u16) -> Arc<Mutex<SocketAddr>> {
        self.targets[&port].clone()
    }

    /// Fails the store over (blocking): PostgreSQL and MariaDB restart; Redis loses its master
    /// and a replica takes its place at the same address; the cluster promotes a
    /// master's replica. Returns once the store serves again.
    pub fn fail_over(&mut self) -> Result<(), String> {
        match self.kind {
            StoreKind::Postgres => self.pg.as_mut().expect("postgres").restart(),
            StoreKind::MySql => self.mysql.as_mut().expect("mariadb").restart(),
            StoreKind::Redis | StoreKind::RedisWait => self.promote_replica(),
            StoreKind::RedisCluster => {
                let cluster = self.redis.as_mut().expect("a cluster");
                let victim = cluster.master_ports()[0];
                cluster.kill(victim);
                let deadline = Instant::now() + Duration::from_secs(30);
                while cluster.master_ports().len() < 3 {
                    if Instant::now() > deadline {
                        return Err("no replica was promoted in 30 s".into());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                cluster.wait_ok(Duration::from_secs(30))?;
                cluster.restart(victim, NODE_TIMEOUT)?;
                cluster.wait_ok(Duration::from_secs(30))?;
                // The next failover must find every master with a replica in sync: the
                // restarted node is the promoted one's.
                cluster.wait_replicated(1, Duration::from_secs(30))
            }
        }
    }

    /// Kills the master, promotes the first replica, makes the others follow it, and
    /// moves every forwarded connection to it: the gateways' URL now names the new
    /// master, as a virtual address or a proxy would after a failover.
    fn promote_replica(&mut self) -> Result<(), String> {
        if self.replicas.is_empty() {
            return Err("no replica left to promote".into());
        }
        let new = self.replicas.remove(0);
        self.redis.as_mut().expect("redis").kill(self.master);
        cli(new, &["REPLICAOF", "NO", "ONE"])?;
        for &r in &self.replicas {
            cli(r, &["REPLICAOF", "127.0.0.1", &new.to_string()])?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = cli(new, &["INFO", "replication"])?;
            let online = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .count();
            if online >= self.replicas.len() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the replicas did not follow {new}: {info}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for target in self.targets.values() {
            *target.lock().unwrap() = SocketAddr::from(([127, 0, 0, 1], new));
        }
        self.master = new;
        Ok(())
    }
}

/// `redis-cli -p PORT ARGS…`'s output.
fn cli(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--raw"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() && !text.starts_with("ERR") {
        Ok(text)
    } else {
        Err(format!("redis-cli -p {port} {}: {text}", args.join(" ")))
    }
}
