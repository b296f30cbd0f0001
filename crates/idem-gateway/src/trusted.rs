//! Who the client is behind a load balancer: `--trusted-proxies`, the networks whose
//! connections may say, in `X-Forwarded-For`, which address they forwarded for.
//!
//! Behind nginx or a cloud load balancer every connection's peer is the proxy, so a log
//! that names the peer names the proxy. With the proxy's networks listed, the gateway
//! takes the client's address as nginx's `real_ip_recursive on` does: when the
//! connection comes from a trusted network, it reads `X-Forwarded-For` from the right
//! (the entry the nearest proxy added) and skips every entry that is itself a trusted
//! address; the first that is not is the client. When every entry is trusted, the
//! leftmost is. A connection from anywhere else is its own client, whatever it sends:
//! a header a client writes names nothing.
//!
//! A value that does not parse as `X-Forwarded-For` (see
//! [`x_forwarded_for_is_valid`](crate::forwarded::x_forwarded_for_is_valid)) is not
//! believed either, and the peer stays the client. An entry that is no address
//! (`unknown`, an obfuscated `_hidden`) ends the walk there and is the client as sent,
//! since nothing beyond it can be checked.
//!
//! The address found is the access log's `client` (its `peer` stays the connection's);
//! what the gateway forwards upstream is not changed by it.
//!
//! `--trusted-headers` names headers only those proxies may set: an identity the
//! ingress asserts (`X-User-Id`, named by `--tenant-header`). From any other peer they
//! are removed before the tenant is named and before anything is forwarded, so a client
//! that reaches the gateway directly can neither pick another tenant's records nor tell
//! the upstream it is someone else.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use crate::forwarded;

/// The networks trusted to say whom they forward for (none by default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Arc<[IpNet]>,
}

impl TrustedProxies {
    /// Parses a list of networks (`10.0.0.0/8`, `2001:db8::/32`) or single addresses
    /// (`127.0.0.1`, `::1`). A network with host bits set (`10.0.0.1/8`) is refused:
    /// it is far more often a typo than a meant network.
    pub(crate) fn parse<S: AsRef<str>>(list: &[S]) -> Result<TrustedProxies, String> {
        let mut nets = Vec::with_capacity(list.len());
        for item in list {
            let item = item.as_ref().trim();
            if item.is_empty() {
                continue;
            }
            let net = match IpNet::from_str(item) {
                Ok(net) if net.trunc() != net => {
                    return Err(format!(
                        "{item:?} has bits set past its prefix; did you mean {}?",
                        net.trunc()
                    ));
                }
                Ok(net) => net,
                Err(_) => {
                    match IpAddr::from_str(item.trim_start_matches('[').trim_end_matches(']')) {
                        Ok(ip) => IpNet::from(ip),
                        Err(_) => {
                            return Err(format!(
                                "{item:?} is no network or address (e.g. 10.0.0.0/8, 127.0.0.1, ::1)"
                            ));
                        }
                    }
                }
            };
            nets.push(net);
        }
        Ok(TrustedProxies { nets: nets.into() })
    }

