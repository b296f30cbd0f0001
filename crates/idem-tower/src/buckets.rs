//! The rate buckets a process keeps itself (on the memory and SQLite stores, which
//! share none between instances), in bounded room and at a bounded cost per new key,
//! however many tenants a client makes up.
//!
//! The [`MAX_BUCKETS`] tenants that took a token last keep their bucket exactly, in a
//! table ordered by last use: a known tenant's token, and a new one's admission, cost
//! a hash look-up and, past the bound, the eviction of the least recently used bucket.
//!
//! **The invariant: forgetting a bucket never gives its tenant more tokens than it had.**
//! An evicted bucket leaves behind when it would be full again, in a small sketch (a
//! count-min sketch of "full again at" times, each cell the latest of those hashed to
//! it); a tenant that is not in the table starts from the latest of the times its cells
//! hold, which is no earlier than its own. A tenant forgotten because others were made
//! up meanwhile comes back with at most the tokens it had, never a fresh burst; the
//! price of a collision in every one of its cells is fewer tokens, never more. The
//! cells hold times, so they empty by themselves: a time in the past says "full".

use std::hash::{BuildHasher, RandomState};

use hashlink::LruCache;
use idem_core::{KeyRate, LocalBucket, Tenant, Timestamp};

/// The most buckets a process keeps exactly.
pub(crate) const MAX_BUCKETS: usize = 16_384;

/// Rows of the sketch, each indexed by its own bits of the tenant's hash.
const ROWS: usize = 4;
/// Cells in a row, a power of two.
const WIDTH_BITS: u32 = 14;
const WIDTH: usize = 1 << WIDTH_BITS;

/// The buckets of the tenants that took a token last, and what the others left behind.
#[derive(Debug)]
pub(crate) struct BucketTable {
    /// Each bucket with the rate it was last taken at, most recently used last.
    recent: LruCache<Tenant, (LocalBucket, KeyRate), RandomState>,
    /// `ROWS` rows of `WIDTH` "full again at" times in milliseconds; empty until the
    /// first eviction.
    forgotten: Vec<i64>,
    /// Keyed at random per process, so that no client can aim at another's cells.
    hasher: RandomState,
    capacity: usize,
}

impl Default for BucketTable {
    fn default() -> BucketTable {
        BucketTable::with_capacity(MAX_BUCKETS)
    }
}

impl BucketTable {
    /// A table that keeps at most `capacity` (at least 1) buckets exactly.
    pub(crate) fn with_capacity(capacity: usize) -> BucketTable {
        BucketTable {
            recent: LruCache::with_hasher(usize::MAX, RandomState::new()),
            forgotten: Vec::new(),
            hasher: RandomState::new(),
            capacity: capacity.max(1),
        }
    }

    /// Takes a token from `tenant`'s bucket at `rate` at `now`: `true` when there was one.
    pub(crate) fn take(&mut self, tenant: &Tenant, rate: &KeyRate, now: Timestamp) -> bool {
        if let Some((bucket, last)) = self.recent.get_mut(tenant) {
            *last = *rate;
            return bucket.take(rate, now);
        }
        let mut bucket = match self.recalled(tenant) {
            Some(full_at) if full_at > now => LocalBucket::full_at_the_latest(rate, full_at, now),
            _ => LocalBucket::full(rate, now),
        };
        let taken = bucket.take(rate, now);
        if self.recent.len() >= self.capacity
            && let Some((evicted, (old, old_rate))) = self.recent.remove_lru()
        {
            self.remember(&evicted, old.full_at(&old_rate));
        }
        self.recent.insert(tenant.clone(), (bucket, *rate));
        taken
    }

