//! Envoy's `CustomResponse` (the `envoy.filters.http.custom_response` filter and its
//! per-route settings): a matcher list whose predicates read the response's status code and
//! headers (`and`, `or`, `not`), each with a `LocalResponsePolicy`. Redirect policies
//! (internal redirects), CEL inputs, matcher trees and `on_no_match` are refused by name.

use envoy_types::pb::envoy::config::core::v3::data_source;
use envoy_types::pb::xds::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::extensions::filters::http::custom_response::v3::CustomResponse;
use envoy_types::pb::envoy::extensions::http::custom_response::local_response_policy::v3::LocalResponsePolicy;
use envoy_types::pb::envoy::r#type::matcher::v3::HttpResponseHeaderMatchInput;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::xds::r#type::matcher::v3::matcher::matcher_list::Predicate;
use envoy_types::pb::xds::r#type::matcher::v3::matcher::matcher_list::predicate::{
    MatchType, single_predicate,
};
use envoy_types::pb::xds::r#type::matcher::v3::matcher::{MatcherType, on_match};

use crate::envoy::unsupported;
use super::{RawCustomResponse, RawResponseMatch, RawResponseRule};
use crate::envoy::{ResourceError, decode, fields, matchers, nothing_else};
use crate::RawHeaderMatch;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.custom_response.v3.CustomResponse";
const LOCAL_RESPONSE: &str = "type.googleapis.com/envoy.extensions.http.custom_response.local_response_policy.v3.LocalResponsePolicy";
const STATUS_INPUT: &str =
    "type.googleapis.com/envoy.type.matcher.v3.HttpResponseStatusCodeMatchInput";
const HEADER_INPUT: &str = "type.googleapis.com/envoy.type.matcher.v3.HttpResponseHeaderMatchInput";
const LOCAL_REPLY_INPUT: &str =
    "type.googleapis.com/envoy.type.matcher.v3.HttpResponseLocalReplyMatchInput";

/// The filter's settings, on the listener or on a route.
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawCustomResponse, ResourceError> {
    let config: CustomResponse = decode(any, TYPE_URL, "a CustomResponse")?;
    let Some(matcher) = config.custom_response_matcher else {
        return Ok(RawCustomResponse::default());
    };
    let at = format!("{at}.custom_response_matcher");
    if matcher.on_no_match.is_some() {
        return Err(unsupported(&at, "on_no_match"));
    }
    let list = match matcher.matcher_type {
        None => return Ok(RawCustomResponse::default()),
        Some(MatcherType::MatcherList(list)) => list,
        Some(MatcherType::MatcherTree(_)) => return Err(unsupported(&at, "matcher_tree")),
    };
    let mut rules = Vec::with_capacity(list.matchers.len());
    for (i, field) in list.matchers.into_iter().enumerate() {
        let at = format!("{at}.matcher_list.matchers[{i}]");
        let predicate = field
            .predicate
            .ok_or_else(|| ResourceError::invalid(&at, "expected a predicate"))?;
        let when = predicate_match(predicate, &format!("{at}.predicate"), 0)?;
        let on_match = field
            .on_match
            .ok_or_else(|| ResourceError::invalid(&at, "expected an on_match"))?;
        if on_match.keep_matching {
            return Err(unsupported(&format!("{at}.on_match"), "keep_matching"));
        }
        let action = match on_match.on_match {
            Some(on_match::OnMatch::Action(action)) => action,
            Some(on_match::OnMatch::Matcher(_)) => {
                return Err(unsupported(&format!("{at}.on_match"), "a nested matcher"));
            }
            None => return Err(ResourceError::invalid(format!("{at}.on_match"), "expected an action")),
        };
        rules.push(local_response(action, when, &format!("{at}.on_match.action"))?);
    }
    Ok(RawCustomResponse { rules })
}

