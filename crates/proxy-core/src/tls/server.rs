//! TLS termination: the certificate picked by SNI, ALPN, resumption, client certificates,
//! and certificates reloaded without a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::TrustAnchor;
use rustls::server::{ClientHello, ProducesTickets, ResolvesServerCert, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, crypto::CryptoProvider};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use config::tls::material::{
    TlsError, certified_key, client_verifier, load_roots, provider, versions,
};
use config::tls::{ListenerTlsConfig, ServerNameMatch, UnknownServerName};

use super::ticketer;
use crate::catalog::TlsStats;

/// Picks the certificate for a handshake by its SNI name: exact names first, then a wildcard
/// for the first label, then the default (unless unknown names are rejected).
#[derive(Debug)]
struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// Keyed by the name without its first label: `*.example.com` is under `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
}

impl SniResolver {
    /// The resolver, and what each of its certificates says (for `/certs`).
    fn new(
        spec: &ListenerTlsConfig,
        provider: &CryptoProvider,
    ) -> Result<(Self, Vec<ServedCertificate>), TlsError> {
        let mut served = Vec::with_capacity(spec.certificates.len());
        let mut resolver = SniResolver {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default: None,
        };
        let default = spec.default_certificate();
        for (i, cert) in spec.certificates.iter().enumerate() {
            let key = Arc::new(certified_key(
                &cert.cert_chain,
                &cert.private_key,
                provider,
            )?);
            served.push(ServedCertificate {
                source: cert.cert_chain.to_string(),
                facts: key
                    .cert
                    .first()
                    .and_then(|leaf| config::tls::facts::certificate_facts(leaf).ok()),
            });
            for name in &cert.server_names {
                match name {
                    ServerNameMatch::Exact(n) => resolver.exact.insert(n.clone(), Arc::clone(&key)),
                    ServerNameMatch::Wildcard(n) => {
                        resolver.wildcard.insert(n.clone(), Arc::clone(&key))
                    }
                };
            }
            if i == default && spec.unknown_server_name == UnknownServerName::Default {
                resolver.default = Some(key);
            }
        }
        Ok((resolver, served))
    }

    fn pick(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = server_name {
            // SNI names are usually lowercase already; only allocate when they are not.
            let lower;
            let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                lower = name.to_ascii_lowercase();
                lower.as_str()
            } else {
                name
            };
            if let Some(key) = self.exact.get(name) {
                return Some(Arc::clone(key));
            }
            if let Some((_, parent)) = name.split_once('.')
                && let Some(key) = self.wildcard.get(parent)
            {
                return Some(Arc::clone(key));
            }
        }
        self.default.clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let picked = self.pick(client_hello.server_name());
        if picked.is_none() {
            tracing::debug!(
                server_name = client_hello.server_name().unwrap_or(""),
                "no certificate for this server name: handshake refused"
            );
        }
        picked
    }
}

/// One listener's TLS: the current `rustls` config, swapped whole on reload. Session tickets
/// keys and the session cache outlive a reload, so clients keep resuming across it, unless
/// the client CA changed: a resumed session is not verified again, so sessions of clients
/// verified under the old CA must not resume.
pub(crate) struct ServerTls {
    listener: String,
    /// Its filter chain's name; `None`: the listener's own.
    chain: Option<String>,
    spec: ListenerTlsConfig,
    config: ArcSwap<ServerConfig>,
    /// What picks `config`'s certificates, asked again for the one a connection got.
    resolver: ArcSwap<SniResolver>,
    /// The certificates `config` serves, as loaded.
    served: ArcSwap<Vec<ServedCertificate>>,
    resumption: Mutex<Resumption>,
}

/// A certificate a listener serves: where it came from, and its leaf's facts (`None` if
/// they cannot be read, which does not stop it serving).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ServedCertificate {
    pub(crate) source: String,
    #[serde(flatten)]
    pub(crate) facts: Option<config::tls::facts::CertificateFacts>,
}

/// What resumes sessions, and the client CA the sessions it holds were verified under.
struct Resumption {
    ticketer: Option<Arc<dyn ProducesTickets>>,
    sessions: Arc<dyn StoresServerSessions>,
    client_ca: Option<Vec<TrustAnchor<'static>>>,
}

