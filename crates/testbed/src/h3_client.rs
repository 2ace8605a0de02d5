//! An HTTP/3 client on quinn and h3, for tests and benchmarks on loopback: the proxy's
//! certificate is not checked, and the flow-control windows are the caller's, so that a
//! client can stop reading and let the proxy's side fill.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// A request sender on one HTTP/3 connection (cloned, one request per clone at a time).
pub type H3Sender = h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>;

/// One request's stream: its response head and body are read from it.
pub type H3Stream = h3::client::RequestStream<h3_quinn::BidiStream<bytes::Bytes>, bytes::Bytes>;

/// Reads a response body to its end: its length.
pub async fn read_to_end(stream: &mut H3Stream) -> Result<u64, String> {
    use bytes::Buf;
    let mut length = 0u64;
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
        length += chunk.remaining() as u64;
        chunk.advance(chunk.remaining());
    }
    Ok(length)
}

/// Reads a response body to its end: its length and SHA-256 (hex).
pub async fn read_digest(stream: &mut H3Stream) -> Result<(u64, String), String> {
    use bytes::Buf;
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut length = 0u64;
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
        while chunk.has_remaining() {
            let piece = chunk.chunk();
            hasher.update(piece);
            length += piece.len() as u64;
            let n = piece.len();
            chunk.advance(n);
        }
    }
    let digest = hasher.finalize();
    Ok((length, digest.iter().map(|b| format!("{b:02x}")).collect()))
}

/// Ends the request's body. A server that has answered without needing the rest may have
/// asked the client to stop sending, with no error ([`not_wanted`]): the request went as it
/// should, and its response is still to be read (RFC 9114 section 4.1).
pub async fn finish(stream: &mut H3Stream) -> Result<(), h3::error::StreamError> {
    not_wanted_is_fine(stream.finish().await)
}

/// Sends a piece of the request's body; a server that no longer wants it is not a failure,
/// as for [`finish`].
pub async fn send_body(
    stream: &mut H3Stream,
    data: bytes::Bytes,
) -> Result<(), h3::error::StreamError> {
    not_wanted_is_fine(stream.send_data(data).await)
}

/// A send that failed only because the server asked for no more is no failure.
fn not_wanted_is_fine(
    sent: Result<(), h3::error::StreamError>,
) -> Result<(), h3::error::StreamError> {
    match sent {
        Err(error) if not_wanted(&error) => Ok(()),
        other => other,
    }
}

/// Whether the server asked the client to stop sending with H3_NO_ERROR, or with a code
/// HTTP/3 does not define, which stands for H3_NO_ERROR (RFC 9114 sections 8.1 and 9): it
/// has what it needs. (quinn says 0, no HTTP/3 code, for a stream dropped unread.)
pub fn not_wanted(error: &h3::error::StreamError) -> bool {
    let h3::error::StreamError::RemoteTerminate { code, .. } = error else {
        return false;
    };
    let code = code.value();
    // HTTP/3's own codes, QPACK's (RFC 9204) and H3_DATAGRAM_ERROR (RFC 9297).
    let defined = matches!(code, 0x101..=0x110 | 0x200..=0x202 | 0x33);
    !defined
}

/// Sends `len` bytes of the test pattern as the request's body, in 64 KiB pieces, and ends it.
pub async fn send_pattern(stream: &mut H3Stream, len: u64) -> Result<(), String> {
    let mut offset = 0u64;
    while offset < len {
        let piece = (len - offset).min(64 << 10) as usize;
        send_body(stream, crate::pattern_bytes(offset, piece))
            .await
            .map_err(|e| e.to_string())?;
        offset += piece as u64;
    }
    finish(stream).await.map_err(|e| e.to_string())
}

/// Cancels a request as a client that gave up on it: both directions of its stream reset.
pub fn cancel(stream: &mut H3Stream) {
    stream.stop_sending(h3::error::Code::H3_REQUEST_CANCELLED);
    stream.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
}

/// A TLS 1.3 client config that accepts any certificate, offering `alpn`, resuming no session
/// (every handshake is a full one).
pub fn insecure_client_tls(alpn: &[u8]) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

/// Where and how to connect.
pub struct H3Client {
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    server_name: String,
    tickets: Option<Arc<NotedTickets>>,
}

/// rustls's session store, noting the early data each TLS 1.3 ticket allows.
#[derive(Debug)]
struct NotedTickets {
    cache: rustls::client::ClientSessionMemoryCache,
    early_data: std::sync::Mutex<Vec<u32>>,
}

impl Default for NotedTickets {
    fn default() -> Self {
        Self {
            cache: rustls::client::ClientSessionMemoryCache::new(32),
            early_data: std::sync::Mutex::default(),
        }
    }
}

