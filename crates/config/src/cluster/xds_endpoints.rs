//! ClusterLoadAssignment -> a cluster's endpoints.

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::google::protobuf::Any;

use crate::envoy::{ResourceError, decode, fields, nothing_else, socket_address, type_url};
use crate::{RawEndpoint, RawWeightedEndpoint};

/// The hosts of a cluster, with their weights. Hosts the server marks unhealthy, draining,
/// timed out or degraded are left out: they take no new requests.
#[derive(Debug, Clone, PartialEq)]
pub struct XdsEndpoints {
    pub name: String,
    /// `(IP:PORT or NAME:PORT, weight)`, each address once.
    pub hosts: Vec<(String, u32)>,
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
        // The overprovisioning factor matters only across priorities, which are not
        // supported; any other policy (drops, staleness, priority health) is refused.
        if let Some(mut policy) = cla.policy.take() {
            policy.overprovisioning_factor = None;
            if policy != Default::default() {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec!["policy (besides overprovisioning_factor)".into()],
                });
            }
        }
        nothing_else(&cla, fields::CLUSTER_LOAD_ASSIGNMENT, &at)?;
        let mut hosts: Vec<(String, u32)> = Vec::new();
        for (i, locality) in localities.into_iter().enumerate() {
            locality_hosts(locality, &format!("{at}.endpoints[{i}]"), &mut hosts)?;
        }
        Ok(Self { name, hosts })
    }

    /// As the config file writes endpoints.
    pub(crate) fn raw(&self) -> Vec<RawEndpoint> {
        self.hosts
            .iter()
            .map(|(address, weight)| {
                RawEndpoint::Weighted(RawWeightedEndpoint {
                    address: address.clone(),
                    weight: Some(*weight),
                })
            })
            .collect()
    }
}

fn locality_hosts(
    mut locality: LocalityLbEndpoints,
    at: &str,
    hosts: &mut Vec<(String, u32)>,
) -> Result<(), ResourceError> {
    if locality.priority != 0 {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["priority (failover between priorities)".into()],
        });
    }
    let endpoints = std::mem::take(&mut locality.lb_endpoints);
    // Locality weights apply only with locality-weighted balancing, which a cluster cannot
    // ask for here (common_lb_config is refused), so they change nothing.
    locality.locality = None;
    locality.metadata = None;
    locality.load_balancing_weight = None;
    nothing_else(&locality, fields::LOCALITY_LB_ENDPOINTS, at)?;
    for (i, endpoint) in endpoints.into_iter().enumerate() {
        let at = format!("{at}.lb_endpoints[{i}]");
        if let Some((address, weight)) = host(endpoint, &at)? {
            // The same address twice (in two localities) is one host with both weights.
            match hosts.iter_mut().find(|(a, _)| *a == address) {
                Some((_, w)) => *w = w.saturating_add(weight),
                None => hosts.push((address, weight)),
            }
        }
    }
    Ok(())
}

/// The endpoint's address and weight; `None` if the server says it takes no requests.
fn host(mut endpoint: LbEndpoint, at: &str) -> Result<Option<(String, u32)>, ResourceError> {
    let weight = endpoint.load_balancing_weight.take().map_or(1, |w| w.value);
    if weight == 0 {
        return Err(ResourceError::invalid(
            format!("{at}.load_balancing_weight"),
            "expected at least 1",
        ));
    }
    let status = HealthStatus::try_from(endpoint.health_status).unwrap_or(HealthStatus::Unknown);
    endpoint.health_status = 0;
    endpoint.metadata = None;
    let identifier = endpoint.host_identifier.take();
    nothing_else(&endpoint, fields::LB_ENDPOINT, at)?;
    let Some(lb_endpoint::HostIdentifier::Endpoint(mut inner)) = identifier else {
        return Err(ResourceError::invalid(
            at,
            "expected an endpoint (named endpoints, `endpoint_name`, are not supported)",
        ));
    };
    let address = socket_address(inner.address.take(), &format!("{at}.endpoint.address"))?;
    // A name for logs and health-check host headers; neither changes where requests go.
    inner.hostname.clear();
    inner.observability_name.clear();
    nothing_else(&inner, fields::ENDPOINT, &format!("{at}.endpoint"))?;
    let takes_requests = matches!(status, HealthStatus::Unknown | HealthStatus::Healthy);
    Ok(takes_requests.then_some((address, weight)))
}
