//! The two ways OTLP reaches a collector: gRPC (`TraceService/Export` or
//! `LogsService/Export`, usually port 4317) and HTTP (a protobuf body POSTed to the URL
//! given, usually `/v1/traces` or `/v1/logs` on port 4318).

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use prost::Message;
use tonic::transport::Channel;

use crate::{ExportError, ExporterConfig, Protocol};

/// One batch's export request.
pub(crate) enum Export {
    Traces(ExportTraceServiceRequest),
    Logs(ExportLogsServiceRequest),
}

/// The collector's client, made once; it connects on first use and again after a failure.
pub(crate) enum Transport {
    /// With the metadata every export carries (boxed: most exporters have none, and the
    /// map is larger than the channel).
    Grpc(Channel, Box<tonic::metadata::MetadataMap>),
    /// Boxed: the client is several times the gRPC one's size.
    Http(Box<HttpTransport>),
}

pub(crate) struct HttpTransport {
    client: HttpClient,
    uri: http::Uri,
    /// `host` (when an authority is given) and the configured headers.
    headers: http::HeaderMap,
}

/// HTTP/1.1 to the collector, in clear text or over TLS.
enum HttpClient {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(Client<TlsConnector, Full<Bytes>>),
}

impl HttpClient {
    async fn request(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match self {
            HttpClient::Plain(client) => client.request(request).await,
            HttpClient::Tls(client) => client.request(request).await,
        }
    }
}

impl Transport {
    pub(crate) fn new(config: &ExporterConfig) -> Transport {
        let (endpoint, timeout) = (&config.endpoint, config.timeout);
        let mut headers = http::HeaderMap::new();
        for (name, value) in &config.headers {
            headers.append(name.clone(), value.clone());
        }
        match config.protocol {
            Protocol::Grpc => {
                let mut channel = tonic::transport::Endpoint::from(endpoint.clone())
                    .connect_timeout(timeout)
                    .timeout(timeout)
                    .tcp_nodelay(true);
                if let Some(authority) = &config.authority {
                    // Checked at load: a scheme and a valid authority make a valid URI.
                    let scheme = endpoint.scheme_str().unwrap_or("http");
                    if let Ok(origin) = format!("{scheme}://{authority}").parse::<http::Uri>() {
                        channel = channel.origin(origin);
                    }
                }
                let channel = match &config.tls {
                    None => channel.connect_lazy(),
                    Some(tls) => {
                        channel.connect_with_connector_lazy(TlsConnector::new(tls, b"h2", timeout))
                    }
                };
                Transport::Grpc(
                    channel,
                    Box::new(tonic::metadata::MetadataMap::from_headers(headers)),
                )
            }
            Protocol::HttpProtobuf => {
                if let Some(authority) = &config.authority
                    && let Ok(host) = http::HeaderValue::from_str(authority.as_str())
                {
                    headers.insert(http::header::HOST, host);
                }
                let builder = Client::builder(TokioExecutor::new());
                let client = match &config.tls {
                    None => HttpClient::Plain(builder.build(plain_connector(timeout))),
                    Some(tls) => {
                        HttpClient::Tls(builder.build(TlsConnector::new(tls, b"http/1.1", timeout)))
                    }
                };
                Transport::Http(Box::new(HttpTransport {
                    client,
                    uri: endpoint.clone(),
                    headers,
                }))
            }
        }
    }

    /// Sends one batch; `Ok` once the collector has taken it.
    pub(crate) async fn export(&mut self, request: Export) -> Result<(), ExportError> {
        match self {
            Transport::Grpc(channel, metadata) => {
                // A client per export is a clone of the channel: no new connection.
                let answer = match request {
                    Export::Traces(request) => {
                        let mut request = tonic::Request::new(request);
                        *request.metadata_mut() = (**metadata).clone();
                        TraceServiceClient::new(channel.clone())
                            .export(request)
                            .await
                            .map(drop)
                    }
                    Export::Logs(request) => {
                        let mut request = tonic::Request::new(request);
                        *request.metadata_mut() = (**metadata).clone();
                        LogsServiceClient::new(channel.clone())
                            .export(request)
                            .await
                            .map(drop)
                    }
                };
                answer.map_err(|status| ExportError::Grpc {
                    code: status.code(),
                    message: status.message().to_owned(),
                })
            }
            Transport::Http(http) => {
                let HttpTransport {
                    client,
                    uri,
                    headers,
                } = &**http;
                let body = Full::new(Bytes::from(match request {
                    Export::Traces(request) => request.encode_to_vec(),
                    Export::Logs(request) => request.encode_to_vec(),
                }));
                let mut post = http::Request::post(uri.clone())
                    .header(CONTENT_TYPE, "application/x-protobuf")
                    .body(body)
                    .map_err(|e| ExportError::Transport(e.to_string()))?;
                post.headers_mut()
                    .extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
                let response = client
                    .request(post)
                    .await
                    .map_err(|e| ExportError::Transport(error_chain(&e)))?;
                let status = response.status();
                // Read to the end, so the connection can carry the next batch.
                let _ = response.into_body().collect().await;
                if status.is_success() {
                    Ok(())
                } else {
                    Err(ExportError::Http(status))
                }
            }
        }
    }
}

fn plain_connector(timeout: std::time::Duration) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector.set_nodelay(true);
    connector
}

/// TCP to the collector (its name resolved as the plain connector does), then TLS with the
/// name it must carry and one protocol offered by ALPN.
#[derive(Clone)]
struct TlsConnector {
    tcp: HttpConnector,
    tls: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl TlsConnector {
    fn new(tls: &crate::Tls, alpn: &[u8], timeout: std::time::Duration) -> Self {
        let mut config = (*tls.config).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        let mut tcp = plain_connector(timeout);
        // The URL's scheme is `https`: this connector is the TLS.
        tcp.enforce_http(false);
        Self {
            tcp,
            tls: tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
            server_name: tls.server_name.clone(),
        }
    }
}

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = TlsIo;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<TlsIo, std::io::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let mut tcp = self.tcp.clone();
        let (tls, name) = (self.tls.clone(), self.server_name.clone());
        Box::pin(async move {
            let stream = tcp
                .call(uri)
                .await
                .map_err(|e| std::io::Error::other(error_chain(&e)))?
                .into_inner();
            let stream = tls.connect(name, stream).await?;
            Ok(TlsIo(hyper_util::rt::TokioIo::new(stream)))
        })
    }
}

/// A TLS connection to the collector, as hyper's client takes one.
struct TlsIo(hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>);

impl hyper::rt::Read for TlsIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
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

impl hyper_util::client::legacy::connect::Connection for TlsIo {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

/// An error with its causes: a client error alone often says only "client error".
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
