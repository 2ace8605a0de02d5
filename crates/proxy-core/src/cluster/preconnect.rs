//! Connections opened ahead of the requests that will use them (Envoy's
//! `preconnect_policy`), so that a request finds one ready instead of waiting a connect.
//!
//! Both ratios compare the streams wanted, the requests in flight times the ratio, with the
//! streams the connections can carry, open or being opened (Envoy's "connecting and
//! connected capacity"): an HTTP/1.1 or relayed connection carries one, an HTTP/2 one up to
//! `max_concurrent_streams`. `per_upstream_ratio` looks at one host's pool on this worker
//! each time a request takes a connection there; `predictive_ratio` at the whole cluster on
//! this worker each time a request is admitted, and opens to the hosts the balancer's next
//! picks will go to. At most three connections are opened per look, only to healthy hosts,
//! and only within the circuit breakers (a refusal is counted in `upstream_cx_overflow`).
//! As Envoy, connections opened ahead stay until used, idle past `idle_timeout` or closed by
//! the host.

use std::rc::{Rc, Weak};

use balancer::Health;

use super::health::TryOutcome;
use super::tcp::ReadyRelay;
use super::{Cluster, HostPool};
use config::UpstreamProtocol;

/// Envoy's cap on connections opened by one look: a host that comes back should not be
/// flooded with all that its traffic would want at once.
const MAX_PER_LOOK: usize = 3;

/// What a connection opened ahead will carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ahead {
    Http1,
    Http2,
    /// Relayed bytes (`tcp_proxy`).
    Relay,
}

/// An HTTP/2 connection being opened on a pool, counted in its capacity until dropped;
/// requests waiting for it are woken then, however the opening ended.
pub(super) struct Opening(Weak<HostPool>);

impl Drop for Opening {
    fn drop(&mut self) {
        if let Some(pool) = self.0.upgrade() {
            pool.opening.set(pool.opening.get().saturating_sub(1));
            pool.h2.room.notify_waiters();
        }
    }
}

impl HostPool {
    /// Counts an HTTP/2 connection as being opened until the guard drops.
    pub(super) fn opening(self: &Rc<Self>) -> Opening {
        self.opening.set(self.opening.get() + 1);
        Opening(Rc::downgrade(self))
    }

    /// What a request that came in as `version` needs opened ahead at this host; `None` for
    /// an `auto` cluster whose host has not chosen its protocol yet.
    pub(super) fn ahead_for(&self, version: http::Version) -> Option<Ahead> {
        if self.settings.protocol == UpstreamProtocol::Auto && self.learned.get().is_none() {
            return None;
        }
        Some(match self.protocol_for(version) {
            UpstreamProtocol::Http1 => Ahead::Http1,
            _ => Ahead::Http2,
        })
    }

    /// The streams this pool's connections carry or can take, open or being opened.
    fn capacity(&self, kind: Ahead) -> f64 {
        match kind {
            Ahead::Http1 | Ahead::Relay => f64::from(self.conns_here.get()),
            Ahead::Http2 => (self.h2).capacity(self.settings.h2_max_streams, self.opening.get()),
        }
    }

    /// Whether another connection is wanted for `ratio` times the requests in flight here
    /// (and one more about to come, `anticipated`), as Envoy's `shouldConnect`.
    fn wants_connection(&self, kind: Ahead, ratio: f64, anticipated: bool) -> bool {
        let demand = f64::from(self.in_flight.get()) + f64::from(u8::from(anticipated));
        demand * ratio > self.capacity(kind)
    }

    /// After a request took a connection (or a slot to open one) here: opens what the
    /// cluster's `per_upstream_ratio` wants beyond it.
    pub(super) fn preconnect(self: &Rc<Self>, kind: Ahead) {
        let Some(ratio) = self.settings.preconnect_ratio else {
            return;
        };
        // An `auto` cluster's host that has not chosen its protocol by ALPN yet could refuse
        // an HTTP/2 connection ahead.
        if kind == Ahead::Http2
            && self.settings.protocol == UpstreamProtocol::Auto
            && self.learned.get() != Some(UpstreamProtocol::Http2)
        {
            return;
        }
        for _ in 0..MAX_PER_LOOK {
            if !self.wants_connection(kind, ratio, false) || !self.open_ahead(kind) {
                return;
            }
        }
    }

