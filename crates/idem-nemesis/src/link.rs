//! A link: a userspace TCP relay with faults, standing for the network between two
//! hosts (this kernel has no `netem`). A fault holds bytes rather than throwing them
//! away, as TCP does over a partition: what was sent arrives once the link heals, late.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::net::Host;
use crate::rng::Rng;

/// What a link does to the bytes it carries, both ways or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    /// Passes everything at once.
    Pass,
    /// A partition: nothing passes either way until the link heals (connections are
    /// still accepted, and held).
    Cut,
    /// A one-way partition: requests reach the server, its replies are held until the
    /// link heals. The server acts; the client never hears.
    HoldReplies,
    /// A slow, lossy link: every chunk waits `delay`; one in `loss` (per mille) is
    /// "lost" and waits for its retransmission besides (200 ms to 1 s).
    Slow {
        /// The one-way delay of every chunk.
        delay: Duration,
        /// Chunks lost, per mille.
        loss: u32,
    },
}

/// Where a link's connections go.
#[derive(Debug, Clone)]
pub enum Dial {
    /// To an address from the root namespace, which may be changed while the link runs
    /// (a failover's new master).
    Root(Arc<Mutex<SocketAddr>>),
    /// To an address from inside a host, through its veth.
    From(Host, SocketAddrV4),
}

/// A relay from a listener to [`Dial`]'s address, with a fault to switch; dropping it
/// closes every connection.
#[derive(Debug)]
pub struct Link {
    fault: watch::Sender<LinkFault>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Link {
    /// Relays what `listener` accepts to `dial`, passing everything until told
    /// otherwise.
    pub fn start(listener: TcpListener, dial: Dial, seed: u64) -> Link {
        let fault = watch::Sender::new(LinkFault::Pass);
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let (fault, tasks) = (fault.clone(), tasks.clone());
            tokio::spawn(async move {
                let mut rng = Rng::new(seed);
                while let Ok((inbound, _)) = listener.accept().await {
                    let _ = inbound.set_nodelay(true);
                    let conn =
                        tokio::spawn(relay(inbound, dial.clone(), fault.clone(), rng.next()));
                    let mut tasks = tasks.lock().unwrap();
                    tasks.retain(|t| !t.is_finished());
                    tasks.push(conn.abort_handle());
                }
            })
        };
        tasks.lock().unwrap().push(accept.abort_handle());
        Link { fault, tasks }
    }

    /// Sets the fault, for live connections and new ones.
    pub fn set(&self, fault: LinkFault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

async fn relay(inbound: TcpStream, dial: Dial, fault: watch::Sender<LinkFault>, seed: u64) {
    let outbound = match &dial {
        Dial::Root(target) => {
            let target = *target.lock().unwrap();
            tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(target))
                .await
                .ok()
                .and_then(Result::ok)
        }
        Dial::From(host, addr) => host.connect(*addr, Duration::from_secs(5)).await.ok(),
    };
    let Some(outbound) = outbound else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let (in_rx, in_tx) = inbound.into_split();
    let (out_rx, out_tx) = outbound.into_split();
    let requests = pump(in_rx, out_tx, fault.subscribe(), false, Rng::new(seed));
    let replies = pump(
        out_rx,
        in_tx,
        fault.subscribe(),
        true,
        Rng::new(seed ^ 0x9e37),
    );
    tokio::join!(requests, replies);
}

/// Copies one direction, holding each chunk as long as the fault says.
async fn pump(
    mut rx: tokio::net::tcp::OwnedReadHalf,
    mut tx: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<LinkFault>,
    reply: bool,
    mut rng: Rng,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        loop {
            let now = *fault.borrow_and_update();
            match now {
                LinkFault::Pass => break,
                LinkFault::HoldReplies if !reply => break,
                LinkFault::Cut | LinkFault::HoldReplies => {
                    if fault.changed().await.is_err() {
                        return;
                    }
                }
                LinkFault::Slow { delay, loss } => {
                    let mut wait = delay;
                    if rng.below(1000) < u64::from(loss) {
                        wait += Duration::from_millis(200 + rng.below(800));
                    }
                    tokio::time::sleep(wait).await;
                    break;
                }
            }
        }
        if tx.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = tx.shutdown().await;
}
