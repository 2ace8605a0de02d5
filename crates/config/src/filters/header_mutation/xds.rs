//! Envoy's `HeaderMutation` filter (`envoy.filters.http.header_mutation`) as the
//! `header_mutation` filter's settings.

use envoy_types::pb::envoy::extensions::filters::http::header_mutation::v3::HeaderMutation;
use envoy_types::pb::google::protobuf::Any;

use super::RawHeaderMutation;
use crate::envoy::headers::ordered;
use crate::envoy::{ResourceError, decode};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";

/// The filter's settings in the chain. `most_specific_header_mutations_wins` orders the
/// filter's changes against a route's `HeaderMutationPerRoute`, which is refused: alone it
/// changes nothing.
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawHeaderMutation, ResourceError> {
    let filter: HeaderMutation = decode(any, TYPE_URL, "a HeaderMutation filter")?;
    let Some(m) = filter.mutations else {
        return Ok(RawHeaderMutation::default());
    };
    let at = format!("{at}.mutations");
    if !m.query_parameter_mutations.is_empty()
        || !m.request_trailers_mutations.is_empty()
        || !m.response_trailers_mutations.is_empty()
    {
        return Err(ResourceError::Unsupported {
            at,
            fields: vec![
                "query_parameter_mutations, request_trailers_mutations, response_trailers_mutations"
                    .into(),
            ],
        });
    }
    Ok(RawHeaderMutation {
        request: ordered(m.request_mutations, &format!("{at}.request_mutations"))?,
        response: ordered(m.response_mutations, &format!("{at}.response_mutations"))?,
    })
}
