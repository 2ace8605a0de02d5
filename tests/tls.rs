//! TLS through the real binary: termination with SNI and ALPN, client certificates,
//! resumption, certificate reload, garbage on the TLS port, and TLS to upstreams. The
//! certificates are made at test time with rcgen; the clients are rustls over real sockets.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::certs::{Ca, Leaf};
use common::*;
use http::{Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// What a test client offers.
struct ClientOptions {
    alpn: Vec<&'static [u8]>,
    tls12_only: bool,
    client_cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            alpn: vec![b"http/1.1"],
            tls12_only: false,
            client_cert: None,
        }
    }
}

fn client_config(
    roots: rustls::RootCertStore,
    options: ClientOptions,
) -> Arc<rustls::ClientConfig> {
    let versions: &[&rustls::SupportedProtocolVersion] = if options.tls12_only {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match options.client_cert {
        Some((cert, key)) => builder.with_client_auth_cert(vec![cert], key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = options.alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn tls_connect(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    server_name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio_rustls::TlsConnector::from(Arc::clone(config)).connect(name, tcp),
    )
    .await
    .map_err(|_| std::io::Error::other("handshake timed out"))?
}

/// The certificate the server presented.
fn peer_leaf(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

async fn h1_over(
    stream: TlsStream<TcpStream>,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn h2_over(
    stream: TlsStream<TcpStream>,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

async fn h1_get(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    name: &str,
) -> Response<Incoming> {
    let stream = tls_connect(addr, config, name).await.unwrap();
    let mut sender = h1_over(stream).await;
    answered(
        "an HTTP/1.1 request over TLS",
        sender.send_request(get("/", &[])),
    )
    .await
    .unwrap()
}

/// A config with one TLS listener (`tls_block` indented under `tls:`) forwarding to `upstream`.
fn tls_config(tls_block: &str, upstream: SocketAddr) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: secure
    address: 127.0.0.1:0
    tls:
{tls_block}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

fn one_certificate(cert: &str, key: &str, extra: &str) -> String {
    format!("      certificates:\n        - {{ cert_chain: {cert}, private_key: {key} }}\n{extra}")
}

async fn upstream() -> (SocketAddr, testbed::NoopHandle) {
    let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (upstream.local_addr(), upstream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_http2_over_tls_chosen_by_alpn() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["localhost", "127.0.0.1"]).write(&dir, "edge");
    let proxy = Proxy::start(&tls_config(&one_certificate(&cert, &key, ""), up), 2);
    let admin = proxy.admin.unwrap();

    // ALPN http/1.1; the upstream sees the request came over TLS.
    let h1 = client_config(ca.roots(), ClientOptions::default());
    let stream = tls_connect(proxy.addr(), &h1, "localhost").await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut sender = h1_over(stream).await;
    let response = sender
        .send_request(get("/", &[("x-noop-echo", "headers")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), Version::HTTP_11);
    let echoed = text(response.into_body()).await;
    assert!(echoed.contains("x-forwarded-proto: https"), "{echoed}");
    // Keep-alive over TLS: a second request on the same connection.
    sender.ready().await.unwrap();
    let again = sender.send_request(get("/", &[])).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);

    // ALPN h2: HTTP/2 without prior knowledge.
    let h2 = client_config(
        ca.roots(),
        ClientOptions {
            alpn: vec![b"h2", b"http/1.1"],
            ..Default::default()
        },
    );
    let stream = tls_connect(proxy.addr(), &h2, "localhost").await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut sender = h2_over(stream).await;
    let mut requests = Vec::new();
    for _ in 0..10 {
        requests.push(sender.send_request(get_h2("/", &[])));
    }
    for response in futures_join(requests).await {
        let response = response.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.version(), Version::HTTP_2);
    }

    // No ALPN at all: the first bytes decide, as on a cleartext port.
    let plain = client_config(
        ca.roots(),
        ClientOptions {
            alpn: vec![],
            ..Default::default()
        },
    );
    let response = h1_get(proxy.addr(), &plain, "127.0.0.1").await;
    assert_eq!(response.status(), StatusCode::OK);

    assert_eq!(stat(admin, "ssl_handshake"), 3);
    let alpn = admin_request(admin, "GET", "/stats?filter=ssl_alpn").1;
    for line in [
        r#"ssl_alpn{listener="secure",protocol="h2"}: 1"#,
        r#"ssl_alpn{listener="secure",protocol="http/1.1"}: 1"#,
        r#"ssl_alpn{listener="secure",protocol="none"}: 1"#,
    ] {
        assert!(alpn.contains(line), "{line} in\n{alpn}");
    }
    assert_eq!(stat(admin, "ssl_no_certificate"), 3);
    assert!(
        admin_request(admin, "GET", "/stats?filter=ssl_versions")
            .1
            .contains(r#"ssl_versions{listener="secure",version="TLSv1_3"}: 3"#)
    );
    assert_eq!(stat(admin, "ssl_connection_error"), 0);
}

/// Awaits every future, in order.
async fn futures_join<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let handles: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out = Vec::with_capacity(handles.len());
    for f in handles {
        out.push(f.await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_the_certificate_and_unknown_names_get_the_default_or_a_refusal() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let a = ca.leaf(&["a.test"]);
    let b = ca.leaf(&["*.b.test"]);
    let fallback = ca.leaf(&["localhost", "other.test"]);
    let (a_cert, a_key) = a.write(&dir, "a");
    let (b_cert, b_key) = b.write(&dir, "b");
    let (d_cert, d_key) = fallback.write(&dir, "default");
    let certificates = format!(
        "      certificates:
        - {{ cert_chain: {a_cert}, private_key: {a_key}, server_names: [a.test] }}
        - {{ cert_chain: {d_cert}, private_key: {d_key} }}
        - {{ cert_chain: {b_cert}, private_key: {b_key}, server_names: [\"*.b.test\"] }}
"
    );
    let client = client_config(ca.roots(), ClientOptions::default());

    let proxy = Proxy::start(&tls_config(&certificates, up), 1);
    for (name, expected) in [
        ("a.test", &a.der),
        ("x.b.test", &b.der),
        ("other.test", &fallback.der),
    ] {
        let stream = tls_connect(proxy.addr(), &client, name).await.unwrap();
        assert_eq!(&peer_leaf(&stream), expected, "certificate for {name}");
        let response = h1_over(stream)
            .await
            .send_request(get("/", &[]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    let rejecting = Proxy::start(
        &tls_config(
            &format!("{certificates}      unknown_server_name: reject\n"),
            up,
        ),
        1,
    );
    let stream = tls_connect(rejecting.addr(), &client, "a.test")
        .await
        .unwrap();
    assert_eq!(peer_leaf(&stream), a.der);
    let refused = tls_connect(rejecting.addr(), &client, "other.test").await;
    assert!(refused.is_err(), "a name without a certificate is refused");
    let admin = rejecting.admin.unwrap();
    // The proxy counts a failed handshake after the client has given up on it: polled.
    assert_eq!(stat_settled(admin, "ssl_connection_error", 1), 1);
    assert_eq!(stat_settled(admin, "ssl_handshake", 1), 1);
}

/// A proxy whose listener requires client certificates from `clients.pem` in the scratch
/// directory: (that directory, the server's CA, the clients' CA, the proxy).
fn requiring_client_certificates(up: SocketAddr) -> (ScratchDir, Ca, Ca, Proxy) {
    let dir = ScratchDir::new();
    let ca = Ca::new("server ca");
    let clients = Ca::new("client ca");
    let (cert, key) = ca.leaf(&["localhost"]).write(&dir, "edge");
    let client_ca = dir.write("clients.pem", &clients.pem());
    let tls = one_certificate(
        &cert,
        &key,
        &format!(
            "      client_certificate: {{ ca: {} }}\n",
            client_ca.display()
        ),
    );
    let proxy = Proxy::start(&tls_config(&tls, up), 1);
    (dir, ca, clients, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_when_configured() {
    let (up, _upstream) = upstream().await;
    let (_dir, ca, clients, proxy) = requiring_client_certificates(up);
    let admin = proxy.admin.unwrap();

    // Without a certificate: TLS 1.3 clients learn of the refusal on their first read.
    let anonymous = client_config(ca.roots(), ClientOptions::default());
    let refused = match tls_connect(proxy.addr(), &anonymous, "localhost").await {
        Err(_) => true,
        Ok(stream) => {
            let mut sender = h1_over(stream).await;
            sender.send_request(get("/", &[])).await.is_err()
        }
    };
    assert!(refused, "no client certificate: refused");

    // A certificate from another CA is refused too.
    let stranger = Ca::new("another ca").leaf(&["client"]);
    let wrong = client_config(
        ca.roots(),
        ClientOptions {
            client_cert: Some((stranger.der.clone(), stranger.key_der())),
            ..Default::default()
        },
    );
    let refused = match tls_connect(proxy.addr(), &wrong, "localhost").await {
        Err(_) => true,
        Ok(stream) => h1_over(stream)
            .await
            .send_request(get("/", &[]))
            .await
            .is_err(),
    };
    assert!(refused, "untrusted client certificate: refused");

    let known = clients.leaf(&["client"]);
    let trusted = client_config(
        ca.roots(),
        ClientOptions {
            client_cert: Some((known.der.clone(), known.key_der())),
            ..Default::default()
        },
    );
    let response = h1_get(proxy.addr(), &trusted, "localhost").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(stat_settled(admin, "ssl_handshake", 1), 1);
    assert_eq!(stat_settled(admin, "ssl_no_certificate", 0), 0);
    assert_eq!(stat_settled(admin, "ssl_connection_error", 2), 2);
}

/// An origin answering with the `x-forwarded-client-cert` it got (`none` without one).
async fn xfcc_origin() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let values: Vec<String> = (req.headers().get_all("x-forwarded-client-cert"))
                        .iter()
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .collect();
                    let body = if values.is_empty() {
                        "none".to_owned()
                    } else {
                        values.join(" | ")
                    };
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, task)
}

/// `x-forwarded-client-cert`, as Envoy's `forward_client_cert_details`: a client's header is
/// removed by default and without a client certificate; over mutual TLS `sanitize_set`
/// replaces it with the certificate's hash and the details asked for, `append_forward` adds
/// them after the client's, `forward_only` passes it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_details_are_forwarded_as_configured() {
    use sha2::Digest;
    let (up, _origin) = xfcc_origin().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("server ca");
    let clients = Ca::new("client ca");
    let (cert, key) = ca.leaf(&["localhost"]).write(&dir, "edge");
    let client_ca = dir
        .write("clients.pem", &clients.pem())
        .display()
        .to_string();
    let listener = |name: &str, http: &str| {
        format!(
            r#"  - name: {name}
    address: 127.0.0.1:0
    tls:
      certificates: [{{ cert_chain: {cert}, private_key: {key} }}]
      client_certificate: {{ ca: {client_ca}, required: false }}
    http: {http}
    routes: [{{ match: {{ prefix: / }}, cluster: origin }}]
"#
        )
    };
    let yaml = format!(
        "admin: {{ address: 127.0.0.1:0 }}\nlisteners:\n{}{}{}{}  - name: plain\n    address: 127.0.0.1:0\n    routes: [{{ match: {{ prefix: / }}, cluster: origin }}]\nclusters:\n  - name: origin\n    endpoints: [{up}]\n",
        listener(
            "set",
            "{ forward_client_cert: sanitize_set, set_current_client_cert_details: { subject: true, uri: true, dns: true } }"
        ),
        listener("append", "{ forward_client_cert: append_forward }"),
        listener("forward", "{ forward_client_cert: forward_only }"),
        listener("default", "{}"),
    );
    let proxy = Proxy::start(&yaml, 1);
    let dump: serde_json::Value =
        serde_json::from_str(&admin_request(proxy.admin.unwrap(), "GET", "/config_dump").1)
            .unwrap();
    let addr = |name: &str| -> SocketAddr {
        (dump["listeners"].as_array().unwrap().iter())
            .find(|l| l["name"] == name)
            .unwrap()["bound_address"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let known = clients.leaf(&["client.example.com"]);
    let hash: String = sha2::Sha256::digest(known.der.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mutual = client_config(
        ca.roots(),
        ClientOptions {
            client_cert: Some((known.der.clone(), known.key_der())),
            ..Default::default()
        },
    );
    let anonymous = client_config(ca.roots(), ClientOptions::default());
    let claimed = [("x-forwarded-client-cert", "Hash=forged")];
    let fetch = async |listener: &str, client: &Arc<rustls::ClientConfig>| {
        let stream = tls_connect(addr(listener), client, "localhost")
            .await
            .unwrap();
        let mut sender = h1_over(stream).await;
        let response = sender.send_request(get("/", &claimed)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        text(response.into_body()).await
    };
    let ours =
        format!("Hash={hash};Subject=\"CN=rcgen self signed cert\";URI=;DNS=client.example.com");
    assert_eq!(fetch("set", &mutual).await, ours);
    assert_eq!(fetch("set", &anonymous).await, "none");
    // The same over HTTP/2.
    let mutual_h2 = client_config(
        ca.roots(),
        ClientOptions {
            alpn: vec![b"h2"],
            client_cert: Some((known.der.clone(), known.key_der())),
            ..Default::default()
        },
    );
    let stream = tls_connect(addr("set"), &mutual_h2, "localhost")
        .await
        .unwrap();
    let mut h2 = h2_over(stream).await;
    let response = h2.send_request(get_h2("/", &claimed)).await.unwrap();
    assert_eq!(text(response.into_body()).await, ours);
    assert_eq!(
        fetch("append", &mutual).await,
        format!("Hash=forged,Hash={hash}")
    );
    assert_eq!(fetch("append", &anonymous).await, "none");
    assert_eq!(fetch("forward", &mutual).await, "Hash=forged");
    assert_eq!(fetch("forward", &anonymous).await, "none");
    assert_eq!(fetch("default", &mutual).await, "none");
    let plain = send_h1(addr("plain"), get("/", &claimed)).await;
    assert_eq!(text(plain.into_body()).await, "none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_with_tls_1_3_and_1_2() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["localhost"]).write(&dir, "edge");
    let proxy = Proxy::start(&tls_config(&one_certificate(&cert, &key, ""), up), 2);
    let admin = proxy.admin.unwrap();
    for tls12_only in [false, true] {
        // One client config: its session store carries the ticket to the next connection.
        let client = client_config(
            ca.roots(),
            ClientOptions {
                tls12_only,
                ..Default::default()
            },
        );
        let first = tls_connect(proxy.addr(), &client, "localhost")
            .await
            .unwrap();
        assert_eq!(
            first.get_ref().1.handshake_kind(),
            Some(rustls::HandshakeKind::Full)
        );
        // TLS 1.3 tickets arrive after the handshake: a request reads them.
        let mut sender = h1_over(first).await;
        assert_eq!(
            sender.send_request(get("/", &[])).await.unwrap().status(),
            StatusCode::OK
        );
        let second = tls_connect(proxy.addr(), &client, "localhost")
            .await
            .unwrap();
        assert_eq!(
            second.get_ref().1.handshake_kind(),
            Some(rustls::HandshakeKind::Resumed),
            "resumed (TLS 1.2 only: {tls12_only})"
        );
        let mut sender = h1_over(second).await;
        assert_eq!(
            sender.send_request(get("/", &[])).await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(stat(admin, "ssl_session_reused"), 2);
    assert!(
        admin_request(admin, "GET", "/stats?filter=ssl_versions")
            .1
            .contains(r#"ssl_versions{listener="secure",version="TLSv1_2"}: 2"#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_ca_ends_resumption_of_sessions_verified_under_the_old_one() {
    let (up, _upstream) = upstream().await;
    let (dir, ca, clients, proxy) = requiring_client_certificates(up);
    let admin = proxy.admin.unwrap();
    let leaf = clients.leaf(&["client"]);
    let client = client_config(
        ca.roots(),
        ClientOptions {
            client_cert: Some((leaf.der.clone(), leaf.key_der())),
            ..Default::default()
        },
    );
    // Connects with the client's session store and makes one request (which also reads
    // the TLS 1.3 tickets): how the handshake went, or None if it was refused.
    let visit = || async {
        let stream = tls_connect(proxy.addr(), &client, "localhost").await.ok()?;
        let kind = stream.get_ref().1.handshake_kind();
        let response = h1_over(stream)
            .await
            .send_request(get("/", &[]))
            .await
            .ok()?;
        (response.status() == StatusCode::OK).then_some(kind)
    };
    assert_eq!(visit().await, Some(Some(rustls::HandshakeKind::Full)));
    assert_eq!(visit().await, Some(Some(rustls::HandshakeKind::Resumed)));

    // The same CA read again: sessions keep resuming.
    let (status, body) = admin_request(admin, "POST", "/reload_certs");
    assert_eq!(status, 200, "{body}");
    assert_eq!(visit().await, Some(Some(rustls::HandshakeKind::Resumed)));

    // Another CA: the client's certificate is no longer trusted, and its session does not
    // get it in either.
    dir.write("clients.pem", &Ca::new("new client ca").pem());
    let (status, body) = admin_request(admin, "POST", "/reload_certs");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        visit().await,
        None,
        "a session from before the CA change resumed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_version_1_3_refuses_tls_1_2_clients() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["localhost"]).write(&dir, "edge");
    let tls = one_certificate(&cert, &key, "      min_version: \"1.3\"\n");
    let proxy = Proxy::start(&tls_config(&tls, up), 1);
    let old = client_config(
        ca.roots(),
        ClientOptions {
            tls12_only: true,
            ..Default::default()
        },
    );
    assert!(tls_connect(proxy.addr(), &old, "localhost").await.is_err());
    let current = client_config(ca.roots(), ClientOptions::default());
    assert_eq!(
        h1_get(proxy.addr(), &current, "localhost").await.status(),
        StatusCode::OK
    );
}

/// With `watch: true`, certificate files replaced by rename (as certificate agents write
/// them) serve new handshakes without a reload asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_certificate_files_replaced_by_rename_serve_new_handshakes() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("watch ca");
    let first = ca.leaf(&["localhost"]);
    let (cert, key) = first.write(&dir, "edge");
    let config = format!(
        "watch: true\n{}",
        tls_config(&one_certificate(&cert, &key, ""), up)
    );
    let proxy = Proxy::start(&config, 1);
    let client = client_config(ca.roots(), ClientOptions::default());
    let stream = tls_connect(proxy.addr(), &client, "localhost")
        .await
        .unwrap();
    assert_eq!(peer_leaf(&stream), first.der);

    let second = ca.leaf(&["localhost"]);
    for (file, pem) in [(&key, &second.key_pem), (&cert, &second.cert_pem)] {
        let fresh = dir.write("replacement.tmp", pem);
        std::fs::rename(fresh, file).unwrap();
    }
    eventually("new handshakes get the replaced certificate", async || {
        tls_connect(proxy.addr(), &client, "localhost")
            .await
            .is_ok_and(|s| peer_leaf(&s) == second.der)
    })
    .await;
    let admin = proxy.admin.unwrap();
    assert!(stat(admin, "ssl_certificate_reload") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_the_certificate_for_new_connections_only() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let first = ca.leaf(&["localhost"]);
    let (cert, key) = first.write(&dir, "edge");
    let proxy = Proxy::start(&tls_config(&one_certificate(&cert, &key, ""), up), 2);
    let admin = proxy.admin.unwrap();
    // A new client each time: a resumed session would not show the server's certificate.
    let connect = || async {
        let client = client_config(ca.roots(), ClientOptions::default());
        tls_connect(proxy.addr(), &client, "localhost")
            .await
            .unwrap()
    };

    let old = connect().await;
    assert_eq!(peer_leaf(&old), first.der);
    let mut old = h1_over(old).await;
    let response = old.send_request(get("/", &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    text(response.into_body()).await;

    // New files, then POST /reload_certs.
    let second = ca.leaf(&["localhost"]);
    second.write(&dir, "edge");
    let (status, body) = admin_request(admin, "POST", "/reload_certs");
    assert_eq!((status, body.as_str()), (200, "secure: reloaded\n"));
    assert_eq!(peer_leaf(&connect().await), second.der);
    // The connection made before the reload goes on as it was.
    old.ready().await.unwrap();
    let response = old.send_request(get("/", &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // A broken file: the reload fails, says why, and the current certificate stays.
    std::fs::write(&cert, "not a certificate").unwrap();
    let (status, body) = admin_request(admin, "POST", "/reload_certs");
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("kept the previous certificates") && body.contains("edge.pem"),
        "{body}"
    );
    let still = connect().await;
    assert_eq!(peer_leaf(&still), second.der);
    assert_eq!(
        h1_over(still)
            .await
            .send_request(get("/", &[]))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    // SIGHUP does the same.
    let third = ca.leaf(&["localhost"]);
    third.write(&dir, "edge");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut swapped = false;
    for _ in 0..100 {
        if peer_leaf(&connect().await) == third.der {
            swapped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        swapped,
        "SIGHUP reloads the certificate; log:\n{}",
        proxy.log()
    );
    let reloads = admin_request(admin, "GET", "/stats?filter=ssl_certificate_reload").1;
    assert!(reloads.contains(r#"result="success"}: 2"#), "{reloads}");
    assert!(reloads.contains(r#"result="failure"}: 1"#), "{reloads}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_tls_port_closes_the_connection_without_harm() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let (cert, key) = ca.leaf(&["localhost"]).write(&dir, "edge");
    let tls = one_certificate(&cert, &key, "      handshake_timeout: 300ms\n");
    let proxy = Proxy::start(&tls_config(&tls, up), 1);
    let admin = proxy.admin.unwrap();

    let mut garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
    ];
    // A TLS record header claiming a huge handshake, then noise.
    let mut record = vec![0x16, 0x03, 0x01, 0xff, 0xff];
    record.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8));
    garbage.push(record);
    for bytes in &garbage {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        let _ = stream.write_all(bytes).await;
        let mut buf = vec![0u8; 4096];
        // Closed (or reset) soon: never an HTTP answer in cleartext, never a hang.
        let closed = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => assert!(!buf[..n].starts_with(b"HTTP/"), "cleartext answer"),
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "connection closed after {bytes:?}");
    }
    // A client that says nothing is dropped after the handshake timeout.
    let mut silent = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(20), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "silent client closed: {read:?}"
    );

    let client = client_config(ca.roots(), ClientOptions::default());
    assert_eq!(
        h1_get(proxy.addr(), &client, "localhost").await.status(),
        StatusCode::OK
    );
    assert_eq!(stat_settled(admin, "ssl_connection_error", 4), 4);
    assert_eq!(stat_settled(admin, "ssl_handshake_timeout", 1), 1);
    assert_eq!(stat_settled(admin, "ssl_handshake", 1), 1);
}

/// A TLS origin answering `alpn=<protocol>` over HTTP/1.1 or HTTP/2.
async fn tls_origin(
    leaf: &Leaf,
    client_ca: Option<&Ca>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    tls_origin_speaking(leaf, client_ca, &[b"h2", b"http/1.1"]).await
}

/// As [`tls_origin`], choosing among `alpn` only.
async fn tls_origin_speaking(
    leaf: &Leaf,
    client_ca: Option<&Ca>,
    alpn: &[&[u8]],
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca.roots()),
                provider(),
            )
            .build()
            .unwrap(),
        ),
    };
    let mut config = builder
        .with_single_cert(vec![leaf.der.clone()], leaf.key_der())
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let alpn =
                    String::from_utf8_lossy(tls.get_ref().1.alpn_protocol().unwrap_or(b"none"))
                        .into_owned();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    // HTTP/2 requests over TLS say so in `:scheme`.
                    let scheme = req
                        .uri()
                        .scheme_str()
                        .map(|s| format!(" scheme={s}"))
                        .unwrap_or_default();
                    let body = format!("alpn={alpn}{scheme}");
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            body,
                        ))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_verifies_the_host_and_fails_with_503_when_it_cannot() {
    let dir = ScratchDir::new();
    let ca = Ca::new("origin ca");
    let clients = Ca::new("proxy client ca");
    let (good, _g) = tls_origin(&ca.leaf(&["origin.internal"]), None).await;
    let (expired, _e) = tls_origin(&ca.issue(&["origin.internal"], true), None).await;
    let (untrusted, _u) = tls_origin(&Ca::new("stranger").leaf(&["origin.internal"]), None).await;
    let (mutual, _m) = tls_origin(&ca.leaf(&["origin.internal"]), Some(&clients)).await;
    let ca_file = dir.write("origin-ca.pem", &ca.pem()).display().to_string();
    let (client_cert, client_key) = clients.leaf(&["legate"]).write(&dir, "client");

    let cluster = |name: &str, endpoint: SocketAddr, protocol: &str, extra: &str| {
        format!(
            "  - name: {name}
    endpoints: [{endpoint}]
    protocol: {protocol}
    tls: {{ ca: {ca_file}{extra} }}
"
        )
    };
    let named = ", server_name: origin.internal";
    let with_cert = format!(
        "{named}, client_certificate: {{ cert_chain: {client_cert}, private_key: {client_key} }}"
    );
    let mut clusters = String::new();
    let mut routes = String::new();
    for (name, endpoint, protocol, extra) in [
        ("h1", good, "http1", named),
        ("h2", good, "http2", named),
        ("by_ip", good, "http1", ""),
        ("expired", expired, "http1", named),
        ("untrusted", untrusted, "http1", named),
        ("mutual", mutual, "http1", with_cert.as_str()),
        ("mutual_without_cert", mutual, "http1", named),
    ] {
        clusters.push_str(&cluster(name, endpoint, protocol, extra));
        routes.push_str(&format!(
            "      - match: {{ prefix: /{name}/ }}\n        cluster: {name}\n"
        ));
    }
    // Health checks of TLS clusters speak TLS (HTTP/2 when ALPN says so) and verify too.
    for (name, endpoint, protocol) in [
        ("checked_h1", good, "http1"),
        ("checked_h2", good, "http2"),
        ("checked_untrusted", untrusted, "http1"),
    ] {
        clusters.push_str(&cluster(name, endpoint, protocol, named));
        clusters.push_str(
            "    health_check: { path: /healthz, interval: 50ms, jitter: 0s, timeout: 1s }\n",
        );
    }
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
{routes}clusters:
{clusters}"#
    );
    let proxy = Proxy::start(&yaml, 1);
    let admin = proxy.admin.unwrap();
    let addr = proxy.addr();
    let fetch = |path: &'static str| async move {
        let response = send_h1(addr, get(path, &[])).await;
        let status = response.status();
        (status, text(response.into_body()).await)
    };
    assert_eq!(
        fetch("/h1/").await,
        (StatusCode::OK, "alpn=http/1.1".to_string())
    );
    assert_eq!(
        fetch("/h2/").await,
        (StatusCode::OK, "alpn=h2 scheme=https".to_string())
    );
    assert_eq!(
        fetch("/mutual/").await,
        (StatusCode::OK, "alpn=http/1.1".to_string())
    );
    for path in ["/by_ip/", "/expired/", "/untrusted/"] {
        let (status, body) = fetch(path).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert_eq!(body, "upstream TLS handshake failure\n", "{path}");
    }
    // Without the client certificate the origin wants: with TLS 1.3 the origin's refusal
    // arrives after the client's side of the handshake is done, as a reset of the request.
    let (status, body) = fetch("/mutual_without_cert/").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let errors = admin_request(admin, "GET", "/stats?filter=upstream_ssl_connection_error").1;
    for cluster in ["by_ip", "expired", "untrusted"] {
        assert!(
            errors.contains(&format!(
                "upstream_ssl_connection_error{{cluster=\"{cluster}\"}}: 1"
            )),
            "{cluster} in\n{errors}"
        );
    }
    assert_eq!(stat(admin, "upstream_ssl_handshake"), 4);
    assert_eq!(stat(admin, "upstream_cx_connect_fail"), 3);
    let log = proxy.log();
    assert!(
        log.contains("Expired") || log.contains("expired"),
        "the log says why:\n{log}"
    );
}

/// The answer of [`answering`]'s service.
type Answer = std::future::Ready<Result<Response<Full<Bytes>>, std::convert::Infallible>>;

/// A service answering `body` to every request.
fn answering(
    body: String,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Full<Bytes>>,
    Error = std::convert::Infallible,
    Future = Answer,
> + Clone {
    hyper::service::service_fn(move |_req: Request<Incoming>| {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from(body.clone())))))
    })
}

/// An origin answering `name` to every request (and, over TLS, ` sni=NAME` with the name the
/// client sent): over TLS with `leaf`, or in plain text.
async fn named_origin(
    name: &'static str,
    leaf: Option<&Leaf>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let acceptor = leaf.map(|leaf| {
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der.clone()], leaf.key_der())
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let server = hyper::server::conn::http1::Builder::new();
                let _ = match acceptor {
                    None => {
                        let service = answering(name.to_owned());
                        server.serve_connection(TokioIo::new(tcp), service).await
                    }
                    Some(acceptor) => match acceptor.accept(tcp).await {
                        Ok(tls) => {
                            // The name the client asked for, if it sent one.
                            let sni = tls.get_ref().1.server_name().unwrap_or("-");
                            let service = answering(format!("{name} sni={sni}"));
                            server.serve_connection(TokioIo::new(tls), service).await
                        }
                        Err(_) => return,
                    },
                };
            });
        }
    });
    (addr, task)
}

/// Envoy's `transport_socket_matches` from the file: each endpoint is reached by the first
/// match its labels (then its locality's) hold, or by the cluster's own TLS; a match may be
/// plain text, or verify the host by its certificate's names (`subject_alt_names`) instead of
/// `server_name`. Health checks use each host's transport too: a check over the wrong one
/// would fail the host and take it out of the rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_is_reached_by_its_transport_socket_match() {
    let dir = ScratchDir::new();
    let ca = Ca::new("origin ca");
    let ca_file = dir.write("origin-ca.pem", &ca.pem()).display().to_string();
    let (secure, _s) = named_origin("secure", Some(&ca.leaf(&["origin.internal"]))).await;
    let (plain, _p) = named_origin("plain", None).await;
    let (pod, _d) = named_origin("pod", Some(&ca.leaf(&["web-1.pods.internal"]))).await;
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /mixed/ }}
        cluster: mixed
      - match: {{ prefix: /wrong_name/ }}
        cluster: wrong_name
clusters:
  - name: mixed
    tls: {{ ca: {ca_file}, server_name: origin.internal }}
    transport_socket_matches:
      - name: cleartext
        match: {{ kind: plain }}
      - name: pods
        match: {{ kind: pod, tier: 1 }}
        tls:
          ca: {ca_file}
          server_name: not-the-certificates.example
          subject_alt_names: [{{ type: dns, suffix: .pods.internal }}]
    endpoints:
      - {secure}
      - address: {plain}
        transport_socket_match: {{ kind: plain }}
      - address: {pod}
        transport_socket_match: {{ kind: other }}
        locality_transport_socket_match: {{ kind: pod, tier: 1.0 }}
    health_check: {{ path: /healthz, interval: 50ms, jitter: 0s, timeout: 1s }}
  - name: wrong_name
    endpoints: [{pod}]
    tls:
      ca: {ca_file}
      subject_alt_names: [{{ type: dns, exact: web-1.other.internal }}, {{ type: uri, prefix: "spiffe://" }}]
"#
    );
    let proxy = Proxy::start(&yaml, 1);
    let admin = proxy.admin.unwrap();
    let addr = proxy.addr();
    // Every host checked at least twice, none failed.
    eventually("each host checked twice", async || {
        stat(admin, "health_check_success") >= 6
    })
    .await;
    assert_eq!(stat(admin, "health_check_failure"), 0);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..9 {
        let response = send_h1(addr, get("/mixed/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK);
        seen.insert(text(response.into_body()).await);
    }
    let all: std::collections::BTreeSet<String> = [
        "pod sni=not-the-certificates.example",
        "plain",
        "secure sni=origin.internal",
    ]
    .map(String::from)
    .into();
    assert_eq!(seen, all);
    // No name of the certificate is one the matchers take.
    let response = send_h1(addr, get("/wrong_name/", &[])).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        text(response.into_body()).await,
        "upstream TLS handshake failure\n"
    );
    // The dump says which match each endpoint is reached by.
    let dump: serde_json::Value =
        serde_json::from_str(&admin_request(admin, "GET", "/config_dump").1).unwrap();
    let mixed = (dump["clusters"].as_array().unwrap().iter())
        .find(|c| c["name"] == "mixed")
        .unwrap();
    let by: Vec<&serde_json::Value> = (mixed["endpoints"].as_array().unwrap().iter())
        .map(|e| &e["transport_socket"])
        .collect();
    assert_eq!(
        by,
        [
            &serde_json::Value::Null,
            &serde_json::json!("cleartext"),
            &serde_json::json!("pods")
        ]
    );
}

/// `auto_sni`: each TLS connection names the request's host as it goes upstream (after a
/// route's host rewrite, without the port) or `override_auto_sni_header`'s value, is verified
/// against it, and is reused only for that name. `auto_host_sni`: the endpoint's hostname.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_sni_names_each_connection_for_its_request_host() {
    let dir = ScratchDir::new();
    let ca = Ca::new("origin ca");
    let ca_file = dir.write("origin-ca.pem", &ca.pem()).display().to_string();
    let leaf = ca.leaf(&[
        "a.internal",
        "b.internal",
        "override.internal",
        "origin.internal",
        "*.many.internal",
    ]);
    let (origin, _o) = named_origin("origin", Some(&leaf)).await;
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /a/ }}
        cluster: named
        host_rewrite: a.internal
      - match: {{ prefix: /header/ }}
        cluster: by_header
      - match: {{ prefix: /hostname/ }}
        cluster: by_hostname
      - match: {{ prefix: / }}
        cluster: named
clusters:
  - name: named
    endpoints: [{origin}]
    auto_sni: true
    auto_san_validation: true
    tls: {{ ca: {ca_file}, server_name: origin.internal }}
  - name: by_header
    endpoints: [{origin}]
    auto_sni: true
    override_auto_sni_header: x-upstream-name
    tls: {{ ca: {ca_file} }}
  - name: by_hostname
    endpoints: [{{ address: "{origin}", hostname: a.internal }}]
    tls: {{ ca: {ca_file}, server_name: origin.internal, auto_host_sni: true }}
"#
    );
    let proxy = Proxy::start(&yaml, 1);
    let admin = proxy.admin.unwrap();
    let addr = proxy.addr();
    let fetch = |path: &'static str, headers: &'static [(&'static str, &'static str)]| async move {
        // `host` given replaces the helper's.
        let mut req = get(path, &[]);
        for (name, value) in headers {
            req.headers_mut()
                .insert(*name, http::HeaderValue::from_static(value));
        }
        let response = send_h1(addr, req).await;
        let status = response.status();
        (status, text(response.into_body()).await)
    };
    let ok = |body: &str| (StatusCode::OK, body.to_owned());
    for _ in 0..2 {
        assert_eq!(fetch("/a/", &[]).await, ok("origin sni=a.internal"));
        assert_eq!(
            fetch("/", &[("host", "b.internal:8080")]).await,
            ok("origin sni=b.internal")
        );
    }
    // The name in any case is one name.
    assert_eq!(
        fetch("/", &[("host", "B.Internal")]).await,
        ok("origin sni=b.internal")
    );
    // One connection per name, each kept for its own name's requests.
    assert_eq!(stat(admin, "upstream_cx_total"), 2);
    // An address is no name: the cluster's is sent.
    assert_eq!(
        fetch("/", &[("host", "127.0.0.1:80")]).await,
        ok("origin sni=origin.internal")
    );
    // A name the certificate does not have fails verification.
    let (status, body) = fetch("/", &[("host", "c.internal")]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // Names a client makes up: pools kept per host are bounded, idle ones let go with
    // their connections.
    for i in 0..40 {
        let host: &'static str = Box::leak(format!("n{i}.many.internal").into_boxed_str());
        let headers: &'static [(&'static str, &'static str)] =
            Box::leak(vec![("host", host)].into_boxed_slice());
        let (status, body) = fetch("/", headers).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body, format!("origin sni={host}"));
    }
    let open = stat(admin, "upstream_cx_active");
    assert!(open <= 33, "{open} connections open");
    // The host's own count agrees with the cluster's (each closed connection counted out
    // once).
    assert_eq!(stat(admin, "host_cx_active"), open);
    // `auto_host_sni`: the endpoint's hostname, whatever the request's host.
    assert_eq!(
        fetch("/hostname/", &[("host", "b.internal")]).await,
        ok("origin sni=a.internal")
    );
    // The header's value when given, the host otherwise.
    assert_eq!(
        fetch(
            "/header/",
            &[
                ("host", "a.internal"),
                ("x-upstream-name", "override.internal")
            ]
        )
        .await,
        ok("origin sni=override.internal")
    );
    assert_eq!(
        fetch("/header/", &[("host", "b.internal")]).await,
        ok("origin sni=b.internal")
    );
}

#[test]
fn validate_reports_a_missing_certificate_file_by_key_path() {
    let dir = ScratchDir::new();
    let config = dir.write(
        "legate.yaml",
        &tls_config(
            &one_certificate("/nonexistent/edge.pem", "/nonexistent/edge.key", ""),
            "127.0.0.1:9".parse().unwrap(),
        ),
    );
    let output = std::process::Command::new(BIN)
        .args(["validate", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("listeners[0].tls") && stderr.contains("/nonexistent/edge.pem"),
        "{stderr}"
    );
}

/// Certificates and keys may be written inline as PEM text instead of paths (as management
/// servers send them); `/config_dump` says `inline` and never shows the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_pem_certificates_serve() {
    let (up, _upstream) = upstream().await;
    let ca = Ca::new("inline ca");
    let leaf = ca.leaf(&["localhost"]);
    let quoted = |pem: &str| serde_json::to_string(pem).unwrap();
    let block = one_certificate(&quoted(&leaf.cert_pem), &quoted(&leaf.key_pem), "");
    let proxy = Proxy::start(&tls_config(&block, up), 1);
    let client = client_config(ca.roots(), ClientOptions::default());
    let stream = tls_connect(proxy.addr(), &client, "localhost")
        .await
        .unwrap();
    assert_eq!(peer_leaf(&stream), leaf.der);
    let mut sender = h1_over(stream).await;
    let response = sender.send_request(get("/", &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (_, dump) = admin_request(proxy.admin.unwrap(), "GET", "/config_dump");
    let parsed: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let certificate = &parsed["listeners"][0]["tls"]["certificates"][0];
    assert_eq!(certificate["private_key"], "inline", "{dump}");
    assert!(!dump.contains("PRIVATE KEY"), "the key is never dumped");
}

/// `protocol: auto` (Envoy's `auto_config`): each host chooses HTTP/2 or HTTP/1.1 by ALPN,
/// and a request goes to it in the form its choice wants, also when a cluster mixes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_clusters_speak_what_each_host_chooses_by_alpn() {
    let dir = ScratchDir::new();
    let ca = Ca::new("origin ca");
    let leaf = ca.leaf(&["origin.internal"]);
    let (both, _b) = tls_origin_speaking(&leaf, None, &[b"h2", b"http/1.1"]).await;
    let (h1_only, _h) = tls_origin_speaking(&leaf, None, &[b"http/1.1"]).await;
    let ca_file = dir.write("origin-ca.pem", &ca.pem()).display().to_string();
    let cluster = |name: &str, endpoints: &str| {
        format!(
            "  - name: {name}\n    endpoints: [{endpoints}]\n    protocol: auto\n    tls: {{ ca: {ca_file}, server_name: origin.internal }}\n"
        )
    };
    let yaml = format!(
        r#"
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /both/ }}
        cluster: both
      - match: {{ prefix: /h1/ }}
        cluster: h1_only
      - match: {{ prefix: /mixed/ }}
        cluster: mixed
clusters:
{}{}{}"#,
        cluster("both", &both.to_string()),
        cluster("h1_only", &h1_only.to_string()),
        cluster("mixed", &format!("{both}, {h1_only}")),
    );
    let proxy = Proxy::start(&yaml, 1);
    let addr = proxy.addr();
    let fetch = |path: &'static str| async move {
        let response = send_h1(addr, get(path, &[])).await;
        let status = response.status();
        (status, text(response.into_body()).await)
    };
    for _ in 0..3 {
        assert_eq!(
            fetch("/both/").await,
            (StatusCode::OK, "alpn=h2 scheme=https".to_string())
        );
        assert_eq!(
            fetch("/h1/").await,
            (StatusCode::OK, "alpn=http/1.1".to_string())
        );
    }
    // Round robin over one host of each kind: every request answered, in both protocols.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10 {
        let (status, body) = fetch("/mixed/").await;
        assert_eq!(status, StatusCode::OK);
        seen.insert(body);
    }
    let expected: std::collections::HashSet<String> = [
        "alpn=h2 scheme=https".to_string(),
        "alpn=http/1.1".to_string(),
    ]
    .into();
    assert_eq!(seen, expected);
}

