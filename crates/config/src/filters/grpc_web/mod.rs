//! Settings of the `grpc_web` filter: gRPC-Web requests (browsers' gRPC, binary or base64
//! text) turned into gRPC for the upstream, and its responses back into gRPC-Web, trailers
//! in the body (Envoy's `grpc_web` filter). Nothing to set; a route may turn it off.

pub(crate) mod xds;

use serde::{Deserialize, Serialize};

use crate::*;

/// The filter has no settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GrpcWebConfig {}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGrpcWeb {}

fn grpc_web(_: RawGrpcWeb, _: &str, _: bool) -> Result<GrpcWebConfig, ConfigError> {
    Ok(GrpcWebConfig {})
}

per_route_settings!(GrpcWebConfig, RawGrpcWeb, grpc_web);
