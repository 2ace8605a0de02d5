//! Decoded header fields made into a request or response head (RFC 9113 section 8), the
//! `http` types the HTTP/1.1 path uses too. A message that breaks section 8's rules is
//! malformed: its stream is reset with `PROTOCOL_ERROR`, and the connection goes on.

use std::cell::Cell;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, COOKIE, HOST};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};

use crate::hpack::Field;

/// Why a header list is not a well-formed request or response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the {0} pseudo-header field is missing")]
    Missing(&'static str),
    #[error("a pseudo-header field this side does not know, or one of the other kind of message")]
    UnknownPseudo,
    #[error("the {0} pseudo-header field twice")]
    Repeated(&'static str),
    #[error("a pseudo-header field after a regular one")]
    PseudoAfterRegular,
    #[error("a field name that is not a lowercase token")]
    InvalidName,
    #[error("a field value with NUL, CR or LF, or with whitespace at an end")]
    InvalidValue,
    #[error("a connection-specific field ({0})")]
    ConnectionSpecific(&'static str),
    #[error("TE with a value other than \"trailers\"")]
    TeNotTrailers,
    #[error("an invalid :method")]
    InvalidMethod,
    #[error("an invalid :scheme")]
    InvalidScheme,
    #[error("an invalid or empty :path, or one with a fragment")]
    InvalidPath,
    #[error("an invalid :authority, one with user information, or a CONNECT's without a port")]
    InvalidAuthority,
    #[error("a Host field that names another authority than :authority, or more than one Host")]
    HostDiffers,
    #[error("more fields than a header map holds")]
    TooManyFields,
    #[error("an invalid :status, or 101 (HTTP/2 has no Upgrade)")]
    InvalidStatus,
    #[error("an invalid content-length, or two that differ")]
    InvalidContentLength,
    #[error("a CONNECT with :scheme or :path")]
    ConnectWithPath,
    #[error(
        ":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL, or on a method other than CONNECT"
    )]
    UnexpectedProtocol,
}

/// A list of decoded fields on its way to a head: a per-thread list, reused, so that reading
/// a header block does not allocate one. Its fields are taken out (`drain`) into the head.
pub(crate) struct FieldList(Vec<Field>);

thread_local! {
    static FIELD_LIST: Cell<Vec<Field>> = const { Cell::new(Vec::new()) };
}

/// A list grown by an unusual block is freed rather than kept at its size.
const FIELD_LIST_KEPT: usize = 64;

impl FieldList {
    pub(crate) fn take() -> Self {
        FieldList(FIELD_LIST.take())
    }
}

impl std::ops::Deref for FieldList {
    type Target = Vec<Field>;
    fn deref(&self) -> &Vec<Field> {
        &self.0
    }
}

impl std::ops::DerefMut for FieldList {
    fn deref_mut(&mut self) -> &mut Vec<Field> {
        &mut self.0
    }
}

impl Drop for FieldList {
    fn drop(&mut self) {
        self.0.clear();
        if self.0.capacity() <= FIELD_LIST_KEPT {
            // At thread exit the slot may be gone: the list is freed then.
            let _ = FIELD_LIST.try_with(|slot| slot.set(std::mem::take(&mut self.0)));
        }
    }
}

/// A request head, and what it said of its body.
#[derive(Debug)]
pub struct RequestHead {
    pub parts: http::request::Parts,
    /// The `content-length` it declared: its DATA must add up to it.
    pub content_length: Option<u64>,
    /// RFC 8441's `:protocol` of an extended CONNECT (a WebSocket, say).
    pub protocol: Option<Bytes>,
}

/// The request the fields of a HEADERS frame make. `extended_connect`: this side announced
/// `SETTINGS_ENABLE_CONNECT_PROTOCOL`.
pub fn request<I>(fields: I, extended_connect: bool) -> Result<RequestHead, HeadError>
where
    I: IntoIterator<Item = Field>,
    I::IntoIter: ExactSizeIterator,
{
    request_in(HeaderMap::new(), fields, extended_connect)
}