mod sds {
    //! Certificates from the management server (SDS), over the ADS stream.

    use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
    use envoy_types::pb::envoy::config::core::v3::{
        AggregatedConfigSource, ConfigSource, DataSource, TransportSocket, config_source,
        data_source, transport_socket,
    };
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, Secret, TlsCertificate, secret,
    };
    use envoy_types::pb::google::protobuf::Any;
    use testbed::ManagementServer;
    use testbed::resources;
    use testbed::xds::{any, type_url};

    use super::*;

    const LIMIT: Duration = Duration::from_secs(20);

    fn inline(text: &str) -> Option<DataSource> {
        Some(DataSource {
            specifier: Some(data_source::Specifier::InlineString(text.into())),
            ..Default::default()
        })
    }

    fn certificate(name: &str, cert_pem: &str, key_pem: &str) -> (String, Any) {
        let secret = Secret {
            name: name.into(),
            r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: inline(cert_pem),
                private_key: inline(key_pem),
                ..Default::default()
            })),
        };
        (name.into(), any(&secret))
    }

    /// A listener on 127.0.0.1 terminating TLS with the certificates of `secrets` (SDS).
    fn tls_listener(secrets: &[&str]) -> (String, Any) {
        let ads = ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                AggregatedConfigSource {},
            )),
            ..Default::default()
        };
        let context = DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificate_sds_secret_configs: secrets
                    .iter()
                    .map(|name| SdsSecretConfig {
                        name: (*name).into(),
                        sds_config: Some(ads.clone()),
                    })
                    .collect(),
                alpn_protocols: vec!["h2".into(), "http/1.1".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut l = resources::listener("edge", "127.0.0.1:0".parse().unwrap(), "edge-routes");
        l.filter_chains[0].transport_socket = Some(TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any(&context))),
        });
        ("edge".into(), any(&l))
    }

    /// The real binary, configured by `server` alone (ADS), with an admin listener.
    fn ads_proxy(server: &ManagementServer) -> Proxy {
        Proxy::start(
            &format!(
                "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1, cluster: edge }}\ndynamic_resources: {{ ads: {{ address: \"{}\" }} }}\n",
                server.local_addr()
            ),
            1,
        )
    }

    fn config_dump(proxy: &Proxy) -> serde_json::Value {
        let (status, body) = admin_request(proxy.admin.unwrap(), "GET", "/config_dump");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    fn acked_secrets(requests: &[testbed::xds::SeenRequest]) -> usize {
        (requests.iter())
            .filter(|r| r.type_url == type_url::SECRET && r.is_ack())
            .count()
    }

    /// A listener naming two secrets warms until they arrive, serves each by SNI, takes a
    /// rotated certificate for new handshakes while kept-alive HTTP/1.1 and HTTP/2
    /// connections go on, and a secret whose key is not its certificate's is refused with
    /// the rotated one still served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn certificates_from_the_management_server_serve_and_rotate() {
        let (up, _upstream) = upstream().await;
        let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let ca = Ca::new("sds ca");
        let api = ca.leaf(&["api.example.com"]);
        let www = ca.leaf(&["www.example.com"]);
        server.set(type_url::LISTENER, vec![tls_listener(&["api", "www"])]);
        let routes =
            resources::route_config("edge-routes", vec![resources::forward("/", "backend")]);
        server.set(type_url::ROUTE, vec![("edge-routes".into(), any(&routes))]);
        let backend = resources::eds_cluster("backend", LbPolicy::RoundRobin);
        server.set(type_url::CLUSTER, vec![("backend".into(), any(&backend))]);
        let endpoints = resources::assignment("backend", &[up]);
        server.set(
            type_url::ENDPOINT,
            vec![("backend".into(), any(&endpoints))],
        );
        let proxy = ads_proxy(&server);

        // It asks for the two secrets, and waits for them.
        assert!(
            server
                .wait_for(LIMIT, |requests, _| requests.iter().any(|r| {
                    r.type_url == type_url::SECRET && r.names == ["api", "www"]
                }))
                .await,
            "{:?}",
            server.requests()
        );
        eventually("the listener warming", async || {
            config_dump(&proxy)["xds"]["warming_listeners"] == serde_json::json!(["edge"])
        })
        .await;
        server.set(
            type_url::SECRET,
            vec![
                certificate("api", &api.cert_pem, &api.key_pem),
                certificate("www", &www.cert_pem, &www.key_pem),
            ],
        );
        let mut addr = None;
        let mut dump = serde_json::Value::Null;
        // The listener is in force, and the status lists the secrets held (published just
        // after the config is swapped).
        eventually("the listener in force and its secrets listed", async || {
            dump = config_dump(&proxy);
            addr = (dump["listeners"].as_array().unwrap().iter())
                .find(|l| l["name"] == "edge")
                .map(|l| l["bound_address"].as_str().unwrap().parse().unwrap());
            let held: Vec<&str> = (dump["xds"]["resources"].as_array().unwrap().iter())
                .filter(|r| r["type"] == "secret")
                .map(|r| r["name"].as_str().unwrap())
                .collect();
            addr.is_some() && held == ["api", "www"]
        })
        .await;
        let addr: SocketAddr = addr.unwrap();
        assert!(
            !dump.to_string().contains("PRIVATE KEY"),
            "no key material in /config_dump"
        );

        // Each name gets its certificate; a name neither has gets the first.
        let h1 = client_config(ca.roots(), ClientOptions::default());
        for (name, leaf) in [
            ("api.example.com", &api),
            ("www.example.com", &www),
            ("other.example.com", &api),
        ] {
            let stream = tls_connect(addr, &h1, name).await;
            // The client verifies the name: only the served names' handshakes succeed.
            match name {
                "other.example.com" => {
                    assert!(stream.is_err(), "api's certificate is not for {name}")
                }
                _ => assert_eq!(peer_leaf(&stream.unwrap()), leaf.der, "{name}"),
            }
        }

        // Kept-alive connections, one of each protocol, from before the rotation.
        let mut kept_h1 = h1_over(tls_connect(addr, &h1, "api.example.com").await.unwrap()).await;
        let h2 = client_config(
            ca.roots(),
            ClientOptions {
                alpn: vec![b"h2"],
                ..Default::default()
            },
        );
        let mut kept_h2 = h2_over(tls_connect(addr, &h2, "api.example.com").await.unwrap()).await;
        assert_eq!(
            kept_h1.send_request(get("/", &[])).await.unwrap().status(),
            200
        );
        assert_eq!(
            kept_h2
                .send_request(get_h2("/", &[]))
                .await
                .unwrap()
                .status(),
            200
        );

        let acked = acked_secrets(&server.requests());
        let rotated = ca.leaf(&["api.example.com"]);
        server.set(
            type_url::SECRET,
            vec![
                certificate("api", &rotated.cert_pem, &rotated.key_pem),
                certificate("www", &www.cert_pem, &www.key_pem),
            ],
        );
        assert!(
            server
                .wait_for(LIMIT, |requests, _| acked_secrets(requests) > acked)
                .await
        );
        eventually("new handshakes see the rotated certificate", async || {
            let stream = tls_connect(addr, &h1, "api.example.com").await.unwrap();
            peer_leaf(&stream) == rotated.der
        })
        .await;
        for _ in 0..3 {
            kept_h1.ready().await.unwrap();
            assert_eq!(
                kept_h1.send_request(get("/", &[])).await.unwrap().status(),
                200
            );
            assert_eq!(
                kept_h2
                    .send_request(get_h2("/", &[]))
                    .await
                    .unwrap()
                    .status(),
                200
            );
        }

        // A key that is not the certificate's: refused, the rotated one still served.
        server.set(
            type_url::SECRET,
            vec![
                certificate("api", &api.cert_pem, &www.key_pem),
                certificate("www", &www.cert_pem, &www.key_pem),
            ],
        );
        assert!(
            server
                .wait_for(LIMIT, |requests, _| requests
                    .iter()
                    .any(|r| r.type_url == type_url::SECRET && r.is_nack()))
                .await
        );
        let nack = (server.requests().into_iter())
            .find(|r| r.is_nack())
            .unwrap();
        let reason = nack.error_detail.unwrap();
        assert!(
            reason.contains("secret `api`") && reason.contains("does not hold the key"),
            "{reason}"
        );
        let stream = tls_connect(addr, &h1, "api.example.com").await.unwrap();
        assert_eq!(peer_leaf(&stream), rotated.der);
        kept_h1.ready().await.unwrap();
        assert_eq!(
            kept_h1.send_request(get("/", &[])).await.unwrap().status(),
            200
        );
        let stats = admin_request(proxy.admin.unwrap(), "GET", "/stats/prometheus").1;
        assert!(
            stats.contains("xds_update_rejected_total{type=\"sds\"} 1"),
            "{stats}"
        );
        // Per secret: both were in the refused response; each was put in force before.
        for secret in ["api", "www"] {
            assert!(
                stats.contains(&format!(
                    "sds_update_rejected_total{{secret=\"{secret}\"}} 1"
                )),
                "{stats}"
            );
            let success = format!("sds_update_success_total{{secret=\"{secret}\"}} ");
            assert!(
                stats
                    .lines()
                    .any(|l| l.strip_prefix(&success).is_some_and(|n| n != "0")),
                "{stats}"
            );
        }
        server.shutdown().await;
    }

    /// Envoy Gateway's backend TLS: an EDS cluster whose `transport_socket_matches` entry
    /// verifies the host by a CA from SDS and a DNS name (`match_typed_subject_alt_names`),
    /// picked by the locality's `envoy.transport_socket_match` metadata, beside a locality in
    /// plain text. The cluster waits for the CA; then both hosts answer. A matcher of the
    /// kind OTHER_NAME is refused by name.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn endpoints_pick_their_transport_by_metadata_with_a_ca_from_sds() {
        use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
        use envoy_types::pb::envoy::config::core::v3::Metadata;
        use envoy_types::pb::envoy::config::endpoint::v3::LocalityLbEndpoints;
        use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
            CertificateValidationContext, SubjectAltNameMatcher, UpstreamTlsContext,
            common_tls_context, subject_alt_name_matcher::SanType,
        };
        use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
        use envoy_types::pb::google::protobuf::{Struct, Value, value};

        let ca = Ca::new("backend ca");
        let (secure, _s) = named_origin("secure", Some(&ca.leaf(&["backend.internal"]))).await;
        let (plain, _p) = named_origin("plain", None).await;
        let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let labels = |name: &str| Struct {
            fields: [(
                "name".to_string(),
                Value {
                    kind: Some(value::Kind::StringValue(name.into())),
                },
            )]
            .into(),
        };
        let tls_to_backend = |san_type: SanType| {
            let context = UpstreamTlsContext {
                common_tls_context: Some(CommonTlsContext {
                    validation_context_type: Some(
                        common_tls_context::ValidationContextType::CombinedValidationContext(
                            common_tls_context::CombinedCertificateValidationContext {
                                default_validation_context: Some(CertificateValidationContext {
                                    match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
                                        san_type: san_type as i32,
                                        matcher: Some(StringMatcher {
                                            match_pattern: Some(
                                                string_matcher::MatchPattern::Exact(
                                                    "backend.internal".into(),
                                                ),
                                            ),
                                            ignore_case: false,
                                        }),
                                        oid: String::new(),
                                    }],
                                    ..Default::default()
                                }),
                                validation_context_sds_secret_config: Some(SdsSecretConfig {
                                    name: "backend-ca".into(),
                                    sds_config: resources::ads(),
                                }),
                                ..Default::default()
                            },
                        ),
                    ),
                    ..Default::default()
                }),
                sni: "backend.internal".into(),
                ..Default::default()
            };
            TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(any(&context))),
            }
        };
        let cluster = |san_type: SanType| {
            let mut c = resources::eds_cluster("backend", LbPolicy::RoundRobin);
            c.transport_socket_matches = vec![TransportSocketMatch {
                name: "backend/tls/0".into(),
                r#match: Some(labels("backend/tls/0")),
                transport_socket: Some(tls_to_backend(san_type)),
            }];
            ("backend".to_string(), any(&c))
        };
        let mut endpoints = resources::assignment("backend", &[plain]);
        let mut secure_locality: LocalityLbEndpoints = resources::assignment("backend", &[secure])
            .endpoints
            .remove(0);
        secure_locality.metadata = Some(Metadata {
            filter_metadata: [(
                "envoy.transport_socket_match".to_string(),
                labels("backend/tls/0"),
            )]
            .into(),
            ..Default::default()
        });
        endpoints.endpoints.push(secure_locality);
        let routes =
            resources::route_config("edge-routes", vec![resources::forward("/", "backend")]);
        let listener = resources::listener("edge", "127.0.0.1:0".parse().unwrap(), "edge-routes");
        server.set(type_url::LISTENER, vec![("edge".into(), any(&listener))]);
        server.set(type_url::ROUTE, vec![("edge-routes".into(), any(&routes))]);
        server.set(type_url::CLUSTER, vec![cluster(SanType::Dns)]);
        server.set(
            type_url::ENDPOINT,
            vec![("backend".into(), any(&endpoints))],
        );
        let proxy = ads_proxy(&server);
        // The cluster asks for its CA, and waits for it.
        assert!(
            server
                .wait_for(LIMIT, |requests, _| requests.iter().any(|r| {
                    r.type_url == type_url::SECRET && r.names == ["backend-ca"]
                }))
                .await,
            "{:?}",
            server.requests()
        );
        let ca_secret = Secret {
            name: "backend-ca".into(),
            r#type: Some(secret::Type::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: inline(&ca.pem()),
                    ..Default::default()
                },
            )),
        };
        server.set(
            type_url::SECRET,
            vec![("backend-ca".into(), any(&ca_secret))],
        );
        let mut addr = None;
        eventually("the listener and the cluster in force", async || {
            let dump = config_dump(&proxy);
            addr = (dump["listeners"].as_array().unwrap().iter())
                .find(|l| l["name"] == "edge")
                .map(|l| l["bound_address"].as_str().unwrap().parse().unwrap());
            let cluster =
                (dump["clusters"].as_array().unwrap().iter()).any(|c| c["name"] == "backend");
            addr.is_some() && cluster
        })
        .await;
        let addr: SocketAddr = addr.unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..6 {
            let response = send_h1(addr, get("/", &[])).await;
            assert_eq!(response.status(), StatusCode::OK);
            seen.insert(text(response.into_body()).await);
        }
        let both: std::collections::BTreeSet<String> = ["plain", "secure sni=backend.internal"]
            .map(String::from)
            .into();
        assert_eq!(seen, both);

        server.set(type_url::CLUSTER, vec![cluster(SanType::OtherName)]);
        assert!(
            server
                .wait_for(LIMIT, |requests, _| requests
                    .iter()
                    .any(|r| r.type_url == type_url::CLUSTER && r.is_nack()))
                .await
        );
        let nack = (server.requests().into_iter())
            .find(|r| r.type_url == type_url::CLUSTER && r.is_nack())
            .unwrap();
        let reason = nack.error_detail.unwrap();
        assert!(
            reason.contains("transport_socket_matches[0]")
                && reason.contains("san_type OTHER_NAME"),
            "{reason}"
        );
        server.shutdown().await;
    }

    /// A listener's certificate read from a file (`path_config_source`), as Envoy Gateway
    /// and certificate agents write one: never asked of the management server, served once
    /// read, replaced by renaming a new file over it for new handshakes while a kept-alive
    /// connection goes on; a file whose key is not its certificate's is refused, counted, and
    /// the certificate before it stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn certificates_from_a_file_rotate_by_rename() {
        use envoy_types::pb::envoy::config::core::v3::{PathConfigSource, WatchedDirectory};
        let (up, _upstream) = upstream().await;
        let dir = ScratchDir::new();
        let ca = Ca::new("file sds ca");
        let first = ca.leaf(&["api.example.com"]);
        let second = ca.leaf(&["api.example.com"]);
        let (first_cert, first_key) = first.write(&dir, "first");
        let (second_cert, second_key) = second.write(&dir, "second");
        let secret_file = dir.0.join("edge-cert.json");
        let write_secret = |cert: &str, key: &str| {
            let json = format!(
                r#"{{"resources":[{{"@type":"{}","name":"edge_cert","tlsCertificate":{{"certificateChain":{{"filename":"{cert}"}},"privateKey":{{"filename":"{key}"}}}}}}]}}"#,
                type_url::SECRET
            );
            // Written beside, then renamed over: the way agents swap files.
            let fresh = dir.write("edge-cert.json.tmp", &json);
            std::fs::rename(fresh, &secret_file).unwrap();
        };
        write_secret(&first_cert, &first_key);

        let from_file = ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::PathConfigSource(
                PathConfigSource {
                    path: secret_file.display().to_string(),
                    watched_directory: Some(WatchedDirectory {
                        path: dir.0.display().to_string(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
            ..Default::default()
        };
        let context = DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificate_sds_secret_configs: vec![SdsSecretConfig {
                    name: "edge_cert".into(),
                    sds_config: Some(from_file),
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut l = resources::listener("edge", "127.0.0.1:0".parse().unwrap(), "edge-routes");
        l.filter_chains[0].transport_socket = Some(TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any(&context))),
        });
        let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        server.set(type_url::LISTENER, vec![("edge".into(), any(&l))]);
        let routes =
            resources::route_config("edge-routes", vec![resources::forward("/", "backend")]);
        server.set(type_url::ROUTE, vec![("edge-routes".into(), any(&routes))]);
        let backend = resources::eds_cluster("backend", LbPolicy::RoundRobin);
        server.set(type_url::CLUSTER, vec![("backend".into(), any(&backend))]);
        let endpoints = resources::assignment("backend", &[up]);
        server.set(
            type_url::ENDPOINT,
            vec![("backend".into(), any(&endpoints))],
        );
        let proxy = ads_proxy(&server);
        let mut addr: Option<SocketAddr> = None;
        eventually("the listener in force", async || {
            let dump = config_dump(&proxy);
            addr = (dump["listeners"].as_array().unwrap().iter())
                .find(|l| l["name"] == "edge")
                .map(|l| l["bound_address"].as_str().unwrap().parse().unwrap());
            addr.is_some()
        })
        .await;
        let addr = addr.unwrap();
        assert!(
            !server
                .requests()
                .iter()
                .any(|r| r.type_url == type_url::SECRET && !r.names.is_empty()),
            "a file's secret is not asked of the server: {:?}",
            server.requests()
        );
        let h1 = client_config(ca.roots(), ClientOptions::default());
        let stream = tls_connect(addr, &h1, "api.example.com").await.unwrap();
        assert_eq!(peer_leaf(&stream), first.der);
        let mut kept = h1_over(tls_connect(addr, &h1, "api.example.com").await.unwrap()).await;
        assert_eq!(
            kept.send_request(get("/", &[])).await.unwrap().status(),
            200
        );

        // Load through the rotation: an HTTP/1.1 and an HTTP/2 keep-alive client send
        // requests back to back until new handshakes see the new certificate.
        let h2 = client_config(
            ca.roots(),
            ClientOptions {
                alpn: vec![b"h2"],
                ..Default::default()
            },
        );
        let rotated = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut load_h1 = h1_over(tls_connect(addr, &h1, "api.example.com").await.unwrap()).await;
        let mut load_h2 = h2_over(tls_connect(addr, &h2, "api.example.com").await.unwrap()).await;
        let load = {
            let rotated = Arc::clone(&rotated);
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u32, 0u32);
                while !rotated.load(std::sync::atomic::Ordering::Relaxed) {
                    let one = match load_h1.ready().await {
                        Ok(()) => load_h1.send_request(get("/", &[])).await.ok(),
                        Err(_) => None,
                    };
                    let two = load_h2.send_request(get_h2("/", &[])).await.ok();
                    for response in [one, two] {
                        match response.map(|r| r.status()) {
                            Some(StatusCode::OK) => ok += 1,
                            _ => failed += 1,
                        }
                    }
                }
                (ok, failed)
            })
        };
        write_secret(&second_cert, &second_key);
        eventually(
            "new handshakes see the renamed-in certificate",
            async || {
                let stream = tls_connect(addr, &h1, "api.example.com").await.unwrap();
                peer_leaf(&stream) == second.der
            },
        )
        .await;
        rotated.store(true, std::sync::atomic::Ordering::Relaxed);
        let (ok, failed) = load.await.unwrap();
        assert_eq!(
            failed, 0,
            "no request failed through the rotation ({ok} answered)"
        );
        assert!(ok > 0);
        kept.ready().await.unwrap();
        assert_eq!(
            kept.send_request(get("/", &[])).await.unwrap().status(),
            200
        );

        // A key of another certificate: refused, counted once, the second one still served.
        write_secret(&first_cert, &second_key);
        let rejected = format!(
            "sds_update_rejected_total{{secret=\"file://{}#edge_cert\"}} ",
            secret_file.display()
        );
        let count = || {
            let stats = admin_request(proxy.admin.unwrap(), "GET", "/stats/prometheus").1;
            (stats.lines())
                .find_map(|l| l.strip_prefix(&rejected)?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        eventually("the bad file counted", async || count() >= 1).await;
        // Every update from the server reads the files again: one more, ACKed, read the bad
        // file again without counting it again.
        let acked = |requests: &[testbed::xds::SeenRequest]| {
            (requests.iter())
                .filter(|r| r.type_url == type_url::ROUTE && r.is_ack())
                .count()
        };
        let before = acked(&server.requests());
        let routes = resources::route_config(
            "edge-routes",
            vec![
                resources::forward("/", "backend"),
                resources::forward("/other", "backend"),
            ],
        );
        server.set(type_url::ROUTE, vec![("edge-routes".into(), any(&routes))]);
        assert!(
            server
                .wait_for(LIMIT, |requests, _| acked(requests) > before)
                .await
        );
        assert_eq!(count(), 1, "counted once");
        let stream = tls_connect(addr, &h1, "api.example.com").await.unwrap();
        assert_eq!(peer_leaf(&stream), second.der);
        server.shutdown().await;
    }

    /// The ADS stream over mutual TLS: the proxy verifies the server by the CA and name it is
    /// given and presents its client certificate; a server it cannot verify gets no request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_management_server_over_mutual_tls() {
        let ca = Ca::new("xds ca");
        let server_leaf = ca.leaf(&["xds.internal"]);
        let client_leaf = ca.leaf(&["edge-1"]);
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(ca.roots()),
            provider(),
        )
        .build()
        .unwrap();
        let cert = server_leaf.der.clone();
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![cert], server_leaf.key_der())
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let server = ManagementServer::start_tls("127.0.0.1:0".parse().unwrap(), Arc::new(config))
            .await
            .unwrap();
        let routes = resources::route_config("r", vec![resources::direct("/", 204)]);
        let l = resources::listener("edge", "127.0.0.1:0".parse().unwrap(), "r");
        server.set(type_url::LISTENER, vec![("edge".into(), any(&l))]);
        server.set(type_url::ROUTE, vec![("r".into(), any(&routes))]);

        let dir = ScratchDir::new();
        let ca_path = dir.write("ca.pem", &ca.pem());
        let (cert, key) = client_leaf.write(&dir, "client");
        let bootstrap = |ca: &std::path::Path| {
            format!(
                "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1, cluster: edge }}\ndynamic_resources:\n  ads: {{ address: \"{}\", tls: {{ ca: {}, server_name: xds.internal, client_certificate: {{ cert_chain: {cert}, private_key: {key} }} }} }}\n",
                server.local_addr(),
                ca.display()
            )
        };
        let proxy = Proxy::start(&bootstrap(&ca_path), 1);
        assert!(
            server
                .wait_for(LIMIT, |requests, _| requests
                    .iter()
                    .any(|r| r.type_url == type_url::LISTENER && r.is_ack()))
                .await,
            "{}",
            proxy.log()
        );
        assert_eq!(
            server.requests()[0].node_id.as_deref(),
            Some("edge-1"),
            "the stream runs over the verified channel"
        );
        drop(proxy);

        // Another CA: the server's certificate does not verify, nothing is asked of it.
        let other = Ca::new("another ca");
        let other_path = dir.write("other.pem", &other.pem());
        // Streams opened so far (the first proxy's requests may still be arriving on its).
        let streams = |server: &ManagementServer| server.requests().iter().map(|r| r.stream).max();
        let opened = streams(&server);
        let refusing = Proxy::start(&bootstrap(&other_path), 1);
        assert!(
            refusing.wait_for_log("xDS stream ended", LIMIT),
            "{}",
            refusing.log()
        );
        assert!(refusing.log().contains("certificate"), "{}", refusing.log());
        assert_eq!(
            streams(&server),
            opened,
            "no stream from the refusing proxy"
        );
        server.shutdown().await;
    }
}

