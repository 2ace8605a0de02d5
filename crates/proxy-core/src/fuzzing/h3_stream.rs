//! HTTP/3 request streams against a proxy started in this process: the input is written as
//! it is on a new request stream of an HTTP/3 connection (after the client's control stream
//! and SETTINGS, as a real client), and the stream's answer is read. Whatever the bytes (a
//! malformed frame, undecodable QPACK, DATA before HEADERS, a length past the end), the proxy
//! must go on serving: a well-formed request on a connection of its own is answered 200. The
//! connection the input went on is made again when the proxy closed it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Buf;

/// How long an input and the request after it may take in all: generous, as sanitizers slow
/// the proxy down, and within libFuzzer's 10 s for an input (fuzz/run.sh), so that a slow
/// proxy fails here, saying so.
const INPUT_WITHIN: Duration = Duration::from_secs(8);
/// How long a connection or a request after a failed probe may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The first probe's time, on a connection that may have gone idle meanwhile.
const PROBE_WITHIN: Duration = Duration::from_secs(2);

struct Harness {
    runtime: tokio::runtime::Runtime,
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    /// The connection inputs go on, and its control stream (kept open: closing it is a
    /// connection error); `None` once the proxy closed it.
    raw: Option<(quinn::Connection, Option<quinn::SendStream>)>,
    /// An HTTP/3 client on a connection of its own, for the well-formed request after each
    /// input.
    probe: Option<Probe>,
    /// Keeps the proxy running.
    _server: crate::Server,
}

type Probe = h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>;

/// Writes `data` on a new HTTP/3 request stream to the proxy, then checks it still serves.
pub fn h3_stream(data: &[u8]) {
    static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();
    let harness = HARNESS.get_or_init(|| Mutex::new(Harness::start()));
    let mut harness = harness.lock().unwrap_or_else(PoisonError::into_inner);
    let harness = &mut *harness;
    let runtime = &harness.runtime;
    let input = async {
        if (harness.raw.as_ref()).is_none_or(|(c, _)| c.close_reason().is_some()) {
            harness.raw = Some(connect_raw(&harness.endpoint, harness.addr).await);
        }
        if let Some((raw, _)) = &harness.raw {
            send_raw(raw, data).await;
        }
        if harness.probe.is_none() {
            harness.probe = Some(connect_probe(&harness.endpoint, harness.addr).await);
        }
        let served = match &mut harness.probe {
            Some(probe) => tokio::time::timeout(PROBE_WITHIN, probe_once(probe)).await,
            None => Ok(Err("no probe".into())),
        };
        match served {
            Ok(Ok(200)) => {}
            // The probe's own connection may have gone idle: once more on a new one.
            _ => {
                let mut probe = connect_probe(&harness.endpoint, harness.addr).await;
                let again = tokio::time::timeout(ANSWER_WITHIN, probe_once(&mut probe)).await;
                assert!(
                    matches!(again, Ok(Ok(200))),
                    "the proxy stopped serving HTTP/3 after an input: {again:?}"
                );
                harness.probe = Some(probe);
            }
        }
    };
    let done = runtime.block_on(async { tokio::time::timeout(INPUT_WITHIN, input).await });
    assert!(
        done.is_ok(),
        "the proxy took over {INPUT_WITHIN:?} to take an input and answer a request after it"
    );
}

