//! Envoy's load-balancing policies as a library: round robin, least request, random, ring
//! hash and maglev over a live set of hosts.
//!
//! The crate is independent of the proxy and of any async runtime. It is built from three
//! things:
//!
//! - a [`HostSet`]: hosts ([`HostSpec`]: address, weight, [`Health`], priority, locality)
//!   behind an atomically
//!   swapped snapshot. Updates (add, remove, reweight, health changes) never stop a pick, and
//!   hosts that stay keep their state;
//! - a [`LoadBalancer`]: one [`LbPolicy`] over a `HostSet`, `Send + Sync`, usable shared
//!   across threads or one per worker thread over clones of the same set;
//! - a [`Picked`] guard from [`LoadBalancer::pick`]: the chosen [`Host`], counted as one
//!   request in flight until the guard is dropped (least request reads these counts).
//!
//! Picks are lock-free and allocate nothing. Unhealthy and ejected hosts are skipped;
//! degraded hosts get traffic only when healthy ones are too few; below the panic threshold
//! (50% by default) the balancer ignores health and uses every host, as Envoy does. Hosts at
//! priority 1 and beyond take the load that the levels above cannot (Envoy's overprovisioning
//! factor, 140% by default), and with [`LbSettings::locality_weighted`] each pick draws a
//! locality by its weight first. Given the proxy's own fleet ([`LocalCluster`]), a balancer
//! routes by zone as Envoy does: as much traffic to its own locality as keeps the upstream
//! hosts evenly loaded.
//!
//! # Embedding
//!
//! ```
//! use balancer::{Health, HostSet, HostSpec, LbPolicy, LoadBalancer};
//!
//! let a = "10.0.0.1:8080".parse().unwrap();
//! let b = "10.0.0.2:8080".parse().unwrap();
//! let hosts = HostSet::new(vec![HostSpec::new(a), HostSpec::new(b).with_weight(3)])?;
//! let lb = LoadBalancer::new(hosts.clone(), LbPolicy::least_request())?;
//!
//! {
//!     let picked = lb.pick(None).expect("two healthy hosts");
//!     assert_eq!(picked.active_requests(), 1); // in flight while `picked` lives
//!     // ... send the request to picked.addr() ...
//! } // dropped: the request is over
//!
//! // Health checks and discovery publish changes; picks see them at once.
//! hosts.set_health(b, Health::Unhealthy);
//! hosts.update(vec![HostSpec::new(a), HostSpec::new(b), HostSpec::new("10.0.0.3:8080".parse()?)])?;
//!
//! // Consistent hashing: hash a header, cookie or client address with `hash_key`.
//! let ring = LoadBalancer::new(hosts.clone(), LbPolicy::maglev())?;
//! let key = balancer::hash_key(b"user-42");
//! let first = ring.pick(Some(key)).expect("hosts").addr();
//! assert_eq!(ring.pick(Some(key)).expect("hosts").addr(), first);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `examples/embed.rs` is a small tokio service that forwards connections through a
//! `LoadBalancer`.
//!
//! # With tower
//!
//! With the `tower` feature, `Balance` is a `tower::Service` that routes each call to one
//! of a set of services through a `LoadBalancer` (and `BalanceLayer` builds it in a
//! `ServiceBuilder`). The guard is held until the response future completes, so least
//! request sees calls in progress.
//!
//! ```
//! # #[cfg(feature = "tower")]
//! # fn main() -> Result<(), balancer::BoxError> {
//! use balancer::{Balance, HostSpec, LbPolicy};
//! use tower::{Service, ServiceExt, service_fn};
//!
//! let backend = |name: &'static str| {
//!     service_fn(move |req: String| async move {
//!         Ok::<_, std::convert::Infallible>(format!("{name} got {req}"))
//!     })
//! };
//! let mut balance = Balance::new(
//!     vec![
//!         (HostSpec::new("127.0.0.1:9001".parse()?), backend("a")),
//!         (HostSpec::new("127.0.0.1:9002".parse()?), backend("b")),
//!     ],
//!     LbPolicy::RoundRobin,
//! )?;
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().build()?;
//! runtime.block_on(async {
//!     let first = balance.ready().await?.call("x".to_string()).await?;
//!     let second = balance.ready().await?.call("y".to_string()).await?;
//!     assert_ne!(first[..1], second[..1]); // one each
//!     Ok::<_, balancer::BoxError>(())
//! })?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "tower"))]
//! # fn main() {}
//! ```
//!
//! # Metrics
//!
//! With the `metrics` feature, each balancer records its picks, failed picks, panic-mode
//! entries and table rebuilds, and each host set its updates, through the `metrics` facade
//! (the names are in `src/meters.rs`), for the embedding service to export with the recorder
//! it installs. `examples/metrics.rs` exports them with metrics-exporter-prometheus
//! (`cargo run -p balancer --features metrics --example metrics`). Handles are made with the
//! balancer: a pick costs one counter increment.

#![deny(unsafe_code)]

mod balancer;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod hash;
mod host;
mod least_request;
mod locality;
mod maglev;
mod member;
#[cfg(feature = "metrics")]
mod meters;
mod policy;
mod priority;
mod random;
mod ring_hash;
mod rng;
mod round_robin;
#[cfg(feature = "tower")]
mod service;
mod slow_start;
mod split;
mod zone;

pub use balancer::{DEFAULT_OVERPROVISIONING_FACTOR, LbSettings, LoadBalancer, Peeked};
pub use error::BuildError;
pub use hash::{hash_key, hash_keys};
pub use host::{Health, Host, HostSet, HostSpec, Picked, Snapshot, ZoneRoute};
pub use policy::{
    DEFAULT_ACTIVE_REQUEST_BIAS, DEFAULT_CHOICE_COUNT, DEFAULT_MAGLEV_TABLE_SIZE,
    DEFAULT_MINIMUM_RING_SIZE, DEFAULT_PANIC_THRESHOLD, LbPolicy, LeastRequestOptions,
    MAX_MAGLEV_TABLE_SIZE, MAX_RING_SIZE, MaglevOptions, RingHashOptions,
};
pub use round_robin::RoundRobin;
#[cfg(feature = "tower")]
pub use service::{
    Balance, BalanceLayer, BoxError, Endpoints, NoHashKey, NoHostAvailable, RequestHashKey,
    ResponseFuture,
};
pub use slow_start::SlowStart;
pub use split::WeightedSplit;
pub use zone::{LocalCluster, ZoneAwareSettings, ZoneRouting};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_types_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<HostSet>();
        assert_send_sync::<LoadBalancer>();
        assert_send_sync::<Picked>();
        assert_send_sync::<Host>();
        assert_send_sync::<Snapshot>();
        assert_send_sync::<RoundRobin>();
    }
}
