//! The checks a request head passes before anything else reads it: the head's size, the path
//! in its one spelling, a valid host, and the route it matches. Synchronous and free of I/O, so
//! the fuzz targets run the same code the request path does.

use http::header::{HOST, HeaderValue};
use http::{Request, Version};

use super::upgrade;
use crate::error::ProxyError;
use crate::router::{Matched, RouteTable};
use config::path;
use config::{PathNormalization, StripHostPort};

/// What the head checks decided.
#[derive(Debug)]
pub(crate) enum Admitted {
    /// Go on with the request: the host the client asked for, and the route it matched.
    Routed {
        host: Option<HeaderValue>,
        matched: Matched,
    },
    /// Answer with a 307 to this location (`escaped_slashes: unescape_and_redirect`).
    Redirect(HeaderValue),
}

/// What a listener takes off a request's host before anything reads it (Envoy's
/// `strip_any_host_port`, `strip_matching_host_port` and `strip_trailing_host_dot`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostRules {
    pub(crate) strip_port: StripHostPort,
    pub(crate) strip_trailing_dot: bool,
    /// The port the client connected to (for `Matching`).
    pub(crate) local_port: u16,
}

impl HostRules {
    #[cfg(test)]
    pub(crate) const NONE: HostRules = HostRules {
        strip_port: StripHostPort::None,
        strip_trailing_dot: false,
        local_port: 0,
    };

    /// `host` with the port and trailing dot these rules take off; `None` when it stays.
    fn apply(self, host: &[u8]) -> Option<HeaderValue> {
        if matches!(self.strip_port, StripHostPort::None) && !self.strip_trailing_dot {
            return None;
        }
        // An IP literal's colons are inside its brackets.
        let name_end = match host.first() {
            Some(b'[') => host.iter().position(|&b| b == b']')? + 1,
            _ => host.iter().position(|&b| b == b':').unwrap_or(host.len()),
        };
        let (mut name, port) = host.split_at(name_end);
        let port_number = port
            .strip_prefix(b":")
            .and_then(|p| std::str::from_utf8(p).ok()?.parse::<u16>().ok());
        // A port that is a number, as Envoy strips only those.
        let drop_port = port_number.is_some()
            && match self.strip_port {
                StripHostPort::None => false,
                StripHostPort::Any => true,
                StripHostPort::Matching => port_number == Some(self.local_port),
            };
        if self.strip_trailing_dot && name.len() > 1 && name.ends_with(b".") {
            name = &name[..name.len() - 1];
        }
        if !drop_port && name.len() == name_end {
            return None;
        }
        let port = if drop_port { &b""[..] } else { port };
        HeaderValue::from_bytes(&[name, port].concat()).ok()
    }
}

/// Checks a request's head and routes it. The request's path is rewritten to its normalised
/// spelling, its host as `host_rules` say. An error is the 4xx to answer with.
pub(crate) fn admit<B>(
    req: &mut Request<B>,
    head_limit: Option<usize>,
    normalization: &PathNormalization,
    host_rules: HostRules,
    routes: &RouteTable,
) -> Result<Admitted, ProxyError> {
    // A CONNECT names an authority and no path (routes match it by `connect`); any other
    // request has a path, else a route matching CONNECT would take it.
    let connect = upgrade::is_connect(req);
    if connect && (req.uri().authority().is_none() || !req.uri().path().is_empty()) {
        return Err(ProxyError::BadRequest("a CONNECT's target is host:port"));
    }
    // What follows a CONNECT's head is the tunnel's, never a body (RFC 9110 section 9.3.6).
    let has_body = |headers: &http::HeaderMap| {
        headers.contains_key(http::header::TRANSFER_ENCODING)
            || headers
                .get(http::header::CONTENT_LENGTH)
                .is_some_and(|len| len.as_bytes() != b"0")
    };
    if connect && has_body(req.headers()) {
        return Err(ProxyError::BadRequest("a CONNECT has no body"));
    }
    if !connect && req.uri().path().is_empty() {
        return Err(ProxyError::BadRequest("the request target has no path"));
    }
    if let Some(limit) = head_limit {
        check_head_size(req, limit)?;
    }
    if !connect && let Some(location) = normalize_path(req, normalization)? {
        return Ok(Admitted::Redirect(location));
    }
    let (host, matched) = route(req, host_rules, routes)?;
    Ok(Admitted::Routed { host, matched })
}

