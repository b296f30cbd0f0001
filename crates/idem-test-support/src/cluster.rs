//! A real Redis Cluster on 127.0.0.1 for tests: [`RedisCluster`] starts the machine's
//! `redis-server` with `--cluster-enabled yes` (masters and replicas, each on its own
//! port and in its own temporary directory, nothing saved), joins them with
//! `redis-cli --cluster create`, and waits until every node says the cluster is ok
//! and every master has its replicas.
//!
//! [`redis_cluster_url`] is the one cluster a test process shares (started on first
//! use, or [`REDIS_CLUSTER_ENV`] names one); a test that breaks nodes starts its own
//! with [`RedisCluster::start`]. Either way a watchdog process stops the nodes and
//! deletes their directories once the test process is gone, so nothing outlives a
//! run that panicked or was killed; an owned cluster also stops when dropped.
//!
//! [`RedisCluster::start_tls`] starts one whose nodes speak only TLS, to clients, to
//! each other on the cluster bus and to their replicas, with certificates from a
//! [`TestPki`].

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process;
use crate::tls::{CertFiles, TestPki};

/// The variable naming a Redis Cluster's URL (`redis+cluster://HOST:PORT`) for the
/// tests to use instead of starting one.
pub const REDIS_CLUSTER_ENV: &str = "IDEM_TEST_REDIS_CLUSTER_URL";

/// The lowest port a cluster's node takes; its bus port is 10 000 above, and both
/// stay below the kernel's ephemeral range.
const PORT_BASE: u16 = 16_000;
/// How many blocks of ports the processes of one run choose among.
const PORT_BLOCKS: u16 = 160;
/// Ports per block: one cluster's nodes.
const BLOCK: u16 = 20;
/// How long a cluster may take to form.
const FORM_DEADLINE: Duration = Duration::from_secs(30);

/// A Redis Cluster of local `redis-server` processes, stopped when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    /// Whether the nodes form a cluster, or are one server and its replicas.
    cluster: bool,
    ports: Vec<u16>,
    nodes: Vec<Child>,
    watchdog: Option<Child>,
    dir: PathBuf,
    /// The certificates of a cluster that speaks only TLS.
    tls: Option<NodeTls>,
}

/// What a TLS-only node presents and trusts.
#[derive(Debug, Clone)]
struct NodeTls {
    /// The CA every certificate here is signed by.
    ca: PathBuf,
    /// What a node presents to whoever connects to it.
    server: CertFiles,
    /// What a node (or `redis-cli`) presents when it connects to another: a server
    /// certificate is for server authentication only, so it would be refused.
    client: CertFiles,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each, whose failure detection
    /// takes `node_timeout` (`--cluster-node-timeout`), and waits until the cluster is
    /// ok; why not, when the machine has no `redis-server` or it would not form.
    pub fn start(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
    ) -> Result<RedisCluster, String> {
        Self::start_with(masters, replicas, node_timeout, None)
    }

    /// As [`start`](Self::start), but every node listens only for TLS (`--port 0
    /// --tls-port`), with a certificate for `127.0.0.1` issued by `pki`'s CA, and the
    /// cluster bus and replication go over TLS too; a client certificate is optional.
    /// [`url`](Self::url) is then a `rediss+cluster://` URL, to which the caller adds
    /// `&cacert=…`. The files live in `pki`'s directory: keep it until the cluster is
    /// dropped.
    pub fn start_tls(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
        pki: &TestPki,
    ) -> Result<RedisCluster, String> {
        let tls = NodeTls {
            ca: pki.ca(),
            server: pki.server("cluster-node", &["127.0.0.1"])?,
            client: pki.client(),
        };
        Self::start_with(masters, replicas, node_timeout, Some(tls))
    }

