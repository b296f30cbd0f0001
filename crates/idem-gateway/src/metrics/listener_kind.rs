//! Which listener: the proxy's or the admin one, as metrics and logs name them. It lives
//! with the metrics, which label by it, so that the listener depends on the metrics and
//! not the other way round.

/// Which of the gateway's listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenerKind {
    /// The proxy's (`--listen`).
    Proxy,
    /// The admin listener's (`--admin`).
    Admin,
}

impl ListenerKind {
    /// Both, in the order metrics list them.
    pub(crate) const ALL: [ListenerKind; 2] = [ListenerKind::Proxy, ListenerKind::Admin];

    /// The label in metrics and logs: `proxy` or `admin`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ListenerKind::Proxy => "proxy",
            ListenerKind::Admin => "admin",
        }
    }

    /// The position in [`ListenerKind::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            ListenerKind::Proxy => 0,
            ListenerKind::Admin => 1,
        }
    }
}