/// As [`request`], with the regular fields put in `headers` (an empty map, from a pool say).
pub fn request_in<I>(
    headers: HeaderMap,
    fields: I,
    extended_connect: bool,
) -> Result<RequestHead, HeadError>
where
    I: IntoIterator<Item = Field>,
    I::IntoIter: ExactSizeIterator,
{
    let fields = fields.into_iter();
    let mut method = None;
    let mut scheme = None;
    let mut authority = None;
    let mut path = None;
    let mut protocol = None;
    let mut regular = Regular::in_map(headers, fields.len())?;
    for field in fields {
        if let Some(pseudo) = field.name.strip_prefix(b":") {
            if regular.seen() {
                return Err(HeadError::PseudoAfterRegular);
            }
            let slot = match pseudo {
                b"method" => (&mut method, ":method"),
                b"scheme" => (&mut scheme, ":scheme"),
                b"authority" => (&mut authority, ":authority"),
                b"path" => (&mut path, ":path"),
                b"protocol" => (&mut protocol, ":protocol"),
                _ => return Err(HeadError::UnknownPseudo),
            };
            set_once(slot, field.value)?;
        } else {
            regular.add(field)?;
        }
    }
    let method = method.ok_or(HeadError::Missing(":method"))?;
    let method = Method::from_bytes(&method).map_err(|_| HeadError::InvalidMethod)?;
    let connect = method == Method::CONNECT;
    if protocol.is_some() && !(connect && extended_connect) {
        return Err(HeadError::UnexpectedProtocol);
    }
    let authority = authority
        .map(|a| Authority::from_maybe_shared(a).map_err(|_| HeadError::InvalidAuthority))
        .transpose()?;
    if authority.as_ref().is_some_and(|a| a.as_str().contains('@')) {
        return Err(HeadError::InvalidAuthority);
    }
    // Parts set directly: `Uri::builder` moves them through a `Result` at every step.
    let mut uri = http::uri::Parts::default();
    if connect && protocol.is_none() {
        // A plain CONNECT names only the authority it tunnels to (RFC 9113 section 8.5).
        if scheme.is_some() || path.is_some() {
            return Err(HeadError::ConnectWithPath);
        }
        let authority = authority.clone().ok_or(HeadError::Missing(":authority"))?;
        // Host and port (RFC 9113 section 8.5).
        if authority.port_u16().is_none() {
            return Err(HeadError::InvalidAuthority);
        }
        uri.authority = Some(authority);
    } else {
        let scheme = scheme.ok_or(HeadError::Missing(":scheme"))?;
        let scheme = Scheme::try_from(&scheme[..]).map_err(|_| HeadError::InvalidScheme)?;
        let path = path.ok_or(HeadError::Missing(":path"))?;
        if path.is_empty() {
            return Err(HeadError::InvalidPath);
        }
        // `*` is OPTIONS' own; any other path of http or https is absolute.
        let asterisk = &path[..] == b"*" && method == Method::OPTIONS;
        // A fragment is never sent (PathAndQuery would cut it off silently).
        if !asterisk && path[0] != b'/' || path.contains(&b'#') {
            return Err(HeadError::InvalidPath);
        }
        let path = PathAndQuery::from_maybe_shared(path).map_err(|_| HeadError::InvalidPath)?;
        uri.path_and_query = Some(path);
        if protocol.is_some() && authority.is_none() {
            return Err(HeadError::Missing(":authority"));
        }
        // Without :authority (a request translated from HTTP/1.1's origin form, say), the
        // URI is the path alone and Host names the authority, as h2 has it.
        if let Some(authority) = authority.clone() {
            uri.scheme = Some(scheme);
            uri.authority = Some(authority);
        }
    }
    let (mut headers, counts) = regular.finish()?;
    if counts.hosts > 1 {
        return Err(HeadError::HostDiffers);
    }
    if counts.hosts == 1
        && let (Some(host), Some(authority)) = (headers.get(HOST), authority.as_ref())
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        return Err(HeadError::HostDiffers);
    }
    let content_length = content_length(&mut headers, counts.lengths)?;
    let mut parts = http::Request::new(()).into_parts().0;
    parts.method = method;
    parts.uri = Uri::from_parts(uri).map_err(|_| HeadError::InvalidPath)?;
    parts.version = Version::HTTP_2;
    parts.headers = headers;
    Ok(RequestHead {
        parts,
        content_length,
        protocol,
    })
}

