//! A cluster as one worker sees it: its hosts' connection pools and the balancer that picks
//! among them. Nothing here is shared with other workers.

mod pool;

use std::rc::Rc;

use balancer::RoundRobin;

use crate::catalog::Catalog;
use crate::config::ClusterConfig;
pub(crate) use pool::{HostPool, UpstreamBody};

pub(crate) struct Cluster {
    hosts: Vec<Rc<HostPool>>,
    balancer: RoundRobin,
}

impl Cluster {
    /// `worker` offsets the round robin so that workers do not all start on the first host.
    pub(crate) fn new(
        config: &ClusterConfig,
        worker: usize,
        catalog: &Catalog,
        shard: &stats::Shard,
    ) -> Self {
        let stats = Rc::new(catalog.cluster(shard, &config.name));
        let hosts: Vec<Rc<HostPool>> = config
            .endpoints
            .iter()
            .map(|addr| {
                Rc::new(HostPool::new(
                    Rc::clone(&stats),
                    catalog.host(shard, &config.name, &addr.to_string()),
                    *addr,
                    config.protocol,
                    config.connect_timeout,
                ))
            })
            .collect();
        let balancer = RoundRobin::with_offset(hosts.len(), worker)
            .expect("validated configs have at least one endpoint per cluster");
        Self { hosts, balancer }
    }

    /// The host for the next request.
    #[inline]
    pub(crate) fn pick(&self) -> &Rc<HostPool> {
        &self.hosts[self.balancer.pick()]
    }
}
