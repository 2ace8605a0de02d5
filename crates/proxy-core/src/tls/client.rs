//! TLS to upstream hosts: verified against a CA bundle or the system's roots, with SNI, ALPN
//! matching the cluster's protocol, and an optional client certificate.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

use super::settings::ClusterTlsConfig;
use super::{TlsError, load_certs, load_key, load_roots, provider, versions};

/// A cluster's TLS client settings, built once at start and shared by every worker.
pub(crate) struct UpstreamTls {
    connector: tokio_rustls::TlsConnector,
    /// The configured name; `None`: each host's IP address.
    server_name: Option<ServerName<'static>>,
}

impl UpstreamTls {
    pub(crate) fn new(
        spec: &ClusterTlsConfig,
        // The ALPN protocol to offer: `h2` for HTTP/2 clusters, `http/1.1` otherwise.
        alpn: &[u8],
    ) -> Result<Self, TlsError> {
        let roots = match &spec.ca {
            Some(ca) => load_roots(ca)?,
            None => system_roots(),
        };
        let mut config = build(spec, roots)?;
        config.alpn_protocols = vec![alpn.to_vec()];
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
            server_name,
        })
    }

    /// Loads the files `spec` names, as a start would (the system's roots are read at start).
    pub(crate) fn check(spec: &ClusterTlsConfig) -> Result<(), TlsError> {
        let roots = match &spec.ca {
            Some(ca) => load_roots(ca)?,
            None => rustls::RootCertStore::empty(),
        };
        build(spec, roots).map(drop)
    }

    /// The TLS handshake over a connected socket, verifying the host's certificate.
    pub(crate) async fn connect(
        &self,
        addr: SocketAddr,
        tcp: TcpStream,
    ) -> io::Result<TlsStream<TcpStream>> {
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => ServerName::IpAddress(addr.ip().into()),
        };
        self.connector.connect(name, tcp).await
    }
}

fn build(spec: &ClusterTlsConfig, roots: rustls::RootCertStore) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions(spec.min_version))?
        .with_root_certificates(roots);
    Ok(match &spec.client_certificate {
        None => builder.with_no_client_auth(),
        Some(pair) => builder
            .with_client_auth_cert(load_certs(&pair.cert_chain)?, load_key(&pair.private_key)?)?,
    })
}

/// The system's trusted roots (`/etc/ssl/certs` and the like). Unreadable ones are skipped
/// with a warning: hosts then fail verification, which is the safe side.
fn system_roots() -> rustls::RootCertStore {
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
