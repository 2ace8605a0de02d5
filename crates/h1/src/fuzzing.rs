//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`): the codec against a
//! reference reading of the same bytes. Not an API.

use bytes::BytesMut;
use http::{HeaderMap, Method, Uri, Version};

use crate::client::ResponseError;
use crate::{
    BodyLength, Chunk, ChunkedDecoder, HeadError, ResponseLength, encode_chunk, encode_last_chunk,
    parse_request,
};

const MAX_HEAD: usize = 64 * 1024;

/// How hyper 1.x's HTTP/1.1 server reads a request head: httparse, then its framing rules
/// (proto/h1/role.rs). The reference the codec is compared with.
enum Reference {
    Partial,
    Refused,
    Accepted {
        method: Method,
        uri: Uri,
        version: Version,
        headers: Vec<(String, Vec<u8>)>,
        body: BodyLength,
        keep_alive: bool,
        /// Content-Length beside Transfer-Encoding: hyper drops the length and closes after.
        both_lengths: bool,
        /// A coding before the final chunked, or chunked twice: hyper takes it.
        odd_coding: bool,
    },
}

fn hyper_reading(data: &[u8]) -> Reference {
    let mut slots = [httparse::EMPTY_HEADER; crate::MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(data) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => {}
        Ok(httparse::Status::Partial) if data.len() < MAX_HEAD => return Reference::Partial,
        _ => return Reference::Refused,
    }
    let version = if req.version == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return Reference::Refused;
    };
    let (Ok(method), Ok(uri)) = (Method::from_bytes(method.as_bytes()), Uri::try_from(path)) else {
        return Reference::Refused;
    };
    let mut length = None;
    let (mut te, mut chunked, mut chunked_count, mut other) = (false, false, 0, false);
    let mut close = false;
    let mut keep_alive_token = false;
    let mut headers = Vec::new();
    for field in req.headers.iter() {
        let name = field.name.to_ascii_lowercase();
        let value = field.value;
        let tokens = || {
            value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .filter(|t| !t.is_empty())
        };
        match name.as_str() {
            "transfer-encoding" => {
                if version == Version::HTTP_10 {
                    return Reference::Refused;
                }
                te = true;
                chunked = tokens()
                    .next_back()
                    .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
                for t in tokens() {
                    if t.eq_ignore_ascii_case(b"chunked") {
                        chunked_count += 1;
                    } else {
                        other = true;
                    }
                }
            }
            "content-length" => {
                // A list of equal values is taken (RFC 9110 section 8.6), where hyper's server
                // refuses it: a deliberate leniency. One field with one value goes on.
                let Some(len) = equal_lengths(value) else {
                    return Reference::Refused;
                };
                if length.is_some_and(|seen| seen != len) {
                    return Reference::Refused;
                }
                if length.is_none() {
                    headers.push((name, one_length(value, len)));
                }
                length = Some(len);
                continue;
            }
            "connection" => {
                close |= tokens().any(|t| t.eq_ignore_ascii_case(b"close"));
                keep_alive_token |= tokens().any(|t| t.eq_ignore_ascii_case(b"keep-alive"));
            }
            _ => {}
        }
        headers.push((name, value.to_vec()));
    }
    if te && !chunked {
        return Reference::Refused;
    }
    let body = match (te, length) {
        (true, _) => BodyLength::Chunked,
        (false, Some(0) | None) => BodyLength::Empty,
        (false, Some(len)) => BodyLength::Length(len),
    };
    Reference::Accepted {
        method,
        uri,
        version,
        headers,
        body,
        keep_alive: !close && (version == Version::HTTP_11 || keep_alive_token),
        both_lengths: te && length.is_some(),
        odd_coding: te && (chunked_count > 1 || other),
    }
}

/// The length a Content-Length value gives: digits, or a list of the same digits.
fn equal_lengths(value: &[u8]) -> Option<u64> {
    let mut items = value
        .split(|&b| b == b',')
        .map(|t| crate::field_values::parse_length(t.trim_ascii()));
    let first = items.next()??;
    items.all(|t| t == Some(first)).then_some(first)
}

