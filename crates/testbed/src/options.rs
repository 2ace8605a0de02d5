//! The `x-noop-*` request headers that steer the no-op upstream, parsed strictly so that a
//! typo in a test fails loudly (400) instead of silently testing something else.

use std::time::Duration;

use http::{HeaderMap, StatusCode};

use crate::duration::parse_duration;

pub(crate) const DELAY: &str = "x-noop-delay";
pub(crate) const STATUS: &str = "x-noop-status";
pub(crate) const SIZE: &str = "x-noop-size";
pub(crate) const CHUNKED: &str = "x-noop-chunked";
pub(crate) const ECHO: &str = "x-noop-echo";
pub(crate) const READ_RATE: &str = "x-noop-read-rate";
pub(crate) const RESPONSE_HEADER: &str = "x-noop-response-header";

/// What the request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) delay: Duration,
    pub(crate) status: StatusCode,
    pub(crate) size: Option<u64>,
    pub(crate) chunked: bool,
    pub(crate) echo: Option<Echo>,
    /// Request body bytes read per second at most; `None`: as fast as they come.
    pub(crate) read_rate: Option<u64>,
    /// Headers set on the response (each `x-noop-response-header: name: value`), replacing
    /// any the upstream would have sent (such as `content-type`).
    pub(crate) response_headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Echo {
    Headers,
    Body,
}

/// A steering header the upstream refused; becomes a 400 whose text names the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadHeader {
    pub(crate) name: &'static str,
    pub(crate) problem: String,
}

impl std::fmt::Display for BadHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad {} header: {}", self.name, self.problem)
    }
}

fn bad(name: &'static str, problem: impl Into<String>) -> BadHeader {
    BadHeader {
        name,
        problem: problem.into(),
    }
}

fn expected(name: &'static str, what: &str, got: &str) -> BadHeader {
    bad(name, format!("expected {what}, got {got:?}"))
}

/// The header's only value, if present.
fn single<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, BadHeader> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(bad(name, "given more than once"));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| bad(name, "value is not visible ASCII"))
}

impl Options {
    pub(crate) fn parse(headers: &HeaderMap) -> Result<Self, BadHeader> {
        let delay = match single(headers, DELAY)? {
            None => Duration::ZERO,
            Some(v) => parse_duration(v)
                .ok_or_else(|| expected(DELAY, "a duration like 250us, 20ms, 1s, 2m or 20", v))?,
        };
        let status = match single(headers, STATUS)? {
            None => StatusCode::OK,
            // 1xx can't be a final response: hyper would turn it into a 500 (or an upgrade).
            Some(v) => v
                .parse::<u16>()
                .ok()
                .filter(|code| (200..=999).contains(code))
                .and_then(|code| StatusCode::from_u16(code).ok())
                .ok_or_else(|| expected(STATUS, "a status code from 200 to 999", v))?,
        };
        let size = match single(headers, SIZE)? {
            None => None,
            Some(v) => Some(
                v.parse::<u64>()
                    .ok()
                    .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| expected(SIZE, "a byte count", v))?,
            ),
        };
        let chunked = match single(headers, CHUNKED)? {
            None | Some("0") | Some("false") => false,
            Some("1") | Some("true") => true,
            Some(v) => return Err(expected(CHUNKED, "1, true, 0 or false", v)),
        };
        let echo = match single(headers, ECHO)? {
            None => None,
            Some("headers") => Some(Echo::Headers),
            Some("body") => Some(Echo::Body),
            Some(v) => return Err(expected(ECHO, "headers or body", v)),
        };
        let read_rate = match single(headers, READ_RATE)? {
            None => None,
            Some(v) => Some(
                v.parse::<u64>()
                    .ok()
                    .filter(|rate| *rate > 0 && v.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| expected(READ_RATE, "bytes per second above 0", v))?,
            ),
        };
        let mut response_headers = Vec::new();
        for value in headers.get_all(RESPONSE_HEADER) {
            let text = value
                .to_str()
                .map_err(|_| bad(RESPONSE_HEADER, "value is not visible ASCII"))?;
            let parsed = text.split_once(':').and_then(|(name, value)| {
                Some((
                    http::HeaderName::from_bytes(name.trim().as_bytes()).ok()?,
                    http::HeaderValue::from_str(value.trim()).ok()?,
                ))
            });
            response_headers
                .push(parsed.ok_or_else(|| expected(RESPONSE_HEADER, "`name: value`", text))?);
        }
        if size.is_some() && echo.is_some() {
            return Err(bad(SIZE, "can't be combined with x-noop-echo"));
        }
        Ok(Self {
            delay,
            status,
            size,
            chunked,
            echo,
            read_rate,
            response_headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parse(pairs: &[(&'static str, &str)]) -> Result<Options, BadHeader> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        Options::parse(&headers)
    }

    #[test]
    fn defaults() {
        assert_eq!(
            parse(&[]).unwrap(),
            Options {
                delay: Duration::ZERO,
                status: StatusCode::OK,
                size: None,
                chunked: false,
                echo: None,
                read_rate: None,
                response_headers: Vec::new(),
            }
        );
    }

    #[test]
    fn all_set() {
        let o = parse(&[
            (DELAY, "250us"),
            (STATUS, "503"),
            (SIZE, "4096"),
            (CHUNKED, "1"),
        ])
        .unwrap();
        assert_eq!(o.delay, Duration::from_micros(250));
        assert_eq!(o.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(o.size, Some(4096));
        assert!(o.chunked);
        assert_eq!(parse(&[(ECHO, "body")]).unwrap().echo, Some(Echo::Body));
        assert_eq!(parse(&[(STATUS, "999")]).unwrap().status.as_u16(), 999);
        assert_eq!(
            parse(&[(READ_RATE, "1048576")]).unwrap().read_rate,
            Some(1 << 20)
        );
        let headers = parse(&[
            (RESPONSE_HEADER, "content-type: text/html"),
            (RESPONSE_HEADER, "etag: \"v1\""),
        ])
        .unwrap()
        .response_headers;
        assert_eq!(headers.len(), 2);
        assert_eq!(headers[0].0, "content-type");
        assert_eq!(headers[1].1, "\"v1\"");
        assert!(parse(&[(RESPONSE_HEADER, "no colon")]).is_err());
    }

    #[test]
    fn bad_values_name_the_header() {
        for (name, value) in [
            (DELAY, "soon"),
            (STATUS, "99"),
            (STATUS, "101"),
            (STATUS, "1000"),
            (STATUS, "abc"),
            (SIZE, "-1"),
            (SIZE, "+1"),
            (SIZE, "1k"),
            (CHUNKED, "yes"),
            (ECHO, "trailers"),
            (READ_RATE, "0"),
            (READ_RATE, "1MiB"),
        ] {
            let err = parse(&[(name, value)]).unwrap_err();
            assert_eq!(err.name, name, "{value}");
            assert!(err.to_string().contains(name));
        }
        assert_eq!(parse(&[(SIZE, "1"), (SIZE, "2")]).unwrap_err().name, SIZE);
        assert_eq!(
            parse(&[(SIZE, "1"), (ECHO, "headers")]).unwrap_err().name,
            SIZE
        );
        let mut headers = HeaderMap::new();
        headers.insert(DELAY, HeaderValue::from_bytes(b"1\xffs").unwrap());
        assert_eq!(Options::parse(&headers).unwrap_err().name, DELAY);
    }
}
