//! The world a run breaks: hosts (network namespaces), a private store, the recording
//! upstream, the links between them, and a gateway in each host.
//!
//! Inside each host, its loopback forwards the store's ports and the upstream's port
//! through its veth to the root namespace (a plain relay, bound and dialling from
//! inside the host), so a gateway opens the same URLs as it would on one machine
//! (a Redis Cluster's node addresses included). On the root side, a relay per host
//! and port carries the faults: [`World::set_store_link`].

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::gateway::Gateway;
use crate::history::Recorder;
use crate::link::{Dial, Link, LinkFault};
use crate::net::{Host, Net};
use crate::stores::{Store, StoreKind};
use crate::upstream::Upstream;

/// Everything of one run, stopped and deleted on drop.
#[derive(Debug)]
pub struct World {
    // Dropped in this order: gateways first, then links, namespaces, servers.
    gateways: Vec<Arc<tokio::sync::Mutex<Gateway>>>,
    store_links: Vec<Vec<Link>>,
    // Held for their drop: the plain relays and the upstream stop with the world.
    _relays: Vec<Link>,
    _upstream: Upstream,
    recorder: Recorder,
    net: Net,
    store: Arc<Mutex<Store>>,
    url: String,
}

/// Why a world could not be made.
#[derive(Debug)]
pub enum Unavailable {
    /// No network namespaces here (not root, no `ip`).
    Namespaces(String),
    /// The store's servers would not start (no binaries on the machine).
    Store(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Namespaces(why) => write!(f, "no network namespaces: {why}"),
            Unavailable::Store(why) => write!(f, "the store would not start: {why}"),
        }
    }
}

impl World {
    /// Makes `gateways` hosts and starts a store of `kind` (with `replicas` replicas
    /// for Redis), the upstream, the links and a gateway in each host, started from
    /// `binary` with `args` (besides its listeners, upstream and store), logging
    /// into `log_dir`.
    pub async fn create(
        kind: StoreKind,
        replicas: usize,
        gateways: usize,
        binary: &Path,
        args: &[String],
        log_dir: &Path,
        seed: u64,
    ) -> Result<World, Unavailable> {
        let net = tokio::task::spawn_blocking(move || Net::create(gateways))
            .await
            .expect("creating namespaces does not panic")
            .map_err(Unavailable::Namespaces)?;
        let store = tokio::task::spawn_blocking(move || Store::start(kind, replicas))
            .await
            .expect("starting a store does not panic")
            .map_err(Unavailable::Store)?;
        let recorder = Recorder::new();
        let upstream = Upstream::start(recorder.clone())
            .await
            .map_err(|e| Unavailable::Store(format!("the upstream: {e}")))?;
        let up_port = upstream.addr().port();
        let mut store_links = Vec::new();
        let mut other_links = Vec::new();
        let bind_err = |e: std::io::Error| Unavailable::Namespaces(format!("bind: {e}"));
        let local = |p: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, p));
        for (i, host) in net.hosts().iter().enumerate() {
            let seed = seed ^ (i as u64 + 1) << 32;
            let mut links = Vec::new();
            for &port in store.ports() {
                let root = tokio::net::TcpListener::bind((host.store_ip, port))
                    .await
                    .map_err(bind_err)?;
                links.push(Link::start(
                    root,
                    Dial::Root(store.target(port)),
                    seed ^ port as u64,
                ));
                let inside = host.bind(local(port)).map_err(bind_err)?;
                let to = SocketAddrV4::new(host.store_ip, port);
                other_links.push(Link::start(inside, Dial::From(host.clone(), to), 0));
            }
            store_links.push(links);
            let root = tokio::net::TcpListener::bind((host.root_ip, up_port))
                .await
                .map_err(bind_err)?;
            other_links.push(Link::start(
                root,
                Dial::Root(Arc::new(Mutex::new(upstream.addr()))),
                0,
            ));
            let inside = host.bind(local(up_port)).map_err(bind_err)?;
            let to = SocketAddrV4::new(host.root_ip, up_port);
            other_links.push(Link::start(inside, Dial::From(host.clone(), to), 0));
        }
        let url = store.url();
        let mut all_args = vec![
            "--upstream".to_owned(),
            format!("http://127.0.0.1:{up_port}"),
            "--store".to_owned(),
            url.clone(),
        ];
        all_args.extend_from_slice(args);
        let mut started = Vec::new();
        for (i, host) in net.hosts().iter().enumerate() {
            let log: PathBuf = log_dir.join(format!("gateway-{i}.log"));
            let gw = Gateway::start(host.clone(), binary.to_owned(), all_args.clone(), log)
                .await
                .map_err(Unavailable::Store)?;
            started.push(Arc::new(tokio::sync::Mutex::new(gw)));
        }
        Ok(World {
            gateways: started,
            store_links,
            _relays: other_links,
            _upstream: upstream,
            recorder,
            net,
            store: Arc::new(Mutex::new(store)),
            url,
        })
    }

    /// The hosts, one per gateway.
    pub fn hosts(&self) -> &[Host] {
        self.net.hosts()
    }

    /// Gateway `i`.
    pub fn gateway(&self, i: usize) -> Arc<tokio::sync::Mutex<Gateway>> {
        self.gateways[i].clone()
    }

    /// How many gateways.
    pub fn gateways(&self) -> usize {
        self.gateways.len()
    }

    /// Where gateway `i` listens.
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.hosts()[i].ip, crate::gateway::PORT))
    }

    /// Where gateway `i`'s admin listener is.
    pub fn admin(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.hosts()[i].ip, crate::gateway::ADMIN_PORT))
    }

    /// The recorder the upstream records executions in, and clients their requests.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// The store's URL, as the gateways open it.
    pub fn store_url(&self) -> &str {
        &self.url
    }

    /// Sets the fault of gateway `i`'s links to the store.
    pub fn set_store_link(&self, i: usize, fault: LinkFault) {
        for link in &self.store_links[i] {
            link.set(fault);
        }
    }

    /// Fails the store over; returns once it serves again.
    pub async fn fail_over(&self) -> Result<(), String> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.lock().unwrap().fail_over())
            .await
            .expect("a failover does not panic")
    }

    /// Every gateway's log, for a failure's message.
    pub async fn logs(&self) -> String {
        let mut all = String::new();
        for (i, gw) in self.gateways.iter().enumerate() {
            all.push_str(&format!("--- gateway {i}\n{}\n", gw.lock().await.logs()));
        }
        all
    }
}
