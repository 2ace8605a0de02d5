//! The HTTP/2 connection to the management server, over TCP (cleartext or TLS) or a Unix
//! socket.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use crate::{Endpoint, Options, StreamError};

/// Largest request sent (requests name resources; a response is bounded by
/// [`Options::max_message_size`]).
const MAX_REQUEST: usize = 256 * 1024 * 1024;

pub(crate) type AdsClient = AggregatedDiscoveryServiceClient<Channel>;

/// Opens the connection the ADS stream runs on.
pub(crate) async fn connect(options: &Options) -> Result<AdsClient, StreamError> {
    let failed = |reason: String| StreamError::Connect {
        endpoint: options.endpoint.clone(),
        reason,
    };
    let uri = match &options.endpoint {
        Endpoint::Tcp(addr) => format!("http://{addr}"),
        Endpoint::Unix(_) => "http://xds.local".to_owned(),
    };
    let endpoint = TonicEndpoint::from_shared(uri)
        .map_err(|e| failed(e.to_string()))?
        .connect_timeout(options.connect_timeout)
        .tcp_nodelay(true)
        // A server that vanishes without closing the connection is noticed within ~40 s.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let tls = match (&options.tls, &options.endpoint) {
        (None, _) => None,
        (Some(tls), Endpoint::Tcp(addr)) => Some(TlsConnector::new(tls, *addr).map_err(failed)?),
        (Some(_), Endpoint::Unix(_)) => {
            return Err(failed("TLS is for TCP addresses only".into()));
        }
    };
    let connect = async {
        match (&options.endpoint, tls) {
            (Endpoint::Tcp(_), None) => endpoint.connect().await,
            (Endpoint::Tcp(_), Some(tls)) => endpoint.connect_with_connector(tls).await,
            (Endpoint::Unix(path), _) => {
                endpoint
                    .connect_with_connector(UnixConnector(path.clone()))
                    .await
            }
        }
    };
    let channel = tokio::time::timeout(options.connect_timeout, connect)
        .await
        .map_err(|_| failed("timed out".into()))?
        .map_err(|e| failed(error_chain(&e)))?;
    Ok(AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(options.max_message_size)
        .max_encoding_message_size(MAX_REQUEST))
}

/// Connects to a Unix socket whatever the URI says.
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl tower_service::Service<http::Uri> for UnixConnector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) })
    }
}

/// TCP, then TLS verifying the server's name (its IP address when none is configured), with
/// `h2` offered.
#[derive(Clone)]
struct TlsConnector {
    addr: SocketAddr,
    name: rustls::pki_types::ServerName<'static>,
    connector: tokio_rustls::TlsConnector,
}

impl TlsConnector {
    fn new(tls: &crate::Tls, addr: SocketAddr) -> Result<Self, String> {
        let mut config = (tls.config)()?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = match &tls.server_name {
            Some(name) => rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|_| format!("`{name}` is not a DNS name or IP address"))?,
            None => rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
        };
        Ok(Self {
            addr,
            name,
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }
}

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect(this.addr).await?;
            let _ = tcp.set_nodelay(true);
            let tls = this.connector.connect(this.name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// An error with its causes: tonic's transport error alone says only "transport error".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