    /// Whether no network is trusted.
    pub(crate) fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// The trusted networks, as given (single addresses as `/32` or `/128`).
    pub(crate) fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Whether `ip` is in a trusted network. An IPv4 address mapped into IPv6
    /// (`::ffff:10.0.0.1`, as a dual-stack socket reports it) counts as the IPv4 one.
    pub(crate) fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request that came from `peer` with `headers`: the peer itself,
    /// or, when the peer is trusted, the address its `X-Forwarded-For` names (see the
    /// module's text). An address comes without its port.
    pub(crate) fn client(&self, peer: SocketAddr, headers: &HeaderMap) -> Client {
        if self.is_empty() || !self.trusts(peer.ip()) {
            return Client::Peer(peer);
        }
        let mut joined = String::new();
        for value in headers.get_all("x-forwarded-for") {
            let Ok(text) = value.to_str() else {
                return Client::Peer(peer);
            };
            if !joined.is_empty() {
                joined.push_str(", ");
            }
            joined.push_str(text);
        }
        if joined.is_empty() || !forwarded::x_forwarded_for_is_valid(&joined) {
            return Client::Peer(peer);
        }
        for entry in forwarded::x_forwarded_for_entries(&joined).rev() {
            match forwarded::node_address(entry) {
                Some(ip) if self.trusts(ip) => continue,
                Some(ip) => return Client::Forwarded(ip.to_canonical().to_string()),
                None => return Client::Forwarded((*entry).to_owned()),
            }
        }
        // Every hop was trusted: the first one named is the client.
        match forwarded::x_forwarded_for_entries(&joined)
            .next()
            .and_then(forwarded::node_address)
        {
            Some(ip) => Client::Forwarded(ip.to_canonical().to_string()),
            None => Client::Peer(peer),
        }
    }
}