    /// Starts a connection for requests to come, if the host is healthy and the breakers
    /// allow it: `false` if none was started.
    fn open_ahead(self: &Rc<Self>, kind: Ahead) -> bool {
        let hosts = self.settings.shared.host_set.snapshot();
        let health = (hosts.position(self.addr)).and_then(|i| Some(hosts.get(i)?.health()));
        if health != Some(Health::Healthy) {
            return false;
        }
        let Ok(claim) = self.claim_pool_slot() else {
            return false;
        };
        let Some(slot) = self.try_slot_ahead() else {
            self.stats.cx_overflow.inc();
            return false;
        };
        let pool = Rc::clone(self);
        match kind {
            Ahead::Http1 => {
                tokio::task::spawn_local(async move {
                    let _claim = claim;
                    match pool.connect_h1(slot).await {
                        Ok(conn) => pool.put_back(conn),
                        Err(error) => pool.report_failed_connect(&error),
                    }
                });
            }
            Ahead::Http2 => {
                let opening = self.opening();
                tokio::task::spawn_local(async move {
                    let _claim = claim;
                    if let Err(error) = pool.open_h2(slot, opening).await {
                        pool.report_failed_connect(&error);
                    }
                });
            }
            Ahead::Relay => {
                tokio::task::spawn_local(async move {
                    let _claim = claim;
                    let failures_at_open = pool.health.health_failures();
                    match pool.connect_raw().await {
                        Ok(io) => {
                            pool.report(TryOutcome::Status(200));
                            let open = pool.open_connection(slot);
                            pool.keep_relay(ReadyRelay::new(io, open, failures_at_open));
                        }
                        Err(error) => pool.report_failed_connect(&error),
                    }
                });
            }
        }
        true
    }

    /// Counts a connection opened ahead that failed against the host, as a request's failed
    /// connect would be (not a protocol the host chose by ALPN, nor a certificate for a name
    /// a client chose).
    fn report_failed_connect(&self, error: &crate::error::ProxyError) {
        let chose_http1 = self.settings.protocol == UpstreamProtocol::Auto
            && self.learned.get() == Some(UpstreamProtocol::Http1);
        if let Some(outcome) = self.outcome_of(error)
            && !chose_http1
        {
            self.report(outcome);
        }
    }
}

impl Cluster {
    /// Before a request (or relay) is sent: opens what the cluster's `predictive_ratio`
    /// wants, to the hosts the next picks will go to. `kind` says what the pool of a host
    /// needs (`None`: nothing can be opened ahead there yet).
    pub(super) fn preconnect_predictive(&self, kind: impl Fn(&HostPool) -> Option<Ahead>) {
        let Some(ratio) = self.settings.predictive_ratio else {
            return;
        };
        for _ in 0..MAX_PER_LOOK {
            // This worker's pools across the cluster, the request about to go anticipated.
            let (mut demand, mut capacity) = (1.0, 0.0);
            for pool in self
                .pools
                .borrow()
                .hosts
                .iter()
                .filter_map(|(_, p)| p.as_ref())
            {
                demand += f64::from(pool.in_flight.get());
                capacity += kind(pool).map_or(0.0, |k| pool.capacity(k));
            }
            if demand * ratio <= capacity {
                return;
            }
            let Some(peeked) = self.balancer.borrow().peek() else {
                return;
            };
            let Some(pool) = self.pool_at(peeked.index(), peeked.addr()) else {
                return;
            };
            let Some(kind) = kind(&pool) else {
                return;
            };
            if !pool.wants_connection(kind, ratio, true) || !pool.open_ahead(kind) {
                return;
            }
        }
    }
}
