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
    client: Client<HttpConnector, Full<Bytes>>,
    uri: http::Uri,
    /// `host` (when an authority is given) and the configured headers.
    headers: http::HeaderMap,
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
                    // Checked at load: `http://` and a valid authority make a valid URI.
                    if let Ok(origin) = format!("http://{authority}").parse::<http::Uri>() {
                        channel = channel.origin(origin);
                    }
                }
                Transport::Grpc(
                    channel.connect_lazy(),
                    Box::new(tonic::metadata::MetadataMap::from_headers(headers)),
                )
            }
            Protocol::HttpProtobuf => {
                if let Some(authority) = &config.authority
                    && let Ok(host) = http::HeaderValue::from_str(authority.as_str())
                {
                    headers.insert(http::header::HOST, host);
                }
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(timeout));
                connector.set_nodelay(true);
                Transport::Http(Box::new(HttpTransport {
                    client: Client::builder(TokioExecutor::new()).build(connector),
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