/// Several filter chains on one port, picked by SNI: each with its certificate, client
/// certificate rules and routes, or relaying the TLS bytes untouched (passthrough).
mod filter_chains {
    use super::*;

    /// Writes at most a few bytes per call, each flushed: a ClientHello in many segments.
    struct Dribble(TcpStream);

    impl tokio::io::AsyncRead for Dribble {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for Dribble {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(7);
            std::pin::Pin::new(&mut self.0).poll_write(cx, &buf[..n])
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    struct Edge {
        proxy: Proxy,
        ca: Ca,
        clients: Ca,
        a: Leaf,
        b: Leaf,
        origin: Leaf,
        _dir: ScratchDir,
        _origin: tokio::task::JoinHandle<()>,
    }

    /// Chains `a` (a.test), `b` (*.b.test, client certificates required) and `pass`
    /// (origin.test, relayed to a TLS origin); no default chain.
    async fn edge() -> Edge {
        let dir = ScratchDir::new();
        let ca = Ca::new("edge ca");
        let clients = Ca::new("client ca");
        let a = ca.leaf(&["a.test"]);
        let b = ca.leaf(&["*.b.test"]);
        let origin = ca.leaf(&["origin.test"]);
        let (origin_addr, origin_task) = tls_origin(&origin, None).await;
        let (a_cert, a_key) = a.write(&dir, "a");
        let (b_cert, b_key) = b.write(&dir, "b");
        let client_ca = dir.write("clients.pem", &clients.pem());
        let config = format!(
            r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: edge
    address: 127.0.0.1:0
    chains:
      - name: a
        match: {{ server_names: [a.test] }}
        tls: {{ certificates: [{{ cert_chain: {a_cert}, private_key: {a_key} }}] }}
        routes: [{{ match: {{ prefix: / }}, direct_response: {{ status: 200, body: "chain a" }} }}]
      - name: b
        match: {{ server_names: ["*.b.test"] }}
        tls:
          certificates: [{{ cert_chain: {b_cert}, private_key: {b_key} }}]
          client_certificate: {{ ca: {client_ca} }}
        routes: [{{ match: {{ prefix: / }}, direct_response: {{ status: 200, body: "chain b" }} }}]
      - name: pass
        match: {{ server_names: [origin.test] }}
        tcp_proxy: {{ cluster: origin }}
clusters:
  - name: origin
    endpoints: [{origin_addr}]
"#,
            client_ca = client_ca.display()
        );
        Edge {
            proxy: Proxy::start(&config, 2),
            ca,
            clients,
            a,
            b,
            origin,
            _dir: dir,
            _origin: origin_task,
        }
    }

