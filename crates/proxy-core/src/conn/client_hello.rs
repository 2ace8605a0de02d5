//! The first bytes of a connection, read to pick its filter chain (Envoy's `tls_inspector`):
//! a TLS ClientHello's SNI and ALPN, or "not TLS"; and for plain text, where asked, its HTTP
//! version as its protocol (Envoy's `http_inspector`). The bytes are peeked, never taken, so
//! the chain's TLS handshake, a passthrough relay or the HTTP codec reads them whole.

use std::io;
use std::mem::MaybeUninit;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Envoy's `max_client_hello_size`: a larger ClientHello is refused, never buffered on.
pub(crate) const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;
/// The record type of a handshake message.
const HANDSHAKE: u8 = 22;

/// What a connection's first bytes say.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Hello {
    /// A TLS ClientHello; otherwise the connection is plain bytes (`raw_buffer`).
    pub(crate) tls: bool,
    /// Its SNI, in lower case.
    pub(crate) server_name: Option<String>,
    /// The ALPN protocols it offers, in its order; for plain text read for HTTP, the one
    /// its first bytes show (`h2c`, `http/1.1`, `http/1.0`), if any.
    pub(crate) alpn: Vec<Vec<u8>>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HelloError {
    /// The client closed, or sent half a ClientHello and stopped.
    Closed,
    /// A ClientHello over [`MAX_CLIENT_HELLO`].
    TooLarge,
    /// Nothing conclusive within the listener's `listener_filters_timeout`.
    Timeout,
}

/// Peeks at `stream` until its first bytes tell a whole ClientHello or not TLS; with `http`,
/// plain text until they tell its HTTP version or not HTTP.
pub(crate) async fn inspect(
    stream: &TcpStream,
    timeout: Option<Duration>,
    http: bool,
) -> Result<Hello, HelloError> {
    let read = read_hello(stream, http);
    match timeout {
        None => read.await,
        Some(limit) => tokio::time::timeout(limit, read)
            .await
            .unwrap_or(Err(HelloError::Timeout)),
    }
}

async fn read_hello(stream: &TcpStream, http: bool) -> Result<Hello, HelloError> {
    let mut buf = vec![0u8; 1024];
    let mut seen = 0;
    loop {
        let ready = stream
            .ready(Interest::READABLE)
            .await
            .map_err(|_| HelloError::Closed)?;
        // A peek that shows nothing new is a would-block: readiness is then cleared, and
        // the next segment's arrival wakes this again (peeking would otherwise spin).
        let peeked = stream.try_io(Interest::READABLE, || {
            let n = socket2::SockRef::from(stream).peek(uninit(&mut buf))?;
            if n == seen && n > 0 {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(n)
            }
        });
        let n = match peeked {
            Ok(0) => return Err(HelloError::Closed),
            Ok(n) => n,
            // The peer's end is read: nothing more is coming.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && ready.is_read_closed() => {
                return Err(HelloError::Closed);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return Err(HelloError::Closed),
        };
        seen = n;
        let parsed = match parse(&buf[..n]) {
            Parsed::Done(hello) if !hello.tls && http => http_version(&buf[..n]),
            parsed => parsed,
        };
        match parsed {
            Parsed::Done(hello) => return Ok(hello),
            Parsed::TooLarge => return Err(HelloError::TooLarge),
            Parsed::More if n < buf.len() => {}
            Parsed::More if buf.len() >= MAX_CLIENT_HELLO + RECORD_HEADER => {
                return Err(HelloError::TooLarge);
            }
            // The buffer is full: a bigger one, up to the limit.
            Parsed::More => buf.resize((buf.len() * 4).min(MAX_CLIENT_HELLO + RECORD_HEADER), 0),
        }
    }
}

/// `buf` as the buffer `peek` writes into.
#[allow(unsafe_code)]
fn uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: same layout; `peek` only writes initialised bytes, so `buf` stays initialised.
    unsafe { &mut *(std::ptr::from_mut::<[u8]>(buf) as *mut [MaybeUninit<u8>]) }
}

enum Parsed {
    Done(Hello),
    More,
    /// Its handshake header says it is over [`MAX_CLIENT_HELLO`].
    TooLarge,
}

/// HTTP/2's connection preface, which a client with prior knowledge starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A request line longer than this is not looked at further: no protocol.
const MAX_REQUEST_LINE: usize = 8 * 1024;