/// The response (or interim response) the fields of a HEADERS frame make.
pub fn response(fields: Vec<Field>) -> Result<(http::response::Parts, Option<u64>), HeadError> {
    let mut status = None;
    let mut regular = Regular::in_map(HeaderMap::new(), fields.len())?;
    for field in fields {
        if let Some(pseudo) = field.name.strip_prefix(b":") {
            if regular.seen() {
                return Err(HeadError::PseudoAfterRegular);
            }
            if pseudo != b"status" {
                return Err(HeadError::UnknownPseudo);
            }
            set_once((&mut status, ":status"), field.value)?;
        } else {
            regular.add(field)?;
        }
    }
    let status = status.ok_or(HeadError::Missing(":status"))?;
    let status = StatusCode::from_bytes(&status)
        .ok()
        .filter(|&s| s != StatusCode::SWITCHING_PROTOCOLS)
        .ok_or(HeadError::InvalidStatus)?;
    let (mut headers, counts) = regular.finish()?;
    let content_length = content_length(&mut headers, counts.lengths)?;
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = Version::HTTP_2;
    parts.headers = headers;
    Ok((parts, content_length))
}

/// Trailer fields: no pseudo-header fields at all (RFC 9113 section 8.1).
pub fn trailers<I>(fields: I) -> Result<HeaderMap, HeadError>
where
    I: IntoIterator<Item = Field>,
    I::IntoIter: ExactSizeIterator,
{
    let fields = fields.into_iter();
    let mut regular = Regular::in_map(HeaderMap::new(), fields.len())?;
    for field in fields {
        if field.name.starts_with(b":") {
            return Err(HeadError::UnknownPseudo);
        }
        regular.add(field)?;
    }
    Ok(regular.finish()?.0)
}

