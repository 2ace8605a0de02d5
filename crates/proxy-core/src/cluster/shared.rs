//! What every worker shares about a cluster: its host set (health, weights, requests in flight)
//! and its circuit breakers. Built when the cluster first appears in a config, and kept by
//! later configs that leave it unchanged (its endpoints may change).

use crate::catalog::{ClusterGauges, ProxyStats};
use crate::config::{ClusterConfig, Endpoint, HealthCheckConfig};
use crate::tls::UpstreamTls;

use super::breaker::CircuitBreakers;
use super::health::HostHealth;

pub(crate) struct SharedCluster {
    pub(crate) name: String,
    pub(crate) host_set: balancer::HostSet,
    pub(crate) breakers: CircuitBreakers,
    pub(crate) health: HostHealth,
    pub(crate) gauges: ClusterGauges,
    /// TLS to the hosts, if the cluster uses it.
    pub(crate) tls: Option<UpstreamTls>,
    /// Active health checking, run by the monitor thread.
    pub(crate) health_check: Option<HealthCheckConfig>,
}

impl SharedCluster {
    pub(crate) fn new(
        config: &ClusterConfig,
        workers: usize,
        stats: &ProxyStats,
        tls: Option<UpstreamTls>,
    ) -> Self {
        let host_set = balancer::HostSet::new(host_specs(&config.endpoints))
            .expect("endpoints were validated: distinct, non-empty, weights >= 1");
        let gauges = stats.catalog.cluster_gauges(&stats.process, &config.name);
        // Until the monitor has measured anything, nothing is in flight: not "no headroom".
        gauges.rq_headroom.set(super::monitor::IDLE_HEADROOM);
        gauges.pending_headroom.set(super::monitor::IDLE_HEADROOM);
        Self {
            name: config.name.clone(),
            health: HostHealth::new(&host_set, config.outlier_detection),
            host_set,
            breakers: CircuitBreakers::new(&config.circuit_breakers, workers),
            gauges,
            tls,
            health_check: config.health_check.clone(),
        }
    }

    /// Replaces the hosts: those that stay keep their health, ejections and requests in
    /// flight, and every worker's pools for them.
    pub(crate) fn set_endpoints(&self, endpoints: &[Endpoint]) -> Result<(), balancer::BuildError> {
        // Hosts that stay are published with the health they have (an ejection stays).
        let specs = host_specs(endpoints)
            .into_iter()
            .map(|spec| match self.health.health_of(spec.addr) {
                Some(health) => spec.with_health(health),
                None => spec,
            })
            .collect();
        self.host_set.update(specs)?;
        self.health.sync(&self.host_set);
        Ok(())
    }

    /// Sets the breaker and membership gauges from the live counts.
    pub(crate) fn refresh_gauges(&self) {
        let b = &self.breakers;
        let g = &self.gauges;
        for (breaker, open, remaining) in [
            (&b.connections, &g.cx_open, &g.remaining_cx),
            (&b.pending, &g.rq_pending_open, &g.remaining_pending),
            (&b.requests, &g.rq_open, &g.remaining_rq),
            (&b.retries, &g.rq_retry_open, &g.remaining_retries),
        ] {
            open.set(i64::from(breaker.is_open()));
            remaining.set(i64::from(breaker.remaining()));
        }
        let (mut healthy, mut ejected) = (0, 0);
        for host in self.host_set.snapshot().hosts() {
            match host.health() {
                balancer::Health::Healthy | balancer::Health::Degraded => healthy += 1,
                balancer::Health::Ejected => ejected += 1,
                balancer::Health::Unhealthy => {}
            }
        }
        g.membership_healthy.set(healthy);
        g.ejections_active.set(ejected);
    }
}

fn host_specs(endpoints: &[Endpoint]) -> Vec<balancer::HostSpec> {
    endpoints
        .iter()
        .map(|e| balancer::HostSpec::new(e.address).with_weight(e.weight))
        .collect()
}
