//! Envoy's `GrpcWeb` filter (`envoy.filters.http.grpc_web`), which has no settings, as the
//! `grpc_web` filter.

use envoy_types::pb::envoy::extensions::filters::http::grpc_web::v3::GrpcWeb;
use envoy_types::pb::google::protobuf::Any;

use super::RawGrpcWeb;
use crate::envoy::{ResourceError, decode};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.grpc_web.v3.GrpcWeb";

pub(crate) fn settings(any: &Any) -> Result<RawGrpcWeb, ResourceError> {
    let GrpcWeb {} = decode(any, TYPE_URL, "a GrpcWeb filter")?;
    Ok(RawGrpcWeb {})
}