impl Resumption {
    fn new(
        spec: &ListenerTlsConfig,
        client_ca: Option<Vec<TrustAnchor<'static>>>,
    ) -> Result<Self, TlsError> {
        let ticketer = if spec.session_tickets {
            Some(ticketer()?)
        } else {
            None
        };
        let sessions: Arc<dyn StoresServerSessions> = if spec.session_cache_size > 0 {
            rustls::server::ServerSessionMemoryCache::new(spec.session_cache_size)
        } else {
            Arc::new(rustls::server::NoServerSessionStorage {})
        };
        Ok(Self {
            ticketer,
            sessions,
            client_ca,
        })
    }
}

impl ServerTls {
    /// `chain`: the filter chain it is of, if it is not the listener's own.
    pub(crate) fn new(
        listener: &str,
        chain: Option<&str>,
        spec: &ListenerTlsConfig,
    ) -> Result<Self, TlsError> {
        let client_ca = client_ca(spec)?;
        let resumption = Resumption::new(spec, client_ca.as_ref().map(|r| r.roots.clone()))?;
        let (config, resolver, served) = build(spec, client_ca, &resumption)?;
        Ok(Self {
            listener: listener.to_owned(),
            chain: chain.map(str::to_owned),
            spec: spec.clone(),
            config: ArcSwap::from_pointee(config),
            resolver: ArcSwap::new(resolver),
            served: ArcSwap::from_pointee(served),
            resumption: Mutex::new(resumption),
        })
    }

    /// The certificates it serves now.
    pub(crate) fn served(&self) -> Arc<Vec<ServedCertificate>> {
        self.served.load_full()
    }

    pub(crate) fn listener(&self) -> &str {
        &self.listener
    }

    /// The filter chain it is of; `None`: the listener's own.
    pub(crate) fn chain(&self) -> Option<&str> {
        self.chain.as_deref()
    }

    /// The settings this listener's TLS was built from.
    pub(crate) fn spec(&self) -> &ListenerTlsConfig {
        &self.spec
    }

    /// Reads the certificate, key and CA files again. New handshakes use them; connections
    /// already established are not touched. On an error the current config stays.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let client_ca = client_ca(&self.spec)?;
        let anchors = client_ca.as_ref().map(|r| r.roots.clone());
        let mut resumption = self.resumption.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = if resumption.client_ca != anchors {
            tracing::info!(
                listener = self.listener,
                "client CA changed: sessions issued under the old one no longer resume"
            );
            Some(Resumption::new(&self.spec, anchors)?)
        } else {
            None
        };
        let (config, resolver, served) =
            build(&self.spec, client_ca, fresh.as_ref().unwrap_or(&resumption))?;
        if let Some(fresh) = fresh {
            *resumption = fresh;
        }
        self.config.store(Arc::new(config));
        self.resolver.store(resolver);
        self.served.store(Arc::new(served));
        Ok(())
    }

    /// The leaf certificate a handshake asking for `server_name` is served (the one the
    /// resolver picks now: after a reload, possibly not the one an older connection got).
    pub(crate) fn local_certificate(
        &self,
        server_name: Option<&str>,
    ) -> Option<rustls::pki_types::CertificateDer<'static>> {
        self.resolver
            .load()
            .pick(server_name)
            .and_then(|key| key.cert.first().cloned())
    }

    /// The rustls config new handshakes use now (QUIC's is made from it).
    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        self.config.load_full()
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.load_full())
    }
}

/// The roots client certificates are verified against, read from their file.
fn client_ca(spec: &ListenerTlsConfig) -> Result<Option<rustls::RootCertStore>, TlsError> {
    spec.client_certificate
        .as_ref()
        .map(|client| load_roots(&client.ca))
        .transpose()
}

fn build(
    spec: &ListenerTlsConfig,
    client_ca: Option<rustls::RootCertStore>,
    resumption: &Resumption,
) -> Result<(ServerConfig, Arc<SniResolver>, Vec<ServedCertificate>), TlsError> {
    let provider = provider();
    let (resolver, served) = SniResolver::new(spec, &provider)?;
    let resolver = Arc::new(resolver);
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions(spec.min_version))?;
    let builder = match (&spec.client_certificate, client_ca) {
        (Some(client), Some(roots)) => {
            builder.with_client_cert_verifier(client_verifier(client, roots, &provider)?)
        }
        (None, _) => builder.with_no_client_auth(),
        // Never reached (client_ca reads the CA whenever certificates are asked for), and
        // never taken as "no client authentication".
        (Some(client), None) => {
            return Err(TlsError::Ca {
                path: client.ca.clone(),
                reason: "client certificates asked for without their CA".into(),
            });
        }
    };
    let mut config = builder.with_cert_resolver(Arc::clone(&resolver) as _);
    config.alpn_protocols = spec.alpn.iter().map(|p| p.id().to_vec()).collect();
    config.session_storage = Arc::clone(&resumption.sessions);
    if let Some(ticketer) = &resumption.ticketer {
        config.ticketer = Arc::clone(ticketer);
    }
    if resumption.ticketer.is_none() && spec.session_cache_size == 0 {
        // Nothing to resume with: do not hand out TLS 1.3 tickets that cannot be used.
        config.send_tls13_tickets = 0;
    }
    Ok((config, resolver, served))
}

