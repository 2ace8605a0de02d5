//! A route's `hash_policy` evaluated for one request: the hash a consistent-hashing cluster
//! picks its host by (and a `use_hash_policy` split its cluster), and the cookie made for a
//! client that has none yet. Values hash as Envoy hashes them (xxHash64), so a fleet that
//! mixes both proxies sends a key to the same host.

use std::net::{IpAddr, SocketAddr};

use http::HeaderValue;

use config::hash_policy::{CookieHash, HashPolicy, HashSource};

/// What the policy made of a request.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RequestHash {
    pub(crate) hash: Option<u64>,
    /// A cookie made for the client (a cookie rule with a `ttl` and no such cookie sent), for
    /// the upstream's response.
    pub(crate) set_cookie: Option<HeaderValue>,
}

/// The request's side of the connection, for a made cookie: one connection's requests get
/// the same cookie.
#[derive(Clone, Copy)]
pub(crate) struct Connection {
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
}

/// Walks the rules in order. Each value found is added to the hash so far (rotated left one
/// bit, then xor-ed, as Envoy combines them); a `terminal` rule that leaves a hash ends the
/// walk. `connection: None`: no cookie is made (a split drawn before the request's host).
pub(crate) fn hash_request<B>(
    policy: &HashPolicy,
    req: &http::Request<B>,
    client: IpAddr,
    connection: Option<Connection>,
) -> RequestHash {
    let mut out = RequestHash::default();
    for rule in &policy.0 {
        let found = match &rule.source {
            HashSource::Header(name) => header_hash(req.headers(), name),
            // An empty value is no value, as Envoy reads a cookie.
            HashSource::Cookie(cookie) => {
                match config::cookie_value(req.headers(), &cookie.name).filter(|v| !v.is_empty()) {
                    Some(value) => Some(balancer::hash_key(value)),
                    None => match connection {
                        Some(connection) if cookie.ttl.is_some() && out.set_cookie.is_none() => {
                            made_cookie(cookie, connection, &mut out.set_cookie)
                        }
                        _ => None,
                    },
                }
            }
            HashSource::SourceIp => Some(crate::cluster::ip_hash(client)),
            HashSource::QueryParameter(name) => req
                .uri()
                .query()
                .and_then(|query| raw_query_value(query, name))
                .map(balancer::hash_key),
        };
        if let Some(value) = found {
            out.hash = Some(match out.hash {
                Some(before) => before.rotate_left(1) ^ value,
                None => value,
            });
        }
        if rule.terminal && out.hash.is_some() {
            break;
        }
    }
    out
}

/// The first value of the parameter `name`, as sent (Envoy hashes it undecoded).
fn raw_query_value<'a>(query: &'a str, name: &str) -> Option<&'a [u8]> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value.as_bytes())
    })
}

/// All the header's values, sorted, hashed in turn (one value: its plain hash).
fn header_hash(headers: &http::HeaderMap, name: &http::HeaderName) -> Option<u64> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(balancer::hash_key(first.as_bytes()));
    };
    let mut all: Vec<&[u8]> = [first, second]
        .into_iter()
        .chain(values)
        .map(HeaderValue::as_bytes)
        .collect();
    all.sort_unstable();
    Some(balancer::hash_keys(all))
}

