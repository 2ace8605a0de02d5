//! Which address a request comes from: the connection's peer (after any PROXY protocol
//! header), or, behind proxies the listener trusts, an address from `x-forwarded-for`, as
//! Envoy's `use_remote_address` and `xff_num_trusted_hops` define it. That address is the one
//! access logs, ext_authz, rate limits, hash keys and header templates see.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use config::listener::client_address::ClientDetection;

use super::ConnCtx;

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// A listener's trust in the proxies in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ForwardedTrust {
    /// The peer is appended to `x-forwarded-for`; `false`: the header goes on as it came.
    pub(crate) use_remote_address: bool,
    /// Proxies in front whose `x-forwarded-for` entries (and `x-forwarded-proto`) count.
    pub(crate) trusted_hops: u32,
}

impl ForwardedTrust {
    /// How many entries from the right of `x-forwarded-for` are skipped to reach the client;
    /// `None`: the peer is the client and the header is not read.
    fn skipped(self) -> Option<u32> {
        if self.use_remote_address {
            // The peer, appended, is the first hop from the right.
            self.trusted_hops.checked_sub(1)
        } else {
            Some(self.trusted_hops)
        }
    }

    /// Whether the proxy names the scheme itself: an `x-forwarded-proto` from the client is
    /// believed only when proxies in front are trusted (Envoy's rule, whatever
    /// `use_remote_address` says).
    pub(crate) fn overwrites_proto(self) -> bool {
        self.trusted_hops == 0
    }

    /// The scheme the client used: the listener's, or what a trusted proxy's
    /// `x-forwarded-proto` says.
    pub(crate) fn scheme(self, tls: bool, headers: &HeaderMap) -> &'static str {
        let listener = if tls { "https" } else { "http" };
        if self.overwrites_proto() {
            return listener;
        }
        match headers.get(&X_FORWARDED_PROTO).map(HeaderValue::as_bytes) {
            Some(proto) if proto.eq_ignore_ascii_case(b"https") => "https",
            Some(proto) if proto.eq_ignore_ascii_case(b"http") => "http",
            _ => listener,
        }
    }
}

/// The address a request comes from: the connection's peer, or one from `x-forwarded-for`.
/// Small and `Copy`: it lives in every request's state, and the peer's address and text are
/// the connection's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Client {
    forwarded: Option<IpAddr>,
    /// The way that found it asks for the peer to be appended to `x-forwarded-for`.
    pub(crate) append_peer: bool,
}

impl Client {
    /// The client of a request with `headers` on `conn`. Falls back to the peer when
    /// `x-forwarded-for` has fewer entries than the trusted hops, or the entry is not an IP
    /// address (Envoy does the same).
    ///
    /// With ways to find the client (`original_ip_detection`), those instead, in order, and
    /// the peer when none finds one; `Err` when a header way refuses such a request.
    pub(crate) fn of(conn: &ConnCtx, headers: &HeaderMap) -> Result<Client, StatusCode> {
        let detection = &conn.listener.client_detection;
        if detection.is_empty() {
            let forwarded = conn
                .listener
                .forwarded_trust
                .skipped()
                .and_then(|skip| forwarded_for(headers, skip));
            return Ok(Client {
                forwarded,
                append_peer: false,
            });
        }
        for way in detection.iter() {
            let found = match way {
                ClientDetection::CustomHeader {
                    name,
                    reject_with_status,
                } => {
                    // The first value only, as Envoy reads it.
                    let found = headers
                        .get(name)
                        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
                        .and_then(|v| v.trim().parse::<IpAddr>().ok());
                    if found.is_none()
                        && let Some(status) = reject_with_status
                    {
                        return Err(*status);
                    }
                    found
                }
                ClientDetection::Xff {
                    num_trusted_hops,
                    trusted_cidrs,
                    append_peer,
                } => {
                    let found = if trusted_cidrs.is_empty() {
                        forwarded_for(headers, *num_trusted_hops)
                    } else {
                        beyond_trusted(headers, conn.peer.ip(), trusted_cidrs)
                    };
                    if found.is_some() {
                        return Ok(Client {
                            forwarded: found,
                            append_peer: *append_peer,
                        });
                    }
                    None
                }
            };
            if found.is_some() {
                return Ok(Client {
                    forwarded: found,
                    append_peer: false,
                });
            }
        }
        Ok(Client::peer())
    }

    /// The connection's own peer.
    pub(crate) fn peer() -> Client {
        Client {
            forwarded: None,
            append_peer: false,
        }
    }

    /// The address; from `x-forwarded-for`, with port 0.
    pub(crate) fn addr(self, conn: &ConnCtx) -> SocketAddr {
        match self.forwarded {
            None => conn.peer,
            Some(ip) => SocketAddr::new(ip, 0),
        }
    }

    pub(crate) fn ip(self, conn: &ConnCtx) -> IpAddr {
        self.forwarded.unwrap_or(conn.peer.ip())
    }

