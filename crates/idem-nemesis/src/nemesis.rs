//! The nemeses: what a run does to the gateways, their links and the store, each on a
//! schedule drawn from the run's seed.

use std::time::Duration;

use crate::link::LinkFault;
use crate::rng::Rng;
use crate::world::World;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    /// A gateway and its store partitioned both ways (its link holds everything).
    StorePartition,
    /// A gateway's requests reach the store, the store's replies do not come back
    /// until the partition heals: the store acts, the gateway never hears.
    OneWayPartition,
    /// A gateway's route to its store blackholed in the kernel (`ip route add
    /// blackhole`), then removed.
    RouteBlackhole,
    /// A gateway cut from everything, the other gateways among it, by its veth taken
    /// down: the gateways never talk to each other but through the store, so this is
    /// the partition that splits them.
    Isolate,
    /// A gateway's link to the store delayed and lossy (each chunk 20–80 ms late, 5 %
    /// of them late by a retransmission besides).
    SlowLink,
    /// A gateway paused with `SIGSTOP` for longer than its lease, then resumed.
    Pause,
    /// A gateway killed with `SIGKILL` and started again.
    Kill,
    /// The store failed over (Redis, Redis Cluster) or restarted (PostgreSQL).
    Failover,
}

impl Nemesis {
    /// Every nemesis.
    pub const ALL: [Nemesis; 8] = [
        Nemesis::StorePartition,
        Nemesis::OneWayPartition,
        Nemesis::RouteBlackhole,
        Nemesis::Isolate,
        Nemesis::SlowLink,
        Nemesis::Pause,
        Nemesis::Kill,
        Nemesis::Failover,
    ];

    /// Its name in reports and in `IDEM_NEMESIS`.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::StorePartition => "partition-store",
            Nemesis::OneWayPartition => "partition-store-one-way",
            Nemesis::RouteBlackhole => "route-blackhole",
            Nemesis::Isolate => "isolate-gateway",
            Nemesis::SlowLink => "slow-lossy-link",
            Nemesis::Pause => "pause",
            Nemesis::Kill => "kill-9",
            Nemesis::Failover => "failover",
        }
    }

    /// The nemesis named `name`.
    pub fn named(name: &str) -> Option<Nemesis> {
        Nemesis::ALL.into_iter().find(|n| n.name() == name)
    }

    /// How long one fault lasts: long enough to matter (beyond the lease where the
    /// point is a takeover), drawn from `rng`.
    fn duration(self, lease: Duration, rng: &mut Rng) -> Duration {
        match self {
            Nemesis::Pause => rng.between(lease * 3 / 2, lease * 2),
            Nemesis::Kill => rng.between(Duration::ZERO, Duration::from_millis(500)),
            Nemesis::Failover => Duration::ZERO,
            _ => rng.between(lease / 2, lease * 3 / 2),
        }
    }
}

/// One fault of a schedule: when it starts (after the one before healed), on which
/// gateway, for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The quiet time before it.
    pub after: Duration,
    /// The gateway it hits (unused by [`Nemesis::Failover`]).
    pub victim: usize,
    /// How long it lasts.
    pub lasts: Duration,
}

/// `cycles` faults of `nemesis` over `gateways` gateways, drawn from `seed`.
pub fn schedule(
    nemesis: Nemesis,
    cycles: usize,
    gateways: usize,
    lease: Duration,
    seed: u64,
) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    (0..cycles)
        .map(|_| Fault {
            after: rng.between(Duration::from_millis(500), Duration::from_millis(1500)),
            victim: rng.below(gateways as u64) as usize,
            lasts: nemesis.duration(lease, &mut rng),
        })
        .collect()
}

/// Injects `fault` of `nemesis` into `world`, waits while it lasts, and heals it.
pub async fn inject(world: &World, nemesis: Nemesis, fault: Fault) -> Result<(), String> {
    let v = fault.victim;
    let host = world.hosts()[v].clone();
    match nemesis {
        Nemesis::StorePartition | Nemesis::OneWayPartition | Nemesis::SlowLink => {
            let kind = match nemesis {
                Nemesis::StorePartition => LinkFault::Cut,
                Nemesis::OneWayPartition => LinkFault::HoldReplies,
                _ => LinkFault::Slow {
                    delay: Duration::from_millis(20 + (fault.lasts.as_millis() as u64 % 60)),
                    loss: 50,
                },
            };
            world.set_store_link(v, kind);
            tokio::time::sleep(fault.lasts).await;
            world.set_store_link(v, LinkFault::Pass);
        }
        Nemesis::RouteBlackhole => {
            host.set_store_route(true)?;
            tokio::time::sleep(fault.lasts).await;
            host.set_store_route(false)?;
        }
        Nemesis::Isolate => {
            host.set_link(false)?;
            tokio::time::sleep(fault.lasts).await;
            host.set_link(true)?;
        }
        Nemesis::Pause => {
            world.gateway(v).lock().await.pause();
            tokio::time::sleep(fault.lasts).await;
            world.gateway(v).lock().await.resume();
        }
        Nemesis::Kill => {
            let gw = world.gateway(v);
            let mut gw = gw.lock().await;
            gw.kill9().await;
            tokio::time::sleep(fault.lasts).await;
            gw.restart().await?;
        }
        Nemesis::Failover => world.fail_over().await?,
    }
    Ok(())
}