/// The request's host (after the listener's host rules, written back onto the request) and
/// the route its host, path and headers match. Run again when a filter clears the route.
pub(crate) fn route<B>(
    req: &mut Request<B>,
    host_rules: HostRules,
    routes: &RouteTable,
) -> Result<(Option<HeaderValue>, Matched), ProxyError> {
    let mut host = request_host(req)?;
    // A CONNECT's port is part of its target (RFC 9110 section 9.3.6): kept, as Envoy keeps it
    // (its trailing dot goes as any host's).
    let host_rules = if upgrade::is_connect(req) {
        HostRules {
            strip_port: StripHostPort::None,
            ..host_rules
        }
    } else {
        host_rules
    };
    let stripped = host.as_ref().and_then(|h| host_rules.apply(h.as_bytes()));
    if let Some(stripped) = stripped {
        // Filters, logs and the upstream see the host as routing does.
        if req.headers().contains_key(HOST) {
            req.headers_mut().insert(HOST, stripped.clone());
        }
        if req.uri().authority().is_some() {
            let mut parts = std::mem::take(req.uri_mut()).into_parts();
            parts.authority = http::uri::Authority::try_from(stripped.as_bytes()).ok();
            *req.uri_mut() = http::Uri::from_parts(parts)
                .map_err(|_| ProxyError::BadRequest("invalid authority"))?;
        }
        host = Some(stripped);
    }
    let host_text = host.as_ref().map_or("", |h| ascii_text(h.as_bytes()));
    let matched = routes.find(
        host_text,
        req.uri().path(),
        req.uri().query(),
        req.headers(),
    );
    Ok((host, matched))
}

/// Headers whose names hold `_`: with `reject`, a request carrying any is an error (400);
/// otherwise they are removed and counted. Names are lower-case ASCII here (the codecs
/// refuse anything else), so a byte search is the whole test.
pub(crate) fn drop_underscored_headers(
    headers: &mut http::HeaderMap,
    reject: bool,
) -> Result<usize, ProxyError> {
    let underscored = |name: &http::HeaderName| name.as_str().as_bytes().contains(&b'_');
    if !headers.keys().any(underscored) {
        return Ok(0);
    }
    if reject {
        return Err(ProxyError::BadRequest("a header name holds an underscore"));
    }
    let names: Vec<http::HeaderName> = headers.keys().filter(|n| underscored(n)).cloned().collect();
    let mut dropped = 0;
    for name in names {
        if let http::header::Entry::Occupied(entry) = headers.entry(name) {
            dropped += entry.iter().count();
            entry.remove_entry_mult().1.for_each(drop);
        }
    }
    Ok(dropped)
}

/// Rewrites the request's path to its one spelling (path.rs), before anything reads it; or
/// gives the location `unescape_and_redirect` asks for.
fn normalize_path<B>(
    req: &mut Request<B>,
    settings: &PathNormalization,
) -> Result<Option<HeaderValue>, ProxyError> {
    let normalized = path::normalize(req.uri().path(), settings)
        .map_err(|e| ProxyError::BadRequest(e.message()))?;
    let path = match normalized {
        path::Normalized::Path(std::borrow::Cow::Borrowed(_)) => return Ok(None),
        path::Normalized::Path(std::borrow::Cow::Owned(path)) => path,
        path::Normalized::Redirect(path) => {
            // `//host` or `/\host` would send the client to another site.
            let path = format!("/{}", path.trim_start_matches(['/', '\\']));
            let location = match req.uri().query() {
                Some(query) => format!("{path}?{query}"),
                None => path,
            };
            let location = HeaderValue::try_from(location)
                .map_err(|_| ProxyError::BadRequest("the normalised path is not a valid header"))?;
            return Ok(Some(location));
        }
    };
    let target = match req.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(
        target
            .parse()
            .map_err(|_| ProxyError::BadRequest("the normalised path is not a valid path"))?,
    );
    *req.uri_mut() = http::Uri::from_parts(parts)
        .map_err(|_| ProxyError::BadRequest("invalid request target"))?;
    Ok(None)
}