    /// How many buckets are kept exactly.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.recent.len()
    }

    /// The cells of `tenant`, one a row.
    fn cells(&self, tenant: &Tenant) -> [usize; ROWS] {
        let hash = self.hasher.hash_one(tenant);
        std::array::from_fn(|row| {
            let bits = (hash >> (row as u32 * WIDTH_BITS)) as usize & (WIDTH - 1);
            row * WIDTH + bits
        })
    }

    /// Keeps that `tenant`'s bucket is full again at `full_at`.
    fn remember(&mut self, tenant: &Tenant, full_at: Timestamp) {
        if self.forgotten.is_empty() {
            self.forgotten = vec![i64::MIN; ROWS * WIDTH];
        }
        for cell in self.cells(tenant) {
            let held = &mut self.forgotten[cell];
            *held = (*held).max(full_at.as_millis());
        }
    }

    /// When `tenant`'s forgotten bucket is full again at the latest, if any was.
    fn recalled(&self, tenant: &Tenant) -> Option<Timestamp> {
        if self.forgotten.is_empty() {
            return None;
        }
        let earliest = self
            .cells(tenant)
            .into_iter()
            .map(|cell| self.forgotten[cell])
            .min()?;
        Some(Timestamp::from_millis(earliest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rate(s: &str) -> KeyRate {
        s.parse().unwrap()
    }

    #[test]
    fn minted_tenants_keep_the_table_bounded() {
        let (r, t0) = (rate("1/min,5"), Timestamp::from_millis(1_000_000_000));
        let mut table = BucketTable::default();
        let started = std::time::Instant::now();
        for i in 0..100_000u32 {
            assert!(table.take(&Tenant::new(format!("minted-{i}")), &r, t0));
            assert!(table.len() <= MAX_BUCKETS);
        }
        assert_eq!(table.len(), MAX_BUCKETS);
        // Each admission a look-up and at most one eviction: 100 000 of them are quick
        // (the table before took a scan of every bucket for each).
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_victim_forgotten_comes_back_with_what_it_had() {
        let r = rate("1/min,3");
        let t0 = Timestamp::from_millis(1_000_000_000);
        let (victim, other) = (Tenant::new("victim"), Tenant::new("other"));
        let mut table = BucketTable::with_capacity(1);
        assert!((0..3).all(|_| table.take(&victim, &r, t0)), "its burst");
        assert!(table.take(&other, &r, t0), "the victim is evicted");
        // A fresh bucket would give it 3 at once; it had none.
        assert!(
            !table.take(&victim, &r, t0),
            "no fresh burst after eviction"
        );
        assert!(table.take(&other, &r, t0));
        // (A moment past the minute: what is recalled is rounded towards fewer tokens.)
        let t1 = t0.plus(Duration::from_millis(60_010));
        assert!(table.take(&victim, &r, t1), "one back a minute after");
        assert!(table.take(&other, &r, t1));
        assert!(!table.take(&victim, &r, t1), "and only one");
        // Once its bucket would be full again, it is full.
        let t2 = t1.plus(Duration::from_secs(3 * 60 + 1));
        assert!(table.take(&other, &r, t2));
        assert!(
            (0..3).all(|_| table.take(&victim, &r, t2)),
            "full after its refill"
        );
    }

    /// However many tenants are made up meanwhile, a victim evicted again and again
    /// never gets more than its bucket allows: its burst, then its rate.
    #[test]
    fn minting_never_lets_a_victim_exceed_its_rate() {
        let r = rate("6/min,3");
        let t0 = Timestamp::from_millis(1_000_000_000);
        let victim = Tenant::new("victim");
        let mut table = BucketTable::with_capacity(1024);
        let (mut taken, mut minted) = (0u32, 0u32);
        for second in 0..600u64 {
            let now = t0.plus(Duration::from_secs(second));
            // 200 made-up tenants a second.
            for _ in 0..200 {
                table.take(&Tenant::new(format!("minted-{minted}")), &r, now);
                minted += 1;
            }
            // The victim comes back every 10 s for all it can get: 2 000 made-up
            // tenants later, so evicted each time.
            if second % 10 == 0 {
                taken += (0..3)
                    .map(|_| u32::from(table.take(&victim, &r, now)))
                    .sum::<u32>();
            }
        }
        assert!(table.len() <= 1024);
        // 3 at once, then one every 10 s for the 599 s after.
        assert!(taken <= 3 + 59, "{taken} tokens in 10 minutes");
    }
}