    async fn body_of(stream: TlsStream<TcpStream>) -> Result<String, hyper::Error> {
        let mut sender = h1_over(stream).await;
        let asked = sender.send_request(get("/", &[]));
        let response = answered("an HTTP/1.1 request over TLS", asked).await?;
        Ok(text(response.into_body()).await)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_name_gets_its_chain_certificate_routes_and_client_rules() {
        let edge = edge().await;
        let addr = edge.proxy.addr();
        let admin = edge.proxy.admin.unwrap();
        let anonymous = client_config(edge.ca.roots(), ClientOptions::default());

        let stream = tls_connect(addr, &anonymous, "a.test").await.unwrap();
        assert_eq!(peer_leaf(&stream), edge.a.der);
        assert_eq!(body_of(stream).await.unwrap(), "chain a");

        // Chain b asks for a client certificate; chain a did not.
        let refused = match tls_connect(addr, &anonymous, "x.b.test").await {
            Err(_) => true,
            Ok(stream) => body_of(stream).await.is_err(),
        };
        assert!(refused, "no client certificate on *.b.test: refused");
        let known = edge.clients.leaf(&["client"]);
        let with_cert = client_config(
            edge.ca.roots(),
            ClientOptions {
                client_cert: Some((known.der.clone(), known.key_der())),
                ..Default::default()
            },
        );
        let stream = tls_connect(addr, &with_cert, "x.b.test").await.unwrap();
        assert_eq!(peer_leaf(&stream), edge.b.der);
        assert_eq!(body_of(stream).await.unwrap(), "chain b");

        // Passthrough: the origin's own certificate, verified by the client, and its answer.
        let stream = tls_connect(addr, &anonymous, "origin.test").await.unwrap();
        assert_eq!(peer_leaf(&stream), edge.origin.der);
        assert_eq!(body_of(stream).await.unwrap(), "alpn=http/1.1");

        // A name no chain has, and plain text: closed, counted.
        assert!(tls_connect(addr, &anonymous, "unknown.test").await.is_err());
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        assert!(read_until_closed(&mut plain).await.is_empty());
        assert_eq!(
            stat_settled(admin, "downstream_cx_no_filter_chain_match", 2),
            2
        );

        // `/certs` lists each chain's certificate.
        let (status, body) = admin_request(admin, "GET", "/certs");
        assert_eq!(status, 200, "{body}");
        let certs: serde_json::Value = serde_json::from_str(&body).unwrap();
        let names: Vec<(&str, &str)> = certs["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["filter_chain"].as_str().unwrap(),
                    c["cert_chain"][0]["dns_names"][0].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(names, [("a", "a.test"), ("b", "*.b.test")]);
        let days = certs["certificates"][0]["cert_chain"][0]["days_until_expiration"].as_i64();
        assert!(days > Some(365), "{days:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hello_in_many_segments_is_read_and_one_too_large_is_refused() {
        let edge = edge().await;
        let addr = edge.proxy.addr();
        let admin = edge.proxy.admin.unwrap();
        let client = client_config(edge.ca.roots(), ClientOptions::default());

        let tcp = TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let name = ServerName::try_from("a.test").unwrap();
        let stream = tokio_rustls::TlsConnector::from(Arc::clone(&client))
            .connect(name, Dribble(tcp))
            .await
            .unwrap();
        assert_eq!(
            stream.get_ref().1.peer_certificates().unwrap()[0],
            edge.a.der
        );

        // A ClientHello whose header says 70,000 bytes: refused at once, not waited for.
        let mut big = TcpStream::connect(addr).await.unwrap();
        big.write_all(&[22, 3, 1, 0x40, 0, 1, 0x01, 0x11, 0x70])
            .await
            .unwrap();
        assert!(read_until_closed(&mut big).await.is_empty());
        assert_eq!(
            stat_settled(admin, "downstream_cx_client_hello_too_large", 1),
            1
        );

        // A 20 KiB hello of noise, over two records: read whole, then refused (no chain
        // matches what is not TLS).
        let mut noise = TcpStream::connect(addr).await.unwrap();
        let mut bytes = vec![22, 3, 1, 0x40, 0, 1, 0, 0x4e, 0x20];
        bytes.resize(5 + 16384, 7);
        bytes.extend_from_slice(&[22, 3, 1, 0x0e, 0x24]);
        bytes.resize(bytes.len() + 0x0e24, 7);
        noise.write_all(&bytes).await.unwrap();
        assert!(read_until_closed(&mut noise).await.is_empty());
        assert_eq!(
            stat_settled(admin, "downstream_cx_no_filter_chain_match", 1),
            1
        );
    }

    /// With `http_inspector`, plain-text connections are picked by their HTTP version: an
    /// HTTP/2 prior-knowledge client and an HTTP/1.1 client reach different chains on one
    /// port, and bytes that are not HTTP reach the listener's own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plain_text_chains_are_picked_by_http_version() {
        let config = r#"
admin: { address: 127.0.0.1:0 }
listeners:
  - name: plain
    address: 127.0.0.1:0
    http_inspector: true
    routes: [{ match: { prefix: / }, direct_response: { status: 200, body: "own" } }]
    chains:
      - name: h2c
        match: { transport_protocol: raw_buffer, application_protocols: [h2c] }
        routes: [{ match: { prefix: / }, direct_response: { status: 200, body: "h2c chain" } }]
      - name: h1
        match: { transport_protocol: raw_buffer, application_protocols: [http/1.1, http/1.0] }
        routes: [{ match: { prefix: / }, direct_response: { status: 200, body: "h1 chain" } }]
"#;
        let proxy = Proxy::start(config, 1);
        let h1 = send_h1(proxy.addr(), get("/", &[])).await;
        assert_eq!(text(h1.into_body()).await, "h1 chain");
        let h2 = send_h2(proxy.addr(), get("/", &[])).await;
        assert_eq!(h2.version(), Version::HTTP_2);
        assert_eq!(text(h2.into_body()).await, "h2c chain");
        // HTTP/1.1 written a few bytes at a time: the inspector waits for the request line.
        let mut dribble = Dribble(TcpStream::connect(proxy.addr()).await.unwrap());
        dribble
            .write_all(b"GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(20), dribble.read_to_string(&mut answer))
            .await
            .expect("answered")
            .unwrap();
        assert!(answer.ends_with("h1 chain"), "{answer}");
        // Not HTTP: no protocol, so the listener's own settings, whose codec refuses it.
        let mut junk = TcpStream::connect(proxy.addr()).await.unwrap();
        junk.write_all(b"\x00\x01\x02 not http\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), junk.read_to_end(&mut answer))
            .await
            .expect("closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        let dump: serde_json::Value =
            serde_json::from_str(&admin_request(proxy.admin.unwrap(), "GET", "/config_dump").1)
                .unwrap();
        assert_eq!(dump["listeners"][0]["http_inspector"], true);
    }
}

mod filter_chain_reloads {
    use super::*;

    fn config(dir: &ScratchDir, leaf: &Leaf, chains: &[(&str, &str)]) -> String {
        let (cert, key) = leaf.write(dir, "edge");
        let mut yaml = String::from(
            "admin: { address: 127.0.0.1:0 }\nlisteners:\n  - name: edge\n    address: 127.0.0.1:0\n    chains:\n",
        );
        for (name, body) in chains {
            yaml.push_str(&format!(
                "      - name: {name}\n        match: {{ server_names: [{name}.test] }}\n        tls: {{ certificates: [{{ cert_chain: {cert}, private_key: {key} }}] }}\n        routes: [{{ match: {{ prefix: / }}, direct_response: {{ status: 200, body: \"{body}\" }} }}]\n"
            ));
        }
        yaml
    }

    /// A changed chain's open connections take its new routes at their next request; a
    /// removed chain's are drained, and new connections for its name find no chain.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_changed_chain_follows_and_a_removed_one_drains() {
        let dir = ScratchDir::new();
        let ca = Ca::new("edge ca");
        let leaf = ca.leaf(&["a.test", "b.test"]);
        let proxy = Proxy::start(&config(&dir, &leaf, &[("a", "a1"), ("b", "b1")]), 1);
        let admin = proxy.admin.unwrap();
        let client = client_config(ca.roots(), ClientOptions::default());
        let mut on_a = h1_over(tls_connect(proxy.addr(), &client, "a.test").await.unwrap()).await;
        let mut on_b = h1_over(tls_connect(proxy.addr(), &client, "b.test").await.unwrap()).await;
        for (sender, want) in [(&mut on_a, "a1"), (&mut on_b, "b1")] {
            let response = sender.send_request(get("/", &[])).await.unwrap();
            assert_eq!(text(response.into_body()).await, want);
        }

        std::fs::write(proxy.config_path(), config(&dir, &leaf, &[("a", "a2")])).unwrap();
        let (status, body) = admin_request(admin, "POST", "/reload");
        assert_eq!(status, 200, "{body}");

        let response = on_a.send_request(get("/", &[])).await.unwrap();
        assert_eq!(
            text(response.into_body()).await,
            "a2",
            "the same connection"
        );
        // The idle connection of the removed chain is closed by the drain.
        eventually("the removed chain's connection closes", async || {
            on_b.ready().await.is_err()
        })
        .await;
        assert!(tls_connect(proxy.addr(), &client, "b.test").await.is_err());
        assert_eq!(
            stat_settled(admin, "downstream_cx_no_filter_chain_match", 1),
            1
        );
    }

    /// A removed chain's connections end too when they are not TLS: its idle (parked)
    /// HTTP/1.1 connection is closed by the drain, and its TCP relay, which a drain cannot
    /// ask to finish, is closed once `drain_timeout` is up, and still logged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_removed_chains_parked_connections_and_relays_are_closed() {
        let echo = {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        let (mut read, mut write) = stream.split();
                        let _ = tokio::io::copy(&mut read, &mut write).await;
                    });
                }
            });
            addr
        };
        let logs = ScratchDir::new();
        let log = logs.0.join("relay.log");
        let config = |chains: &str| {
            format!(
                "admin: {{ address: 127.0.0.1:0 }}\ndrain_timeout: 3s\nlisteners:\n  - name: edge\n    address: 127.0.0.1:0\n    http_inspector: true\n    chains:\n{chains}clusters:\n  - {{ name: echo, endpoints: [{echo}] }}\n"
            )
        };
        let h2c = "      - name: h2c\n        match: { transport_protocol: raw_buffer, application_protocols: [h2c] }\n        routes: [{ match: { prefix: / }, direct_response: { status: 200, body: h2c } }]\n";
        let web = "      - name: web\n        match: { transport_protocol: raw_buffer, application_protocols: [http/1.1] }\n        routes: [{ match: { prefix: / }, direct_response: { status: 200, body: web } }]\n";
        let relay = format!(
            "      - name: relay\n        match: {{ transport_protocol: raw_buffer }}\n        tcp_proxy: {{ cluster: echo }}\n        access_log: [{{ path: \"{}\", format: \"%BYTES_RECEIVED% %BYTES_SENT%\\n\" }}]\n",
            log.display()
        );
        let proxy = Proxy::start(&config(&format!("{h2c}{web}{relay}")), 1);
        let admin = proxy.admin.unwrap();

