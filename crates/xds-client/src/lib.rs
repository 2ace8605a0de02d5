//! A client for Envoy's aggregated discovery service (ADS).
//!
//! Fleets of Envoy take their listeners, routes, clusters and endpoints from a management
//! server over one gRPC stream, `envoy.service.discovery.v3.AggregatedDiscoveryService`. This
//! crate speaks that protocol as Envoy does, so existing control planes (go-control-plane,
//! Istio, Envoy Gateway, Contour) can drive whatever embeds it:
//!
//! - one stream, in the state-of-the-world or the incremental (delta) variant;
//! - the node on the first request of every stream;
//! - clusters and listeners subscribed as wildcards, endpoints, route configurations and
//!   secrets (SDS) by the names the [`Handler`] says it needs after each update;
//! - each response ACKed (its nonce, and in state of the world its version) once the handler
//!   has put it in force, or NACKed with the handler's reason (and the last accepted
//!   version), in which case the handler keeps what it had;
//! - when the stream ends or the server cannot be reached, a new stream after a jittered
//!   exponential backoff, resynchronised with the versions already held.
//!
//! What a resource means is the handler's business; this crate hands it the decoded
//! envelope ([`Update`]) and keeps the protocol's bookkeeping.
//!
//! ```no_run
//! use std::collections::BTreeSet;
//! use std::sync::Arc;
//! use xds_client::{Endpoint, Handler, Options, Update, Variant};
//!
//! struct Print;
//!
//! impl Handler for Print {
//!     async fn apply(&mut self, update: Update) -> Result<(), String> {
//!         println!("{}: {} resources", update.type_url, update.resources.len());
//!         Ok(())
//!     }
//!     fn wanted(&self, _type_url: &str) -> Arc<BTreeSet<String>> {
//!         Arc::default()
//!     }
//!     fn connected(&mut self, up: bool) {
//!         println!("connected: {up}");
//!     }
//! }
//!
//! # async fn run() {
//! let options = Options::new(
//!     Endpoint::Tcp("127.0.0.1:18000".parse().unwrap()),
//!     Variant::Delta,
//!     xds_client::node("edge-1", "edge"),
//! );
//! xds_client::run(options, Print).await; // runs until dropped
//! # }
//! ```

mod backoff;
mod delta;
mod sotw;
mod subscription;
mod transport;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

pub use envoy_types::pb::envoy::config::core::v3::Node;
pub use envoy_types::pb::google::protobuf::Any;

pub use backoff::Backoff;
use subscription::Subscriptions;

/// The resource types this client subscribes to, in the order Envoy subscribes.
pub mod type_url {
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    /// SDS: certificates and CA bundles that listeners and clusters name.
    pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

    /// Every type, clusters first: a listener's routes name clusters, so clusters should be
    /// known by the time they arrive.
    pub const ALL: [&str; 5] = [CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET];

    /// Whether every resource of the type is subscribed (`true`: clusters and listeners) or
    /// only those named ([`crate::Handler::wanted`]).
    pub fn is_wildcard(type_url: &str) -> bool {
        type_url == CLUSTER || type_url == LISTENER
    }
}

/// Where the management server listens.
pub use service_endpoint::Endpoint;

/// The two variants of the ADS protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `StreamAggregatedResources`: each response carries every subscribed resource of its
    /// type (clusters and listeners: all of them; absence means removal).
    StateOfTheWorld,
    /// `DeltaAggregatedResources`: each response carries what changed and what was removed.
    Delta,
}

/// How to reach the management server and who this client is.
#[derive(Debug, Clone)]
pub struct Options {
    pub endpoint: Endpoint,
    pub variant: Variant,
    pub node: Node,
    /// Waits between streams after a failure.
    pub backoff: Backoff,
    /// A connect attempt that takes longer fails.
    pub connect_timeout: Duration,
    /// TLS to the server (TCP only); `None`: cleartext HTTP/2.
    pub tls: Option<Tls>,
    /// The largest response read, in bytes. A larger one is refused from its length prefix,
    /// before its body is buffered: the stream ends ([`StreamError::TooLarge`]) and the
    /// resources held stay. Default [`DEFAULT_MAX_MESSAGE_SIZE`].
    pub max_message_size: usize,
}

/// The default [`Options::max_message_size`]: 256 MiB, room for a whole fleet's clusters in
/// one response.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 256 * 1024 * 1024;

/// TLS to the management server.
#[derive(Clone)]
pub struct Tls {
    /// Makes the rustls config for each new connection, so that certificate files replaced
    /// since are read again; an error fails that connect attempt. `h2` is offered by ALPN
    /// whatever the config says.
    pub config: Arc<dyn Fn() -> Result<rustls::ClientConfig, String> + Send + Sync>,
    /// The name the server's certificate must carry; `None`: its IP address.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Options {
    /// Envoy's defaults: backoff from 500 ms to 30 s, connect timeout 5 s.
    pub fn new(endpoint: Endpoint, variant: Variant, node: Node) -> Self {
        Self {
            endpoint,
            variant,
            node,
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
            tls: None,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        }
    }
}

