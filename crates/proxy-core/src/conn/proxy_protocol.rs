//! The PROXY protocol header (HAProxy's v1 text line or v2 binary block) a TCP load balancer
//! sends before the client's own bytes, read before TLS and HTTP: its source address becomes
//! the connection's client.
//!
//! The socket is read up to the header's end, never past it: what follows is a TLS handshake
//! or an HTTP request, and belongs to the next layer. Once the first bytes say which version
//! is coming, the rest is peeked and as many bytes taken as are the header's; the header is
//! then parsed by the `ppp` crate. While the first bytes are still a start that both a header
//! and a request could have (`PRO` of `PROPFIND`), they are taken too (a dozen at most) and,
//! when no header follows on a listener where it is optional, handed to the codec first.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use config::ProxyProtocolConfig;

const V1_PREFIX: &[u8] = b"PROXY ";
/// The longest v1 line, `\r\n` included (the protocol's own limit).
const V1_MAX: usize = 107;
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v2 header's fixed part: signature, version and command, family, length.
const V2_FIXED: usize = 16;
/// The largest v2 header taken: addresses and a few TLVs fit many times over. A longer one
/// is refused rather than buffered.
const V2_MAX: usize = 2048;

/// What a connection's first bytes said.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Header {
    /// A header naming the client, and the address it connected to (the balancer's).
    Client {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// A header without an address (v1 `UNKNOWN`, v2 `LOCAL` or a non-IP family): the
    /// connection's own peer stands.
    Local,
    /// No header, on a listener where it is optional. `taken`: the client's first bytes,
    /// read while they could still have begun one, for the next layer to see first.
    Absent { taken: Vec<u8> },
}

/// Why a connection was closed before anything else was read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ProxyProtocolError {
    #[error("the connection does not start with a PROXY protocol header")]
    Missing,
    #[error("PROXY protocol {0} is not accepted on this listener")]
    Version(&'static str),
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(String),
    #[error("the PROXY protocol header is longer than {0} bytes")]
    TooLong(usize),
    #[error("the connection closed within the PROXY protocol header")]
    Closed,
    #[error("no complete PROXY protocol header within {0:?}")]
    TimedOut(Duration),
}

/// Reads the header `config` asks for from the start of `stream`, within `timeout`.
pub(crate) async fn read(
    stream: &mut TcpStream,
    config: &ProxyProtocolConfig,
    timeout: Duration,
) -> Result<Header, ProxyProtocolError> {
    tokio::time::timeout(timeout, read_header(stream, config))
        .await
        .unwrap_or(Err(ProxyProtocolError::TimedOut(timeout)))
}

#[derive(Debug, Clone, Copy)]
enum Version {
    V1,
    V2,
}

async fn read_header(
    stream: &mut TcpStream,
    config: &ProxyProtocolConfig,
) -> Result<Header, ProxyProtocolError> {
    let mut reader = HeaderReader::new(*config);
    let mut peeked = [0u8; 256];
    loop {
        let n = stream
            .peek(&mut peeked)
            .await
            .map_err(|_| ProxyProtocolError::Closed)?;
        if n == 0 {
            return Err(ProxyProtocolError::Closed);
        }
        let take = match reader.next(&peeked[..n])? {
            Step::Take(take) => take,
            Step::Done(header) => return Ok(header),
        };
        let into = reader.room(take);
        stream
            .read_exact(into)
            .await
            .map_err(|_| ProxyProtocolError::Closed)?;
        if let Some(header) = reader.taken()? {
            return Ok(header);
        }
    }
}

/// What to do with the bytes seen next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Take this many of them (at least one): they are the header's, or may be.
    Take(usize),
    /// Take none: the connection's bytes start here.
    Done(Header),
}

/// The header's framing, apart from the socket: told what the next bytes are, it says how
/// many belong to the header, and once they are taken, whether the header is complete.
pub(crate) struct HeaderReader {
    config: ProxyProtocolConfig,
    /// The bytes taken so far.
    header: Vec<u8>,
    version: Option<Version>,
}

impl HeaderReader {
    pub(crate) fn new(config: ProxyProtocolConfig) -> Self {
        Self {
            config,
            header: Vec::with_capacity(64),
            version: None,
        }
    }

