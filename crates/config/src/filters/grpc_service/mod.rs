//! A gRPC service a filter calls on every request (a rate limit service, an external
//! processor): its address, the calls' `:authority`, and TLS to it. Checked once here for
//! every filter that names one.

pub(crate) mod xds;

use serde::{Deserialize, Serialize};

use crate::serialize as ser;
use crate::*;

/// Where the service listens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GrpcService {
    #[serde(serialize_with = "ser::display")]
    pub address: ServiceEndpoint,
    /// The calls' `:authority` (the filter's default when not given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::ClusterTlsConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGrpcService {
    pub address: String,
    pub authority: Option<String>,
    /// The keys of a cluster's `tls`: the service's CA and name, a client certificate.
    pub tls: Option<crate::tls::raw::RawClusterTls>,
}

/// The filter's `service` at `path`; `what` names the service in the error for a missing one.
pub(crate) fn grpc_service(
    raw: Option<RawGrpcService>,
    path: &str,
    what: &str,
) -> Result<GrpcService, ConfigError> {
    let Some(service) = raw else {
        return Err(ConfigError::invalid(
            path,
            format!("expected the {what}'s `address`"),
        ));
    };
    Ok(GrpcService {
        tls: crate::tls::check::service_tls(service.tls, &service.address, path)?,
        address: crate::values::service_endpoint(&service.address, &format!("{path}.address"))?,
        authority: match service.authority {
            Some(a) if a.parse::<http::uri::Authority>().is_err() => {
                return Err(ConfigError::invalid(
                    format!("{path}.authority"),
                    format!("expected a host name (and port), found `{a}`"),
                ));
            }
            other => other,
        },
    })
}
