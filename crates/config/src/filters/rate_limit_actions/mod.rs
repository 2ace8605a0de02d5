//! Envoy's rate limit actions, shared by the local and the global rate limit: `rate_limits`
//! describe a request as lists of key/value entries (descriptors), one list per rule whose
//! actions all apply.

pub(crate) mod xds;

use http::HeaderName;
use ipnet::IpNet;
use serde::{Deserialize, Serialize, Serializer};

use crate::matchers::{query_match, value_match};
use crate::*;

/// One rule: its actions' entries, in order, make one list; none when an action does not
/// apply to the request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateLimitRule {
    pub actions: Vec<RateLimitAction>,
}

/// A route's or virtual host's own `rate_limits` (Envoy's `RouteAction.rate_limits` and
/// `VirtualHost.rate_limits`): rules for the rate limit filter of the same `stage`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StagedRateLimit {
    #[serde(flatten)]
    pub rule: RateLimitRule,
    #[serde(skip_serializing_if = "is_zero")]
    pub stage: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A route's rate limit policy: its rules, and whether its virtual host's apply too.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteRateLimitPolicy {
    pub rate_limits: Vec<StagedRateLimit>,
    /// The virtual host's rules apply as well (Envoy's `include_vh_rate_limits`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub include_vh_rate_limits: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStagedRateLimit {
    pub actions: Vec<RawRateLimitAction>,
    pub stage: Option<u32>,
}

/// A route's or host's `rate_limits`, checked: stages 0 to 10, as Envoy.
pub(crate) fn staged_rules(
    raw: Vec<RawStagedRateLimit>,
    path: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<StagedRateLimit>, ConfigError> {
    // Most routes have none: a table's thousands of routes are checked on every change.
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let stages: Vec<Option<u32>> = raw.iter().map(|r| r.stage).collect();
    for (i, stage) in stages.iter().enumerate() {
        if stage.is_some_and(|s| s > 10) {
            return Err(ConfigError::invalid(
                format!("{path}[{i}].stage"),
                "expected 0 to 10",
            ));
        }
    }
    let checked = rules(
        raw.into_iter()
            .map(|r| RawRateLimitRule { actions: r.actions })
            .collect(),
        path,
    )?;
    Ok(checked
        .into_iter()
        .zip(stages)
        .map(|(rule, stage)| StagedRateLimit {
            rule,
            stage: stage.unwrap_or(0),
        })
        .collect())
}

/// What one action adds to a request's list.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitAction {
    /// `(descriptor_key, descriptor_value)` when every header matches (or, with
    /// `expect_match: false`, when not all do).
    HeaderValueMatch {
        descriptor_key: String,
        descriptor_value: String,
        expect_match: bool,
        headers: Vec<RequestHeaderMatch>,
    },
    /// `(descriptor_key, the header's value)`; without the header the rule makes no list,
    /// or with `skip_if_absent` goes on without this entry.
    RequestHeaders {
        header_name: RequestField,
        descriptor_key: String,
        skip_if_absent: bool,
    },
    /// `(descriptor_key, the parameter's value)`, percent-decoded; absent as for
    /// `request_headers`.
    QueryParameters {
        query_parameter_name: String,
        descriptor_key: String,
        skip_if_absent: bool,
    },
    /// `("remote_address", the client's IP)`.
    RemoteAddress,
    /// `("masked_remote_address", the client's network)`, e.g. `10.1.0.0/16`.
    MaskedRemoteAddress {
        v4_prefix_mask_len: u8,
        v6_prefix_mask_len: u8,
    },
    /// `(descriptor_key, descriptor_value)`, always.
    GenericKey {
        descriptor_key: String,
        descriptor_value: String,
    },
    /// As `header_value_match`, over the query string's parameters.
    QueryParameterValueMatch {
        descriptor_key: String,
        descriptor_value: String,
        expect_match: bool,
        query_parameters: Vec<QueryMatch>,
    },
    /// `(descriptor_key, descriptor_value)` when the client's IP is in one of `ranges` (not
    /// in any, with `invert`).
    RemoteAddressMatch {
        descriptor_key: String,
        descriptor_value: DescriptorValue,
        #[serde(serialize_with = "ser_ranges")]
        ranges: Vec<IpNet>,
        invert: bool,
    },
}

/// A request attribute a header match reads: a header, or one of HTTP/2's pseudo-headers as
/// Envoy names them (HTTP/1.1 requests have them too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestField {
    Header(HeaderName),
    /// `:method`
    Method,
    /// `:path`: the path with its query string.
    Path,
    /// `:authority`: the host as the client sent it.
    Authority,
}

impl Serialize for RequestField {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            RequestField::Header(name) => name.as_str(),
            RequestField::Method => ":method",
            RequestField::Path => ":path",
            RequestField::Authority => ":authority",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestHeaderMatch {
    pub name: RequestField,
    #[serde(flatten)]
    pub value: HeaderValueMatch,
}

/// A descriptor value with the client's IP in it where it says
/// `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%` (a bucket per client, within ranges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorValue(pub Vec<ValuePart>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePart {
    Literal(String),
    ClientIp,
}