/// A predicate over the response's status and headers; nesting bounded as in the file.
fn predicate_match(p: Predicate, at: &str, depth: usize) -> Result<RawResponseMatch, ResourceError> {
    if depth > super::MAX_DEPTH {
        return Err(ResourceError::invalid(at, "nested too deep"));
    }
    let list = |list: Vec<Predicate>, key: &str| {
        // Envoy's validation: a list of fewer than two is invalid.
        if list.len() < 2 {
            return Err(ResourceError::invalid(
                format!("{at}.{key}.predicate"),
                "expected at least two predicates",
            ));
        }
        list.into_iter()
            .enumerate()
            .map(|(i, p)| predicate_match(p, &format!("{at}.{key}.predicate[{i}]"), depth + 1))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match p.match_type {
        Some(MatchType::SinglePredicate(single)) => {
            let at = format!("{at}.single_predicate");
            let input = single
                .input
                .and_then(|i| i.typed_config)
                .ok_or_else(|| ResourceError::invalid(format!("{at}.input"), "expected an input"))?;
            let value = match single.matcher {
                Some(single_predicate::Matcher::ValueMatch(m)) => {
                    // xDS's StringMatcher is Envoy's, field for field (the same numbers and
                    // types), so its encoding reads as one.
                    let m: envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher =
                        prost::Message::decode(prost::Message::encode_to_vec(&m).as_slice())
                            .map_err(|e| ResourceError::invalid(format!("{at}.value_match"), e.to_string()))?;
                    m
                }
                Some(single_predicate::Matcher::CustomMatch(m)) => {
                    return Err(unsupported(&at, format!("custom_match `{}`", m.name)));
                }
                None => return Err(ResourceError::invalid(at, "expected a value_match")),
            };
            let pattern = |value| matchers::pattern_of(value, &format!("{at}.value_match"));
            match input.type_url.as_str() {
                STATUS_INPUT => RawResponseMatch {
                    status: Some(pattern(value)?),
                    ..Default::default()
                },
                LOCAL_REPLY_INPUT => RawResponseMatch {
                    local_reply: Some(pattern(value)?),
                    ..Default::default()
                },
                HEADER_INPUT => {
                    let header: HttpResponseHeaderMatchInput =
                        decode(&input, HEADER_INPUT, "an HttpResponseHeaderMatchInput")?;
                    let m: RawHeaderMatch = matchers::string_match(
                        header.header_name.to_ascii_lowercase(),
                        value,
                        &format!("{at}.value_match"),
                    )?;
                    RawResponseMatch {
                        header: Some(m),
                        ..Default::default()
                    }
                }
                other => {
                    return Err(unsupported(
                        &format!("{at}.input"),
                        format!(
                            "input {} (the response's status code, headers and local reply flag only)",
                            other.rsplit('/').next().unwrap_or(other)
                        ),
                    ));
                }
            }
        }
        Some(MatchType::OrMatcher(or)) => RawResponseMatch {
            or: Some(list(or.predicate, "or_matcher")?),
            ..Default::default()
        },
        Some(MatchType::AndMatcher(and)) => RawResponseMatch {
            and: Some(list(and.predicate, "and_matcher")?),
            ..Default::default()
        },
        Some(MatchType::NotMatcher(not)) => RawResponseMatch {
            not: Some(Box::new(predicate_match(*not, &format!("{at}.not_matcher"), depth + 1)?)),
            ..Default::default()
        },
        None => return Err(ResourceError::invalid(at, "expected a predicate")),
    })
}

/// A `LocalResponsePolicy`: status, a literal body, response headers.
fn local_response(
    action: TypedExtensionConfig,
    when: RawResponseMatch,
    at: &str,
) -> Result<RawResponseRule, ResourceError> {
    let Some(any) = action.typed_config.filter(|a| a.type_url == LOCAL_RESPONSE) else {
        return Err(unsupported(
            at,
            format!("action `{}` (LocalResponsePolicy only: no internal redirects)", action.name),
        ));
    };
    let mut policy: LocalResponsePolicy = decode(&any, LOCAL_RESPONSE, "a LocalResponsePolicy")?;
    let body = match policy.body.take().and_then(|b| b.specifier) {
        None => None,
        Some(data_source::Specifier::InlineString(s)) => Some(bytes::Bytes::from(s)),
        Some(data_source::Specifier::InlineBytes(b)) => Some(bytes::Bytes::from(b)),
        Some(_) => return Err(unsupported(&format!("{at}.body"), "filename / environment_variable (inline bodies only)")),
    };
    let body = match policy.body_format.take() {
        None => body,
        Some(format) => Some(crate::envoy::literal_body(format, &format!("{at}.body_format"))?),
    };
    let status = policy
        .status_code
        .take()
        .map(|code| {
            u16::try_from(code.value).map_err(|_| {
                ResourceError::invalid(format!("{at}.status_code"), format!("{} is not a status", code.value))
            })
        })
        .transpose()?;
    let headers = crate::envoy::headers::mutations(
        std::mem::take(&mut policy.response_headers_to_add),
        Vec::new(),
        &format!("{at}.response_headers_to_add"),
    )?;
    nothing_else(&policy, fields::LOCAL_RESPONSE_POLICY, at)?;
    Ok(RawResponseRule {
        when: Some(when),
        status,
        body,
        headers,
    })
}