/// Refuses a request whose head is larger than `limit` bytes, counted as Envoy does: the
/// request line's target plus every header name and value.
fn check_head_size<B>(req: &Request<B>, limit: usize) -> Result<(), ProxyError> {
    let target = req.uri().authority().map_or(0, |a| a.as_str().len())
        + req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    let size = target
        + req
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum::<usize>();
    if size > limit {
        return Err(ProxyError::HeadersTooLarge { size, limit });
    }
    Ok(())
}

/// The host the client asked for: the URI's authority (HTTP/2's `:authority`, or an
/// absolute-form HTTP/1.1 target, which RFC 9112 section 3.2.2 says overrides `Host`), else
/// the `Host` header. HTTP/1.1 requires exactly one `Host` line (RFC 9112 section 3.2).
fn request_host<B>(req: &Request<B>) -> Result<Option<HeaderValue>, ProxyError> {
    let mut hosts = req.headers().get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::BadRequest("more than one host header"));
    }
    if let Some(host) = host
        && !is_authority(host.as_bytes())
    {
        return Err(ProxyError::BadRequest("invalid host header"));
    }
    if host.is_none() && req.version() == Version::HTTP_11 {
        return Err(ProxyError::BadRequest(
            "HTTP/1.1 request without a host header",
        ));
    }
    if let Some(authority) = req.uri().authority() {
        if !is_authority(authority.as_str().as_bytes()) {
            return Err(ProxyError::BadRequest("invalid authority"));
        }
        // Copied into the worker's chunk for heads (an `Authority` does not lend its bytes):
        // no allocation, and clones of it share the chunk.
        return Ok(Some(authority_value(authority.as_str().as_bytes())));
    }
    Ok(host.cloned())
}

