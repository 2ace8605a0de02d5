//! Envoy's rate limit actions (`config.route.v3.RateLimit.Action`) as the file writes them.

use envoy_types::pb::envoy::config::route::v3::rate_limit::Action;
use envoy_types::pb::envoy::config::route::v3::rate_limit::action::ActionSpecifier;

use envoy_types::pb::envoy::config::route::v3::RateLimit;

use super::{
    RawAddressMatch, RawGenericKey, RawMaskedAddress, RawNothing, RawQueryParameters,
    RawRateLimitAction, RawRequestHeaders, RawStagedRateLimit, RawValueMatch,
};
use crate::envoy::matchers::{header, query_parameter};
use crate::envoy::{ResourceError, unsupported};

/// A route's or virtual host's own `rate_limits` (for the `ratelimit` filter of their stage).
/// `disable_key` only names a runtime key (no runtime here: the rule applies, as Envoy's
/// without that key set); what else changes the descriptor is refused by name.
pub(crate) fn staged(
    rules: Vec<RateLimit>,
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<RawStagedRateLimit>, ResourceError> {
    rules
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            let at = format!("{at}[{i}]");
            let refused = [
                (r.limit.is_some(), "limit"),
                (r.hits_addend.is_some(), "hits_addend"),
                (r.apply_on_stream_done, "apply_on_stream_done"),
                (r.x_ratelimit_option != 0, "x_ratelimit_option"),
            ];
            if let Some((_, name)) = refused.iter().find(|(set, _)| *set) {
                return Err(unsupported(&at, *name));
            }
            Ok(RawStagedRateLimit {
                actions: actions(std::mem::take(&mut r.actions), &at)?,
                stage: r.stage.map(|s| s.value),
            })
        })
        .collect()
}

/// A rule's actions; `at` is the rule's path.
pub(crate) fn actions(
    actions: Vec<Action>,
    at: &str,
) -> Result<Vec<RawRateLimitAction>, ResourceError> {
    actions
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let at = format!("{at}.actions[{i}]");
            match a.action_specifier {
                Some(spec) => action(spec, &at),
                None => Err(ResourceError::invalid(at, "expected an action")),
            }
        })
        .collect()
}

// `dynamic_metadata` is deprecated, and named when refused.
#[allow(deprecated)]
fn action(spec: ActionSpecifier, at: &str) -> Result<RawRateLimitAction, ResourceError> {
    let mut raw = RawRateLimitAction::default();
    // Envoy reads these descriptor values as literal text unless a runtime flag says
    // otherwise, and then only falls back to `default_value` on an empty result: a literal
    // value is never empty, so `default_value` is never used.
    match spec {
        ActionSpecifier::HeaderValueMatch(m) => {
            let at = format!("{at}.header_value_match");
            let headers = m
                .headers
                .into_iter()
                .enumerate()
                .map(|(i, h)| header(h, &format!("{at}.headers[{i}]")))
                .collect::<Result<_, _>>()?;
            raw.header_value_match = Some(RawValueMatch {
                descriptor_key: Some(m.descriptor_key),
                descriptor_value: m.descriptor_value,
                expect_match: m.expect_match.map(|b| b.value),
                headers,
                query_parameters: Vec::new(),
            });
        }
        ActionSpecifier::QueryParameterValueMatch(m) => {
            let at = format!("{at}.query_parameter_value_match");
            let query_parameters = m
                .query_parameters
                .into_iter()
                .enumerate()
                .map(|(i, q)| query_parameter(q, &format!("{at}.query_parameters[{i}]")))
                .collect::<Result<_, _>>()?;
            raw.query_parameter_value_match = Some(RawValueMatch {
                descriptor_key: Some(m.descriptor_key),
                descriptor_value: m.descriptor_value,
                expect_match: m.expect_match.map(|b| b.value),
                headers: Vec::new(),
                query_parameters,
            });
        }
        ActionSpecifier::RequestHeaders(h) => {
            raw.request_headers = Some(RawRequestHeaders {
                header_name: h.header_name.to_ascii_lowercase(),
                descriptor_key: h.descriptor_key,
                skip_if_absent: Some(h.skip_if_absent),
            });
        }
        ActionSpecifier::QueryParameters(q) => {
            raw.query_parameters = Some(RawQueryParameters {
                query_parameter_name: q.query_parameter_name,
                descriptor_key: q.descriptor_key,
                skip_if_absent: Some(q.skip_if_absent),
            });
        }
        ActionSpecifier::RemoteAddress(_) => raw.remote_address = Some(RawNothing {}),
        ActionSpecifier::MaskedRemoteAddress(m) => {
            let at = format!("{at}.masked_remote_address");
            let len = |value: Option<u32>, max: u32, name: &str| {
                value
                    .map(|v| {
                        u8::try_from(v)
                            .ok()
                            .filter(|v| u32::from(*v) <= max)
                            .ok_or_else(|| {
                                ResourceError::invalid(
                                    format!("{at}.{name}"),
                                    format!("expected 0 to {max}"),
                                )
                            })
                    })
                    .transpose()
            };
            raw.masked_remote_address = Some(RawMaskedAddress {
                v4_prefix_mask_len: len(
                    m.v4_prefix_mask_len.map(|v| v.value),
                    32,
                    "v4_prefix_mask_len",
                )?,
                v6_prefix_mask_len: len(
                    m.v6_prefix_mask_len.map(|v| v.value),
                    128,
                    "v6_prefix_mask_len",
                )?,
            });
        }
        ActionSpecifier::GenericKey(g) => {
            raw.generic_key = Some(RawGenericKey {
                descriptor_key: Some(g.descriptor_key),
                descriptor_value: g.descriptor_value,
            });
        }
        ActionSpecifier::RemoteAddressMatch(m) => {
            let at = format!("{at}.remote_address_match");
            // Its value is always a format: `default_value` stands in for an empty result,
            // which the operators here never give.
            let matcher = m
                .address_matcher
                .ok_or_else(|| ResourceError::invalid(&at, "expected an address_matcher"))?;
            let ranges = matcher
                .ranges
                .into_iter()
                .map(|r| {
                    let len = r.prefix_len.map_or(0, |l| l.value);
                    format!("{}/{len}", r.address_prefix)
                })
                .collect();
            raw.remote_address_match = Some(RawAddressMatch {
                descriptor_key: Some(m.descriptor_key),
                descriptor_value: m.descriptor_value,
                ranges,
                invert: Some(matcher.invert_match),
            });
        }
        other => {
            let name = match other {
                ActionSpecifier::SourceCluster(_) => "source_cluster",
                ActionSpecifier::DestinationCluster(_) => "destination_cluster",
                ActionSpecifier::DynamicMetadata(_) => "dynamic_metadata",
                ActionSpecifier::Metadata(_) => "metadata",
                ActionSpecifier::Extension(_) => "extension",
                _ => "an action",
            };
            return Err(unsupported(at, name));
        }
    }
    Ok(raw)
}
