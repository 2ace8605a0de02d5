//! The messages of the stream: an exchange's headers and bodies as the processor is sent
//! them, and its answers' changes made to the exchange, under Envoy's default mutation rules.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap as PbHeaderMap, HeaderValue as PbHeader};
use envoy_types::pb::envoy::config::core::v3::HeaderValueOption;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, HeaderMutation, ImmediateResponse, body_mutation,
};
use http::header::{CONTENT_LENGTH, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};

use super::LocalReply;
use super::stream::ProcessorError;

/// The request's head as Envoy sends it: its pseudo-headers, then its headers (`host` is
/// `:authority`). Values go as `raw_value`.
pub(super) fn request_headers(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    authority: &str,
    scheme: &str,
) -> PbHeaderMap {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut list = Vec::with_capacity(headers.len() + 4);
    list.push(pb(":authority", authority.as_bytes()));
    list.push(pb(":path", path.as_bytes()));
    list.push(pb(":method", method.as_str().as_bytes()));
    list.push(pb(":scheme", scheme.as_bytes()));
    list.extend(
        (headers.iter())
            .filter(|(name, _)| **name != HOST)
            .map(|(name, value)| pb(name.as_str(), value.as_bytes())),
    );
    PbHeaderMap { headers: list }
}

/// The response's head: `:status`, then its headers.
pub(super) fn response_headers(status: StatusCode, headers: &HeaderMap) -> PbHeaderMap {
    let mut list = Vec::with_capacity(headers.len() + 1);
    list.push(pb(":status", status.as_str().as_bytes()));
    list.extend(headers.iter().map(|(name, value)| pb(name.as_str(), value.as_bytes())));
    PbHeaderMap { headers: list }
}

fn pb(key: &str, value: &[u8]) -> PbHeader {
    PbHeader {
        key: key.to_owned(),
        value: String::new(),
        raw_value: value.to_vec(),
    }
}

/// What a mutation may change besides the headers.
pub(super) struct Head<'a> {
    pub(super) headers: &'a mut HeaderMap,
    /// The request's `:path` (requests only).
    pub(super) path: Option<&'a mut Uri>,
    /// The response's `:status` (responses only).
    pub(super) status: Option<&'a mut StatusCode>,
}

/// How many asked-for changes were refused (and not made), or why the answer fails.
pub(super) fn apply_header_mutation(
    mutation: &HeaderMutation,
    head: &mut Head<'_>,
) -> Result<u64, ProcessorError> {
    let mut rejected = 0;
    for name in &mutation.remove_headers {
        let name = name.to_ascii_lowercase();
        // System headers are never removed, nor `x-envoy-*` by default (Envoy's rules).
        if name.starts_with(':') || name == "host" || !allowed(&name) {
            rejected += 1;
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            return Err(ProcessorError::Mutation(format!("cannot remove `{name}`: not a header name")));
        };
        head.headers.remove(name);
    }
    for option in &mutation.set_headers {
        let Some(header) = &option.header else {
            continue;
        };
        let key = header.key.to_ascii_lowercase();
        let value = match (header.value.is_empty(), header.raw_value.is_empty()) {
            (_, false) if !header.value.is_empty() => {
                return Err(ProcessorError::Mutation(format!("`{key}` with both value and raw_value")));
            }
            (_, false) => &header.raw_value[..],
            (_, true) => header.value.as_bytes(),
        };
        let Ok(value) = HeaderValue::from_bytes(value) else {
            return Err(ProcessorError::Mutation(format!("a value of `{key}` that is not a header value")));
        };
        match key.as_str() {
            ":path" => match head.path.as_deref_mut() {
                Some(uri) => set_path(uri, &value)?,
                None => rejected += 1,
            },
            // A status that is not one (or below 200) is not set, as Envoy's checker ignores it.
            ":status" => match head.status.as_deref_mut() {
                Some(status) => match std::str::from_utf8(value.as_bytes()).ok().and_then(|v| v.parse::<u16>().ok()) {
                    Some(code @ 200..=599) => *status = StatusCode::from_u16(code).unwrap_or(*status),
                    _ => rejected += 1,
                },
                None => rejected += 1,
            },
            name if !allowed(name) => rejected += 1,
            name => {
                let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                    return Err(ProcessorError::Mutation(format!("`{name}` is not a header name")));
                };
                if appends(option) && head.headers.contains_key(&name) {
                    head.headers.append(name, value);
                } else {
                    head.headers.insert(name, value);
                }
            }
        }
    }
    Ok(rejected)
}

/// Envoy's rules without `mutation_rules`: the routing headers (`:authority`/`host`,
/// `:method`, `:scheme`), the other pseudo-headers (but `:path` and `:status`, handled
/// before) and `x-envoy-*` are not set.
fn allowed(name: &str) -> bool {
    !(name.starts_with(':') || name == "host" || name.starts_with("x-envoy-"))
}

/// Whether the value is added to the header's others: `append`, false unless given (the
/// field is deprecated elsewhere, but it is what ext_proc reads; `append_action` is not).
#[allow(deprecated)]
fn appends(option: &HeaderValueOption) -> bool {
    option.append.as_ref().is_some_and(|append| append.value)
}

fn set_path(uri: &mut Uri, value: &HeaderValue) -> Result<(), ProcessorError> {
    let path = value.to_str().ok().filter(|p| p.starts_with('/'));
    let Some(path) = path.and_then(|p| p.parse::<http::uri::PathAndQuery>().ok()) else {
        return Err(ProcessorError::Mutation(format!("`:path` {value:?} is not a path")));
    };
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(path);
    *uri = Uri::from_parts(parts).map_err(|e| ProcessorError::Mutation(e.to_string()))?;
    Ok(())
}

/// The body a mutation gives: `None` where it leaves the body as it is.
pub(super) fn new_body(mutation: Option<&BodyMutation>) -> Option<Bytes> {
    match mutation?.mutation.as_ref()? {
        body_mutation::Mutation::Body(body) => Some(Bytes::copy_from_slice(body)),
        body_mutation::Mutation::ClearBody(true) => Some(Bytes::new()),
        body_mutation::Mutation::ClearBody(false) | body_mutation::Mutation::StreamedResponse(_) => None,
    }
}

/// After the body changed: its length, where it is known whole.
pub(super) fn set_length(headers: &mut HeaderMap, length: Option<usize>) {
    match length {
        Some(length) => {
            headers.remove(http::header::TRANSFER_ENCODING);
            headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
        }
        None => {
            headers.remove(CONTENT_LENGTH);
        }
    }
}

/// The processor's own answer to the client.
pub(super) fn immediate_reply(answer: ImmediateResponse) -> LocalReply {
    // Envoy's default: 200 where no status is given (or an invalid one).
    let status = answer
        .status
        .as_ref()
        .and_then(|s| u16::try_from(s.code).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|s| s.as_u16() >= 200)
        .unwrap_or(StatusCode::OK);
    let mut reply = LocalReply::new(status, Bytes::from(answer.body));
    if let Some(mutation) = &answer.headers {
        let mut head = Head {
            headers: &mut reply.headers,
            path: None,
            status: None,
        };
        // What cannot be set is left out of the reply.
        let _ = apply_header_mutation(mutation, &mut head);
    }
    reply.grpc_status = answer.grpc_status.map(|g| g.status);
    reply
}
