//! Settings of the `buffer` filter: a request's whole body read before it goes upstream, up to
//! a size (Envoy's `buffer` filter), for upstreams that want a `content-length`.

pub(crate) mod xds;

use serde::{Deserialize, Serialize};

use crate::units::{de_opt_size, ser_size};
use crate::*;

/// A body read whole before the request goes on; a longer one is answered 413.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BufferConfig {
    #[serde(serialize_with = "ser_size")]
    pub max_request_bytes: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBuffer {
    #[serde(default, deserialize_with = "de_opt_size")]
    pub max_request_bytes: Option<u64>,
}

/// The most a request may ask to hold (Envoy's `max_request_bytes` is a 32-bit count).
const MAX_REQUEST_BYTES: u64 = u32::MAX as u64;

fn buffer(raw: RawBuffer, path: &str, _: bool) -> Result<BufferConfig, ConfigError> {
    let at = format!("{path}.max_request_bytes");
    let Some(max) = raw.max_request_bytes else {
        return Err(ConfigError::invalid(at, "required"));
    };
    if max == 0 || max > MAX_REQUEST_BYTES {
        return Err(ConfigError::invalid(
            at,
            format!("expected 1 byte to {MAX_REQUEST_BYTES} bytes, found {max}"),
        ));
    }
    Ok(BufferConfig {
        max_request_bytes: max,
    })
}

per_route_settings!(BufferConfig, RawBuffer, buffer);