/// Plain text's protocol as Envoy's `http_inspector` tells it: `h2c` for HTTP/2's preface,
/// `http/1.1` or `http/1.0` for an HTTP/1 request line; nothing for anything else. Waits
/// for more while the bytes could still be either.
fn http_version(bytes: &[u8]) -> Parsed {
    let shown = |protocol: &[u8]| {
        Parsed::Done(Hello {
            alpn: vec![protocol.to_vec()],
            ..Hello::default()
        })
    };
    let common = bytes.len().min(H2_PREFACE.len());
    if bytes[..common] == H2_PREFACE[..common] {
        return match common == H2_PREFACE.len() {
            true => shown(b"h2c"),
            false => Parsed::More,
        };
    }
    // Empty lines before a request line are allowed (RFC 9112, section 2.2).
    let Some(first) = bytes.iter().position(|&b| b != b'\r' && b != b'\n') else {
        return match bytes.len() > MAX_REQUEST_LINE {
            true => Parsed::Done(Hello::default()),
            false => Parsed::More,
        };
    };
    let bytes = &bytes[first..];
    let line_end = bytes.iter().position(|&b| b == b'\n');
    let line = &bytes[..line_end.unwrap_or(bytes.len())];
    // The method is a token of letters; anything else before the first space is not HTTP.
    let method_end = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
    let method_ok = line[..method_end]
        .iter()
        .all(|b| b.is_ascii_alphabetic() || *b == b'-' || *b == b'_');
    let control = line.iter().any(|&b| b < 0x20 && b != b'\r' && b != b'\t');
    if !method_ok || control || line.len() > MAX_REQUEST_LINE {
        return Parsed::Done(Hello::default());
    }
    if line_end.is_none() {
        return Parsed::More;
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    match line.rsplit(|&b| b == b' ').next() {
        _ if method_end == 0 || method_end == line.len() => Parsed::Done(Hello::default()),
        Some(b"HTTP/1.1") => shown(b"http/1.1"),
        Some(b"HTTP/1.0") => shown(b"http/1.0"),
        _ => Parsed::Done(Hello::default()),
    }
}

/// The handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;

/// Reads a ClientHello from the bytes so far with rustls's own parser.
fn parse(bytes: &[u8]) -> Parsed {
    if bytes.first() != Some(&HANDSHAKE) {
        return Parsed::Done(Hello::default());
    }
    // The handshake header after the record's: type, then a 24-bit length.
    if let [_, _, _, _, _, CLIENT_HELLO, a, b, c, ..] = *bytes {
        let length = u32::from_be_bytes([0, a, b, c]) as usize;
        if length + 4 > MAX_CLIENT_HELLO {
            return Parsed::TooLarge;
        }
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = bytes;
    // Fed a record at a time, each looked at: rustls joins a ClientHello's records only
    // inside `accept`, and would refuse more than one record's worth of bytes unread.
    let accepted = loop {
        let record = match rest.get(3..5) {
            Some(len) => {
                (RECORD_HEADER + usize::from(u16::from_be_bytes([len[0], len[1]]))).min(rest.len())
            }
            None => rest.len(),
        };
        let mut chunk = &rest[..record];
        rest = &rest[record..];
        while !chunk.is_empty() {
            match acceptor.read_tls(&mut chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => return Parsed::Done(Hello::default()),
            }
        }
        match acceptor.accept() {
            Ok(None) if !rest.is_empty() => {}
            other => break other,
        }
    };
    match accepted {
        Ok(Some(accepted)) => {
            let hello = accepted.client_hello();
            Parsed::Done(Hello {
                tls: true,
                server_name: hello.server_name().map(str::to_ascii_lowercase),
                alpn: hello
                    .alpn()
                    .map(|protocols| protocols.map(<[u8]>::to_vec).collect())
                    .unwrap_or_default(),
            })
        }
        Ok(None) => Parsed::More,
        // Not a ClientHello rustls can read: the chains see plain bytes, as Envoy's
        // inspector's `tls_not_found`.
        Err(_) => Parsed::Done(Hello::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real ClientHello, as rustls's client writes it.
    fn client_hello(name: &str, alpn: &[&[u8]]) -> Vec<u8> {
        let provider = config::tls::material::provider();
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let server = rustls::pki_types::ServerName::try_from(name.to_owned()).expect("name");
        let mut conn =
            rustls::ClientConnection::new(std::sync::Arc::new(config), server).expect("client");
        let mut out = Vec::new();
        conn.write_tls(&mut out).expect("hello");
        out
    }

    #[test]
    fn sni_and_alpn_are_read_and_a_partial_hello_asks_for_more() {
        let hello = client_hello("WWW.Example.com", &[b"h2", b"http/1.1"]);
        match parse(&hello) {
            Parsed::Done(h) => {
                assert!(h.tls);
                assert_eq!(h.server_name.as_deref(), Some("www.example.com"));
                assert_eq!(h.alpn, [b"h2".to_vec(), b"http/1.1".to_vec()]);
            }
            _ => panic!("a whole hello"),
        }
        for cut in [1, RECORD_HEADER, hello.len() / 2, hello.len() - 1] {
            assert!(matches!(parse(&hello[..cut]), Parsed::More), "cut at {cut}");
        }
    }

    #[test]
    fn plain_bytes_are_not_tls() {
        match parse(b"GET / HTTP/1.1\r\n") {
            Parsed::Done(h) => assert_eq!(h, Hello::default()),
            _ => panic!("plain text is known at once"),
        }
    }

    /// `hello` (one record) with a padding extension of `pad` bytes, in records of at most
    /// 16 KiB.
    fn padded(hello: &[u8], pad: usize) -> Vec<u8> {
        let u16_at = |b: &[u8], i: usize| usize::from(u16::from_be_bytes([b[i], b[i + 1]]));
        let mut body = hello[RECORD_HEADER + 4..].to_vec();
        let mut i = 2 + 32;
        i += 1 + usize::from(body[i]);
        i += 2 + u16_at(&body, i);
        i += 1 + usize::from(body[i]);
        let extensions = u16_at(&body, i) + 4 + pad;
        body[i..i + 2].copy_from_slice(&u16::try_from(extensions).unwrap().to_be_bytes());
        body.extend_from_slice(&[0, 21]);
        body.extend_from_slice(&u16::try_from(pad).unwrap().to_be_bytes());
        body.resize(body.len() + pad, 0);
        let mut message = vec![CLIENT_HELLO];
        message.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        message.extend_from_slice(&body);
        let mut records = Vec::new();
        for part in message.chunks(16384) {
            records.extend_from_slice(&[HANDSHAKE, 3, 1]);
            records.extend_from_slice(&u16::try_from(part.len()).unwrap().to_be_bytes());
            records.extend_from_slice(part);
        }
        records
    }

    #[test]
    fn a_hello_over_several_records_is_joined() {
        let hello = padded(&client_hello("a.example.com", &[b"h2"]), 30_000);
        assert!(hello.len() > 30_000);
        match parse(&hello) {
            Parsed::Done(h) => {
                assert!(h.tls);
                assert_eq!(h.server_name.as_deref(), Some("a.example.com"));
            }
            _ => panic!("a whole hello of two records"),
        }
        for cut in [16384, 16384 + RECORD_HEADER + 3, hello.len() - 1] {
            assert!(matches!(parse(&hello[..cut]), Parsed::More), "cut at {cut}");
        }
    }

    #[test]
    fn a_hello_longer_than_the_limit_is_refused_from_its_header() {
        let header = [HANDSHAKE, 3, 1, 0x40, 0, CLIENT_HELLO, 0x01, 0x11, 0x70];
        assert!(matches!(parse(&header), Parsed::TooLarge));
    }

    #[test]
    fn plain_text_shows_its_http_version_or_nothing() {
        let protocol = |bytes: &[u8]| match http_version(bytes) {
            Parsed::Done(hello) => {
                assert!(!hello.tls);
                Some(
                    hello
                        .alpn
                        .first()
                        .map(|p| String::from_utf8_lossy(p).into_owned()),
                )
            }
            Parsed::More => None,
            Parsed::TooLarge => panic!("never too large"),
        };
        let some = |p: &str| Some(Some(p.to_owned()));
        assert_eq!(protocol(H2_PREFACE), some("h2c"));
        assert_eq!(protocol(&H2_PREFACE[..10]), None, "half a preface: more");
        assert_eq!(protocol(b"GET / HTTP/1.1\r\nhost: a\r\n"), some("http/1.1"));
        assert_eq!(protocol(b"POST /x HTTP/1.0\n"), some("http/1.0"));
        assert_eq!(
            protocol(b"GET /long/path?q="),
            None,
            "no line end yet: more"
        );
        assert_eq!(protocol(b"\r\n\r\nGET / HTTP/1.1\r\n"), some("http/1.1"));
        assert_eq!(protocol(b"\r\n"), None, "empty lines so far: more");
        assert_eq!(protocol(b"P"), None, "could be the preface or a method");
        assert_eq!(protocol(b"GET / HTTP/2.0\r\n"), Some(None));
        assert_eq!(protocol(b"GET / SPDY/3\r\n"), Some(None));
        assert_eq!(protocol(b"\x00\x01binary"), Some(None));
        assert_eq!(protocol(b"SSH-2.0-OpenSSH_9.6\r\n"), Some(None));
        assert_eq!(
            protocol(b"HELLO\r\n"),
            Some(None),
            "a word, no target or version"
        );
        let long = [b"GET /".as_slice(), &[b'a'; MAX_REQUEST_LINE]].concat();
        assert_eq!(protocol(&long), Some(None), "a line too long to wait for");
    }
}
