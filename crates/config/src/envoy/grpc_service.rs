//! Envoy's `GrpcService` naming a cluster (`envoy_grpc`): the cluster, the authority it is
//! called by, the metadata sent with each call and the call's timeout. Used by the
//! OpenTelemetry tracer and access logger, whose collectors are a cluster's single host.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};

use super::{ResourceError, duration};

/// A gRPC service found in a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GrpcTarget {
    pub(crate) cluster: String,
    pub(crate) authority: Option<String>,
    /// `initial_metadata`, names lowercase.
    pub(crate) headers: BTreeMap<String, String>,
    /// `None`: not given (or `0s`).
    pub(crate) timeout: Option<Duration>,
}

/// `at`: where the service is, `...grpc_service`. Anything beyond the cluster, its
/// authority, the timeout and the metadata is refused by name.
pub(crate) fn grpc_target(mut service: GrpcService, at: &str) -> Result<GrpcTarget, ResourceError> {
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.to_owned(),
        fields: vec![what.to_owned()],
    };
    let Some(grpc_service::TargetSpecifier::EnvoyGrpc(mut grpc)) = service.target_specifier.take()
    else {
        return Err(unsupported("google_grpc (envoy_grpc, a cluster, only)"));
    };
    let cluster = std::mem::take(&mut grpc.cluster_name);
    let authority = Some(std::mem::take(&mut grpc.authority)).filter(|a| !a.is_empty());
    if grpc != Default::default() {
        return Err(unsupported("envoy_grpc besides cluster_name and authority"));
    }
    let timeout =
        duration(service.timeout.take(), &format!("{at}.timeout"))?.filter(|t| !t.is_zero());
    let mut headers = BTreeMap::new();
    for header in std::mem::take(&mut service.initial_metadata) {
        let value = if header.raw_value.is_empty() {
            header.value
        } else {
            String::from_utf8(header.raw_value).map_err(|_| {
                ResourceError::invalid(format!("{at}.initial_metadata"), "expected UTF-8 text")
            })?
        };
        headers.insert(header.key.to_ascii_lowercase(), value);
    }
    if service != Default::default() {
        return Err(unsupported(
            "grpc_service besides envoy_grpc, timeout and initial_metadata",
        ));
    }
    Ok(GrpcTarget {
        cluster,
        authority,
        headers,
        timeout,
    })
}