        let mut idle = TcpStream::connect(proxy.addr()).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        idle.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        eventually("the idle connection parked", async || {
            stat(admin, "downstream_cx_parked") == 1
        })
        .await;
        let mut relayed = TcpStream::connect(proxy.addr()).await.unwrap();
        relayed.write_all(b"\x00ping").await.unwrap();
        let mut echoed = [0u8; 5];
        relayed.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"\x00ping");

        std::fs::write(proxy.config_path(), config(h2c)).unwrap();
        let (status, body) = admin_request(admin, "POST", "/reload");
        assert_eq!(status, 200, "{body}");
        // The parked connection: closed at once, its rest of the response read first.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), idle.read_to_end(&mut rest))
            .await
            .expect("the parked connection closes")
            .unwrap();
        assert!(String::from_utf8_lossy(&rest).ends_with("web"), "{rest:?}");
        assert_eq!(stat(admin, "downstream_cx_parked"), 0);
        // The relay still relays through the drain, then is closed.
        relayed.write_all(b"pong").await.unwrap();
        let mut echoed = [0u8; 4];
        relayed.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"pong");
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(20), relayed.read_to_end(&mut rest))
            .await
            .expect("the relay closes after the drain time");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        eventually("the closed relay logged", async || {
            std::fs::read_to_string(&log).is_ok_and(|text| text == "9 9\n")
        })
        .await;
    }

    /// A listener's own routes that stop being its default chain drain their connections,
    /// rather than answering them 404 from then on: also a connection from before the
    /// listener had chains.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_default_chain_removed_drains_its_connections() {
        let chains = "    chains:\n      - name: other\n        match: { destination_port: 1 }\n        routes: [{ match: { prefix: / }, direct_response: { status: 200, body: other } }]\n";
        let config = |own: &str, chains: &str| {
            format!(
                "admin: {{ address: 127.0.0.1:0 }}\nlisteners:\n  - name: edge\n    address: 127.0.0.1:0\n{own}{chains}"
            )
        };
        let own =
            "    routes: [{ match: { prefix: / }, direct_response: { status: 200, body: own } }]\n";
        let proxy = Proxy::start(&config(own, ""), 1);
        let admin = proxy.admin.unwrap();
        let mut kept = TcpStream::connect(proxy.addr()).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        kept.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        let mut rest = [0u8; 1024];
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).ends_with("own") {
            let n = kept.read(&mut rest).await.unwrap();
            assert!(n > 0, "closed early");
            seen.extend_from_slice(&rest[..n]);
        }

        // Chains come, the own routes still the default: the connection goes on.
        std::fs::write(proxy.config_path(), config(own, chains)).unwrap();
        let (status, body) = admin_request(admin, "POST", "/reload");
        assert_eq!(status, 200, "{body}");
        kept.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        kept.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");

        // The own routes go: the connection drains.
        std::fs::write(proxy.config_path(), config("", chains)).unwrap();
        let (status, body) = admin_request(admin, "POST", "/reload");
        assert_eq!(status, 200, "{body}");
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), kept.read_to_end(&mut rest))
            .await
            .expect("the default chain's connection closes")
            .unwrap();
        assert!(String::from_utf8_lossy(&rest).ends_with("own"), "{rest:?}");
        // New connections find no chain.
        let mut late = TcpStream::connect(proxy.addr()).await.unwrap();
        let _ = late.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n").await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), late.read_to_end(&mut answer))
            .await
            .expect("closed");
        assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
    }
}

