//! Envoy's `Buffer` filter (`envoy.filters.http.buffer`) and its `BufferPerRoute` as the
//! `buffer` filter's settings.

use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::{
    Buffer, BufferPerRoute, buffer_per_route,
};
use envoy_types::pb::google::protobuf::Any;

use super::RawBuffer;
use crate::envoy::{ResourceError, decode};
use crate::filters::RawPerRoute;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute";

pub(crate) fn settings(any: &Any) -> Result<RawBuffer, ResourceError> {
    let buffer: Buffer = decode(any, TYPE_URL, "a Buffer filter")?;
    Ok(raw(buffer))
}

fn raw(buffer: Buffer) -> RawBuffer {
    RawBuffer {
        max_request_bytes: buffer.max_request_bytes.map(|v| u64::from(v.value)),
    }
}

/// A route's entry: off, or its own size; `None` for an empty one.
pub(crate) fn per_route(any: &Any) -> Result<Option<RawPerRoute<RawBuffer>>, ResourceError> {
    let per_route: BufferPerRoute = decode(any, PER_ROUTE, "a BufferPerRoute")?;
    Ok(match per_route.r#override {
        Some(buffer_per_route::Override::Disabled(true)) => {
            Some(RawPerRoute::Word("disabled".into()))
        }
        Some(buffer_per_route::Override::Buffer(buffer)) => Some(RawPerRoute::Settings(raw(buffer))),
        _ => None,
    })
}