impl rustls::client::ClientSessionStore for NotedTickets {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: rustls::NamedGroup) {
        self.cache.set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.cache.kx_hint(server_name)
    }

    fn set_tls12_session(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.cache.set_tls12_session(server_name, value);
    }

    fn tls12_session(
        &self,
        server_name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.cache.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.cache.remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        if let Ok(mut noted) = self.early_data.lock() {
            noted.push(value.max_early_data_size());
        }
        self.cache.insert_tls13_ticket(server_name, value);
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.cache.take_tls13_ticket(server_name)
    }
}

/// Flow-control windows the client grants the proxy: QUIC extends them only as the
/// application reads.
#[derive(Clone, Copy)]
pub struct Windows {
    pub stream: u32,
    pub connection: u32,
}

impl H3Client {
    /// A client for `addr` asking for `server_name`; `windows`: quinn's defaults if `None`.
    pub fn new(
        addr: SocketAddr,
        server_name: &str,
        windows: Option<Windows>,
    ) -> Result<Self, String> {
        let tls = insecure_client_tls(b"h3").map_err(|e| e.to_string())?;
        Self::with_tls(addr, server_name, windows, tls)
    }

    /// A client for `addr` that resumes the sessions the proxy gives it and, where a
    /// session allows, sends its first requests in 0-RTT ([`Self::connect_early`]).
    /// [`Self::tickets`] tells what the proxy's tickets allow.
    pub fn resuming(addr: SocketAddr, server_name: &str) -> Result<Self, String> {
        let mut tls = insecure_client_tls(b"h3").map_err(|e| e.to_string())?;
        let tickets = Arc::new(NotedTickets::default());
        tls.resumption = rustls::client::Resumption::store(Arc::clone(&tickets) as _);
        tls.enable_early_data = true;
        let mut client = Self::with_tls(addr, server_name, None, tls)?;
        client.tickets = Some(tickets);
        Ok(client)
    }

    /// The early data each session ticket the proxy gave allows, in bytes, in the order they
    /// came (QUIC's is `u32::MAX` or 0); empty for a client that does not resume.
    pub fn tickets(&self) -> Vec<u32> {
        (self.tickets.as_ref()).map_or_else(Vec::new, |t| {
            t.early_data
                .lock()
                .map_or_else(|_| Vec::new(), |e| e.clone())
        })
    }

    fn with_tls(
        addr: SocketAddr,
        server_name: &str,
        windows: Option<Windows>,
        tls: rustls::ClientConfig,
    ) -> Result<Self, String> {
        let crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        // A connection left waiting (a stalled reader, a slow test machine) is not closed for
        // idleness meanwhile.
        transport.keep_alive_interval(Some(std::time::Duration::from_secs(5)));
        if let Some(windows) = windows {
            transport
                .stream_receive_window(windows.stream.into())
                .receive_window(windows.connection.into());
        }
        config.transport_config(Arc::new(transport));
        let bind = SocketAddr::new(addr.ip(), 0);
        let mut endpoint = quinn::Endpoint::client(bind).map_err(|e| e.to_string())?;
        endpoint.set_default_client_config(config);
        Ok(Self {
            endpoint,
            addr,
            server_name: server_name.to_owned(),
            tickets: None,
        })
    }

    /// A new connection (its driver on a task of its own).
    pub async fn connect(&self) -> Result<H3Sender, String> {
        let connection = self
            .endpoint
            .connect(self.addr, &self.server_name)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        h3_over(connection).await
    }

    /// A new connection whose requests go in 0-RTT until the handshake ends, which the
    /// returned future tells (true: the proxy took the early data); `None` if the client
    /// holds no session that allows early data (the connection attempt is dropped).
    pub async fn connect_early(
        &self,
    ) -> Result<Option<(H3Sender, quinn::ZeroRttAccepted)>, String> {
        let connecting = self
            .endpoint
            .connect(self.addr, &self.server_name)
            .map_err(|e| e.to_string())?;
        let Ok((connection, accepted)) = connecting.into_0rtt() else {
            return Ok(None);
        };
        Ok(Some((h3_over(connection).await?, accepted)))
    }

    /// Closes every connection and waits for the proxy to learn of it.
    pub async fn close(&self) {
        self.endpoint.close(0u32.into(), b"done");
        self.endpoint.wait_idle().await;
    }
}

/// HTTP/3 on a connection, its driver on a task of its own.
async fn h3_over(connection: quinn::Connection) -> Result<H3Sender, String> {
    let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(connection))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok(sender)
}

/// Accepts any certificate: the proxy's, made for the run, on loopback.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
