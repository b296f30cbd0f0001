//! The fault proxy: a TCP relay on a loopback port, between a client and the server it
//! talks to, that refuses, resets or stalls connections, or loses a reply after the
//! server acted on the request.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// `url` (`scheme://[user[:password]@]host[:port][/path][?query]`) split around its
/// `host[:port]`: what comes before it, it, and what comes after.
fn split_authority(url: &str) -> (&str, &str, &str) {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host_start = rest[..authority_end].rfind('@').map_or(0, |at| at + 1);
    let (head, tail) = url.split_at(scheme_end + authority_end);
    let (head, host_port) = head.split_at(scheme_end + host_start);
    (head, host_port, tail)
}

/// `url` with its host and port replaced by `addr`, everything else (user, password,
/// database, query) kept: the URL of a service seen through a [`Relay`]. A PostgreSQL
/// URL that says nothing of TLS gets `sslmode=disable`: the relay finds requests by
/// their bytes, which TLS (the driver's default `prefer`, on a server with `ssl = on`)
/// would hide.
pub fn url_via(url: &str, addr: SocketAddr) -> String {
    let (head, _, tail) = split_authority(url);
    let mut via = format!("{head}{addr}{tail}");
    if url.starts_with("postgres") && !url.contains("sslmode=") {
        via.push(if via.contains('?') { '&' } else { '?' });
        via.push_str("sslmode=disable");
    }
    via
}

/// The address `url`'s host and port resolve to (`default_port` when it names none).
///
/// # Panics
///
/// When the host does not resolve.
pub async fn service_addr(url: &str, default_port: u16) -> SocketAddr {
    let (_, host_port, _) = split_authority(url);
    let has_port = host_port
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
    let host_port = if has_port {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    };
    tokio::net::lookup_host(&host_port)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("{host_port} does not resolve"))
}

/// A TCP relay on a loopback port to a server, for tests that make the server
/// unreachable ([`cut`](Relay::cut), [`set_mode`](Relay::set_mode)), break chosen
/// connections ([`fault_next`](Relay::fault_next)) or lose a reply after the server
/// acted on the request ([`lose_reply_to`](Relay::lose_reply_to)). Point the client at
/// [`addr`](Relay::addr). Dropping it cuts everything.
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<RelayShared>,
}

/// What a [`Relay`] does with connections, old and new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
    /// Passes bytes both ways.
    Forward,
    /// The server is down: the port is closed, so connecting is refused, and live
    /// connections are reset. Leaving this mode opens the same port again.
    Refuse,
    /// The link is broken: connections are accepted and reset at once, and live ones
    /// are reset.
    Reset,
    /// The server stopped answering: connections are accepted and held, and nothing
    /// is passed on either way. Leaving this mode resets the held connections.
    Stall,
}

/// What a [`Relay`] does to one connection, chosen with [`Relay::fault_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Closes the client's connection at once, before anything reaches the server.
    Close,
    /// Passes the request on; when the server's reply starts to arrive, drops the
    /// connection both ways without passing it on: the server acted, the client
    /// never learns what happened.
    LoseReply,
    /// Passes the request on, swallows the server's reply and keeps the client
    /// waiting, until the relay's mode changes or the relay is dropped.
    HoldReply,
}

/// What becomes of the next reply on a connection, in an [`AtomicU8`].
const PASS: u8 = 0;
const LOSE: u8 = 1;
const HOLD: u8 = 2;

struct RelayShared {
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Bytes whose appearance in a request loses the next reply on its connection.
    marker: Mutex<Option<Vec<u8>>>,
    /// Bytes whose appearance in a request delays the next reply on its connection,
    /// and by how long.
    delay_marker: Mutex<Option<(Vec<u8>, Duration)>>,
    /// Replies passed on late.
    delayed: AtomicUsize,
    /// Faults for the next connections, one each.
    faults: Mutex<VecDeque<Fault>>,
    connections: AtomicUsize,
    lost: watch::Sender<u64>,
    mode: watch::Sender<RelayMode>,
}