/// The value that goes on for a Content-Length field of length `len`: a list as its one
/// number, a single value as it was written.
fn one_length(value: &[u8], len: u64) -> Vec<u8> {
    if value.contains(&b',') {
        len.to_string().into_bytes()
    } else {
        value.to_vec()
    }
}

/// Differential: the codec reads a head as hyper does (same method, target, version, fields
/// and framing), except where it is stricter on purpose (Content-Length beside
/// Transfer-Encoding, codings other than one final `chunked`) and where RFC 9110 section 8.6
/// lets it take more: a Content-Length list of one value, which goes on as one field with
/// one value (the reference models that). Otherwise it never takes what hyper refuses.
pub fn request_head(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let ours = parse_request(&mut buf, MAX_HEAD);
    match (ours, hyper_reading(data)) {
        (Ok(None), Reference::Partial) | (Err(_), Reference::Refused) => {}
        (Ok(Some(head)), Reference::Refused) => {
            panic!("taken here, refused by hyper: {:?}", head.request)
        }
        (
            Ok(Some(head)),
            Reference::Accepted {
                method,
                uri,
                version,
                headers,
                body,
                keep_alive,
                both_lengths,
                odd_coding,
            },
        ) => {
            assert!(
                !both_lengths && !odd_coding,
                "a stricter refusal was missed"
            );
            let req = &head.request;
            assert_eq!(req.method(), method);
            assert_eq!(req.uri(), &uri);
            assert_eq!(req.version(), version);
            let ours: Vec<(String, Vec<u8>)> = req
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect();
            // The map groups repeated names; the order within a name is kept.
            let mut theirs = headers;
            let mut ours_sorted = ours;
            theirs.sort_by(|a, b| a.0.cmp(&b.0));
            ours_sorted.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(ours_sorted, theirs);
            assert_eq!(head.body, body);
            assert_eq!(head.keep_alive, keep_alive);
        }
        (
            Err(err),
            Reference::Accepted {
                both_lengths,
                odd_coding,
                ..
            },
        ) => match err {
            HeadError::ContentLengthAndTransferEncoding => assert!(both_lengths),
            HeadError::InvalidTransferEncoding | HeadError::UnsupportedTransferCoding => {
                assert!(odd_coding, "{err}")
            }
            other => panic!("refused here, taken by hyper: {other}"),
        },
        (Ok(None), _) | (Err(_) | Ok(Some(_)), Reference::Partial) => {
            // Incomplete to one and not the other: only when the head is over the limit.
            assert!(data.len() >= MAX_HEAD, "disagree on completeness");
        }
    }
}

/// A chunked body decoded the same however the bytes arrive (the first input byte sets
/// the read size), and, re-encoded, decoded back to the same data and trailers.
pub fn chunked_body(data: &[u8]) {
    let Some((&stride, body)) = data.split_first() else {
        return;
    };
    let whole = decode(body, body.len().max(1));
    let split = decode(body, usize::from(stride % 16) + 1);
    assert_eq!(whole, split, "the split changed the reading");
    if let Ok((data, trailers, _)) = whole {
        let mut encoded = BytesMut::new();
        for piece in data.chunks(1000) {
            encode_chunk(piece, &mut encoded);
        }
        encode_last_chunk(trailers.as_ref(), &mut encoded);
        let again = decode(&encoded, encoded.len().max(1));
        let Ok((data_again, trailers_again, rest)) = again else {
            panic!("re-encoded body does not decode: {again:?}");
        };
        assert_eq!(data_again, data);
        assert_eq!(trailers_again, trailers);
        assert!(rest.is_empty());
    }
}

type Decoded = (Vec<u8>, Option<HeaderMap>, Vec<u8>);