/// Every TLS listener of the process, for `SIGHUP` and `POST /reload_certs`.
pub(crate) struct TlsListeners {
    listeners: Vec<Arc<ServerTls>>,
    /// `ssl_certificate_reload{result}` per listener: (success, failure). Reloads are rare
    /// and come from the admin or signal thread, so a lock is fine.
    counters: Mutex<Vec<(stats::Counter, stats::Counter)>>,
}

impl TlsListeners {
    /// Every TLS context, listeners' and their chains', in config order.
    pub(crate) fn all(&self) -> &[Arc<ServerTls>] {
        &self.listeners
    }

    pub(crate) fn new(
        listeners: Vec<Arc<ServerTls>>,
        counters: Vec<(stats::Counter, stats::Counter)>,
    ) -> Self {
        Self {
            listeners,
            counters: Mutex::new(counters),
        }
    }

    /// Reloads every listener's certificates: `(listener, outcome)` for each.
    pub(crate) fn reload_all(&self) -> Vec<(String, Result<(), TlsError>)> {
        self.reload_some(|_| true)
    }

    /// Reloads the certificates of the listeners `which` picks.
    pub(crate) fn reload_some(
        &self,
        which: impl Fn(&Arc<ServerTls>) -> bool,
    ) -> Vec<(String, Result<(), TlsError>)> {
        let counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        self.listeners
            .iter()
            .enumerate()
            .filter(|(_, tls)| which(tls))
            .map(|(i, tls)| {
                let outcome = tls.reload();
                match &outcome {
                    Ok(()) => {
                        tracing::info!(listener = tls.listener(), "TLS certificates reloaded");
                        if let Some((ok, _)) = counters.get(i) {
                            ok.inc();
                        }
                    }
                    Err(error) => {
                        tracing::error!(listener = tls.listener(), %error, "TLS certificate reload failed; the previous certificates stay in use");
                        if let Some((_, failed)) = counters.get(i) {
                            failed.inc();
                        }
                    }
                }
                (tls.listener().to_owned(), outcome)
            })
            .collect()
    }
}

/// A worker's side of one TLS listener: runs handshakes and counts them.
pub(crate) struct Handshake {
    server: Arc<ServerTls>,
    stats: TlsStats,
    timeout: Duration,
    /// Plaintext rustls queues for sending at most, as the listener's buffer limit.
    buffer_limit: usize,
}

impl Handshake {
    pub(crate) fn new(server: Arc<ServerTls>, stats: TlsStats, buffer_limit: u32) -> Self {
        let timeout = server.spec.handshake_timeout;
        Self {
            server,
            stats,
            timeout,
            buffer_limit: buffer_limit as usize,
        }
    }

    /// The listener's TLS.
    pub(crate) fn server(&self) -> &ServerTls {
        &self.server
    }