impl Relay {
    /// Relays from a fresh loopback port to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        Relay::start_at(([127, 0, 0, 1], 0).into(), target).await
    }

    /// Relays from `listen` (a loopback address, port 0 for any) to `target`.
    pub async fn start_at(listen: SocketAddr, target: SocketAddr) -> Relay {
        let listener = TcpListener::bind(listen).await.expect("the relay binds");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let shared = Arc::new(RelayShared {
            tasks: Mutex::default(),
            marker: Mutex::default(),
            delay_marker: Mutex::default(),
            delayed: AtomicUsize::new(0),
            faults: Mutex::default(),
            connections: AtomicUsize::new(0),
            lost: watch::Sender::new(0),
            mode: watch::Sender::new(RelayMode::Forward),
        });
        let accept = tokio::spawn(accept(listener, addr, target, shared.clone()));
        shared.tasks.lock().unwrap().push(accept);
        Relay { addr, shared }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://` and the relay's address, then `path`: the URL of an HTTP server seen
    /// through the relay.
    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Drops every relayed connection and stops accepting new ones, for good.
    pub fn cut(&self) {
        for t in self.shared.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// Switches what the relay does with connections, live and new; see [`RelayMode`].
    pub fn set_mode(&self, mode: RelayMode) {
        self.shared.mode.send_replace(mode);
    }

    /// The next connections accepted get these faults, one each in order; later ones
    /// are relayed as the mode says.
    pub fn fault_next(&self, faults: impl IntoIterator<Item = Fault>) {
        self.shared.faults.lock().unwrap().extend(faults);
    }

    /// Once a request containing `marker` has been passed on, the next bytes the
    /// server sends on that connection are thrown away and the connection is dropped
    /// both ways: the server acted on the request, and the client never learns what
    /// happened. Mark with something only the request of interest carries (its key,
    /// say), so that replies to earlier requests still get through. Once only.
    pub fn lose_reply_to(&self, marker: &[u8]) {
        *self.shared.marker.lock().unwrap() = Some(marker.to_vec());
    }

    /// Once a request containing `marker` has been passed on, the next reply on that
    /// connection is held for `delay` and then passed on, and what follows it on the
    /// connection after it: the server acted at once, and the client hears of it
    /// `delay` late, as over a link that holds replies for a while (a one-way
    /// partition that heals). Requests still go through meanwhile. Once only.
    pub fn delay_reply_to(&self, marker: &[u8], delay: Duration) {
        *self.shared.delay_marker.lock().unwrap() = Some((marker.to_vec(), delay));
    }

    /// How many replies were passed on late ([`delay_reply_to`](Relay::delay_reply_to)).
    pub fn replies_delayed(&self) -> usize {
        self.shared.delayed.load(Ordering::SeqCst)
    }

    /// How many connections clients have opened.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many replies were thrown away or held back.
    pub fn replies_lost(&self) -> u64 {
        *self.shared.lost.borrow()
    }

    /// Waits until the server has sent `n` replies that the relay threw away or held
    /// back; panics when that takes longer than [`WAIT`](crate::WAIT).
    pub async fn wait_replies_lost(&self, n: u64) {
        let mut lost = self.shared.lost.subscribe();
        tokio::time::timeout(crate::WAIT, lost.wait_for(|c| *c >= n))
            .await
            .expect("the server never replied through the relay")
            .expect("the relay is alive while borrowed");
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Accepts connections and hands each to [`relay_one`] with its fault; in
/// [`RelayMode::Refuse`] the port is closed until the mode changes.
async fn accept(
    mut listener: TcpListener,
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<RelayShared>,
) {
    let mut mode = shared.mode.subscribe();
    loop {
        if *mode.borrow_and_update() == RelayMode::Refuse {
            drop(listener);
            if mode.wait_for(|m| *m != RelayMode::Refuse).await.is_err() {
                return;
            }
            // The same port again, so that the client's URL stays valid.
            listener = TcpListener::bind(addr)
                .await
                .expect("the relay binds its port again");
            continue;
        }
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let fault = shared.faults.lock().unwrap().pop_front();
                let conn = tokio::spawn(relay_one(inbound, target, shared.clone(), fault));
                shared.tasks.lock().unwrap().push(conn);
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// Closes with a reset rather than a clean FIN, as a dead link does.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Whether the relay passes bytes on now.
fn forwarding(shared: &RelayShared) -> bool {
    *shared.mode.borrow() == RelayMode::Forward
}

/// Serves one connection by its fault and the relay's mode, following the mode as it
/// changes.
async fn relay_one(
    client: TcpStream,
    target: SocketAddr,
    shared: Arc<RelayShared>,
    fault: Option<Fault>,
) {
    let next_reply = match fault {
        Some(Fault::Close) => return drop(client),
        Some(Fault::LoseReply) => LOSE,
        Some(Fault::HoldReply) => HOLD,
        None => PASS,
    };
    let mut mode = shared.mode.subscribe();
    let now = *mode.borrow_and_update();
    match now {
        RelayMode::Forward => {}
        RelayMode::Refuse | RelayMode::Reset => return reset(client),
        RelayMode::Stall => {
            let _ = mode.changed().await;
            return reset(client);
        }
    }
    let Ok(server) = TcpStream::connect(target).await else {
        return reset(client);
    };
    let mut pair = (client, server);
    let stalled = tokio::select! {
        () = forward(&mut pair.0, &mut pair.1, &shared, next_reply) => return,
        changed = mode.wait_for(|m| *m != RelayMode::Forward) => {
            changed.is_ok_and(|m| *m == RelayMode::Stall)
        }
    };
    // Stalled: hold both ends, passing nothing on, until the mode changes again.
    if stalled {
        let _ = mode.changed().await;
    }
    reset(pair.0);
    reset(pair.1);
}

/// Passes bytes both ways until either side stops, losing or holding the reply as
/// `next_reply` says, or as the relay's marker arms it. Once the relay leaves
/// [`RelayMode::Forward`] it passes nothing more on, and waits for its caller to act
/// on the new mode: bytes a client sends after [`Relay::set_mode`] returned never
/// reach the server, however late this task notices the change.
async fn forward(
    client: &mut TcpStream,
    server: &mut TcpStream,
    shared: &RelayShared,
    next_reply: u8,
) {
    let (mut client_rx, mut client_tx) = client.split();
    let (mut server_rx, mut server_tx) = server.split();
    let next_reply = AtomicU8::new(next_reply);
    // Milliseconds the next reply waits, when a delay marker went by.
    let next_delay = AtomicU64::new(0);
    let requests = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            {
                let mut marker = shared.marker.lock().unwrap();
                if marker
                    .as_deref()
                    .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m))
                {
                    *marker = None;
                    next_reply.store(LOSE, Ordering::SeqCst);
                }
            }
            {
                let mut delay = shared.delay_marker.lock().unwrap();
                if let Some((_, d)) = delay
                    .as_ref()
                    .filter(|(m, _)| chunk.windows(m.len()).any(|w| w == m))
                {
                    next_delay.store(d.as_millis() as u64, Ordering::SeqCst);
                    *delay = None;
                }
            }
            if !forwarding(shared) {
                std::future::pending::<()>().await;
            }
            if server_tx.write_all(chunk).await.is_err() {
                break;
            }
        }
        let _ = server_tx.shutdown().await;
    };
    let replies = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            match next_reply.load(Ordering::SeqCst) {
                PASS => {}
                LOSE => {
                    shared.lost.send_modify(|c| *c += 1);
                    return;
                }
                _ => {
                    shared.lost.send_modify(|c| *c += 1);
                    std::future::pending::<()>().await;
                }
            }
            let delay = next_delay.swap(0, Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                shared.delayed.fetch_add(1, Ordering::SeqCst);
            }
            if !forwarding(shared) {
                std::future::pending::<()>().await;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // The connection ends, both ways, when the replies stop (or are lost).
    tokio::select! {
        () = replies => {}
        () = async { requests.await; std::future::pending::<()>().await } => {}
    }
}

#[cfg(test)]
mod tests;