fn decode(input: &[u8], stride: usize) -> Result<Decoded, String> {
    let mut decoder = ChunkedDecoder::new(8 * 1024);
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut pieces = input.chunks(stride).peekable();
    while let Some(piece) = pieces.next() {
        buf.extend_from_slice(piece);
        while let Some(chunk) = decoder.decode(&mut buf).map_err(|e| e.to_string())? {
            let trailers = match chunk {
                Chunk::Data(data) => {
                    body.extend_from_slice(&data);
                    continue;
                }
                Chunk::Trailers(trailers) => Some(trailers),
                Chunk::End => None,
            };
            let rest = buf.iter().chain(pieces.flatten()).copied().collect();
            return Ok((body, trailers, rest));
        }
    }
    Err("incomplete".into())
}

/// How hyper 1.x's HTTP/1.1 client reads a response head: httparse, then its framing rules
/// (proto/h1/role.rs, `Client::decoder`).
enum ResponseReference {
    Partial,
    Refused,
    /// An informational response hyper skips (100, 102-199).
    Skipped,
    Accepted {
        status: u16,
        version: Version,
        headers: Vec<(String, Vec<u8>)>,
        length: ResponseLength,
        keep_alive: bool,
        /// Content-Length beside Transfer-Encoding: hyper takes the chunked reading.
        both_lengths: bool,
        /// `chunked` more than once: hyper reads the last.
        chunked_twice: bool,
        /// Content-Length values that are not one length, which hyper does not read for a
        /// bodiless status or beside Transfer-Encoding.
        odd_length: bool,
        /// The head's length in bytes.
        head_len: usize,
    },
}

fn hyper_client_reading(data: &[u8], head_request: bool) -> ResponseReference {
    let mut slots = [httparse::EMPTY_HEADER; crate::MAX_HEADERS];
    let mut res = httparse::Response::new(&mut slots);
    let head_len = match res.parse(data) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
        Ok(httparse::Status::Partial) if data.len() < MAX_HEAD => {
            return ResponseReference::Partial;
        }
        _ => return ResponseReference::Refused,
    };
    let version = if res.version == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let Some(status) = res
        .code
        .filter(|code| http::StatusCode::from_u16(*code).is_ok())
    else {
        return ResponseReference::Refused;
    };
    let mut headers = Vec::new();
    let (mut te, mut chunked, mut chunked_count) = (false, false, 0);
    let (mut lengths, mut collapsed, mut bad_length) = (Vec::new(), false, false);
    let (mut close, mut keep_alive_token) = (false, false);
    for field in res.headers.iter() {
        let name = field.name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_bytes(field.value).is_err()
        {
            return ResponseReference::Refused;
        }
        let tokens = || {
            field
                .value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .filter(|t| !t.is_empty())
        };
        match name.as_str() {
            "transfer-encoding" => {
                te = true;
                if let Some(last) = tokens().next_back() {
                    chunked = last.eq_ignore_ascii_case(b"chunked");
                }
                chunked_count += tokens()
                    .filter(|t| t.eq_ignore_ascii_case(b"chunked"))
                    .count();
            }
            "content-length" => {
                // hyper takes a list of equal values; one field with one value goes on
                // (RFC 9110 section 8.6).
                for t in field.value.split(|&b| b == b',') {
                    match crate::field_values::parse_length(t.trim_ascii()) {
                        Some(len) => lengths.push(len),
                        None => bad_length = true,
                    }
                }
                if !collapsed && let Some(len) = equal_lengths(field.value) {
                    headers.push((name, one_length(field.value, len)));
                }
                collapsed = true;
                continue;
            }
            "connection" => {
                close |= tokens().any(|t| t.eq_ignore_ascii_case(b"close"));
                keep_alive_token |= tokens().any(|t| t.eq_ignore_ascii_case(b"keep-alive"));
            }
            _ => {}
        }
        headers.push((name, field.value.to_vec()));
    }
    let differing = lengths.windows(2).any(|w| w[0] != w[1]);
    let length = match status {
        101 | 204 | 304 => ResponseLength::NoBody,
        100..=199 => return ResponseReference::Skipped,
        _ if head_request => ResponseLength::NoBody,
        _ if te && version == Version::HTTP_10 => return ResponseReference::Refused,
        _ if te && chunked => ResponseLength::Chunked,
        _ if te => ResponseLength::UntilClose,
        _ if bad_length || differing => {
            return ResponseReference::Refused;
        }
        _ => match lengths.first() {
            Some(&len) => ResponseLength::Length(len),
            None => ResponseLength::UntilClose,
        },
    };
    ResponseReference::Accepted {
        status,
        version,
        headers,
        keep_alive: length != ResponseLength::UntilClose
            && !close
            && (version == Version::HTTP_11 || keep_alive_token),
        length,
        both_lengths: te && !lengths.is_empty(),
        chunked_twice: te && chunked_count > 1,
        odd_length: bad_length || differing,
        head_len,
    }
}