    /// The IP as header text (the peer's is formatted once per connection).
    pub(crate) fn ip_text(self, conn: &ConnCtx) -> HeaderValue {
        match self.forwarded {
            None => conn.peer_ip.clone(),
            Some(ip) => {
                HeaderValue::from_str(&ip.to_string()).expect("an IP address is valid header text")
            }
        }
    }
}

/// For a peer in `trusted`: the first `x-forwarded-for` entry from the right that is not in
/// them, or the leftmost when all are (Envoy's `xff_trusted_cidrs`). `None` for a peer not
/// trusted, no header, or an entry that is no address.
fn beyond_trusted(headers: &HeaderMap, peer: IpAddr, trusted: &[ipnet::IpNet]) -> Option<IpAddr> {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return None;
    }
    let mut last = None;
    for line in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
        for entry in line.as_bytes().rsplit(|&b| b == b',') {
            let ip: IpAddr = std::str::from_utf8(entry).ok()?.trim().parse().ok()?;
            if !is_trusted(&ip) {
                return Some(ip);
            }
            last = Some(ip);
        }
    }
    last
}

/// The entry `skip` places from the right end of `x-forwarded-for` (its lines read in order
/// as one list), if it is an IP address.
fn forwarded_for(headers: &HeaderMap, skip: u32) -> Option<IpAddr> {
    let mut left = skip;
    for line in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
        for entry in line.as_bytes().rsplit(|&b| b == b',') {
            if left == 0 {
                return std::str::from_utf8(entry).ok()?.trim().parse().ok();
            }
            left -= 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append("x-forwarded-for", line.parse().unwrap());
        }
        headers
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn entries_are_counted_from_the_right_across_lines() {
        let one_line = xff(&["203.0.113.128, 203.0.113.10,203.0.113.1"]);
        let two_lines = xff(&["203.0.113.128, 203.0.113.10", " 203.0.113.1 "]);
        for headers in [one_line, two_lines] {
            assert_eq!(forwarded_for(&headers, 0), ip("203.0.113.1"));
            assert_eq!(forwarded_for(&headers, 1), ip("203.0.113.10"));
            assert_eq!(forwarded_for(&headers, 2), ip("203.0.113.128"));
            assert_eq!(forwarded_for(&headers, 3), None);
        }
        assert_eq!(forwarded_for(&HeaderMap::new(), 0), None);
        assert_eq!(forwarded_for(&xff(&["2001:db8::7"]), 0), ip("2001:db8::7"));
    }

    #[test]
    fn trusted_ranges_skip_their_entries_from_the_right() {
        let trusted: Vec<ipnet::IpNet> = vec![
            "10.0.0.0/8".parse().unwrap(),
            "127.0.0.0/8".parse().unwrap(),
        ];
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let headers = xff(&["198.51.100.1, 10.0.0.5", "10.1.1.1"]);
        assert_eq!(beyond_trusted(&headers, peer, &trusted), ip("198.51.100.1"));
        // All trusted: the leftmost.
        let inside = xff(&["10.0.0.9, 10.0.0.5"]);
        assert_eq!(beyond_trusted(&inside, peer, &trusted), ip("10.0.0.9"));
        // A peer outside the ranges is believed about nothing; no header, nothing found.
        let outside: IpAddr = "203.0.113.1".parse().unwrap();
        assert_eq!(beyond_trusted(&headers, outside, &trusted), None);
        assert_eq!(beyond_trusted(&HeaderMap::new(), peer, &trusted), None);
        assert_eq!(
            beyond_trusted(&xff(&["junk, 10.0.0.5"]), peer, &trusted),
            None
        );
    }

    #[test]
    fn an_entry_that_is_no_address_gives_none() {
        // Not an address, a port, an empty entry: the peer will stand (as in Envoy).
        assert_eq!(forwarded_for(&xff(&["unknown"]), 0), None);
        assert_eq!(forwarded_for(&xff(&["192.0.2.1:80"]), 0), None);
        assert_eq!(forwarded_for(&xff(&["192.0.2.1,"]), 0), None);
        // Entries skipped are not read.
        assert_eq!(
            forwarded_for(&xff(&["192.0.2.1, junk"]), 1),
            ip("192.0.2.1")
        );
    }

    #[test]
    fn trust_says_how_far_to_look() {
        let trust = |use_remote_address, trusted_hops| ForwardedTrust {
            use_remote_address,
            trusted_hops,
        };
        assert_eq!(trust(true, 0).skipped(), None);
        assert_eq!(trust(true, 2).skipped(), Some(1));
        assert_eq!(trust(false, 0).skipped(), Some(0));
        assert_eq!(trust(false, 2).skipped(), Some(2));
        assert!(trust(true, 0).overwrites_proto());
        assert!(!trust(true, 1).overwrites_proto());
        assert!(trust(false, 0).overwrites_proto());
        assert!(!trust(false, 1).overwrites_proto());
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-proto", "HTTPS".parse().unwrap());
        assert_eq!(trust(true, 0).scheme(false, &headers), "http");
        assert_eq!(trust(true, 1).scheme(false, &headers), "https");
        headers.insert("x-forwarded-proto", "gopher".parse().unwrap());
        assert_eq!(trust(true, 1).scheme(true, &headers), "https");
    }
}