/// A node with an id and a cluster, and this client's name as its user agent.
pub fn node(id: &str, cluster: &str) -> Node {
    Node {
        id: id.to_owned(),
        cluster: cluster.to_owned(),
        user_agent_name: "legate".to_owned(),
        ..Default::default()
    }
}

/// One resource of a response.
#[derive(Debug, Clone)]
pub struct Resource {
    /// Its name as the server gave it (delta); empty in state of the world, where the name
    /// is inside the resource.
    pub name: String,
    /// Its version as the server gave it (delta); empty in state of the world.
    pub version: String,
    pub value: Any,
}

/// The resources of one response, all of one type.
#[derive(Debug, Clone)]
pub struct Update {
    pub type_url: String,
    /// `true`: `resources` is every resource of the type, and any other is removed (state of
    /// the world, clusters and listeners). `false`: resources not named are unchanged,
    /// except those in `removed`.
    pub complete: bool,
    pub resources: Vec<Resource>,
    /// Names of resources the server removed (delta).
    pub removed: Vec<String>,
    /// The response's version: state of the world's version of the type, delta's system
    /// version (informational).
    pub version_info: String,
}

/// What the client calls with each update, and asks which resources to subscribe to.
pub trait Handler: Send {
    /// Puts `update` in force, or says why it cannot (the response is then NACKed with the
    /// reason and the handler is expected to keep what it had).
    fn apply(&mut self, update: Update) -> impl Future<Output = Result<(), String>> + Send;

    /// The names of `type_url` resources needed now: route configurations the listeners
    /// name, endpoints of the clusters that take them from EDS. Asked after every update for
    /// the types that are not wildcards.
    fn wanted(&self, type_url: &str) -> Arc<BTreeSet<String>>;

    /// Called when a stream is established (`true`) and when it ends (`false`).
    fn connected(&mut self, up: bool);

    /// Called when a stream ends or cannot be opened, with why, before `connected(false)`.
    fn stream_ended(&mut self, error: &StreamError) {
        let _ = error;
    }
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect { endpoint: Endpoint, reason: String },
    #[error("the stream was refused: {0}")]
    Refused(tonic::Status),
    #[error("the stream broke: {0}")]
    Broken(tonic::Status),
    /// A response longer than [`Options::max_message_size`]: it cannot be read, so not
    /// NACKed either (its nonce is in it); the stream is ended instead, as Envoy's gRPC
    /// client does.
    #[error("a response was larger than the limit and was refused: {0}")]
    TooLarge(tonic::Status),
    #[error("the server closed the stream")]
    Closed,
    #[error("the request stream is gone")]
    RequestsGone,
}

/// Keeps a stream to the management server open for as long as the returned future runs:
/// a new stream after each failure, `options.backoff` apart, reset once a stream has
/// delivered a response.
pub async fn run<H: Handler>(options: Options, mut handler: H) {
    let mut subscriptions = Subscriptions::new(&handler);
    let mut backoff = options.backoff.clone();
    loop {
        let outcome = match transport::connect(&options).await {
            Ok(channel) => match options.variant {
                Variant::StateOfTheWorld => {
                    sotw::stream(channel, &options.node, &mut subscriptions, &mut handler).await
                }
                Variant::Delta => {
                    delta::stream(channel, &options.node, &mut subscriptions, &mut handler).await
                }
            },
            Err(error) => Err((error, false)),
        };
        let (error, responded) = match outcome {
            Ok(()) => (StreamError::Closed, true),
            Err(pair) => pair,
        };
        handler.stream_ended(&error);
        handler.connected(false);
        if responded {
            backoff.reset();
        }
        let wait = backoff.next_wait();
        tracing::warn!(
            endpoint = %options.endpoint,
            %error,
            retry_in_ms = wait.as_millis() as u64,
            "xDS stream ended; the config in force stays"
        );
        tokio::time::sleep(wait).await;
    }
}

/// The `error_detail` of a NACK: INVALID_ARGUMENT with the handler's reason.
fn nack_status(message: String) -> envoy_types::pb::google::rpc::Status {
    envoy_types::pb::google::rpc::Status {
        code: tonic::Code::InvalidArgument as i32,
        message,
        details: Vec::new(),
    }
}

/// The next response of a stream; the error says why the stream ended, and whether a
/// response had come on it (`responded`).
async fn next_response<T>(
    responses: &mut tonic::Streaming<T>,
    responded: bool,
) -> Result<T, (StreamError, bool)> {
    match responses.message().await {
        Ok(Some(response)) => Ok(response),
        Ok(None) => Err((StreamError::Closed, responded)),
        Err(status) if is_too_large(&status) => Err((StreamError::TooLarge(status), responded)),
        Err(status) => Err((StreamError::Broken(status), responded)),
    }
}

/// Whether the stream failed on a message over the decoder's limit (tonic's `OUT_OF_RANGE`,
/// "decoded message length too large").
fn is_too_large(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::OutOfRange && status.message().contains("too large")
}

/// Queues a request on the stream (after a response, so `true`: one had come).
fn send<T>(
    requests: &tokio::sync::mpsc::UnboundedSender<T>,
    request: T,
) -> Result<(), (StreamError, bool)> {
    requests
        .send(request)
        .map_err(|_| (StreamError::RequestsGone, true))
}
