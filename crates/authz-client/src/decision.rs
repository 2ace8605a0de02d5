//! What the service decided, and the header changes it asked for.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// The service's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Let the request through, with these changes.
    Allow(Allowed),
    /// Answer the client with this instead.
    Deny(Denied),
}

/// Changes to make to an allowed request and to its response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    /// Applied to the request before it goes upstream.
    pub upstream_headers: Vec<HeaderMutation>,
    /// Removed from the request before it goes upstream.
    pub headers_to_remove: Vec<HeaderName>,
    /// Applied to the response sent to the client.
    pub response_headers: Vec<HeaderMutation>,
}

impl Allowed {
    /// Applies the upstream-side changes: removals first, then additions.
    pub fn apply_to_request(&self, headers: &mut HeaderMap) {
        for name in &self.headers_to_remove {
            headers.remove(name);
        }
        for mutation in &self.upstream_headers {
            mutation.apply(headers);
        }
    }

    pub fn apply_to_response(&self, headers: &mut HeaderMap) {
        for mutation in &self.response_headers {
            mutation.apply(headers);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.upstream_headers.is_empty()
            && self.headers_to_remove.is_empty()
            && self.response_headers.is_empty()
    }
}

/// The answer for the client of a denied request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub status: StatusCode,
    pub headers: Vec<HeaderMutation>,
    pub body: Bytes,
}

/// Whether a service may not set or remove `name`: the headers that frame a message or
/// describe one hop. A `content-length` from the service would otherwise sit beside a body of
/// another length, and the client or the upstream would read the stream differently from the
/// proxy (request or response smuggling). `host` is the proxy's to set. Decisions never carry
/// these; docs/security.md lists them.
pub fn is_protected(name: &HeaderName) -> bool {
    use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
    *name == CONTENT_LENGTH
        || *name == TRANSFER_ENCODING
        || *name == CONNECTION
        || *name == UPGRADE
        || *name == TE
        || *name == TRAILER
        || *name == HOST
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// One header to add or change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMutation {
    pub name: HeaderName,
    pub value: HeaderValue,
    pub action: HeaderAction,
}

/// Envoy's `HeaderValueOption` actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderAction {
    /// Add another value, keeping any there are.
    Append,
    /// Add only if the header is absent.
    AddIfAbsent,
    /// Replace any values, or add.
    Set,
    /// Replace only if the header is present.
    OverwriteIfExists,
}

impl HeaderMutation {
    pub fn apply(&self, headers: &mut HeaderMap) {
        match self.action {
            HeaderAction::Append => {
                headers.append(self.name.clone(), self.value.clone());
            }
            HeaderAction::AddIfAbsent => {
                if !headers.contains_key(&self.name) {
                    headers.insert(self.name.clone(), self.value.clone());
                }
            }
            HeaderAction::Set => {
                headers.insert(self.name.clone(), self.value.clone());
            }
            HeaderAction::OverwriteIfExists => {
                if headers.contains_key(&self.name) {
                    headers.insert(self.name.clone(), self.value.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mutation(name: &'static str, value: &'static str, action: HeaderAction) -> HeaderMutation {
        HeaderMutation {
            name: HeaderName::from_static(name),
            value: HeaderValue::from_static(value),
            action,
        }
    }

    #[test]
    fn actions_follow_envoy() {
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_static("1"));
        headers.insert("x-b", HeaderValue::from_static("1"));
        headers.insert("x-gone", HeaderValue::from_static("1"));
        let allowed = Allowed {
            upstream_headers: vec![
                mutation("x-a", "2", HeaderAction::Append),
                mutation("x-b", "2", HeaderAction::Set),
                mutation("x-b", "3", HeaderAction::AddIfAbsent),
                mutation("x-c", "1", HeaderAction::AddIfAbsent),
                mutation("x-d", "1", HeaderAction::OverwriteIfExists),
            ],
            headers_to_remove: vec![HeaderName::from_static("x-gone")],
            response_headers: Vec::new(),
        };
        allowed.apply_to_request(&mut headers);
        let values = |n: &str| {
            headers
                .get_all(n)
                .iter()
                .map(|v| v.to_str().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(values("x-a"), ["1", "2"]);
        assert_eq!(values("x-b"), ["2"]);
        assert_eq!(values("x-c"), ["1"]);
        assert!(values("x-d").is_empty());
        assert!(values("x-gone").is_empty());
    }
}
