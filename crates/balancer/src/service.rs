//! A `tower::Service` that puts a [`LoadBalancer`] in front of a set of services (feature
//! `tower`).
//!
//! Each inner service is one host of a [`HostSet`]: give each an address (real, or any
//! distinct one that names it) with its weight and health. Every call picks a host with the
//! balancer and goes to that host's service; the [`Picked`] guard lives in the response
//! future until it completes, so least request sees the calls in progress.
//!
//! Readiness works as in `tower::steer::Steer`: [`Balance`] is ready when every inner service
//! is, because which one a call goes to is known only once the call (and its hash key) is
//! there. After a call only the service that took it is polled again, so for services that
//! are always ready (clients with their own queue or pool) readiness costs one poll per call.
//! Health changes and reweighting go through [`Balance::hosts`]; hosts added there without a
//! service fail calls routed to them with [`NoHostAvailable`].

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::{BuildError, HostSet, HostSpec, LbPolicy, LoadBalancer, Picked};

/// The error type of [`Balance`]: the inner service's error, or [`NoHostAvailable`].
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Returned when the balancer has no host for a call (none available, or the picked host has
/// no service).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoHostAvailable;

impl fmt::Display for NoHostAvailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no upstream host available")
    }
}

impl Error for NoHostAvailable {}

/// Computes a request's hash key for ring hash and maglev. Any `Fn(&Req) -> Option<u64>`
/// is one; [`NoHashKey`] gives none (policies that need a key then pick at random).
pub trait RequestHashKey<Req> {
    /// The key of `req`, usually [`hash_key`](crate::hash_key) of a header or address.
    fn hash_key(&self, req: &Req) -> Option<u64>;
}

/// No hash key for any request.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHashKey;

impl<Req> RequestHashKey<Req> for NoHashKey {
    fn hash_key(&self, _: &Req) -> Option<u64> {
        None
    }
}

impl<Req, F> RequestHashKey<Req> for F
where
    F: Fn(&Req) -> Option<u64>,
{
    fn hash_key(&self, req: &Req) -> Option<u64> {
        self(req)
    }
}

/// Services paired with the hosts that stand for them, validated (no duplicate address, no
/// zero weight): the input of [`BalanceLayer`].
pub struct Endpoints<S> {
    hosts: HostSet,
    addrs: Vec<SocketAddr>,
    services: Vec<S>,
}

impl<S> Endpoints<S> {
    /// Pairs each service with its host.
    pub fn new(endpoints: Vec<(HostSpec, S)>) -> Result<Self, BuildError> {
        let (specs, services): (Vec<HostSpec>, Vec<S>) = endpoints.into_iter().unzip();
        let addrs = specs.iter().map(|s| s.addr).collect();
        Ok(Self {
            hosts: HostSet::new(specs)?,
            addrs,
            services,
        })
    }
}

impl<S> fmt::Debug for Endpoints<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoints")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Routes each call to one of several services, chosen by a [`LoadBalancer`].
pub struct Balance<S, K = NoHashKey> {
    balancer: LoadBalancer,
    services: Vec<S>,
    addrs: Vec<SocketAddr>,
    by_addr: HashMap<SocketAddr, usize>,
    /// Services to poll before the next call: all at first, then the ones that took a call.
    unready: Vec<usize>,
    key: K,
}

impl<S> Balance<S> {
    /// A balancer over these services with `policy`.
    pub fn new(endpoints: Vec<(HostSpec, S)>, policy: LbPolicy) -> Result<Self, BuildError> {
        let endpoints = Endpoints::new(endpoints)?;
        let balancer = LoadBalancer::new(endpoints.hosts, policy)?;
        Ok(Self::from_parts(
            balancer,
            endpoints.addrs,
            endpoints.services,
        ))
    }

    fn from_parts(balancer: LoadBalancer, addrs: Vec<SocketAddr>, services: Vec<S>) -> Self {
        let by_addr = addrs.iter().enumerate().map(|(i, a)| (*a, i)).collect();
        Self {
            balancer,
            unready: (0..services.len()).collect(),
            services,
            addrs,
            by_addr,
            key: NoHashKey,
        }
    }
}

impl<S, K> Balance<S, K> {
    /// The same balancer, computing each request's hash key with `key`.
    pub fn with_hash_key<K2>(self, key: K2) -> Balance<S, K2> {
        Balance {
            balancer: self.balancer,
            services: self.services,
            addrs: self.addrs,
            by_addr: self.by_addr,
            unready: self.unready,
            key,
        }
    }

