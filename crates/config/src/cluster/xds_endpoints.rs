//! ClusterLoadAssignment -> a cluster's endpoints.

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::google::protobuf::Any;

use crate::envoy::{ResourceError, decode, fields, nothing_else, socket_address, type_url};
use crate::{RawEndpoint, RawWeightedEndpoint};

/// The hosts of a cluster, with their weights, priorities, localities and the health the
/// server gives them (unhealthy, draining and timed-out hosts stay in the set, counted as
/// unavailable, as Envoy counts them for priority and panic arithmetic).
#[derive(Debug, Clone, PartialEq)]
pub struct XdsEndpoints {
    pub name: String,
    /// Each address once.
    pub hosts: Vec<RawWeightedEndpoint>,
    /// The assignment's `policy.overprovisioning_factor`, if it gives one.
    pub overprovisioning_factor: Option<u32>,
}

impl XdsEndpoints {
    pub fn decode(value: &Any) -> Result<Self, ResourceError> {
        let cla: ClusterLoadAssignment =
            decode(value, type_url::ENDPOINT, "a ClusterLoadAssignment")?;
        Self::from_assignment(cla, None)
    }

    /// `cluster`: the cluster an inline `load_assignment` belongs to (names the errors).
    pub(crate) fn from_assignment(
        mut cla: ClusterLoadAssignment,
        cluster: Option<&str>,
    ) -> Result<Self, ResourceError> {
        let name = cluster.unwrap_or(&cla.cluster_name).to_owned();
        let at = match cluster {
            Some(c) => format!("cluster `{c}`.load_assignment"),
            None => format!("endpoints `{name}`"),
        };
        let localities = std::mem::take(&mut cla.endpoints);
        cla.cluster_name.clear();
        // Drops, staleness and weighted priority health are refused.
        let mut overprovisioning_factor = None;
        if let Some(mut policy) = cla.policy.take() {
            overprovisioning_factor = policy.overprovisioning_factor.take().map(|f| f.value);
            if policy != Default::default() {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec!["policy (besides overprovisioning_factor)".into()],
                });
            }
        }
        nothing_else(&cla, fields::CLUSTER_LOAD_ASSIGNMENT, &at)?;
        let mut hosts = Vec::new();
        for (i, locality) in localities.into_iter().enumerate() {
            locality_hosts(locality, &format!("{at}.endpoints[{i}]"), &mut hosts)?;
        }
        Ok(Self {
            name,
            hosts,
            overprovisioning_factor,
        })
    }

    /// As the config file writes endpoints.
    pub(crate) fn raw(&self) -> Vec<RawEndpoint> {
        self.hosts
            .iter()
            .cloned()
            .map(RawEndpoint::Weighted)
            .collect()
    }
}

fn locality_hosts(
    mut group: LocalityLbEndpoints,
    at: &str,
    hosts: &mut Vec<RawWeightedEndpoint>,
) -> Result<(), ResourceError> {
    let endpoints = std::mem::take(&mut group.lb_endpoints);
    let priority = std::mem::take(&mut group.priority);
    let locality = group
        .locality
        .take()
        .map(|l| crate::cluster::local::locality_name(&l.region, &l.zone, &l.sub_zone));
    let locality_weight = group.load_balancing_weight.take().map(|w| w.value);
    if locality_weight == Some(0) {
        return Err(ResourceError::invalid(
            format!("{at}.load_balancing_weight"),
            "expected at least 1",
        ));
    }
    // Only the transport socket labels change anything here (other keys are for filters and
    // balancers this proxy does not have).
    let locality_labels =
        crate::cluster::socket_match::metadata_labels(group.metadata.take().as_ref());
    nothing_else(&group, fields::LOCALITY_LB_ENDPOINTS, at)?;
    for (i, endpoint) in endpoints.into_iter().enumerate() {
        let at = format!("{at}.lb_endpoints[{i}]");
        let Host {
            address,
            weight,
            health,
            hostname,
            health_check,
            labels,
        } = host(endpoint, &at)?;
        // The same address twice is one host: the first place it is listed (Envoy skips
        // the later ones).
        match hosts.iter().find(|h| h.address == address) {
            Some(_) => {}
            None => hosts.push(RawWeightedEndpoint {
                address,
                weight: Some(weight),
                priority: Some(priority),
                locality: locality.clone(),
                locality_weight,
                health: health.map(str::to_owned),
                hostname,
                health_check,
                transport_socket_match: labels,
                locality_transport_socket_match: locality_labels.clone(),
            }),
        }
    }
    Ok(())
}

/// An endpoint as the file writes it: address, weight, health (`None`: healthy), hostname
/// and its own health-check target.
struct Host {
    address: String,
    weight: u32,
    health: Option<&'static str>,
    hostname: Option<String>,
    health_check: Option<crate::RawEndpointHealthCheck>,
    /// Its `envoy.transport_socket_match` metadata.
    labels: Option<crate::cluster::socket_match::Labels>,
}

fn host(mut endpoint: LbEndpoint, at: &str) -> Result<Host, ResourceError> {
    let weight = endpoint.load_balancing_weight.take().map_or(1, |w| w.value);
    if weight == 0 {
        return Err(ResourceError::invalid(
            format!("{at}.load_balancing_weight"),
            "expected at least 1",
        ));
    }
    let status = HealthStatus::try_from(endpoint.health_status).unwrap_or(HealthStatus::Unknown);
    endpoint.health_status = 0;
    let labels = crate::cluster::socket_match::metadata_labels(endpoint.metadata.take().as_ref());
    let identifier = endpoint.host_identifier.take();
    nothing_else(&endpoint, fields::LB_ENDPOINT, at)?;
    let Some(lb_endpoint::HostIdentifier::Endpoint(mut inner)) = identifier else {
        return Err(ResourceError::invalid(
            at,
            "expected an endpoint (named endpoints, `endpoint_name`, are not supported)",
        ));
    };
    let address = socket_address(inner.address.take(), &format!("{at}.endpoint.address"))?;
    let hostname = Some(std::mem::take(&mut inner.hostname)).filter(|h| !h.is_empty());
    // A name for stats and logs elsewhere; it changes nothing here.
    inner.observability_name.clear();
    let health_check = match inner.health_check_config.take() {
        None => None,
        Some(mut check) => {
            let hc_at = format!("{at}.endpoint.health_check_config");
            let port = match std::mem::take(&mut check.port_value) {
                0 => None,
                port => Some(u16::try_from(port).map_err(|_| {
                    ResourceError::invalid(format!("{hc_at}.port_value"), "expected a port")
                })?),
            };
            let hostname = Some(std::mem::take(&mut check.hostname)).filter(|h| !h.is_empty());
            nothing_else(&check, fields::ENDPOINT_HEALTH_CHECK_CONFIG, &hc_at)?;
            Some(crate::RawEndpointHealthCheck { hostname, port })
        }
    };
    nothing_else(&inner, fields::ENDPOINT, &format!("{at}.endpoint"))?;
    let health = match status {
        HealthStatus::Unknown | HealthStatus::Healthy => None,
        HealthStatus::Degraded => Some("degraded"),
        HealthStatus::Unhealthy | HealthStatus::Timeout => Some("unhealthy"),
        HealthStatus::Draining => Some("draining"),
    };
    Ok(Host {
        address,
        weight,
        health,
        hostname,
        health_check,
        labels,
    })
}
