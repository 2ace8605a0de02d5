//! Settings of the `custom_response` filter (Envoy's): responses, from an upstream or made
//! here, that a rule's match picks (by status, by response header, and/or/not) get a new
//! status, body or headers. The first rule that matches applies. `xds.rs` maps Envoy's
//! `CustomResponse` matcher and its `LocalResponsePolicy` actions.

pub(crate) mod xds;

use bytes::Bytes;
use serde::{Deserialize, Serialize, Serializer};

use super::reply::{ReplyRewrite, reply_rewrite};
use crate::matchers::{header_match, string_patterns};
use crate::*;

/// Rules over responses, in order: the first whose match holds rewrites the response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CustomResponseConfig {
    pub rules: Vec<ResponseRule>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseRule {
    pub when: ResponseMatch,
    #[serde(flatten)]
    pub rewrite: ReplyRewrite,
}

/// What a rule looks at in a response.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseMatch {
    /// The status code, as text (`"404"`), matched as a string (Envoy's
    /// `HttpResponseStatusCodeMatchInput`).
    Status(StringMatch),
    /// A response header (Envoy's `HttpResponseHeaderMatchInput`); absent: no match.
    Header(HeaderMatch),
    /// Whether the proxy made the response, as `"true"` or `"false"` (Envoy's
    /// `HttpResponseLocalReplyMatchInput`).
    LocalReply(StringMatch),
    And(Vec<ResponseMatch>),
    Or(Vec<ResponseMatch>),
    Not(Box<ResponseMatch>),
}

impl ResponseMatch {
    /// `local`: the proxy made the response.
    pub fn holds(&self, status: http::StatusCode, headers: &http::HeaderMap, local: bool) -> bool {
        match self {
            ResponseMatch::Status(m) => m.matches(status.as_str().as_bytes()),
            ResponseMatch::Header(m) => m.matches(headers),
            ResponseMatch::LocalReply(m) => m.matches(if local { b"true" } else { b"false" }),
            ResponseMatch::And(all) => all.iter().all(|m| m.holds(status, headers, local)),
            ResponseMatch::Or(any) => any.iter().any(|m| m.holds(status, headers, local)),
            ResponseMatch::Not(m) => !m.holds(status, headers, local),
        }
    }
}

impl Serialize for ResponseMatch {
    /// As written: `{ status: { exact: "404" } }`, `{ header: {...} }`, `{ and: [...] }`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            ResponseMatch::Status(m) => {
                map.serialize_entry("status", &crate::serialize::OneStringMatch(m))?
            }
            ResponseMatch::Header(m) => map.serialize_entry("header", m)?,
            ResponseMatch::LocalReply(m) => {
                map.serialize_entry("local_reply", &crate::serialize::OneStringMatch(m))?
            }
            ResponseMatch::And(all) => map.serialize_entry("and", all)?,
            ResponseMatch::Or(any) => map.serialize_entry("or", any)?,
            ResponseMatch::Not(m) => map.serialize_entry("not", m)?,
        }
        map.end()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCustomResponse {
    #[serde(default)]
    pub rules: Vec<RawResponseRule>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResponseRule {
    pub when: Option<RawResponseMatch>,
    pub status: Option<u16>,
    #[serde(default, deserialize_with = "crate::units::de_opt_text_bytes")]
    pub body: Option<Bytes>,
    pub headers: Option<RawHeaderMutations>,
}

/// One key: `status`, `header`, `and`, `or` or `not`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResponseMatch {
    pub status: Option<RawStringMatch>,
    pub header: Option<RawHeaderMatch>,
    /// `"true"` for the proxy's own responses, `"false"` for an upstream's.
    pub local_reply: Option<RawStringMatch>,
    pub and: Option<Vec<RawResponseMatch>>,
    pub or: Option<Vec<RawResponseMatch>>,
    pub not: Option<Box<RawResponseMatch>>,
}

/// Nesting bounded, so a config cannot make matching (or checking) recurse without end.
const MAX_DEPTH: usize = 16;

fn response_match(raw: RawResponseMatch, path: &str, depth: usize) -> Result<ResponseMatch, ConfigError> {
    if depth > MAX_DEPTH {
        return Err(ConfigError::invalid(
            path,
            format!("nested more than {MAX_DEPTH} deep"),
        ));
    }
    let list = |list: Vec<RawResponseMatch>, key: &str| {
        if list.is_empty() {
            return Err(ConfigError::invalid(
                format!("{path}.{key}"),
                "expected at least one match",
            ));
        }
        list.into_iter()
            .enumerate()
            .map(|(i, m)| response_match(m, &format!("{path}.{key}[{i}]"), depth + 1))
            .collect::<Result<Vec<_>, _>>()
    };
    let set = [
        raw.status.is_some(),
        raw.header.is_some(),
        raw.local_reply.is_some(),
        raw.and.is_some(),
        raw.or.is_some(),
        raw.not.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err(ConfigError::invalid(
            path,
            "expected one of `status`, `header`, `local_reply`, `and`, `or` or `not`",
        ));
    }
    Ok(if let Some(status) = raw.status {
        let at = format!("{path}.status");
        let mut one = string_patterns(vec![status], &at)?;
        ResponseMatch::Status(one.remove(0))
    } else if let Some(local) = raw.local_reply {
        let mut one = string_patterns(vec![local], &format!("{path}.local_reply"))?;
        ResponseMatch::LocalReply(one.remove(0))
    } else if let Some(header) = raw.header {
        ResponseMatch::Header(header_match(header, &format!("{path}.header"))?)
    } else if let Some(all) = raw.and {
        ResponseMatch::And(list(all, "and")?)
    } else if let Some(any) = raw.or {
        ResponseMatch::Or(list(any, "or")?)
    } else {
        let inner = raw.not.map(|m| *m).unwrap_or_default();
        ResponseMatch::Not(Box::new(response_match(inner, &format!("{path}.not"), depth + 1)?))
    })
}

fn custom_response(
    raw: RawCustomResponse,
    path: &str,
    _: bool,
) -> Result<CustomResponseConfig, ConfigError> {
    let rules = raw
        .rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| {
            let at = format!("{path}.rules[{i}]");
            let when = rule.when.ok_or_else(|| {
                ConfigError::invalid(format!("{at}.when"), "expected the responses it picks")
            })?;
            Ok(ResponseRule {
                when: response_match(when, &format!("{at}.when"), 0)?,
                rewrite: reply_rewrite(rule.status, rule.body, rule.headers, &at)?,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(CustomResponseConfig { rules })
}

per_route_settings!(CustomResponseConfig, RawCustomResponse, custom_response);
