//! Settings of the `header_mutation` filter: the `headers` filter's changes, made where this
//! filter sits in the chain (requests on their way in, responses on their way back), as
//! Envoy's `header_mutation` filter. A chain may hold both: `headers` for the rules of each
//! level, this one for changes at a place of their own.

pub(crate) mod xds;

use serde::{Deserialize, Serialize};

use super::headers::both_ways;
use crate::*;

/// The changes to requests and to responses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeaderMutationConfig {
    pub request: HeaderMutations,
    pub response: HeaderMutations,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMutation {
    pub request: Option<RawHeaderMutations>,
    pub response: Option<RawHeaderMutations>,
}

fn header_mutation(
    raw: RawHeaderMutation,
    path: &str,
    _on_route: bool,
) -> Result<HeaderMutationConfig, ConfigError> {
    let (request, response) = both_ways(raw.request, raw.response, path)?;
    Ok(HeaderMutationConfig { request, response })
}

per_route_settings!(HeaderMutationConfig, RawHeaderMutation, header_mutation);
