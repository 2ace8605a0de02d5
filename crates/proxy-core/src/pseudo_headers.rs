//! A request header by name as Envoy's formats read it, pseudo-headers included: `:method`,
//! `:path` (with its query), `:authority` (an HTTP/1.1 request's `host`) and `:scheme`.

use http::{HeaderMap, Method, Uri};

/// `name` (lowercase) of the request; `tls`: the client's connection is TLS, which is the
/// scheme where the request names none.
pub(crate) fn request_header<'a>(
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    tls: bool,
    name: &str,
) -> Option<&'a [u8]> {
    match name {
        ":method" => Some(method.as_str().as_bytes()),
        ":path" => uri.path_and_query().map(|p| p.as_str().as_bytes()),
        ":authority" => match uri.authority() {
            Some(a) => Some(a.as_str().as_bytes()),
            None => headers.get(http::header::HOST).map(|v| v.as_bytes()),
        },
        ":scheme" => Some(match uri.scheme_str() {
            Some("https") => b"https",
            Some(_) => b"http",
            None if tls => b"https",
            None => b"http",
        }),
        name => headers.get(name).map(|v| v.as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_headers_come_from_the_request_line() {
        let uri: Uri = "/a?b=c".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("host", "example.com".parse().unwrap());
        let of = |name| request_header(&Method::POST, &uri, &headers, true, name);
        assert_eq!(of(":method"), Some(&b"POST"[..]));
        assert_eq!(of(":path"), Some(&b"/a?b=c"[..]));
        assert_eq!(of(":authority"), Some(&b"example.com"[..]));
        assert_eq!(of(":scheme"), Some(&b"https"[..]));
        assert_eq!(of("host"), Some(&b"example.com"[..]));
        assert_eq!(of("missing"), None);
    }
}
