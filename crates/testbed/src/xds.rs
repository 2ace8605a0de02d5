//! A management server speaking Envoy's Aggregated Discovery Service
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService`), both state of the world
//! (`StreamAggregatedResources`) and incremental (`DeltaAggregatedResources`), whose resources
//! a test sets while clients are connected. Every request a client sends is recorded, so a
//! test can check its ACKs and NACKs (nonce, version, error detail) and what it subscribed to.
//!
//! It behaves as go-control-plane's snapshot cache does for one node:
//! * Each resource type has a version, bumped by every [`ManagementServer::set`] of that type.
//!   A state-of-the-world response carries all the resources of the type that the stream
//!   asked for (all of them when it named none) and that version; an incremental response
//!   carries only the resources whose own version the client does not have, and the names of
//!   those removed.
//! * A resource's own version (incremental) is a hash of its bytes, as go-control-plane's
//!   delta cache makes it: it changes only when they do, and a restarted server gives the
//!   same resource the same version.
//! * A request whose nonce answers the last response (an ACK or a NACK) gets no response
//!   until something changes; a new subscription gets the current state at once.
//!
//! And it misbehaves on demand, as a control plane under trouble does:
//! [`ManagementServer::reset_streams`] ends every stream with `UNAVAILABLE` (a flapping
//! server), [`ManagementServer::set_silent`] stops it answering anything (requests are still
//! recorded) until it is told to speak again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::Stream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Type URLs of the resource types Envoy's ADS carries.
pub mod type_url {
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
}

/// `message` as a resource body: its type URL and bytes.
pub fn any<M: prost::Message + prost::Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

/// One request a client sent, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// Which of the two variants the stream speaks.
    pub delta: bool,
    /// The stream it came on, counted from 1 in order of opening.
    pub stream: u64,
    pub type_url: String,
    /// The node's id, when the request carried the node (the first of every stream must).
    pub node_id: Option<String>,
    /// State of the world: the version the client last accepted.
    pub version_info: String,
    pub response_nonce: String,
    /// Set on a NACK: the client's reason for refusing the response.
    pub error_detail: Option<String>,
    /// State of the world: the names asked for; incremental: the names subscribed to.
    pub names: Vec<String>,
    /// Incremental: the names unsubscribed from.
    pub unsubscribed: Vec<String>,
    /// Incremental: the versions the client already has (first request of a stream).
    pub initial_versions: BTreeMap<String, String>,
}

impl SeenRequest {
    /// Whether this request answers a response (it carries a nonce) and refuses it.
    pub fn is_nack(&self) -> bool {
        !self.response_nonce.is_empty() && self.error_detail.is_some()
    }

    /// Whether this request answers a response (it carries a nonce) and accepts it.
    pub fn is_ack(&self) -> bool {
        !self.response_nonce.is_empty() && self.error_detail.is_none()
    }
}

/// A response the server sent, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentResponse {
    pub delta: bool,
    pub stream: u64,
    pub type_url: String,
    pub nonce: String,
    /// Names of the resources carried.
    pub names: Vec<String>,
    /// Incremental: names removed.
    pub removed: Vec<String>,
}

#[derive(Default)]
struct TypeState {
    version: u64,
    /// By name: the resource's own version and body.
    resources: BTreeMap<String, (String, Any)>,
}

#[derive(Default)]
struct Log {
    requests: Vec<SeenRequest>,
    responses: Vec<SentResponse>,
}

struct State {
    types: Mutex<HashMap<String, TypeState>>,
    log: Mutex<Log>,
    /// Bumped on every `set`: streams compare what they sent with the new state.
    changed: watch::Sender<u64>,
    /// Bumped on every request and response recorded, for [`ManagementServer::wait_for`].
    logged: watch::Sender<u64>,
    /// Bumped by [`ManagementServer::reset_streams`]: every stream open ends.
    resets: watch::Sender<u64>,
    /// While true, nothing is sent (requests are recorded); back to false, every stream
    /// catches up.
    silent: watch::Sender<bool>,
    streams: AtomicU64,
    nonces: AtomicU64,
}

/// A resource's own version: the first 16 hex digits of the SHA-256 of its bytes.
fn content_version(body: &Any) -> String {
    use sha2::Digest;
    let hash = sha2::Sha256::new()
        .chain_update(body.type_url.as_bytes())
        .chain_update(&body.value)
        .finalize();
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a test thread holding the lock leaves the data usable for the others.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl State {
    fn record_request(&self, seen: SeenRequest) {
        lock(&self.log).requests.push(seen);
        self.logged.send_modify(|n| *n += 1);
    }

    fn record_response(&self, sent: SentResponse) {
        lock(&self.log).responses.push(sent);
        self.logged.send_modify(|n| *n += 1);
    }

    fn nonce(&self) -> String {
        (self.nonces.fetch_add(1, Ordering::Relaxed) + 1).to_string()
    }
}

/// A running management server. Dropping it does not stop it; call
/// [`ManagementServer::shutdown`].
#[derive(Clone)]
pub struct ManagementServer {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Arc<watch::Sender<bool>>,
    /// Becomes true once the listening socket is closed.
    closed: watch::Receiver<bool>,
}

impl ManagementServer {
    /// Binds `addr` (port 0 for any) and serves on the current tokio runtime, with no
    /// resources.
    pub async fn start(addr: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        Ok(Self::serve(listener, addr))
    }

    /// As [`start`](Self::start), over TLS with `config` (which may ask for client
    /// certificates); connections whose handshake fails are dropped.
    pub async fn start_tls(
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        Ok(Self::serve(TlsIncoming { listener, acceptor }, addr))
    }

    /// Serves on a Unix socket at `path` (an existing file there is replaced).
    /// [`local_addr`](Self::local_addr) is then `0.0.0.0:0`.
    pub async fn start_unix(path: &std::path::Path) -> io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)?;
        Ok(Self::serve(listener, SocketAddr::from(([0, 0, 0, 0], 0))))
    }

    fn serve<L: Incoming>(listener: L, addr: SocketAddr) -> Self {
        let state = Arc::new(State {
            types: Mutex::new(HashMap::new()),
            log: Mutex::new(Log::default()),
            changed: watch::Sender::new(0),
            logged: watch::Sender::new(0),
            resets: watch::Sender::new(0),
            silent: watch::Sender::new(false),
            streams: AtomicU64::new(0),
            nonces: AtomicU64::new(0),
        });
        let state_for_loop = Arc::clone(&state);
        let (stop, stopped) = watch::channel(false);
        let (close, closed) = watch::channel(false);
        tokio::spawn(async move {
            accept_loop(listener, state_for_loop, stopped).await;
            // The listener is dropped by now: its port is free.
            close.send_replace(true);
        });
        Self {
            addr,
            state,
            stop: Arc::new(stop),
            closed,
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces every resource of `type_url` with `resources` (name, body), bumps the type's
    /// version and pushes the change to the streams subscribed to it.
    pub fn set(&self, type_url: &str, resources: Vec<(String, Any)>) {
        {
            let mut types = lock(&self.state.types);
            let ty = types.entry(type_url.to_owned()).or_default();
            ty.version += 1;
            ty.resources = resources
                .into_iter()
                .map(|(name, body)| (name, (content_version(&body), body)))
                .collect();
        }
        self.state.changed.send_modify(|n| *n += 1);
    }

    /// Ends every open stream with `UNAVAILABLE`, as a management server restarting or a
    /// proxy in between dropping them does; clients reconnect.
    pub fn reset_streams(&self) {
        self.state.resets.send_modify(|n| *n += 1);
    }

    /// Stops answering (`true`): requests, ACKs and NACKs are recorded but nothing is sent,
    /// whatever changes; streams stay open. Back to `false`, every stream is sent what it
    /// asked for since.
    pub fn set_silent(&self, silent: bool) {
        self.state.silent.send_replace(silent);
    }

    /// The type's current version, as state-of-the-world responses carry it.
    pub fn version(&self, type_url: &str) -> String {
        lock(&self.state.types)
            .get(type_url)
            .map_or(0, |t| t.version)
            .to_string()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.state.log).requests.clone()
    }

    /// Every response sent so far, in order.
    pub fn responses(&self) -> Vec<SentResponse> {
        lock(&self.state.log).responses.clone()
    }

    /// Waits until `done` holds for the requests and responses recorded, or `limit` passes.
    /// Returns whether it held.
    pub async fn wait_for(
        &self,
        limit: Duration,
        mut done: impl FnMut(&[SeenRequest], &[SentResponse]) -> bool,
    ) -> bool {
        let mut logged = self.state.logged.subscribe();
        let check = async {
            loop {
                {
                    let log = lock(&self.state.log);
                    if done(&log.requests, &log.responses) {
                        return;
                    }
                }
                if logged.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(limit, check).await.is_ok()
    }

    /// Closes the listener and every stream, as a management server going away does, and
    /// returns once the port is free (a new server may bind it at once).
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let mut closed = self.closed.clone();
        // An error means the accept task is gone, and the listener with it.
        let _ = closed.wait_for(|closed| *closed).await;
    }
}

/// A listening socket the server accepts connections on: TCP or Unix.
trait Incoming: Send + 'static {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn next(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Incoming for TcpListener {
    type Io = tokio::net::TcpStream;
    async fn next(&self) -> io::Result<Self::Io> {
        let (stream, _) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

struct TlsIncoming {
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Incoming for TlsIncoming {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    async fn next(&self) -> io::Result<Self::Io> {
        let (stream, _) = self.listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::time::timeout(Duration::from_secs(5), self.acceptor.accept(stream))
            .await
            .map_err(|_| io::Error::other("TLS handshake timed out"))?
    }
}

impl Incoming for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn next(&self) -> io::Result<Self::Io> {
        Ok(self.accept().await?.0)
    }
}

async fn accept_loop<L: Incoming>(
    listener: L,
    state: Arc<State>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.next() => match accepted {
                Ok(stream) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = until_stopped(&mut stopped) => return,
        };
        let service = AggregatedDiscoveryServiceServer::new(Ads {
            state: Arc::clone(&state),
            stopped: stopped.clone(),
        });
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new()).http2_only();
            let served =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            tokio::select! {
                _ = served => {}
                () = until_stopped(&mut stopped) => {}
            }
        });
    }
}

/// Resolves once the server is stopped (the guard `wait_for` returns is not `Send`).
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let stopped = stopped.wait_for(|s| *s).await.is_ok();
    if !stopped {
        // The sender is gone with the server: nothing will stop this any more.
        std::future::pending::<()>().await;
    }
}

struct Ads {
    state: Arc<State>,
    stopped: watch::Receiver<bool>,
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let stream = SotwStream::new(&self.state, tx);
        tokio::spawn(serve(stream, request.into_inner(), self.stopped.clone()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let stream = DeltaStream::new(&self.state, tx);
        tokio::spawn(serve(stream, request.into_inner(), self.stopped.clone()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// What the two variants' streams do differently: answer a request, and bring a type up to
/// date after a change. The loop around them is [`serve`].
trait Variant: Send + 'static {
    type Request: Send + 'static;

    /// False once the client is gone.
    fn on_request(&mut self, request: Self::Request) -> impl Future<Output = bool> + Send;

    /// Sends what changed of `type_url` (everything the client should have, if `always`).
    /// False once the client is gone.
    fn send(&mut self, type_url: &str, always: bool) -> impl Future<Output = bool> + Send;
}

/// One stream of either variant: its responses go out through `tx`; `subscriptions` holds,
/// by type, what it asked for and what it was sent.
struct AdsStream<Response, Subscription> {
    id: u64,
    state: Arc<State>,
    tx: mpsc::Sender<Result<Response, Status>>,
    subscriptions: HashMap<String, Subscription>,
}

impl<Response, Subscription> AdsStream<Response, Subscription> {
    fn new(state: &Arc<State>, tx: mpsc::Sender<Result<Response, Status>>) -> Self {
        Self {
            id: state.streams.fetch_add(1, Ordering::Relaxed) + 1,
            state: Arc::clone(state),
            tx,
            subscriptions: HashMap::new(),
        }
    }
}

/// Runs one stream: its requests, and the changes `set` makes, until either side goes away.
async fn serve<R, S>(
    mut stream: AdsStream<R, S>,
    mut incoming: Streaming<<AdsStream<R, S> as Variant>::Request>,
    mut stopped: watch::Receiver<bool>,
) where
    AdsStream<R, S>: Variant,
{
    let mut changed = stream.state.changed.subscribe();
    let mut resets = stream.state.resets.subscribe();
    let mut silent = stream.state.silent.subscribe();
    loop {
        tokio::select! {
            request = incoming.message() => match request {
                Ok(Some(request)) => {
                    if !stream.on_request(request).await {
                        return;
                    }
                }
                _ => return,
            },
            Ok(()) = changed.changed() => {
                if !catch_up(&mut stream, false).await {
                    return;
                }
            }
            Ok(()) = silent.changed() => {
                // Speaking again: what was asked for meanwhile, and what changed.
                let speaking = !*silent.borrow_and_update();
                if speaking && !catch_up(&mut stream, true).await {
                    return;
                }
            }
            Ok(()) = resets.changed() => {
                let _ = stream.tx.send(Err(Status::unavailable("stream reset by the server"))).await;
                return;
            }
            () = until_stopped(&mut stopped) => return,
        }
    }
}

/// Sends every type the stream subscribed to what changed (everything, if `always`). False
/// once the client is gone.
async fn catch_up<R, S>(stream: &mut AdsStream<R, S>, always: bool) -> bool
where
    AdsStream<R, S>: Variant,
{
    let types: Vec<String> = stream.subscriptions.keys().cloned().collect();
    for type_url in types {
        if !stream.send(&type_url, always).await {
            return false;
        }
    }
    true
}

/// What a state-of-the-world stream asked for of one type, and the version it was last sent.
#[derive(Default)]
struct SotwSubscription {
    names: Vec<String>,
    sent: Option<u64>,
}

type SotwStream = AdsStream<DiscoveryResponse, SotwSubscription>;

impl Variant for SotwStream {
    type Request = DiscoveryRequest;

    async fn on_request(&mut self, request: DiscoveryRequest) -> bool {
        self.state.record_request(SeenRequest {
            delta: false,
            stream: self.id,
            type_url: request.type_url.clone(),
            node_id: request.node.as_ref().map(|n| n.id.clone()),
            version_info: request.version_info.clone(),
            response_nonce: request.response_nonce.clone(),
            error_detail: request.error_detail.as_ref().map(|s| s.message.clone()),
            names: request.resource_names.clone(),
            unsubscribed: Vec::new(),
            initial_versions: BTreeMap::new(),
        });
        let subscription = self
            .subscriptions
            .entry(request.type_url.clone())
            .or_default();
        let fresh =
            request.response_nonce.is_empty() || subscription.names != request.resource_names;
        subscription.names = request.resource_names;
        // An ACK or a NACK of what was sent waits for the next change.
        !fresh || self.send(&request.type_url, true).await
    }

    /// Sends the current resources of `type_url` if the stream has not had this version (or
    /// `always`). False once the client is gone.
    async fn send(&mut self, type_url: &str, always: bool) -> bool {
        if *self.state.silent.borrow() {
            return true;
        }
        let Some(subscription) = self.subscriptions.get_mut(type_url) else {
            return true;
        };
        let (version, resources) = {
            let types = lock(&self.state.types);
            let Some(ty) = types.get(type_url) else {
                // Nothing of this type yet: the first `set` will answer.
                return true;
            };
            let wanted =
                |name: &String| subscription.names.is_empty() || subscription.names.contains(name);
            let resources: Vec<(String, Any)> = ty
                .resources
                .iter()
                .filter(|(name, _)| wanted(name))
                .map(|(name, (_, body))| (name.clone(), body.clone()))
                .collect();
            (ty.version, resources)
        };
        if !always && subscription.sent == Some(version) {
            return true;
        }
        subscription.sent = Some(version);
        let nonce = self.state.nonce();
        self.state.record_response(SentResponse {
            delta: false,
            stream: self.id,
            type_url: type_url.to_owned(),
            nonce: nonce.clone(),
            names: resources.iter().map(|(n, _)| n.clone()).collect(),
            removed: Vec::new(),
        });
        let response = DiscoveryResponse {
            version_info: version.to_string(),
            resources: resources.into_iter().map(|(_, body)| body).collect(),
            type_url: type_url.to_owned(),
            nonce,
            ..Default::default()
        };
        self.tx.send(Ok(response)).await.is_ok()
    }
}

/// What an incremental stream subscribed to of one type, and the versions it has.
#[derive(Default)]
struct DeltaSubscription {
    wildcard: bool,
    names: HashSet<String>,
    /// By name: the version of each resource the client holds.
    known: HashMap<String, String>,
}

type DeltaStream = AdsStream<DeltaDiscoveryResponse, DeltaSubscription>;

impl Variant for DeltaStream {
    type Request = DeltaDiscoveryRequest;

    async fn on_request(&mut self, request: DeltaDiscoveryRequest) -> bool {
        self.state.record_request(SeenRequest {
            delta: true,
            stream: self.id,
            type_url: request.type_url.clone(),
            node_id: request.node.as_ref().map(|n| n.id.clone()),
            version_info: String::new(),
            response_nonce: request.response_nonce.clone(),
            error_detail: request.error_detail.as_ref().map(|s| s.message.clone()),
            names: request.resource_names_subscribe.clone(),
            unsubscribed: request.resource_names_unsubscribe.clone(),
            initial_versions: request
                .initial_resource_versions
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        });
        let first = !self.subscriptions.contains_key(&request.type_url);
        let subscription = self
            .subscriptions
            .entry(request.type_url.clone())
            .or_default();
        if first {
            // The first request of a type: no names (or `*`) asks for all of them.
            subscription.wildcard = request.resource_names_subscribe.is_empty();
            subscription.known = request.initial_resource_versions.into_iter().collect();
        }
        let subscribes = !request.resource_names_subscribe.is_empty();
        for name in request.resource_names_subscribe {
            if name == "*" {
                subscription.wildcard = true;
            } else {
                subscription.names.insert(name);
            }
        }
        for name in request.resource_names_unsubscribe {
            if name == "*" {
                subscription.wildcard = false;
            }
            subscription.known.remove(&name);
            subscription.names.remove(&name);
        }
        if first || subscribes {
            return self.send(&request.type_url, first).await;
        }
        true
    }

    /// Sends what the client lacks of `type_url` (and what it holds that is gone), if
    /// anything or `always`. False once the client is gone.
    async fn send(&mut self, type_url: &str, always: bool) -> bool {
        if *self.state.silent.borrow() {
            return true;
        }
        let Some(subscription) = self.subscriptions.get_mut(type_url) else {
            return true;
        };
        let mut resources = Vec::new();
        let mut removed = Vec::new();
        {
            let types = lock(&self.state.types);
            let empty = BTreeMap::new();
            let current = types.get(type_url).map_or(&empty, |t| &t.resources);
            for (name, (own, body)) in current {
                let wanted = subscription.wildcard || subscription.names.contains(name);
                let version = own.clone();
                if wanted && subscription.known.get(name) != Some(&version) {
                    subscription.known.insert(name.clone(), version.clone());
                    resources.push(Resource {
                        name: name.clone(),
                        version,
                        resource: Some(body.clone()),
                        ..Default::default()
                    });
                }
            }
            subscription.known.retain(|name, _| {
                let kept = current.contains_key(name);
                if !kept {
                    removed.push(name.clone());
                }
                kept
            });
        }
        if !always && resources.is_empty() && removed.is_empty() {
            return true;
        }
        let nonce = self.state.nonce();
        self.state.record_response(SentResponse {
            delta: true,
            stream: self.id,
            type_url: type_url.to_owned(),
            nonce: nonce.clone(),
            names: resources.iter().map(|r| r.name.clone()).collect(),
            removed: removed.clone(),
        });
        let response = DeltaDiscoveryResponse {
            resources,
            type_url: type_url.to_owned(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        };
        self.tx.send(Ok(response)).await.is_ok()
    }
}