/// A cookie for a client that sent none: the hash of the connection's two addresses as 16
/// hex digits (as Envoy makes it), and its `set-cookie`. Returns the value's hash.
fn made_cookie(
    cookie: &CookieHash,
    connection: Connection,
    set_cookie: &mut Option<HeaderValue>,
) -> Option<u64> {
    let addresses = format!("{}{}", connection.peer, connection.local);
    let value = format!("{:016x}", balancer::hash_key(addresses.as_bytes()));
    *set_cookie = Some(cookie.set_cookie(&value)?);
    Some(balancer::hash_key(value.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::hash_policy::HashRule;

    fn request(headers: &[(&str, &str)], uri: &str) -> http::Request<()> {
        let mut req = http::Request::builder().uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(()).unwrap()
    }

    fn rule(source: HashSource, terminal: bool) -> HashRule {
        HashRule { source, terminal }
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    #[test]
    fn values_hash_as_envoy_hashes_them_and_combine_in_order() {
        let user = rule(HashSource::Header("x-user".parse().unwrap()), false);
        let ip = rule(HashSource::SourceIp, false);
        let req = request(&[("x-user", "alice")], "/");
        let alone = hash_request(&HashPolicy(vec![user.clone()]), &req, CLIENT, None);
        assert_eq!(alone.hash, Some(balancer::hash_key(b"alice")));
        let ip_only = hash_request(&HashPolicy(vec![ip.clone()]), &req, CLIENT, None);
        assert_eq!(ip_only.hash, Some(balancer::hash_key(b"10.0.0.1")));
        let both = hash_request(
            &HashPolicy(vec![user.clone(), ip.clone()]),
            &req,
            CLIENT,
            None,
        );
        assert_eq!(
            both.hash,
            Some(balancer::hash_key(b"alice").rotate_left(1) ^ balancer::hash_key(b"10.0.0.1"))
        );
        // A rule that finds nothing adds nothing.
        let anonymous = request(&[], "/");
        let skipped = hash_request(&HashPolicy(vec![user, ip]), &anonymous, CLIENT, None);
        assert_eq!(skipped.hash, Some(balancer::hash_key(b"10.0.0.1")));
    }

    #[test]
    fn a_terminal_rule_that_hashes_ends_the_walk() {
        let policy = HashPolicy(vec![
            rule(HashSource::Header("x-user".parse().unwrap()), true),
            rule(HashSource::SourceIp, false),
        ]);
        let with = hash_request(&policy, &request(&[("x-user", "bob")], "/"), CLIENT, None);
        assert_eq!(with.hash, Some(balancer::hash_key(b"bob")));
        let without = hash_request(&policy, &request(&[], "/"), CLIENT, None);
        assert_eq!(without.hash, Some(balancer::hash_key(b"10.0.0.1")));
    }

    #[test]
    fn several_header_values_hash_sorted_and_query_parameters_as_sent() {
        let policy = HashPolicy(vec![rule(
            HashSource::Header("x-k".parse().unwrap()),
            false,
        )]);
        let ab = hash_request(
            &policy,
            &request(&[("x-k", "b"), ("x-k", "a")], "/"),
            CLIENT,
            None,
        );
        assert_eq!(ab.hash, Some(balancer::hash_keys([&b"a"[..], b"b"])));
        let query = HashPolicy(vec![rule(HashSource::QueryParameter("id".into()), false)]);
        let req = request(&[], "/p?x=1&id=a%20b&id=c");
        let by_query = hash_request(&query, &req, CLIENT, None);
        assert_eq!(by_query.hash, Some(balancer::hash_key(b"a%20b")));
        assert_eq!(
            hash_request(&query, &request(&[], "/p"), CLIENT, None).hash,
            None
        );
    }

    #[test]
    fn a_cookie_with_a_ttl_is_made_for_a_client_without_one() {
        let cookie = CookieHash {
            name: "sticky".into(),
            ttl: Some(std::time::Duration::from_secs(60)),
            path: Some("/".into()),
            attributes: Vec::new(),
        };
        let policy = HashPolicy(vec![rule(HashSource::Cookie(cookie), false)]);
        let connection = Connection {
            peer: "127.0.0.1:40000".parse().unwrap(),
            local: "127.0.0.1:8080".parse().unwrap(),
        };
        // An empty cookie is none: one is made.
        let empty = request(&[("cookie", "sticky=")], "/");
        assert!(
            hash_request(&policy, &empty, CLIENT, Some(connection))
                .set_cookie
                .is_some()
        );
        let sent = request(&[("cookie", "a=1; sticky=\"v1\"")], "/");
        let kept = hash_request(&policy, &sent, CLIENT, Some(connection));
        assert_eq!(kept.hash, Some(balancer::hash_key(b"v1")));
        assert_eq!(kept.set_cookie, None);

        let made = hash_request(&policy, &request(&[], "/"), CLIENT, Some(connection));
        let value = format!(
            "{:016x}",
            balancer::hash_key(b"127.0.0.1:40000127.0.0.1:8080")
        );
        assert_eq!(made.hash, Some(balancer::hash_key(value.as_bytes())));
        assert_eq!(
            made.set_cookie.unwrap(),
            format!("sticky=\"{value}\"; Max-Age=60; Path=/; HttpOnly").as_str()
        );
        // Without the connection (a split drawn early) nothing is made.
        let early = hash_request(&policy, &request(&[], "/"), CLIENT, None);
        assert_eq!(early, RequestHash::default());
    }
}