    /// How many of `seen` (not empty: the next bytes) to take.
    pub(crate) fn next(&mut self, seen: &[u8]) -> Result<Step, ProxyProtocolError> {
        let take = match self.version {
            Some(version) => still_header(version, &self.header, seen)?,
            None => match classify(&self.header, seen) {
                Kind::Neither if self.config.required => {
                    return Err(ProxyProtocolError::Missing);
                }
                Kind::Neither => {
                    let taken = std::mem::take(&mut self.header);
                    return Ok(Step::Done(Header::Absent { taken }));
                }
                // Taken, so that the next peek waits for bytes not seen yet; all of them are
                // shorter than the signature they may begin.
                Kind::Undecided => seen.len(),
                Kind::Decided(Version::V1) if !self.config.versions.v1 => {
                    return Err(ProxyProtocolError::Version("v1"));
                }
                Kind::Decided(Version::V2) if !self.config.versions.v2 => {
                    return Err(ProxyProtocolError::Version("v2"));
                }
                Kind::Decided(decided) => {
                    self.version = Some(decided);
                    still_header(decided, &self.header, seen)?
                }
            },
        };
        Ok(Step::Take(take))
    }

    /// Room for the `take` bytes [`next`](Self::next) asked for, to be filled with them.
    pub(crate) fn room(&mut self, take: usize) -> &mut [u8] {
        let start = self.header.len();
        self.header.resize(start + take, 0);
        &mut self.header[start..]
    }