const CLIENT_IP: &str = "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%";

impl Serialize for DescriptorValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text: String = self
            .0
            .iter()
            .map(|part| match part {
                ValuePart::Literal(text) => text.as_str(),
                ValuePart::ClientIp => CLIENT_IP,
            })
            .collect();
        s.serialize_str(&text)
    }
}

fn ser_ranges<S: Serializer>(ranges: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(ranges.iter().map(ToString::to_string))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimitRule {
    pub actions: Vec<RawRateLimitAction>,
}

/// Exactly one of the fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimitAction {
    pub header_value_match: Option<RawValueMatch>,
    pub request_headers: Option<RawRequestHeaders>,
    pub query_parameters: Option<RawQueryParameters>,
    pub remote_address: Option<RawNothing>,
    pub masked_remote_address: Option<RawMaskedAddress>,
    pub generic_key: Option<RawGenericKey>,
    pub query_parameter_value_match: Option<RawValueMatch>,
    pub remote_address_match: Option<RawAddressMatch>,
}

/// `{}`: an action with no settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNothing {}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawValueMatch {
    pub descriptor_key: Option<String>,
    pub descriptor_value: String,
    pub expect_match: Option<bool>,
    #[serde(default)]
    pub headers: Vec<RawHeaderMatch>,
    #[serde(default)]
    pub query_parameters: Vec<RawHeaderMatch>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRequestHeaders {
    pub header_name: String,
    pub descriptor_key: String,
    pub skip_if_absent: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueryParameters {
    pub query_parameter_name: String,
    pub descriptor_key: String,
    pub skip_if_absent: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMaskedAddress {
    pub v4_prefix_mask_len: Option<u8>,
    pub v6_prefix_mask_len: Option<u8>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGenericKey {
    pub descriptor_key: Option<String>,
    pub descriptor_value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAddressMatch {
    pub descriptor_key: Option<String>,
    pub descriptor_value: String,
    pub ranges: Vec<String>,
    pub invert: Option<bool>,
}

pub(crate) fn rules(
    raw: Vec<RawRateLimitRule>,
    path: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<RateLimitRule>, ConfigError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, rule)| {
            let at = format!("{path}[{i}].actions");
            if rule.actions.is_empty() {
                return Err(ConfigError::invalid(at, "expected at least one action"));
            }
            let actions = rule
                .actions
                .into_iter()
                .enumerate()
                .map(|(j, a)| action(a, &format!("{at}[{j}]")))
                .collect::<Result<_, _>>()?;
            Ok(RateLimitRule { actions })
        })
        .collect()
}

fn action(raw: RawRateLimitAction, path: &str) -> Result<RateLimitAction, ConfigError> {
    let given = [
        raw.header_value_match.is_some(),
        raw.request_headers.is_some(),
        raw.query_parameters.is_some(),
        raw.remote_address.is_some(),
        raw.masked_remote_address.is_some(),
        raw.generic_key.is_some(),
        raw.query_parameter_value_match.is_some(),
        raw.remote_address_match.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ConfigError::invalid(
            path,
            "expected exactly one of `header_value_match`, `request_headers`, \
             `query_parameters`, `remote_address`, `masked_remote_address`, `generic_key`, `query_parameter_value_match` or \
             `remote_address_match`",
        ));
    }
    let key = |given: Option<String>, default: &str| {
        given
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| default.to_owned())
    };
    if let Some(m) = raw.header_value_match {
        let at = format!("{path}.header_value_match");
        if m.headers.is_empty() || !m.query_parameters.is_empty() {
            return Err(ConfigError::invalid(
                at,
                "expected `headers` (at least one) and no `query_parameters`",
            ));
        }
        let headers = m
            .headers
            .into_iter()
            .enumerate()
            .map(|(i, h)| request_header_match(h, &format!("{at}.headers[{i}]")))
            .collect::<Result<_, _>>()?;
        return Ok(RateLimitAction::HeaderValueMatch {
            descriptor_key: key(m.descriptor_key, "header_match"),
            descriptor_value: value(m.descriptor_value, &at)?,
            expect_match: m.expect_match.unwrap_or(true),
            headers,
        });
    }
    if let Some(m) = raw.query_parameter_value_match {
        let at = format!("{path}.query_parameter_value_match");
        if m.query_parameters.is_empty() || !m.headers.is_empty() {
            return Err(ConfigError::invalid(
                at,
                "expected `query_parameters` (at least one) and no `headers`",
            ));
        }
        let query_parameters = m
            .query_parameters
            .into_iter()
            .enumerate()
            .map(|(i, q)| query_match(q, &format!("{at}.query_parameters[{i}]")))
            .collect::<Result<_, _>>()?;
        return Ok(RateLimitAction::QueryParameterValueMatch {
            descriptor_key: key(m.descriptor_key, "query_match"),
            descriptor_value: value(m.descriptor_value, &at)?,
            expect_match: m.expect_match.unwrap_or(true),
            query_parameters,
        });
    }
    if let Some(h) = raw.request_headers {
        let at = format!("{path}.request_headers");
        if h.descriptor_key.is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.descriptor_key"),
                "expected a key",
            ));
        }
        return Ok(RateLimitAction::RequestHeaders {
            header_name: field(&h.header_name, &format!("{at}.header_name"))?,
            descriptor_key: h.descriptor_key,
            skip_if_absent: h.skip_if_absent.unwrap_or(false),
        });
    }
    if let Some(q) = raw.query_parameters {
        let at = format!("{path}.query_parameters");
        if q.query_parameter_name.is_empty() || q.descriptor_key.is_empty() {
            return Err(ConfigError::invalid(
                at,
                "expected a `query_parameter_name` and a `descriptor_key`",
            ));
        }
        return Ok(RateLimitAction::QueryParameters {
            query_parameter_name: q.query_parameter_name,
            descriptor_key: q.descriptor_key,
            skip_if_absent: q.skip_if_absent.unwrap_or(false),
        });
    }
    if raw.remote_address.is_some() {
        return Ok(RateLimitAction::RemoteAddress);
    }
    if let Some(m) = raw.masked_remote_address {
        let at = format!("{path}.masked_remote_address");
        let v4 = m.v4_prefix_mask_len.unwrap_or(32);
        let v6 = m.v6_prefix_mask_len.unwrap_or(128);
        if v4 > 32 {
            return Err(ConfigError::invalid(
                format!("{at}.v4_prefix_mask_len"),
                format!("expected 0 to 32, found {v4}"),
            ));
        }
        if v6 > 128 {
            return Err(ConfigError::invalid(
                format!("{at}.v6_prefix_mask_len"),
                format!("expected 0 to 128, found {v6}"),
            ));
        }
        return Ok(RateLimitAction::MaskedRemoteAddress {
            v4_prefix_mask_len: v4,
            v6_prefix_mask_len: v6,
        });
    }
    if let Some(g) = raw.generic_key {
        let at = format!("{path}.generic_key");
        return Ok(RateLimitAction::GenericKey {
            descriptor_key: key(g.descriptor_key, "generic_key"),
            descriptor_value: value(g.descriptor_value, &at)?,
        });
    }
    let Some(m) = raw.remote_address_match else {
        unreachable!("exactly one action is set");
    };
    let at = format!("{path}.remote_address_match");
    if m.ranges.is_empty() {
        return Err(ConfigError::invalid(
            format!("{at}.ranges"),
            "expected at least one CIDR range",
        ));
    }
    let ranges = m
        .ranges
        .iter()
        .enumerate()
        .map(|(i, text)| {
            text.parse::<IpNet>().map(|net| net.trunc()).map_err(|_| {
                ConfigError::invalid(
                    format!("{at}.ranges[{i}]"),
                    format!("expected a CIDR range (`10.0.0.0/8`), found `{text}`"),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(RateLimitAction::RemoteAddressMatch {
        descriptor_key: key(m.descriptor_key, "remote_address_match"),
        descriptor_value: formatted(&m.descriptor_value, &format!("{at}.descriptor_value"))?,
        ranges,
        invert: m.invert.unwrap_or(false),
    })
}

/// A literal descriptor value: never empty (Envoy's rule).
fn value(text: String, path: &str) -> Result<String, ConfigError> {
    if text.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.descriptor_value"),
            "expected a value",
        ));
    }
    Ok(text)
}

/// A value that may name the client's IP; other `%OPERATORS%` are refused.
fn formatted(text: &str, path: &str) -> Result<DescriptorValue, ConfigError> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('%') {
        if start > 0 {
            parts.push(ValuePart::Literal(rest[..start].to_owned()));
        }
        let after = &rest[start..];
        if let Some(tail) = after.strip_prefix(CLIENT_IP) {
            parts.push(ValuePart::ClientIp);
            rest = tail;
        } else {
            return Err(ConfigError::invalid(
                path,
                format!("`{text}`: the only operator here is {CLIENT_IP}"),
            ));
        }
    }
    if !rest.is_empty() {
        parts.push(ValuePart::Literal(rest.to_owned()));
    }
    if parts.is_empty() {
        return Err(ConfigError::invalid(path, "expected a value"));
    }
    Ok(DescriptorValue(parts))
}

fn field(name: &str, path: &str) -> Result<RequestField, ConfigError> {
    Ok(match name {
        ":method" => RequestField::Method,
        ":path" => RequestField::Path,
        ":authority" => RequestField::Authority,
        _ => RequestField::Header(HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            ConfigError::invalid(
                path,
                format!("expected a header name or :method, :path or :authority, found `{name}`"),
            )
        })?),
    })
}

fn request_header_match(
    raw: RawHeaderMatch,
    path: &str,
) -> Result<RequestHeaderMatch, ConfigError> {
    Ok(RequestHeaderMatch {
        name: field(&raw.name, &format!("{path}.name"))?,
        value: value_match(&raw, path)?,
    })
}