/// The `trusted_headers` setting: header names (any case), each once. `proxies` is the
/// `trusted_proxies` setting as given: without any, no peer could ever set them, which
/// is a mistake rather than a rule.
pub(crate) fn parse_trusted_headers<S: AsRef<str>>(
    list: &[S],
    proxies: &[S],
) -> Result<Vec<HeaderName>, String> {
    let mut names: Vec<HeaderName> = Vec::new();
    for item in list
        .iter()
        .map(|s| s.as_ref().trim())
        .filter(|s| !s.is_empty())
    {
        let name = HeaderName::from_bytes(item.to_ascii_lowercase().as_bytes())
            .map_err(|_| format!("{item:?} is no header name"))?;
        if name == http::header::HOST || name == http::header::CONTENT_LENGTH {
            return Err(format!("{item} is not a header a proxy asserts"));
        }
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if !names.is_empty() && proxies.iter().all(|p| p.as_ref().trim().is_empty()) {
        return Err("needs trusted_proxies: the proxies allowed to set these headers".to_owned());
    }
    Ok(names)
}

impl TrustedProxies {
    /// Removes `names` from `headers` unless `peer` is trusted; how many fields went.
    pub(crate) fn strip_untrusted(
        &self,
        peer: SocketAddr,
        headers: &mut HeaderMap,
        names: &[HeaderName],
    ) -> usize {
        if names.is_empty() || self.trusts(peer.ip()) {
            return 0;
        }
        let mut removed = 0;
        for name in names {
            if let http::header::Entry::Occupied(e) = headers.entry(name) {
                removed += e.remove_entry_mult().1.count();
            }
        }
        removed
    }
}

/// Who a request's client is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Client {
    /// The connection's peer, with its port.
    Peer(SocketAddr),
    /// The address a trusted proxy forwarded for (or the identifier it used).
    Forwarded(String),
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Peer(addr) => addr.fmt(f),
            Client::Forwarded(text) => f.write_str(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(list: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(list).unwrap()
    }

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_and_single_addresses_parse_and_typos_are_named() {
        let t = trusted(&[
            "10.0.0.0/8",
            "127.0.0.1",
            "::1",
            "[fd00::1]",
            " 2001:db8::/32 ",
        ]);
        assert_eq!(t.nets().len(), 5);
        assert!(t.trusts("10.1.2.3".parse().unwrap()));
        assert!(
            t.trusts("::ffff:10.1.2.3".parse().unwrap()),
            "a mapped IPv4 address"
        );
        assert!(t.trusts("2001:db8::7".parse().unwrap()));
        assert!(!t.trusts("11.0.0.1".parse().unwrap()));
        let e = TrustedProxies::parse(&["10.0.0.1/8"]).unwrap_err();
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
        let e = TrustedProxies::parse(&["ingress.internal"]).unwrap_err();
        assert!(e.contains("\"ingress.internal\" is no network"), "{e}");
        assert!(TrustedProxies::parse(&["10.0.0.0/33"]).is_err());
        assert!(TrustedProxies::parse::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn an_untrusted_peer_is_its_own_client_whatever_it_sends() {
        let t = trusted(&["10.0.0.0/8"]);
        let got = t.client(peer("203.0.113.9:5000"), &headers(&["198.51.100.1"]));
        assert_eq!(got, Client::Peer(peer("203.0.113.9:5000")));
        // Nothing trusted: the header is never read.
        let none = TrustedProxies::default();
        let got = none.client(peer("10.0.0.2:5000"), &headers(&["198.51.100.1"]));
        assert_eq!(got.to_string(), "10.0.0.2:5000");
    }

    #[test]
    fn a_trusted_peer_names_the_rightmost_untrusted_entry() {
        let t = trusted(&["10.0.0.0/8", "127.0.0.1"]);
        let p = peer("127.0.0.1:4000");
        // The client put a lie on the left; the ingress appended what it saw.
        let got = t.client(p, &headers(&["6.6.6.6, 198.51.100.7, 10.0.0.5"]));
        assert_eq!(got, Client::Forwarded("198.51.100.7".into()));
        // Several fields are one list, and ports and brackets are dropped.
        let got = t.client(p, &headers(&["6.6.6.6", "[2001:db8::9]:443"]));
        assert_eq!(got, Client::Forwarded("2001:db8::9".into()));
        let got = t.client(p, &headers(&["198.51.100.7:5555"]));
        assert_eq!(got, Client::Forwarded("198.51.100.7".into()));
        // All trusted: the leftmost.
        let got = t.client(p, &headers(&["10.0.0.9, 10.0.0.5"]));
        assert_eq!(got, Client::Forwarded("10.0.0.9".into()));
        // An identifier ends the walk.
        let got = t.client(p, &headers(&["198.51.100.7, unknown, 10.0.0.5"]));
        assert_eq!(got, Client::Forwarded("unknown".into()));
    }

    #[test]
    fn a_value_that_does_not_parse_or_is_missing_leaves_the_peer() {
        let t = trusted(&["127.0.0.0/8"]);
        let p = peer("127.0.0.1:4000");
        assert_eq!(t.client(p, &HeaderMap::new()), Client::Peer(p));
        assert_eq!(t.client(p, &headers(&["not an address"])), Client::Peer(p));
        assert_eq!(
            t.client(p, &headers(&["1.2.3.4", ", ,"])),
            Client::Forwarded("1.2.3.4".into())
        );
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"1.2.3.4\xff").unwrap(),
        );
        assert_eq!(t.client(p, &h), Client::Peer(p));
    }

    #[test]
    fn trusted_headers_are_removed_from_every_other_peer() {
        let t = trusted(&["10.0.0.0/8"]);
        let names =
            parse_trusted_headers(&["X-User-Id", "x-user-id", "X-Org"], &["10.0.0.0/8"]).unwrap();
        assert_eq!(names.len(), 2);
        let mut h = HeaderMap::new();
        h.append("x-user-id", "alice".parse().unwrap());
        h.append("x-user-id", "bob".parse().unwrap());
        h.append("x-org", "acme".parse().unwrap());
        h.append("authorization", "Bearer t".parse().unwrap());
        let mut from_ingress = h.clone();
        assert_eq!(
            t.strip_untrusted(peer("10.1.1.1:80"), &mut from_ingress, &names),
            0
        );
        assert_eq!(from_ingress, h);
        assert_eq!(t.strip_untrusted(peer("203.0.113.9:80"), &mut h, &names), 3);
        assert_eq!(h.len(), 1, "only authorization is left: {h:?}");
        let e = parse_trusted_headers(&["x-user-id"], &[]).unwrap_err();
        assert!(e.contains("trusted_proxies"), "{e}");
        assert!(parse_trusted_headers(&["bad header"], &["10.0.0.0/8"]).is_err());
        assert!(parse_trusted_headers(&["Host"], &["10.0.0.0/8"]).is_err());
    }
}