    /// After the bytes are in: the header, once complete.
    pub(crate) fn taken(&mut self) -> Result<Option<Header>, ProxyProtocolError> {
        let header = &self.header;
        match self.version {
            Some(Version::V1) if header.ends_with(b"\n") => parse_v1(header).map(Some),
            Some(Version::V2) if header.len() >= V2_FIXED => {
                let total = v2_length(header);
                if total > V2_MAX {
                    // Said as soon as the length is known, not after waiting for the bytes.
                    return Err(ProxyProtocolError::TooLong(V2_MAX));
                }
                if header.len() == total {
                    return parse_v2(header).map(Some);
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }
}

enum Kind {
    Decided(Version),
    /// A start both a header and something else could have.
    Undecided,
    Neither,
}

/// What the bytes taken so far followed by those seen next begin.
fn classify(taken: &[u8], seen: &[u8]) -> Kind {
    let mut start = [0u8; 16];
    let len = (taken.len() + seen.len()).min(start.len());
    start[..taken.len()].copy_from_slice(taken);
    start[taken.len()..len].copy_from_slice(&seen[..len - taken.len()]);
    let start = &start[..len];
    let begins = |signature: &[u8]| {
        let common = start.len().min(signature.len());
        start[..common] == signature[..common]
    };
    match (begins(V1_PREFIX), begins(V2_SIGNATURE)) {
        (true, _) if start.len() >= V1_PREFIX.len() => Kind::Decided(Version::V1),
        (_, true) if start.len() >= V2_SIGNATURE.len() => Kind::Decided(Version::V2),
        (false, false) => Kind::Neither,
        _ => Kind::Undecided,
    }
}

/// How many of `seen` (the next bytes, after `header`) belong to the header.
fn still_header(version: Version, header: &[u8], seen: &[u8]) -> Result<usize, ProxyProtocolError> {
    match version {
        Version::V2 if header.len() < V2_FIXED => Ok(seen.len().min(V2_FIXED - header.len())),
        Version::V2 => Ok(seen.len().min(v2_length(header) - header.len())),
        // Up to and with the `\n` of the line's `\r\n`.
        Version::V1 => match seen.iter().position(|&b| b == b'\n') {
            Some(end) if header.len() + end < V1_MAX => Ok(end + 1),
            None if header.len() + seen.len() < V1_MAX => Ok(seen.len()),
            _ => Err(ProxyProtocolError::TooLong(V1_MAX)),
        },
    }
}

fn v2_length(header: &[u8]) -> usize {
    V2_FIXED + usize::from(u16::from_be_bytes([header[14], header[15]]))
}

fn malformed(error: impl std::fmt::Display) -> ProxyProtocolError {
    ProxyProtocolError::Malformed(error.to_string())
}

/// The source address of a complete v2 header. TLVs after the addresses are not read.
fn parse_v2(header: &[u8]) -> Result<Header, ProxyProtocolError> {
    // LOCAL (version 2, command 0): the block, family included, is discarded unread, as the
    // protocol says (a balancer's health check).
    if header[12] == 0x20 {
        return Ok(Header::Local);
    }
    let parsed = ppp::v2::Header::try_from(header).map_err(malformed)?;
    if parsed.command == ppp::v2::Command::Local {
        return Ok(Header::Local);
    }
    Ok(match parsed.addresses {
        ppp::v2::Addresses::IPv4(a) => Header::Client {
            source: SocketAddr::new(a.source_address.into(), a.source_port),
            destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
        },
        ppp::v2::Addresses::IPv6(a) => Header::Client {
            source: SocketAddr::new(a.source_address.into(), a.source_port),
            destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
        },
        ppp::v2::Addresses::Unspecified | ppp::v2::Addresses::Unix(_) => Header::Local,
    })
}

/// The source address of a complete v1 line.
fn parse_v1(header: &[u8]) -> Result<Header, ProxyProtocolError> {
    if !header.ends_with(b"\r\n") {
        return Err(malformed("the v1 line does not end with CRLF"));
    }
    let parsed = ppp::v1::Header::try_from(header).map_err(malformed)?;
    Ok(match parsed.addresses {
        ppp::v1::Addresses::Tcp4(a) => Header::Client {
            source: SocketAddr::new(a.source_address.into(), a.source_port),
            destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
        },
        ppp::v1::Addresses::Tcp6(a) => Header::Client {
            source: SocketAddr::new(a.source_address.into(), a.source_port),
            destination: SocketAddr::new(a.destination_address.into(), a.destination_port),
        },
        ppp::v1::Addresses::Unknown => Header::Local,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::ProxyProtocolVersions;
    use tokio::io::AsyncWriteExt;

    const BOTH: ProxyProtocolConfig = ProxyProtocolConfig {
        versions: ProxyProtocolVersions { v1: true, v2: true },
        required: true,
    };

    /// A v2 PROXY header from 198.51.100.7:4242 to 10.0.0.1:443, with one TLV.
    fn v2_ipv4() -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[0x21, 0x11, 0, 12 + 7]);
        h.extend_from_slice(&[198, 51, 100, 7, 10, 0, 0, 1]);
        h.extend_from_slice(&4242u16.to_be_bytes());
        h.extend_from_slice(&443u16.to_be_bytes());
        // A TLV (type 0x04, NOOP) of 4 bytes: ignored.
        h.extend_from_slice(&[0x04, 0, 4, 1, 2, 3, 4]);
        h
    }

    /// Sends `chunks` one by one (each flushed, the next after the reader has had a go),
    /// reads the header on the other end, then what follows it.
    async fn exchange(
        config: ProxyProtocolConfig,
        chunks: Vec<Vec<u8>>,
    ) -> (Result<Header, ProxyProtocolError>, Vec<u8>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = tokio::spawn(async move {
            let mut client = TcpStream::connect(addr).await.unwrap();
            client.set_nodelay(true).unwrap();
            for chunk in chunks {
                client.write_all(&chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
            let _ = client.shutdown().await;
        });
        let (mut stream, _) = listener.accept().await.unwrap();
        let header = read(&mut stream, &config, Duration::from_secs(5)).await;
        let mut rest = Vec::new();
        if header.is_ok() {
            stream.read_to_end(&mut rest).await.unwrap();
        }
        writer.await.unwrap();
        (header, rest)
    }

    fn bytewise(bytes: &[u8]) -> Vec<Vec<u8>> {
        bytes.iter().map(|b| vec![*b]).collect()
    }

    #[tokio::test]
    async fn v1_and_v2_headers_name_the_client_and_leave_the_rest() {
        let v1 = b"PROXY TCP4 203.0.113.9 10.0.0.1 56324 443\r\nGET / HTTP/1.1\r\n\r\n".to_vec();
        let v1_6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 1234 80\r\n\x16\x03\x01".to_vec();
        let mut v2 = v2_ipv4();
        v2.extend_from_slice(b"GET /");
        for (input, client, rest) in [
            (
                v1.clone(),
                "203.0.113.9:56324",
                &b"GET / HTTP/1.1\r\n\r\n"[..],
            ),
            (v1_6.clone(), "[2001:db8::1]:1234", &b"\x16\x03\x01"[..]),
            (v2.clone(), "198.51.100.7:4242", &b"GET /"[..]),
        ] {
            let client: SocketAddr = client.parse().unwrap();
            // In one piece, and byte by byte.
            for chunks in [vec![input.clone()], bytewise(&input)] {
                let (header, after) = exchange(BOTH, chunks).await;
                assert!(
                    matches!(header, Ok(Header::Client { source, .. }) if source == client),
                    "{header:?}"
                );
                assert_eq!(after, rest);
            }
        }
    }

    #[tokio::test]
    async fn headers_without_an_address_keep_the_peer() {
        let (header, rest) = exchange(BOTH, vec![b"PROXY UNKNOWN\r\nx".to_vec()]).await;
        assert_eq!((header, rest), (Ok(Header::Local), b"x".to_vec()));
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        let (header, _) = exchange(BOTH, vec![local]).await;
        assert_eq!(header, Ok(Header::Local));
        // LOCAL with a family, with or without its addresses: the block is discarded.
        for block in [
            &[0x20, 0x11, 0, 0][..],
            &[0x20, 0x11, 0, 12, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2],
        ] {
            let mut local = V2_SIGNATURE.to_vec();
            local.extend_from_slice(block);
            local.extend_from_slice(b"GET");
            let (header, rest) = exchange(BOTH, vec![local]).await;
            assert_eq!((header, rest), (Ok(Header::Local), b"GET".to_vec()));
        }
    }

    #[tokio::test]
    async fn malformed_and_refused_headers() {
        let optional = ProxyProtocolConfig {
            required: false,
            ..BOTH
        };
        let only_v2 = ProxyProtocolConfig {
            versions: ProxyProtocolVersions {
                v1: false,
                v2: true,
            },
            ..BOTH
        };
        let mut long_v2 = V2_SIGNATURE.to_vec();
        long_v2.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        let cases: Vec<(ProxyProtocolConfig, Vec<u8>, ProxyProtocolError)> = vec![
            (
                BOTH,
                b"GET / HTTP/1.1\r\n\r\n".to_vec(),
                ProxyProtocolError::Missing,
            ),
            (
                BOTH,
                b"PROXY TCP4 300.1.1.1 10.0.0.1 1 2\r\n".to_vec(),
                ProxyProtocolError::Malformed(String::new()),
            ),
            (
                BOTH,
                b"PROXY TCP4 1.1.1.1 10.0.0.1 1 2\n".to_vec(),
                ProxyProtocolError::Malformed(String::new()),
            ),
            (
                BOTH,
                [b"PROXY ".as_slice(), &[b'A'; 200]].concat(),
                ProxyProtocolError::TooLong(V1_MAX),
            ),
            (BOTH, long_v2, ProxyProtocolError::TooLong(V2_MAX)),
            (
                only_v2,
                b"PROXY TCP4 1.1.1.1 10.0.0.1 1 2\r\n".to_vec(),
                ProxyProtocolError::Version("v1"),
            ),
            (BOTH, b"PROXY TCP4 1.1".to_vec(), ProxyProtocolError::Closed),
        ];
        for (config, input, expected) in cases {
            let (header, _) = exchange(config, vec![input.clone()]).await;
            let err = header.unwrap_err();
            match expected {
                ProxyProtocolError::Malformed(_) => {
                    assert!(
                        matches!(err, ProxyProtocolError::Malformed(_)),
                        "{input:?}: {err}"
                    )
                }
                expected => assert_eq!(err, expected, "{input:?}"),
            }
        }
        // Optional: a connection without a header loses no byte, even when its start looks
        // like one for a while ("PRO" of "PROPFIND", "\r\n" before a request line): what was
        // taken while undecided is handed back.
        for (input, taken) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], &b""[..]),
            (b"PROPFIND / HTTP/1.1\r\n\r\n", b"PRO"),
            (b"\r\nGET / HTTP/1.1\r\n\r\n", b"\r\n"),
        ] {
            for chunks in [vec![input.to_vec()], bytewise(input)] {
                let (header, rest) = exchange(optional, chunks).await;
                let Ok(Header::Absent { taken: got }) = header else {
                    panic!("{input:?}: {header:?}");
                };
                assert_eq!([&got[..], &rest].concat(), input);
                if got.is_empty() {
                    continue;
                }
                // Byte by byte, exactly the undecided start is taken; in one piece, as much
                // of it as the first peek saw undecided (nothing, when it saw all).
                assert!(taken.starts_with(&got), "{input:?}: took {got:?}");
            }
        }
    }
}