fn set_once(
    (slot, name): (&mut Option<Bytes>, &'static str),
    value: Bytes,
) -> Result<(), HeadError> {
    if slot.replace(value).is_some() {
        return Err(HeadError::Repeated(name));
    }
    Ok(())
}

/// The regular fields, checked one by one; cookie crumbs put back together.
struct Regular {
    headers: HeaderMap,
    cookies: Vec<HeaderValue>,
    any: bool,
    /// Most heads have no `host` and no `content-length`, and then need no lookup of either.
    counts: FieldCounts,
}

/// A header map holds at most 24,576 fields (`with_capacity` panics past that): a list that
/// large is refused by name, and the map starts only as large as a common head needs.
pub(crate) const CAPACITY_HINT: usize = 64;

impl Regular {
    /// The fields go into `headers`, which has room made for `len` of them (up to the hint).
    fn in_map(mut headers: HeaderMap, len: usize) -> Result<Self, HeadError> {
        let room = len.min(CAPACITY_HINT);
        if headers.capacity() < room {
            headers
                .try_reserve(room)
                .map_err(|_| HeadError::TooManyFields)?;
        }
        Ok(Regular {
            headers,
            cookies: Vec::new(),
            any: false,
            counts: FieldCounts::default(),
        })
    }

    fn seen(&self) -> bool {
        self.any
    }

    fn add(&mut self, field: Field) -> Result<(), HeadError> {
        self.any = true;
        // `from_lowercase` refuses capitals, which HTTP/2 names may not have.
        let name = HeaderName::from_lowercase(&field.name).map_err(|_| HeadError::InvalidName)?;
        let value = &field.value[..];
        // RFC 9113 section 8.2.1: no NUL, CR or LF (HeaderValue refuses them and other
        // controls), and no whitespace at either end.
        if value.first().is_some_and(|b| matches!(b, b' ' | b'\t'))
            || value.last().is_some_and(|b| matches!(b, b' ' | b'\t'))
        {
            return Err(HeadError::InvalidValue);
        }
        let mut value =
            HeaderValue::from_maybe_shared(field.value).map_err(|_| HeadError::InvalidValue)?;
        if field.never_indexed {
            value.set_sensitive(true);
        }
        if let Some(which) = connection_specific(&name) {
            return Err(HeadError::ConnectionSpecific(which));
        }
        if name == http::header::TE && !value.as_bytes().eq_ignore_ascii_case(b"trailers") {
            return Err(HeadError::TeNotTrailers);
        }
        if name == COOKIE {
            self.cookies.push(value);
            return Ok(());
        }
        if name == HOST {
            self.counts.hosts = self.counts.hosts.saturating_add(1);
        } else if name == CONTENT_LENGTH {
            self.counts.lengths = self.counts.lengths.saturating_add(1);
        }
        self.headers
            .try_append(name, value)
            .map_err(|_| HeadError::TooManyFields)?;
        Ok(())
    }

    /// The fields, with the counts of `host` and `content-length` fields among them.
    fn finish(mut self) -> Result<(HeaderMap, FieldCounts), HeadError> {
        // RFC 9113 section 8.2.3: crumbs are joined with "; " for an HTTP/1.1 hop, which
        // allows one Cookie field.
        match self.cookies.len() {
            0 => {}
            1 => {
                let value = self.cookies.remove(0);
                self.insert_cookie(value)?;
            }
            _ => {
                let mut joined = BytesMut::new();
                for (i, crumb) in self.cookies.iter().enumerate() {
                    if i > 0 {
                        joined.extend_from_slice(b"; ");
                    }
                    joined.extend_from_slice(crumb.as_bytes());
                }
                let mut value = HeaderValue::from_maybe_shared(joined.freeze())
                    .map_err(|_| HeadError::InvalidValue)?;
                // One never-indexed crumb makes the whole field sensitive.
                value.set_sensitive(self.cookies.iter().any(HeaderValue::is_sensitive));
                self.insert_cookie(value)?;
            }
        }
        Ok((self.headers, self.counts))
    }

    fn insert_cookie(&mut self, value: HeaderValue) -> Result<(), HeadError> {
        self.headers
            .try_insert(COOKIE, value)
            .map_err(|_| HeadError::TooManyFields)?;
        Ok(())
    }
}

/// How many `host` and `content-length` fields a head has (saturating at 255).
#[derive(Debug, Clone, Copy, Default)]
struct FieldCounts {
    hosts: u8,
    lengths: u8,
}

/// The fields RFC 9113 section 8.2.2 forbids.
fn connection_specific(name: &HeaderName) -> Option<&'static str> {
    Some(match name.as_str() {
        "connection" => "connection",
        "proxy-connection" => "proxy-connection",
        "keep-alive" => "keep-alive",
        "transfer-encoding" => "transfer-encoding",
        "upgrade" => "upgrade",
        _ => return None,
    })
}

/// The declared length: digits only, and every `content-length` field the same (they are
/// folded into one). `fields`: how many there are (saturating), so that a head without one
/// needs no lookup.
fn content_length(headers: &mut HeaderMap, fields: u8) -> Result<Option<u64>, HeadError> {
    if fields == 0 {
        return Ok(None);
    }
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > 19 || !bytes.iter().all(u8::is_ascii_digit) {
            return Err(HeadError::InvalidContentLength);
        }
        let parsed = bytes.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        if length.is_some_and(|l| l != parsed) {
            return Err(HeadError::InvalidContentLength);
        }
        length = Some(parsed);
    }
    if fields > 1
        && let Some(one) = headers.get(CONTENT_LENGTH).cloned()
    {
        headers.insert(CONTENT_LENGTH, one);
    }
    Ok(length)
}

#[cfg(test)]
mod tests;