    fn start_with(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
        tls: Option<NodeTls>,
    ) -> Result<RedisCluster, String> {
        let count = masters * (1 + replicas);
        let ports = free_ports(count)?;
        let dir = std::env::temp_dir().join(format!(
            "idem-redis-cluster-{}-{}",
            std::process::id(),
            ports[0]
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cluster = RedisCluster {
            cluster: true,
            ports: ports.clone(),
            nodes: Vec::with_capacity(count),
            watchdog: None,
            dir,
            tls,
        };
        for &port in &ports {
            let child = cluster.spawn_node(port, &cluster_args(node_timeout), None)?;
            cluster.nodes.push(child);
        }
        cluster.watchdog = Some(cluster.spawn_watchdog()?);
        cluster.form(replicas)?;
        Ok(cluster)
    }

    /// One server (not a cluster) with `replicas` replicas, each a `redis-server` on
    /// its own port; [`url`](Self::url) names the server.
    pub fn start_replicated(replicas: usize) -> Result<RedisCluster, String> {
        let ports = free_ports(1 + replicas)?;
        let dir = std::env::temp_dir().join(format!(
            "idem-redis-replicated-{}-{}",
            std::process::id(),
            ports[0]
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut set = RedisCluster {
            cluster: false,
            ports: ports.clone(),
            nodes: Vec::with_capacity(ports.len()),
            watchdog: None,
            dir,
            tls: None,
        };
        for (i, &port) in ports.iter().enumerate() {
            let child = set.spawn_node(port, &[], (i > 0).then_some(ports[0]))?;
            set.nodes.push(child);
        }
        set.watchdog = Some(set.spawn_watchdog()?);
        let start = Instant::now();
        loop {
            let linked = set
                .cli(ports[0], &["INFO", "replication"])
                .is_ok_and(|info| {
                    info.lines()
                        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                        .count()
                        >= replicas
                });
            if linked {
                return Ok(set);
            }
            if start.elapsed() > FORM_DEADLINE {
                return Err("the replicas did not link to the server".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts `redis-server` on `port` in its own directory, with `extra` arguments,
    /// as a replica of `replica_of` if given.
    fn spawn_node(
        &self,
        port: u16,
        extra: &[String],
        replica_of: Option<u16>,
    ) -> Result<Child, String> {
        let node_dir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1"]);
        match &self.tls {
            None => {
                cmd.args(["--port", &port.to_string()]);
            }
            Some(tls) => {
                cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&tls.server.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.server.key)
                    .arg("--tls-client-cert-file")
                    .arg(&tls.client.cert)
                    .arg("--tls-client-key-file")
                    .arg(&tls.client.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .args(["--tls-auth-clients", "optional"])
                    .args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
            }
        }
        cmd.args(extra)
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &node_dir.to_string_lossy()])
            .args(["--logfile", "redis.log"]);
        if let Some(master) = replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))
    }

    /// The URL of the cluster (the first node as seed, the others in `seeds`), or of
    /// the server of [`start_replicated`](Self::start_replicated).
    pub fn url(&self) -> String {
        if !self.cluster {
            return format!("redis://127.0.0.1:{}", self.ports[0]);
        }
        let scheme = if self.tls.is_some() {
            "rediss+cluster"
        } else {
            "redis+cluster"
        };
        let seeds: Vec<String> = self.ports[1..]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "{scheme}://127.0.0.1:{}/?seeds={}",
            self.ports[0],
            seeds.join(",")
        )
    }

    /// Every node's port.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The ports of the nodes that are masters now.
    pub fn master_ports(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|&p| {
                self.cli(p, &["ROLE"])
                    .is_ok_and(|role| role.starts_with("master"))
            })
            .collect()
    }

    /// Kills the node on `port` at once (`SIGKILL`), as a crash would.
    pub fn kill(&mut self, port: u16) {
        if let Some(i) = self.ports.iter().position(|&p| p == port) {
            let _ = self.nodes[i].kill();
            let _ = self.nodes[i].wait();
        }
    }

    /// Pauses the node on `port` (`SIGSTOP`): its connections stay open and nothing
    /// on them is answered, as a frozen machine or a cut link would do; the cluster
    /// fails it over once the node timeout passes. [`resume`](Self::resume) undoes it;
    /// dropping the cluster kills it all the same.
    pub fn pause(&mut self, port: u16) -> Result<(), String> {
        self.signal(port, "STOP")
    }

    /// Resumes a node [`pause`](Self::pause)d (`SIGCONT`).
    pub fn resume(&mut self, port: u16) -> Result<(), String> {
        self.signal(port, "CONT")
    }

    fn signal(&mut self, port: u16, signal: &str) -> Result<(), String> {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .ok_or_else(|| format!("no node on {port}"))?;
        process::signal(self.nodes[i].id(), signal).map_err(|e| format!("the node on {port}: {e}"))
    }

    /// Waits until the other nodes see the node on `port` failed and `masters`
    /// masters serve the slots without it (asking only the other nodes, so it works
    /// while that one is paused).
    pub fn wait_failed_over(
        &self,
        port: u16,
        masters: usize,
        deadline: Duration,
    ) -> Result<(), String> {
        let start = Instant::now();
        let others: Vec<u16> = self.ports.iter().copied().filter(|&p| p != port).collect();
        let address = format!("127.0.0.1:{port}@");
        loop {
            let nodes = self
                .cli(others[0], &["CLUSTER", "NODES"])
                .unwrap_or_default();
            let failed = nodes.lines().any(|l| {
                l.contains(&address)
                    && l.split_whitespace()
                        .nth(2)
                        .is_some_and(|f| f.split(',').any(|f| f == "fail"))
            });
            let serving = nodes
                .lines()
                .filter(|l| {
                    let flags = l.split_whitespace().nth(2).unwrap_or("");
                    flags.split(',').any(|f| f == "master")
                        && !flags.contains("fail")
                        && !l.contains(&address)
                })
                .count();
            let ok = others.iter().all(|&p| {
                self.cli(p, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if failed && serving >= masters && ok {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(format!(
                    "the node on {port} was not failed over after {deadline:?}:\n{nodes}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts the node on `port` again after [`kill`](Self::kill), with its
    /// directory (a cluster node keeps its identity there, and rejoins as a replica
    /// if it was failed over); watched like the others.
    pub fn restart(&mut self, port: u16, node_timeout: Duration) -> Result<(), String> {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .ok_or_else(|| format!("no node on {port}"))?;
        let args = if self.cluster {
            cluster_args(node_timeout)
        } else {
            Vec::new()
        };
        let replica_of = (!self.cluster && i > 0).then_some(self.ports[0]);
        self.nodes[i] = self.spawn_node(port, &args, replica_of)?;
        let watchdog = self.spawn_watchdog()?;
        if let Some(mut old) = self.watchdog.replace(watchdog) {
            let _ = old.kill();
            let _ = old.wait();
        }
        Ok(())
    }

    /// Waits until every node still running says the cluster is ok.
    pub fn wait_ok(&self, deadline: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let live: Vec<u16> = self.live_ports();
            let ok = live.iter().all(|&p| {
                self.cli(p, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(format!(
                    "the cluster on {live:?} is not ok after {deadline:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn live_ports(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|&p| self.cli(p, &["PING"]).is_ok_and(|r| r.trim() == "PONG"))
            .collect()
    }

    /// Joins the nodes, then waits until the cluster is ok and each master has its
    /// `replicas` replicas linked.
    fn form(&self, replicas: usize) -> Result<(), String> {
        let start = Instant::now();
        while self.live_ports().len() < self.ports.len() {
            if start.elapsed() > FORM_DEADLINE {
                return Err("the redis-server nodes did not all start".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = self
            .redis_cli()
            .args(["--cluster", "create"])
            .args(self.ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        self.wait_ok(FORM_DEADLINE.saturating_sub(start.elapsed()))?;
        self.wait_replicated(replicas, FORM_DEADLINE.saturating_sub(start.elapsed()))
    }

    /// Waits until every master has `replicas` replicas online.
    pub fn wait_replicated(&self, replicas: usize, deadline: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let masters = self.master_ports();
            let linked = masters.iter().all(|&p| {
                self.cli(p, &["INFO", "replication"]).is_ok_and(|info| {
                    info.lines()
                        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                        .count()
                        >= replicas
                })
            });
            if linked {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(format!(
                    "the masters {masters:?} do not all have {replicas} replicas online"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis-cli`, with the TLS options when the nodes speak only TLS.
    fn redis_cli(&self) -> Command {
        let mut cmd = Command::new("redis-cli");
        if let Some(tls) = &self.tls {
            cmd.arg("--tls")
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.cert)
                .arg("--key")
                .arg(&tls.client.key);
        }
        cmd
    }

    /// `redis-cli -p PORT ARGS…`'s output, raw.
    fn cli(&self, port: u16, args: &[&str]) -> Result<String, String> {
        let out = self
            .redis_cli()
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--raw"])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && !text.starts_with("Could not connect") {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// A shell that, once this process is gone, stops the nodes and deletes their
    /// directory: statics never drop, and a killed test never runs `Drop`.
    fn spawn_watchdog(&mut self) -> Result<Child, String> {
        let pids: Vec<String> = self
            .nodes
            .iter_mut()
            .filter_map(|c| matches!(c.try_wait(), Ok(None)).then(|| c.id().to_string()))
            .collect();
        process::once_gone(&format!(
            "kill -9 {pids} 2>/dev/null; rm -rf '{dir}'",
            pids = pids.join(" "),
            dir = self.dir.display()
        ))
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
        if let Some(watchdog) = &mut self.watchdog {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The arguments that make a `redis-server` a cluster node.
fn cluster_args(node_timeout: Duration) -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([node_timeout.as_millis().to_string()])
    .collect()
}

/// `count` ports of one block, each free with its bus port: blocks are tried from
/// one this process's id picks, so the test processes of a run rarely meet.
fn free_ports(count: usize) -> Result<Vec<u16>, String> {
    // Blocks this process handed out already: two tests starting servers at once would
    // otherwise both find the same block free before either server binds it.
    static CLAIMED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
    let first = (std::process::id() % u32::from(PORT_BLOCKS)) as u16;
    for i in 0..PORT_BLOCKS {
        let block = PORT_BASE + ((first + i) % PORT_BLOCKS) * BLOCK;
        if claimed.contains(&block) {
            continue;
        }
        let ports: Vec<u16> = (block..block + count as u16).collect();
        let free = ports.iter().all(|&p| {
            TcpListener::bind(("127.0.0.1", p)).is_ok()
                && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
        });
        if free {
            claimed.push(block);
            return Ok(ports);
        }
    }
    Err("no free block of ports for a Redis Cluster".into())
}

/// The Redis Cluster this test process shares: [`REDIS_CLUSTER_ENV`] when set, else
/// three masters with a replica each, started on the first call; `Err` says why it
/// could not start (for [`service_unavailable`](crate::service_unavailable)).
pub fn redis_cluster_url() -> Result<String, String> {
    if let Ok(url) = std::env::var(REDIS_CLUSTER_ENV) {
        return Ok(url);
    }
    static SHARED: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| RedisCluster::start(3, 1, Duration::from_secs(5)))
        .as_ref()
        .map(RedisCluster::url)
        .map_err(Clone::clone)
}
