//! TLS to upstream hosts: verified against a CA bundle or the system's roots, with SNI, ALPN
//! matching the cluster's protocol, and an optional client certificate.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

use config::tls::ClusterTlsConfig;
use config::tls::material::{TlsError, client_config, load_roots};

/// A cluster's TLS client settings, built once at start and shared by every worker.
pub(crate) struct UpstreamTls {
    connector: tokio_rustls::TlsConnector,
    /// Offering `http/1.1` alone, where the cluster offers more (`auto`): for connections
    /// that must speak HTTP/1.1 (a host that chose it before, an upgrade).
    http1_only: Option<tokio_rustls::TlsConnector>,
    /// Offering no protocol: bytes relayed for a `tcp_proxy` listener are not HTTP.
    no_alpn: tokio_rustls::TlsConnector,
    /// The configured name; `None`: each host's IP address.
    server_name: Option<ServerName<'static>>,
    /// Each host's own name, where it has one, instead (`auto_host_sni`).
    host_names: bool,
}

impl UpstreamTls {
    pub(crate) fn new(
        spec: &ClusterTlsConfig,
        // The ALPN protocols to offer, preferred first: `h2` for HTTP/2 clusters, `http/1.1`
        // for HTTP/1.1 ones, both for `auto`.
        alpn: &[&[u8]],
    ) -> Result<Self, TlsError> {
        let roots = match &spec.ca {
            Some(ca) => load_roots(ca)?,
            None => system_roots(),
        };
        let mut config = client_config(spec, roots)?;
        let no_alpn = tokio_rustls::TlsConnector::from(Arc::new(config.clone()));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let http1_only = (alpn.len() > 1).then(|| {
            let mut h1 = config.clone();
            h1.alpn_protocols = vec![b"http/1.1".to_vec()];
            tokio_rustls::TlsConnector::from(Arc::new(h1))
        });
        let server_name = spec
            .server_name
            .as_deref()
            .map(|name| {
                ServerName::try_from(name.to_owned()).map_err(|_| {
                    TlsError::Rustls(rustls::Error::General(format!(
                        "`{name}` is not a DNS name or IP address"
                    )))
                })
            })
            .transpose()?;
        Ok(Self {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            http1_only,
            no_alpn,
            server_name,
            host_names: spec.auto_host_sni,
        })
    }

    /// Whether each host's own name is sent and verified, where it has one.
    pub(crate) fn names_hosts(&self) -> bool {
        self.host_names
    }

    /// The TLS handshake over a connected socket, verifying the host's certificate. `name`:
    /// the name to send and verify instead of the configured one (`auto_sni`).
    pub(crate) async fn connect(
        &self,
        addr: SocketAddr,
        tcp: TcpStream,
        name: Option<&ServerName<'static>>,
    ) -> io::Result<TlsStream<TcpStream>> {
        self.connect_with(&self.connector, addr, tcp, name).await
    }

    /// As [`connect`](Self::connect), offering `http/1.1` alone.
    pub(crate) async fn connect_http1(
        &self,
        addr: SocketAddr,
        tcp: TcpStream,
        name: Option<&ServerName<'static>>,
    ) -> io::Result<TlsStream<TcpStream>> {
        let connector = self.http1_only.as_ref().unwrap_or(&self.connector);
        self.connect_with(connector, addr, tcp, name).await
    }

    /// As [`connect`](Self::connect), offering no protocol by ALPN.
    pub(crate) async fn connect_without_alpn(
        &self,
        addr: SocketAddr,
        tcp: TcpStream,
        name: Option<&ServerName<'static>>,
    ) -> io::Result<TlsStream<TcpStream>> {
        self.connect_with(&self.no_alpn, addr, tcp, name).await
    }

    async fn connect_with(
        &self,
        connector: &tokio_rustls::TlsConnector,
        addr: SocketAddr,
        tcp: TcpStream,
        name: Option<&ServerName<'static>>,
    ) -> io::Result<TlsStream<TcpStream>> {
        let name = match (name, &self.server_name) {
            (Some(name), _) | (None, Some(name)) => name.clone(),
            (None, None) => ServerName::IpAddress(addr.ip().into()),
        };
        connector.connect(name, tcp).await
    }
}

/// How a cluster reaches its hosts: its own TLS (or cleartext) at 0, then each of its
/// transport socket matches' (Envoy's `transport_socket_matches`), in order.
pub(crate) struct UpstreamTransports(Vec<(Option<String>, Option<UpstreamTls>)>);

