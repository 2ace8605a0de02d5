//! A service exporting what its balancer records (feature `metrics`) with
//! metrics-exporter-prometheus: picks, failed picks, panic mode and host-set updates, in the
//! Prometheus text format it would serve on its `/metrics`.
//!
//! ```text
//! cargo run -p balancer --features metrics --example metrics
//! ```

use balancer::{Health, HostSet, HostSpec, LbPolicy, LoadBalancer};
use metrics_exporter_prometheus::PrometheusBuilder;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    // The service's recorder, installed before the balancer makes its handles.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let addrs: Vec<std::net::SocketAddr> = (0..4)
        .map(|i| format!("127.0.0.1:{}", 9000 + i).parse())
        .collect::<Result<_, _>>()?;
    let hosts = HostSet::new(addrs.iter().map(|&a| HostSpec::new(a)).collect())?;
    let balancer = LoadBalancer::new(hosts.clone(), LbPolicy::least_request())?;
    for _ in 0..1000 {
        let _picked = balancer.pick(None);
    }
    // Three of four hosts fail their checks: too few left, the balancer panics (picks ignore
    // health) until they come back.
    for &addr in &addrs[..3] {
        hosts.set_health(addr, Health::Unhealthy);
    }
    for _ in 0..100 {
        let _picked = balancer.pick(None);
    }
    for &addr in &addrs[..3] {
        hosts.set_health(addr, Health::Healthy);
    }
    balancer.refresh();

    print!("{}", prometheus.render());
    Ok(())
}
