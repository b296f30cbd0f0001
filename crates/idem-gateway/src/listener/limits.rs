//! The file-descriptor budget: the open-file limit, raised at start, shared between the
//! proxy's connections, the upstream connections they hold, the store's, and the admin
//! listener's.

/// The most connections the admin listener holds open: plenty for probes, scrapes and
/// an operator, and few enough that it never takes the proxy's descriptors.
pub(crate) const ADMIN_MAX_CONNECTIONS: usize = 32;

/// Descriptors kept out of the proxy's default cap beyond the store's and the admin
/// listener's: the listeners themselves, standard streams, DNS lookups, files the store
/// opens besides its connections, and room to spare.
pub(crate) const SPARE_DESCRIPTORS: u64 = 64;

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard limit, as servers
/// commonly do, and returns the soft limit then in force; `None` where it cannot be
/// read. A failure to raise it is logged and leaves it as it was.
pub(crate) fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let (soft, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
            Ok(limits) => limits,
            Err(e) => {
                tracing::warn!(error = %e, "the open-file limit could not be read");
                return None;
            }
        };
        match rlimit::increase_nofile_limit(hard) {
            Ok(now) => Some(now),
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "the open-file limit could not be raised");
                Some(soft)
            }
        }
    }
    #[cfg(not(unix))]
    None
}

/// The soft limit on open files now; `None` where it cannot be read.
pub(crate) fn fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _)| soft)
    }
    #[cfg(not(unix))]
    None
}

/// The proxy's connection cap when `--max-connections` is not given, for a process that
/// may open `nofile` files:
///
/// ```text
/// (nofile - store - admin - SPARE_DESCRIPTORS) / 2, at least 1
/// ```
///
/// where `store` is the most descriptors the store's connections hold (as its crate
/// counts them), `admin` is the admin listener's own cap of 32 connections when it is
/// on, `SPARE_DESCRIPTORS` (64) are kept for the listeners themselves, standard
/// streams, DNS lookups and the store's files, and the halving leaves each client
/// connection room for the upstream connection it may hold while its request is
/// forwarded. At the usual hard limit of 1 048 576 that is about half a million; at a
/// limit of 1 024 with the SQLite store and the admin listener, 452.
pub fn default_max_connections(nofile: u64, store: u64, admin: bool) -> usize {
    let admin = if admin {
        ADMIN_MAX_CONNECTIONS as u64
    } else {
        0
    };
    let left = nofile
        .saturating_sub(store)
        .saturating_sub(admin)
        .saturating_sub(SPARE_DESCRIPTORS);
    usize::try_from(left / 2).unwrap_or(usize::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_room_for_upstream_store_and_admin_connections() {
        // SQLite's default pool (8 connections, 3 files each) and the admin listener.
        assert_eq!(
            default_max_connections(1024, 24, true),
            (1024 - 24 - 32 - 64) / 2
        );
        assert_eq!(default_max_connections(1024, 24, true), 452);
        assert_eq!(default_max_connections(1024, 0, false), 480);
        assert_eq!(default_max_connections(1_048_576, 10, true), 524_235);
        // Never none, however few descriptors there are.
        assert_eq!(default_max_connections(50, 24, true), 1);
        assert_eq!(default_max_connections(0, 0, false), 1);
    }
}
