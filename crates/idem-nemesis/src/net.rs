//! Hosts as Linux network namespaces: each [`Host`] is a namespace of its own with a
//! veth pair to the test's (root) namespace, on addresses of a private `/24` the run
//! takes (`10.213.X.0/24`, one `/29` per host).
//!
//! In a host's `/29` at `10.213.X.8i`: `.8i+1` is the root side (the clients' source,
//! and where the relays to the upstream listen), `.8i+2` the host (its gateway listens
//! there), `.8i+3` a second root-side address where only the relays to the store
//! listen, so that a blackhole route to it cuts a gateway from its store and from
//! nothing else.
//!
//! Creating namespaces needs root and `ip` (iproute2): [`Net::create`] says why not.
//! Everything is deleted on drop, and by a watchdog process if the test process dies
//! first.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Runs `ip ARGS…` and fails with its error output unless it succeeds.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The network namespaces of one run.
#[derive(Debug)]
pub struct Net {
    hosts: Vec<Host>,
    watchdog: std::process::Child,
}

/// One host: a network namespace and its link to the root namespace.
#[derive(Debug, Clone)]
pub struct Host {
    /// The namespace's name (under `/run/netns`).
    pub ns: String,
    /// The root side of the veth pair.
    pub veth: String,
    /// The root side's address: the clients' source, the upstream relays'.
    pub root_ip: Ipv4Addr,
    /// The second root-side address, only the store relays'.
    pub store_ip: Ipv4Addr,
    /// The host's own address.
    pub ip: Ipv4Addr,
}

impl Net {
    /// Makes `hosts` namespaces, each linked to the root namespace; why not, when this
    /// process may not (not root, no `ip`).
    pub fn create(hosts: usize) -> Result<Net, String> {
        static RUN: AtomicU32 = AtomicU32::new(0);
        assert!(hosts <= 30, "one /24 holds 30 hosts of a /29 each");
        // Runs of concurrent test processes take different /24s: the choice and the
        // addresses are made under a lock every process takes.
        let lock = File::create(std::env::temp_dir().join("idem-nemesis-net.lock"))
            .map_err(|e| format!("the lock file: {e}"))?;
        lock.lock().map_err(|e| format!("the lock: {e}"))?;
        let used = Command::new("ip")
            .args(["-4", "-o", "addr", "show"])
            .output()
            .map_err(|e| format!("ip: {e}"))?;
        let used = String::from_utf8_lossy(&used.stdout).into_owned();
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        let start = (std::process::id().wrapping_mul(31).wrapping_add(run * 7)) % 256;
        let octet = (0..256)
            .map(|i| (start + i) % 256)
            .find(|o| !used.contains(&format!("10.213.{o}.")))
            .ok_or("every 10.213.X.0/24 is taken")?;
        let tag = format!("{}{}", std::process::id() % 100_000, run);
        let hosts: Vec<Host> = (0..hosts as u8)
            .map(|i| Host {
                ns: format!("idem-nemesis-{tag}-{i}"),
                veth: format!("in{tag}v{i}"),
                root_ip: Ipv4Addr::new(10, 213, octet as u8, 8 * i + 1),
                ip: Ipv4Addr::new(10, 213, octet as u8, 8 * i + 2),
                store_ip: Ipv4Addr::new(10, 213, octet as u8, 8 * i + 3),
            })
            .collect();
        // The watchdog first: whatever is made below goes with this process.
        let names: Vec<String> = hosts.iter().map(|h| h.ns.clone()).collect();
        let script = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; for n in {}; do ip netns del $n; done",
            std::process::id(),
            names.join(" ")
        );
        let watchdog = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("sh: {e}"))?;
        let net = Net {
            hosts: hosts.clone(),
            watchdog,
        };
        for h in &hosts {
            let peer = format!("{}p", h.veth);
            let cidr = |a: Ipv4Addr| format!("{a}/29");
            ip(&["netns", "add", &h.ns])?;
            ip(&[
                "link", "add", &h.veth, "type", "veth", "peer", "name", &peer, "netns", &h.ns,
            ])?;
            ip(&["addr", "add", &cidr(h.root_ip), "dev", &h.veth])?;
            ip(&["addr", "add", &cidr(h.store_ip), "dev", &h.veth])?;
            ip(&["link", "set", &h.veth, "up"])?;
            h.ip_in(&["link", "set", "lo", "up"])?;
            h.ip_in(&["addr", "add", &cidr(h.ip), "dev", &peer])?;
            h.ip_in(&["link", "set", &peer, "up"])?;
        }
        drop(lock);
        Ok(net)
    }

    /// The hosts.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            // Deleting the namespace deletes its end of the veth pair, and so the pair.
            let _ = ip(&["netns", "del", &h.ns]);
            let _ = ip(&["link", "del", &h.veth]);
        }
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

impl Host {
    /// Runs `ip ARGS…` inside the host.
    pub fn ip_in(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.ns, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Takes the host's link down (`up == false`) or up again: the host is cut from
    /// everything, or joins again.
    pub fn set_link(&self, up: bool) -> Result<(), String> {
        ip(&["link", "set", &self.veth, if up { "up" } else { "down" }])
    }

    /// Adds (or removes) a blackhole route to the store relays' address inside the
    /// host: the host's packets to its store go nowhere, both ways of every connection
    /// stall.
    pub fn set_store_route(&self, blackholed: bool) -> Result<(), String> {
        let to = format!("{}/32", self.store_ip);
        if blackholed {
            self.ip_in(&["route", "add", "blackhole", &to])
        } else {
            self.ip_in(&["route", "del", "blackhole", &to])
        }
    }

    /// A command run inside the host (`ip netns exec NS PROGRAM`), which `ip` replaces
    /// by the program itself: the child's pid is the program's.
    pub fn command(&self, program: &std::path::Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]).arg(program);
        cmd
    }

    /// Runs `f` on a thread of its own moved into the host's namespace: sockets made
    /// there belong to the host, whichever thread uses them afterwards.
    fn inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let path = format!("/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            let ns = File::open(&path)?;
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            f()
        })
        .join()
        .expect("the namespace thread does not panic")
    }

    /// A listener inside the host on `addr` (its loopback, say).
    pub fn bind(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
        let listener = self.inside(move || {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?;
        tokio::net::TcpListener::from_std(listener)
    }

    /// A connection made from inside the host to `addr` (bounded by `within`).
    pub async fn connect(
        &self,
        addr: SocketAddrV4,
        within: Duration,
    ) -> std::io::Result<tokio::net::TcpStream> {
        let host = self.clone();
        let stream = tokio::task::spawn_blocking(move || {
            host.inside(move || {
                let s = std::net::TcpStream::connect_timeout(&addr.into(), within)?;
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
                Ok(s)
            })
        })
        .await
        .expect("the connecting task does not panic")?;
        tokio::net::TcpStream::from_std(stream)
    }
}