impl UpstreamTransports {
    pub(crate) fn new(
        own: Option<UpstreamTls>,
        matches: Vec<(String, Option<UpstreamTls>)>,
    ) -> Self {
        let mut all = Vec::with_capacity(1 + matches.len());
        all.push((None, own));
        all.extend(matches.into_iter().map(|(name, tls)| (Some(name), tls)));
        Self(all)
    }

    /// Whether some hosts may be reached otherwise than by the cluster's own transport.
    pub(crate) fn has_matches(&self) -> bool {
        self.0.len() > 1
    }

    /// Where the match `name` is (0, the cluster's own, for none).
    pub(crate) fn index(&self, name: Option<&str>) -> usize {
        name.and_then(|name| self.0.iter().position(|(n, _)| n.as_deref() == Some(name)))
            .unwrap_or(0)
    }

    /// The TLS of transport `index`; `None`: cleartext.
    pub(crate) fn tls(&self, index: usize) -> Option<&UpstreamTls> {
        self.0.get(index).and_then(|(_, tls)| tls.as_ref())
    }
}

/// TLS to a service of the proxy's own (a collector, an authorization service): its CA (or
/// the system's roots), client certificate and name (`address`'s IP when none is given),
/// read now (a reload reads them again).
pub(crate) fn service_tls(
    spec: &config::ClusterTlsConfig,
    address: Option<std::net::IpAddr>,
) -> std::io::Result<(
    std::sync::Arc<rustls::ClientConfig>,
    rustls::pki_types::ServerName<'static>,
)> {
    use config::tls::material::{client_config, load_roots};
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let roots = match &spec.ca {
        Some(ca) => load_roots(ca).map_err(|e| invalid(e.to_string()))?,
        None => system_roots(),
    };
    let config = client_config(spec, roots).map_err(|e| invalid(e.to_string()))?;
    let server_name = match (&spec.server_name, address) {
        (Some(name), _) => rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|_| invalid(format!("`{name}` is not a DNS name or IP address")))?,
        (None, Some(ip)) => rustls::pki_types::ServerName::IpAddress(ip.into()),
        (None, None) => return Err(invalid("no name to verify the service by".into())),
    };
    Ok((std::sync::Arc::new(config), server_name))
}

/// TLS to an OpenTelemetry collector (its name set from the endpoint's host at load).
pub(crate) fn collector_tls(spec: &config::ClusterTlsConfig) -> std::io::Result<trace_export::Tls> {
    let (config, server_name) = service_tls(spec, None)?;
    Ok(trace_export::Tls {
        config,
        server_name,
    })
}

/// The system's trusted roots (`/etc/ssl/certs` and the like). Unreadable ones are skipped
/// with a warning: hosts then fail verification, which is the safe side.
pub(crate) fn system_roots() -> rustls::RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!(%error, "cannot read a system root certificate");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            ignored,
            "no system root certificates found: upstream TLS will fail to verify"
        );
    }
    roots
}

/// An upstream connection: cleartext, or TLS (boxed: the TLS state is large and most upstream
/// connections are cleartext).
pub(crate) type UpstreamIo = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// TLS to a filter's gRPC service (authorization, rate limit). The files were read when the
/// config was loaded; if they cannot be read now, the client trusts no certificate: its calls
/// fail, and the filter's failure mode answers (never a call in clear text).
pub(crate) fn grpc_service_tls(
    spec: &config::ClusterTlsConfig,
    endpoint: &grpc_channel::Endpoint,
    filter: &str,
) -> grpc_channel::Tls {
    let ip = match endpoint {
        grpc_channel::Endpoint::Tcp(addr) => Some(addr.ip()),
        grpc_channel::Endpoint::Unix(_) => None,
    };
    match crate::tls::service_tls(spec, ip) {
        Ok((config, server_name)) => grpc_channel::Tls {
            config,
            server_name,
        },
        Err(error) => {
            tracing::error!(%error, filter, "cannot set up TLS to the service; its calls will fail");
            let config =
                rustls::ClientConfig::builder_with_provider(config::tls::material::provider())
                    .with_safe_default_protocol_versions()
                    .expect("the crypto provider supports TLS 1.2 and 1.3")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
            grpc_channel::Tls {
                config: std::sync::Arc::new(config),
                server_name: rustls::pki_types::ServerName::IpAddress(
                    std::net::IpAddr::from([127, 0, 0, 1]).into(),
                ),
            }
        }
    }
}