/// `bytes` as text when they are ASCII (a host that [`is_authority`] passed always is), else
/// `""`. A word-at-a-time ASCII test: `str::from_utf8` and `HeaderValue::to_str` take about
/// 130 instructions over a host of 15 bytes, once per request.
#[allow(unsafe_code)]
fn ascii_text(bytes: &[u8]) -> &str {
    if !bytes.is_ascii() {
        return "";
    }
    // SAFETY: ASCII is UTF-8.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

/// `authority` (which [`is_authority`] passed) as a header value, in the worker's chunk for
/// heads.
#[allow(unsafe_code)]
fn authority_value(authority: &[u8]) -> HeaderValue {
    debug_assert!(is_authority(authority));
    // SAFETY: `is_authority` passes visible ASCII only, all of it valid in a header value
    // (checked in debug builds by `http`, and by the tests below): the bytes are not checked
    // again on every request.
    unsafe { HeaderValue::from_maybe_shared_unchecked(h1::copy_shared(authority)) }
}

/// Whether `value` is `host[:port]` as RFC 3986 writes it (section 3.2.2): an IP literal in
/// brackets, or a name of unreserved characters and sub-delimiters; no user info (`@`), no
/// path, no spaces. Anything else could be read differently by the upstream (or a cache keyed
/// on it), so it is never forwarded. Percent escapes, which RFC 3986 allows in a name, are
/// refused: DNS names never carry them (IDNs travel as punycode) and the `http` crate, so an
/// HTTP/2 upstream's request, cannot carry them (found by the `h1_head` fuzz target).
pub(crate) fn is_authority(value: &[u8]) -> bool {
    // A table, not a test per byte: every request's host goes through here.
    const NAME_BYTES: [bool; 256] = {
        // Letters and digits, the unreserved marks and the sub-delimiters.
        let mut table = [false; 256];
        let mut b = 0;
        while b < 256 {
            table[b] = (b as u8).is_ascii_alphanumeric();
            b += 1;
        }
        let marks = b"-._~!$&'()*+,;=";
        let mut i = 0;
        while i < marks.len() {
            table[marks[i] as usize] = true;
            i += 1;
        }
        table
    };
    let (host, port) = match value.first() {
        Some(b'[') => match value.iter().position(|&b| b == b']') {
            Some(end) => {
                let literal = &value[1..end];
                let ok = !literal.is_empty()
                    && literal
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !ok {
                    return false;
                }
                match &value[end + 1..] {
                    [] => return true,
                    [b':', port @ ..] => (&value[..0], port),
                    _ => return false,
                }
            }
            None => return false,
        },
        _ => match value.iter().rposition(|&b| b == b':') {
            Some(colon) => (&value[..colon], &value[colon + 1..]),
            None => (value, &value[..0]),
        },
    };
    let port_ok = port.is_empty()
        || (port.len() <= 5
            && port.iter().all(u8::is_ascii_digit)
            && port.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')) <= 65535);
    let host_ok = host.iter().all(|&b| NAME_BYTES[usize::from(b)]);
    // A bracketed literal has no name part; otherwise the name is required.
    port_ok && host_ok && (!host.is_empty() || value.first() == Some(&b'['))
}

#[cfg(test)]
mod tests {
    use super::{HostRules, StripHostPort, ascii_text, authority_value, is_authority};

    #[test]
    fn hosts_are_host_and_port_and_nothing_else() {
        for good in [
            "example.com",
            "example.com:8080",
            "example.com:65535",
            "EXAMPLE.com:",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:8443",
            "[::ffff:10.0.0.1]:1",
            "a-b_c~d.e",
            "xn--bcher-kva.example",
            "a!$&'()*+,;=",
        ] {
            assert!(is_authority(good.as_bytes()), "{good}");
            // Made into a header value unchecked: it must be one.
            assert_eq!(authority_value(good.as_bytes()).as_bytes(), good.as_bytes());
            assert!(
                http::HeaderValue::from_bytes(good.as_bytes()).is_ok(),
                "{good}"
            );
        }
        for bad in [
            "",
            ":80",
            "a b",
            "a/b",
            "user@host",
            "a/b@c",
            "host:port",
            "host:123456",
            "host:65536",
            "host:99999",
            "::1",
            "[::1",
            "[zz::1]",
            "[::1]x",
            "[]",
            "a%2",
            "a%zz",
            "caf%C3%A9.example",
            "b.example%c5:",
            "a\\b",
            "a?b",
            "a#b",
            "a\"b",
        ] {
            assert!(!is_authority(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn ascii_is_text_and_anything_else_is_empty() {
        assert_eq!(ascii_text(b"example.com:8080"), "example.com:8080");
        assert_eq!(ascii_text(b""), "");
        assert_eq!(ascii_text("café.example".as_bytes()), "");
        assert_eq!(ascii_text(&[b'a', 0xff, b'b']), "");
    }

    #[test]
    fn a_name_is_unreserved_characters_and_sub_delimiters() {
        // Every byte, as a one-byte name: RFC 3986's reg-name without percent escapes.
        for b in 0..=u8::MAX {
            let allowed = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b);
            assert_eq!(is_authority(&[b]), allowed, "byte {b:#04x}");
            assert_eq!(
                is_authority(&[b'a', b, b'z', b':', b'8']),
                allowed,
                "byte {b:#04x}"
            );
            // What passes is a header value (`authority_value` makes it one unchecked).
            if allowed {
                assert!(http::HeaderValue::from_bytes(&[b'a', b, b'z']).is_ok());
            }
        }
    }

    #[test]
    fn hosts_lose_what_the_listener_strips() {
        let rules = |strip_port, strip_trailing_dot| HostRules {
            strip_port,
            strip_trailing_dot,
            local_port: 8080,
        };
        let any = rules(StripHostPort::Any, false);
        let matching = rules(StripHostPort::Matching, false);
        let dot = rules(StripHostPort::None, true);
        let both = rules(StripHostPort::Any, true);
        for (rules, host, stripped) in [
            (any, "a.example:9000", Some("a.example")),
            (any, "a.example", None),
            (any, "a.example:", None),
            (any, "[::1]:8080", Some("[::1]")),
            (matching, "a.example:8080", Some("a.example")),
            (matching, "a.example:9000", None),
            (matching, "[::1]:8080", Some("[::1]")),
            (dot, "a.example.", Some("a.example")),
            (dot, "a.example.:8080", Some("a.example:8080")),
            (dot, "a.example", None),
            (dot, ".", None),
            (both, "a.example.:8080", Some("a.example")),
            (HostRules::NONE, "a.example.:8080", None),
        ] {
            let got = rules.apply(host.as_bytes());
            assert_eq!(
                got.as_ref().map(|h| h.to_str().unwrap()),
                stripped,
                "{host}"
            );
        }
    }
}