    /// The host set: change health or weights here.
    pub fn hosts(&self) -> &HostSet {
        self.balancer.hosts()
    }

    /// The balancer choosing among the services.
    pub fn balancer(&self) -> &LoadBalancer {
        &self.balancer
    }

    fn service_of(&self, picked: &Picked) -> Option<usize> {
        let addr = picked.addr();
        // Fast path: the host list is still the one the services were given with.
        if self.addrs.get(picked.index()) == Some(&addr) {
            return Some(picked.index());
        }
        self.by_addr.get(&addr).copied()
    }
}

impl<S, K> fmt::Debug for Balance<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balance")
            .field("balancer", &self.balancer)
            .field("unready", &self.unready.len())
            .finish_non_exhaustive()
    }
}

impl<S, K, Req> Service<Req> for Balance<S, K>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    K: RequestHashKey<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let mut i = 0;
        while i < self.unready.len() {
            match self.services[self.unready[i]].poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    self.unready.swap_remove(i);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => i += 1,
            }
        }
        if self.unready.is_empty() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let key = self.key.hash_key(&req);
        let Some(picked) = self.balancer.pick(key) else {
            return ResponseFuture::failed(NoHostAvailable);
        };
        let Some(index) = self.service_of(&picked) else {
            return ResponseFuture::failed(NoHostAvailable);
        };
        let future = self.services[index].call(req);
        self.unready.push(index);
        ResponseFuture {
            inner: Some(future),
            picked: Some(picked),
            error: None,
        }
    }
}

pin_project! {
    /// The response of a [`Balance`] call; holds the host's [`Picked`] guard until the inner
    /// future completes.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
        picked: Option<Picked>,
        error: Option<BoxError>,
    }
}

impl<F> ResponseFuture<F> {
    fn failed(error: impl Into<BoxError>) -> Self {
        Self {
            inner: None,
            picked: None,
            error: Some(error.into()),
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(error) = this.error.take() {
            return Poll::Ready(Err(error));
        }
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(Err("ResponseFuture polled after completion".into()));
        };
        let output = std::task::ready!(inner.poll(cx));
        // The request is over: release the host's in-flight slot now, not when the future
        // is dropped.
        this.picked.take();
        Poll::Ready(output.map_err(Into::into))
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("picked", &self.picked)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Balance`] from [`Endpoints`] in a `ServiceBuilder`.
///
/// ```
/// use balancer::{BalanceLayer, Endpoints, HostSpec, LbPolicy};
/// use tower::{ServiceBuilder, service_fn};
///
/// let echo = service_fn(|req: u32| async move { Ok::<_, std::convert::Infallible>(req) });
/// let endpoints = Endpoints::new(vec![
///     (HostSpec::new("127.0.0.1:1".parse()?), echo.clone()),
///     (HostSpec::new("127.0.0.1:2".parse()?), echo),
/// ])?;
/// let balance = ServiceBuilder::new()
///     .layer(BalanceLayer::new(LbPolicy::least_request())?)
///     .service(endpoints);
/// # let _ = balance;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BalanceLayer {
    policy: LbPolicy,
    panic_threshold: f64,
}

impl BalanceLayer {
    /// A layer balancing with `policy` and the default panic threshold.
    pub fn new(policy: LbPolicy) -> Result<Self, BuildError> {
        Self::with_panic_threshold(policy, crate::DEFAULT_PANIC_THRESHOLD)
    }

    /// A layer with another panic threshold, in percent.
    pub fn with_panic_threshold(
        policy: LbPolicy,
        panic_threshold: f64,
    ) -> Result<Self, BuildError> {
        // Build once over an empty set so every error surfaces here, not in `layer`.
        LoadBalancer::with_panic_threshold(HostSet::new(Vec::new())?, policy, panic_threshold)?;
        Ok(Self {
            policy,
            panic_threshold,
        })
    }
}

impl<S> Layer<Endpoints<S>> for BalanceLayer {
    type Service = Balance<S>;

    fn layer(&self, endpoints: Endpoints<S>) -> Balance<S> {
        let balancer =
            LoadBalancer::with_panic_threshold(endpoints.hosts, self.policy, self.panic_threshold)
                .expect("policy and threshold were validated by BalanceLayer::new");
        Balance::from_parts(balancer, endpoints.addrs, endpoints.services)
    }
}