/// An expired certificate still serves (the client decides), and shows in `/certs` and the
/// expiry gauge as days past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certs_lists_days_until_expiration_and_the_gauge_the_soonest() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("test ca");
    let expired = ca.issue(&["localhost"], true);
    let (cert, key) = expired.write(&dir, "expired");
    let proxy = Proxy::start(&tls_config(&one_certificate(&cert, &key, ""), up), 1);
    let admin = proxy.admin.unwrap();
    let (status, body) = admin_request(admin, "GET", "/certs");
    assert_eq!(status, 200, "{body}");
    let certs: serde_json::Value = serde_json::from_str(&body).unwrap();
    let leaf = &certs["certificates"][0]["cert_chain"][0];
    assert_eq!(leaf["source"].as_str(), Some(cert.as_str()));
    assert_eq!(
        leaf["not_after"].as_i64(),
        Some(1_609_459_200),
        "2021-01-01"
    );
    let days = leaf["days_until_expiration"].as_i64().unwrap();
    assert!(days < -365, "{days}");
    // Read a moment apart: a day may turn in between.
    let gauge = stat(admin, "server_days_until_first_cert_expiring");
    assert!((gauge - days).abs() <= 1, "gauge {gauge}, /certs {days}");
}

/// RBAC rules on a mutual-TLS listener: the client certificate's names (`authenticated`)
/// and the server name the client asked for (`requested_server_name`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_reads_the_client_certificate_and_the_server_name() {
    let (up, _upstream) = upstream().await;
    let dir = ScratchDir::new();
    let ca = Ca::new("server ca");
    let clients = Ca::new("client ca");
    let (cert, key) = ca.leaf(&["localhost", "api.test"]).write(&dir, "edge");
    let client_ca = dir.write("clients.pem", &clients.pem());
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: secure
    address: 127.0.0.1:0
    tls:
      certificates: [{{ cert_chain: {cert}, private_key: {key} }}]
      client_certificate: {{ ca: {}, required: false }}
    http_filters:
      - rbac:
          rules:
            matchers:
              - name: partners-api
                action: allow
                match:
                  and:
                    - {{ requested_server_name: {{ exact: api.test }} }}
                    - {{ authenticated: {{ principal_name: {{ suffix: .partner.example }} }} }}
              - {{ name: site, action: allow, match: {{ requested_server_name: {{ exact: localhost }} }} }}
            on_no_match: deny
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{up}]
"#,
        client_ca.display()
    );
    let proxy = Proxy::start(&yaml, 1);
    let with_cert = |leaf: &Leaf| {
        client_config(
            ca.roots(),
            ClientOptions {
                client_cert: Some((leaf.der.clone(), leaf.key_der())),
                ..Default::default()
            },
        )
    };
    let partner = with_cert(&clients.leaf(&["acme.partner.example"]));
    let stranger = with_cert(&clients.leaf(&["someone.example"]));
    let anonymous = client_config(ca.roots(), ClientOptions::default());
    let status = async |client: &Arc<rustls::ClientConfig>, server_name: &str| {
        let stream = tls_connect(proxy.addr(), client, server_name)
            .await
            .unwrap();
        let mut sender = h1_over(stream).await;
        sender
            .send_request(get("/", &[]))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(status(&partner, "api.test").await, 200);
    assert_eq!(status(&stranger, "api.test").await, 403);
    assert_eq!(status(&anonymous, "api.test").await, 403);
    assert_eq!(status(&anonymous, "localhost").await, 200);
}