    /// Completes the handshake on `stream`, within the handshake timeout. A failure is
    /// counted and logged at debug level (scanners and plaintext clients are routine).
    pub(crate) async fn accept(&self, stream: TcpStream) -> Option<TlsStream<TcpStream>> {
        let started = Instant::now();
        let accepted =
            tokio::time::timeout(self.timeout, self.server.acceptor().accept(stream)).await;
        let mut tls = match accepted {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                self.stats.connection_error.inc();
                tracing::debug!(listener = self.server.listener(), %error, "TLS handshake failed");
                return None;
            }
            Err(_) => {
                self.stats.connection_error.inc();
                self.stats.handshake_timeout.inc();
                tracing::debug!(listener = self.server.listener(), "TLS handshake timed out");
                return None;
            }
        };
        self.stats.handshake_time.record_duration(started.elapsed());
        let conn = tls.get_mut().1;
        conn.set_buffer_limit(Some(self.buffer_limit));
        self.stats.handshake.inc();
        self.stats.version(conn.protocol_version());
        self.stats.alpn(conn.alpn_protocol());
        if conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
            self.stats.session_reused.inc();
        }
        if conn.peer_certificates().is_none_or(|c| c.is_empty()) {
            self.stats.no_certificate.inc();
        }
        Some(tls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::tls::{AlpnProtocol, CertificateConfig, PemSource, TlsVersion};

    fn cert_files(dir: &std::path::Path, name: &str) -> CertificateConfig {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("cert");
        let cert_chain = dir.join(format!("{name}.pem"));
        let private_key = dir.join(format!("{name}.key"));
        std::fs::write(&cert_chain, cert.pem()).expect("write");
        std::fs::write(&private_key, key.serialize_pem()).expect("write");
        CertificateConfig {
            cert_chain: PemSource::File(cert_chain),
            private_key: PemSource::File(private_key),
            server_names: Vec::new(),
        }
    }

    fn spec(certificates: Vec<CertificateConfig>, unknown: UnknownServerName) -> ListenerTlsConfig {
        ListenerTlsConfig {
            certificates,
            unknown_server_name: unknown,
            min_version: TlsVersion::Tls12,
            alpn: vec![AlpnProtocol::Http2, AlpnProtocol::Http11],
            session_tickets: true,
            session_cache_size: 16,
            handshake_timeout: Duration::from_secs(1),
            client_certificate: None,
        }
    }

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("legate-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn sni_picks_exact_then_wildcard_then_default() {
        let dir = temp_dir("sni");
        let mut a = cert_files(&dir, "a.test");
        a.server_names = vec![ServerNameMatch::Exact("a.test".into())];
        let mut b = cert_files(&dir, "b.test");
        b.server_names = vec![ServerNameMatch::Wildcard("b.test".into())];
        let fallback = cert_files(&dir, "default.test");
        let provider = provider();
        let (resolver, served) = SniResolver::new(
            &spec(vec![a, b, fallback], UnknownServerName::Default),
            &provider,
        )
        .expect("resolver");
        let names: Vec<_> = (served.iter())
            .map(|c| c.facts.as_ref().map(|f| f.dns_names.clone()))
            .collect();
        assert_eq!(
            names,
            [
                Some(vec!["a.test".to_owned()]),
                Some(vec!["b.test".to_owned()]),
                Some(vec!["default.test".to_owned()])
            ],
            "each certificate's facts, in order"
        );
        let leaf = |name: Option<&str>| resolver.pick(name).map(|k| k.cert[0].clone());
        let a_leaf = leaf(Some("a.test"));
        let b_leaf = leaf(Some("x.b.test"));
        let default_leaf = leaf(None);
        assert!(a_leaf.is_some() && b_leaf.is_some() && default_leaf.is_some());
        assert_ne!(a_leaf, b_leaf);
        assert_ne!(a_leaf, default_leaf);
        assert_eq!(leaf(Some("A.TEST")), a_leaf);
        // A wildcard covers one label only, and not the bare name.
        assert_eq!(leaf(Some("y.x.b.test")), default_leaf);
        assert_eq!(leaf(Some("b.test")), default_leaf);
        assert_eq!(leaf(Some("unknown.test")), default_leaf);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn reject_leaves_unknown_names_without_a_certificate() {
        let dir = temp_dir("reject");
        let mut a = cert_files(&dir, "a.test");
        a.server_names = vec![ServerNameMatch::Exact("a.test".into())];
        let (resolver, _) =
            SniResolver::new(&spec(vec![a], UnknownServerName::Reject), &provider())
                .expect("resolver");
        assert!(resolver.pick(Some("a.test")).is_some());
        assert!(resolver.pick(Some("b.test")).is_none());
        assert!(resolver.pick(None).is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let dir = temp_dir("mismatch");
        let a = cert_files(&dir, "a.test");
        let b = cert_files(&dir, "b.test");
        let mixed = CertificateConfig {
            private_key: b.private_key,
            ..a
        };
        let err =
            config::tls::material::check_listener(&spec(vec![mixed], UnknownServerName::Default))
                .expect_err("mismatched key");
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        let missing = CertificateConfig {
            cert_chain: PemSource::File(dir.join("missing.pem")),
            private_key: PemSource::File(dir.join("missing.key")),
            server_names: Vec::new(),
        };
        let err =
            config::tls::material::check_listener(&spec(vec![missing], UnknownServerName::Default))
                .expect_err("missing file");
        assert!(err.to_string().contains("missing.pem"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
