//! Envoy's `GrpcService` as a filter's service: an address (`google_grpc.target_uri`) or a
//! cluster (`envoy_grpc`). The filter calls one address, so the cluster must have exactly one
//! endpoint, and a listener whose service cluster is not there yet waits for it.

use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};

use super::RawGrpcService;
use crate::envoy::{ResourceError, duration, unsupported};

/// Where a filter's service is, as xDS names it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Target {
    /// `google_grpc.target_uri`: an address.
    Address(String),
    /// A cluster, and the calls' `:authority` when given.
    Cluster(String, Option<String>),
}

impl Target {
    /// The service's target, and its `timeout` (which the rate limit filter does not read,
    /// and ext_proc does not either: each has a timeout of its own).
    pub(crate) fn of(
        mut service: GrpcService,
        at: &str,
    ) -> Result<(Self, Option<std::time::Duration>), ResourceError> {
        let target = match service.target_specifier.take() {
            Some(grpc_service::TargetSpecifier::EnvoyGrpc(mut grpc)) => {
                let cluster = std::mem::take(&mut grpc.cluster_name);
                let authority = Some(std::mem::take(&mut grpc.authority)).filter(|a| !a.is_empty());
                if grpc != Default::default() {
                    return Err(unsupported(
                        at,
                        "envoy_grpc besides cluster_name and authority",
                    ));
                }
                Target::Cluster(cluster, authority)
            }
            Some(grpc_service::TargetSpecifier::GoogleGrpc(mut grpc)) => {
                let target = std::mem::take(&mut grpc.target_uri);
                if grpc != Default::default() {
                    return Err(unsupported(
                        at,
                        "google_grpc besides target_uri (credentials)",
                    ));
                }
                Target::Address(target)
            }
            None => {
                return Err(ResourceError::invalid(
                    at,
                    "the gRPC service names no target",
                ));
            }
        };
        let timeout = duration(service.timeout.take(), &format!("{at}.timeout"))?;
        if service != Default::default() {
            return Err(unsupported(
                at,
                "grpc_service besides the target and timeout (retry_policy, initial_metadata)",
            ));
        }
        Ok((target, timeout))
    }

    /// The cluster the service's address comes from, if it is named by one.
    pub(crate) fn cluster(&self) -> Option<&str> {
        match self {
            Target::Cluster(name, _) => Some(name),
            Target::Address(_) => None,
        }
    }

    /// The service as the config file writes it, with the address of its cluster's one host
    /// (and that cluster's TLS, as Envoy's calls through it would have); `None` while the
    /// cluster is not known.
    pub(crate) fn service(
        &self,
        clusters: &dyn crate::cluster::xds::ReadyClusters,
    ) -> Option<RawGrpcService> {
        Some(match self {
            Target::Address(address) => RawGrpcService {
                address: address.clone(),
                authority: None,
                tls: None,
            },
            Target::Cluster(cluster, authority) => {
                let host = clusters.single_host(cluster.as_str())?;
                RawGrpcService {
                    address: host.address.to_owned(),
                    authority: authority.clone(),
                    tls: host.tls.cloned(),
                }
            }
        })
    }
}