impl Harness {
    fn start() -> Self {
        let config = config::Config::from_yaml(&format!(
            "listeners:\n  - name: h3\n    address: 127.0.0.1:0\n    tls:\n      certificates:\n        - cert_chain: {cert:?}\n          private_key: {key:?}\n    http3: {{}}\n    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200, body: \"ok\\n\" }}\n",
            cert = include_str!("h3_cert.pem"),
            key = include_str!("h3_key.pem"),
        ))
        .unwrap_or_else(|e| panic!("the harness's config: {e}"));
        let server =
            crate::Server::start(config, 1).unwrap_or_else(|e| panic!("the harness's proxy: {e}"));
        let addr = server
            .addresses()
            .first()
            .map(|(_, addr)| *addr)
            .unwrap_or_else(|| panic!("the harness's proxy has no listener"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("the harness's runtime: {e}"));
        let endpoint = runtime.block_on(async {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile_certs(include_str!("h3_cert.pem")) {
                roots
                    .add(cert)
                    .unwrap_or_else(|e| panic!("the harness's root: {e}"));
            }
            let mut tls =
                rustls::ClientConfig::builder_with_provider(config::tls::material::provider())
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .unwrap_or_else(|e| panic!("the harness's TLS: {e}"))
                    .with_root_certificates(roots)
                    .with_no_client_auth();
            tls.alpn_protocols = vec![b"h3".to_vec()];
            let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
                .unwrap_or_else(|e| panic!("the harness's QUIC TLS: {e}"));
            let mut endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0)))
                .unwrap_or_else(|e| panic!("the harness's endpoint: {e}"));
            endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
            endpoint
        });
        Self {
            runtime,
            endpoint,
            addr,
            raw: None,
            probe: None,
            _server: server,
        }
    }
}

fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("the harness's certificate: {e}"))
}

async fn connect(endpoint: &quinn::Endpoint, addr: SocketAddr) -> quinn::Connection {
    let connecting = endpoint
        .connect(addr, "fuzz.test")
        .unwrap_or_else(|e| panic!("cannot connect to the proxy: {e}"));
    match tokio::time::timeout(ANSWER_WITHIN, connecting).await {
        Ok(Ok(connection)) => connection,
        other => panic!("the proxy refused a QUIC connection: {other:?}"),
    }
}

/// A connection with the client's control stream and an empty SETTINGS frame on it, as
/// HTTP/3 asks before any request.
async fn connect_raw(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
) -> (quinn::Connection, Option<quinn::SendStream>) {
    let connection = connect(endpoint, addr).await;
    let control = match connection.open_uni().await {
        Ok(mut control) => {
            // Stream type 0x00 (control), then SETTINGS (type 0x04) of length 0.
            let _ = control.write_all(&[0x00, 0x04, 0x00]).await;
            Some(control)
        }
        Err(_) => None,
    };
    (connection, control)
}

/// `data` on a new request stream, and whatever comes back until the proxy ends the stream
/// (or a moment passes).
async fn send_raw(connection: &quinn::Connection, data: &[u8]) {
    // Streams the proxy still holds (a head it waits for) use up the credit: past a moment,
    // the connection is left for a new one.
    let Ok(Ok((mut send, mut recv))) =
        tokio::time::timeout(Duration::from_secs(1), connection.open_bi()).await
    else {
        connection.close(0u32.into(), b"no stream credit");
        return;
    };
    let written = tokio::time::timeout(Duration::from_secs(1), send.write_all(data)).await;
    if !matches!(written, Ok(Ok(()))) {
        let _ = send.reset(0u32.into());
        return;
    }
    let _ = send.finish();
    let answered =
        tokio::time::timeout(Duration::from_millis(200), recv.read_to_end(1 << 20)).await;
    if answered.is_err() {
        // Given up on: its credit comes back once the proxy sees the stream go.
        let _ = recv.stop(0u32.into());
    }
}

async fn connect_probe(endpoint: &quinn::Endpoint, addr: SocketAddr) -> Probe {
    let connection = connect(endpoint, addr).await;
    let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(connection))
        .await
        .unwrap_or_else(|e| panic!("HTTP/3 over the proxy's QUIC: {e}"));
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    sender
}

/// A well-formed GET: its status.
async fn probe_once(probe: &mut Probe) -> Result<u16, String> {
    let request = http::Request::get("https://fuzz.test/probe")
        .body(())
        .map_err(|e| e.to_string())?;
    let mut stream = probe
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    stream.finish().await.map_err(|e| e.to_string())?;
    let response = stream.recv_response().await.map_err(|e| e.to_string())?;
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
        chunk.advance(chunk.remaining());
    }
    Ok(response.status().as_u16())
}