/// Differential: the codec reads a response head as hyper's client does (same status,
/// version, fields and framing; the first input byte says whether the request was a HEAD),
/// except where it is stricter on purpose: both lengths, `chunked` twice, lengths it does not
/// read. Repeated Content-Length fields go on as one. It never takes what hyper refuses.
pub fn response_head(data: &[u8]) {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let head_request = flags & 1 == 1;
    let mut buf = BytesMut::from(data);
    let ours = crate::client::parse_response(&mut buf, MAX_HEAD, head_request);
    match (ours, hyper_client_reading(data, head_request)) {
        (Ok(None), ResponseReference::Partial) | (Err(_), ResponseReference::Refused) => {}
        (Ok(Some(head)), ResponseReference::Skipped) => {
            assert!(head.parts.status.is_informational());
            assert_eq!(head.length, ResponseLength::NoBody);
        }
        (Err(err), ResponseReference::Skipped) => {
            // hyper skips an informational head before looking at its framing fields.
            assert!(
                matches!(
                    err,
                    ResponseError::InvalidContentLength | ResponseError::ChunkedTwice
                ),
                "refused here, skipped by hyper: {err}"
            );
        }
        (Ok(Some(head)), ResponseReference::Refused) => {
            panic!("taken here, refused by hyper: {:?}", head.parts)
        }
        (
            Ok(Some(head)),
            ResponseReference::Accepted {
                status,
                version,
                headers,
                length,
                keep_alive,
                both_lengths,
                chunked_twice,
                odd_length,
                head_len,
            },
        ) => {
            assert!(!odd_length, "a stricter refusal was missed");
            // A bodiless response's other framing fields are not read for its length.
            if length != ResponseLength::NoBody {
                assert!(
                    !both_lengths && !chunked_twice,
                    "a stricter refusal was missed"
                );
            }
            assert_eq!(head.parts.status.as_u16(), status);
            assert_eq!(head.parts.version, version);
            let mut ours: Vec<(String, Vec<u8>)> = head
                .parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect();
            let mut theirs = headers;
            ours.sort_by(|a, b| a.0.cmp(&b.0));
            theirs.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(ours, theirs);
            assert_eq!(head.length, length);
            assert_eq!(head.keep_alive, keep_alive);
            assert_eq!(data.len() - buf.len(), head_len, "the head's end");
        }
        (
            Err(err),
            ResponseReference::Accepted {
                both_lengths,
                chunked_twice,
                odd_length,
                ..
            },
        ) => match err {
            ResponseError::ContentLengthAndTransferEncoding => assert!(both_lengths),
            ResponseError::ChunkedTwice => assert!(chunked_twice),
            ResponseError::InvalidContentLength => assert!(odd_length),
            other => panic!("refused here, taken by hyper: {other}"),
        },
        (Ok(None), _) | (Err(_) | Ok(Some(_)), ResponseReference::Partial) => {
            assert!(data.len() >= MAX_HEAD, "disagree on completeness");
        }
    }
}
