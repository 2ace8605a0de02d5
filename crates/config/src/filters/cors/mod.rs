//! Settings of the `cors` filter, validated.

pub(crate) mod xds;

use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use serde::{Deserialize, Serialize, Serializer};

use crate::serialize as ser;
use crate::units::de_opt_duration;
use crate::*;

/// Cross-origin resource sharing (the Fetch standard's CORS protocol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorsConfig {
    /// Origins allowed to read responses; none: the filter does nothing here (its policies
    /// are on routes).
    pub allow_origins: Vec<OriginMatch>,
    /// Methods a preflight allows.
    pub allow_methods: AllowList<Method>,
    /// Request headers a preflight allows.
    pub allow_headers: AllowList<HeaderName>,
    /// Response headers scripts may read.
    #[serde(serialize_with = "ser::header_names")]
    pub expose_headers: Vec<HeaderName>,
    /// How long browsers may cache a preflight answer.
    #[serde(serialize_with = "ser::opt_duration")]
    pub max_age: Option<Duration>,
    /// Requests with credentials (cookies) may be read.
    pub allow_credentials: bool,
    /// The status of a preflight's answer: 204 unless configured (Envoy answers 200).
    #[serde(serialize_with = "ser::status")]
    pub preflight_status: StatusCode,
    /// A preflight from an origin not allowed goes on to the upstream (the default); `false`:
    /// the proxy answers it, without `access-control-allow-origin`.
    pub forward_not_matching_preflights: bool,
    /// A preflight asking `access-control-request-private-network: true` gets
    /// `access-control-allow-private-network: true` (Chrome's Private Network Access).
    pub allow_private_network_access: bool,
}

/// What a preflight's answer allows of what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowList<T> {
    /// What the preflight asks for (`*`, and the default).
    Asked,
    /// These; none: the answer names none.
    Listed(Vec<T>),
}

impl<T: AsRef<str>> Serialize for AllowList<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AllowList::Asked => s.collect_seq(["*"]),
            AllowList::Listed(items) => s.collect_seq(items.iter().map(AsRef::as_ref)),
        }
    }
}

/// An origin as written: `https://app.example.com`, `https://*.example.com` or `*`; or a
/// string matcher (Envoy's `allow_origin_string_match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginMatch {
    Any,
    /// Lowercase `scheme://host[:port]`.
    Exact(String),
    /// `https://*.example.com` as (`https://`, `.example.com`): any subdomain.
    Subdomains {
        scheme: String,
        suffix: String,
    },
    /// Allows an origin it matches, and every origin when it matches `*` (as Envoy).
    Matcher {
        /// Lowercase where `ignore_case` (never a regex: its own `(?i)` says).
        matcher: StringMatch,
        ignore_case: bool,
    },
}

impl OriginMatch {
    /// Whether `origin` may read (for `Matcher`; the other forms are compared by the filter).
    pub fn matcher_allows(matcher: &StringMatch, ignore_case: bool, origin: &[u8]) -> bool {
        if matcher.matches(b"*") {
            return true;
        }
        if ignore_case {
            matcher.matches(&origin.to_ascii_lowercase())
        } else {
            matcher.matches(origin)
        }
    }
}

impl Serialize for OriginMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            OriginMatch::Any => s.serialize_str("*"),
            OriginMatch::Exact(origin) => s.serialize_str(origin),
            OriginMatch::Subdomains { scheme, suffix } => {
                s.collect_str(&format_args!("{scheme}*{suffix}"))
            }
            OriginMatch::Matcher {
                matcher,
                ignore_case,
            } => {
                let mut map = s.serialize_map(None)?;
                matcher.write(&mut map)?;
                if *ignore_case {
                    map.serialize_entry("ignore_case", &true)?;
                }
                map.end()
            }
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCors {
    #[serde(default)]
    pub allow_origins: Vec<RawOrigin>,
    pub allow_methods: Option<Vec<String>>,
    pub allow_headers: Option<Vec<String>>,
    #[serde(default)]
    pub expose_headers: Vec<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_age: Option<Duration>,
    pub allow_credentials: Option<bool>,
    pub preflight_status: Option<u16>,
    pub forward_not_matching_preflights: Option<bool>,
    pub allow_private_network_access: Option<bool>,
    /// Set by the xDS mapping: Envoy's rules, which let a matcher that matches `*` allow
    /// every origin with credentials (the file refuses that, as it refuses `*`).
    #[serde(skip)]
    pub from_envoy: bool,
}

/// An origin as text, or `{ exact | prefix | suffix | contains | regex: ..., ignore_case }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawOrigin {
    Text(String),
    Matcher(RawOriginMatcher),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOriginMatcher {
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub contains: Option<String>,
    pub regex: Option<String>,
    #[serde(default)]
    pub ignore_case: bool,
}

pub(super) fn cors(raw: RawCors, path: &str) -> Result<CorsConfig, ConfigError> {
    let allow_credentials = raw.allow_credentials.unwrap_or(false);
    let allow_origins = raw
        .allow_origins
        .iter()
        .enumerate()
        .map(|(i, origin)| {
            let at = format!("{path}.allow_origins[{i}]");
            match origin {
                RawOrigin::Text(text) => origin_text(text, allow_credentials, &at),
                RawOrigin::Matcher(m) => origin_matcher(m, &at),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if allow_credentials && !raw.from_envoy {
        let any = allow_origins.iter().position(|o| match o {
            OriginMatch::Matcher { matcher, ignore_case } => {
                OriginMatch::matcher_allows(matcher, *ignore_case, b"*")
            }
            _ => false,
        });
        if let Some(i) = any {
            // It allows every origin: with credentials, any site could read a user's data.
            return Err(ConfigError::invalid(
                format!("{path}.allow_origins[{i}]"),
                "this matcher allows every origin (it matches `*`), which cannot go with \
                 `allow_credentials: true`; list the origins",
            ));
        }
    }
    let allow_methods = allow_list(raw.allow_methods, &format!("{path}.allow_methods"), |m, at| {
        Method::from_bytes(m.as_bytes()).map_err(|_| {
            ConfigError::invalid(at, format!("expected a method such as GET, found `{m}`"))
        })
    })?;
    let allow_headers = allow_list(raw.allow_headers, &format!("{path}.allow_headers"), |h, at| {
        HeaderName::from_bytes(h.as_bytes())
            .map_err(|_| ConfigError::invalid(at, format!("`{h}` is not a header name")))
    })?;
    let preflight_status = match raw.preflight_status {
        None => StatusCode::NO_CONTENT,
        Some(code @ 200..=299) => StatusCode::from_u16(code).map_err(|_| {
            ConfigError::invalid(format!("{path}.preflight_status"), "not a status")
        })?,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.preflight_status"),
                format!("expected a 2xx status (a browser fails any other preflight), found {other}"),
            ));
        }
    };
    Ok(CorsConfig {
        allow_origins,
        allow_methods,
        allow_headers,
        expose_headers: super::ext_authz::header_names(
            &raw.expose_headers,
            &format!("{path}.expose_headers"),
        )?,
        max_age: raw.max_age,
        allow_credentials,
        preflight_status,
        forward_not_matching_preflights: raw.forward_not_matching_preflights.unwrap_or(true),
        allow_private_network_access: raw.allow_private_network_access.unwrap_or(false),
    })
}

/// `allow_methods` / `allow_headers`: absent or `["*"]` allows what is asked for.
fn allow_list<T>(
    raw: Option<Vec<String>>,
    path: &str,
    item: impl Fn(&str, String) -> Result<T, ConfigError>,
) -> Result<AllowList<T>, ConfigError> {
    let Some(items) = raw else {
        return Ok(AllowList::Asked);
    };
    if items.iter().any(|i| i.trim() == "*") {
        if items.len() > 1 {
            return Err(ConfigError::invalid(
                path,
                "`*` (what the preflight asks for) stands alone",
            ));
        }
        return Ok(AllowList::Asked);
    }
    items
        .iter()
        .enumerate()
        .map(|(i, text)| item(text.trim(), format!("{path}[{i}]")))
        .collect::<Result<Vec<_>, _>>()
        .map(AllowList::Listed)
}

fn origin_text(text: &str, allow_credentials: bool, at: &str) -> Result<OriginMatch, ConfigError> {
    let lower = text.trim().to_ascii_lowercase();
    if lower == "*" {
        if allow_credentials {
            // The Fetch standard refuses `*` with credentials; say so at load, not in every
            // browser's console.
            return Err(ConfigError::invalid(
                at,
                "`*` cannot be used with `allow_credentials: true`; list the origins",
            ));
        }
        return Ok(OriginMatch::Any);
    }
    let Some((scheme, host)) = lower.split_once("://") else {
        return Err(ConfigError::invalid(
            at,
            format!("expected an origin `scheme://host[:port]`, found `{text}`"),
        ));
    };
    let valid_host = |h: &str| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return Err(ConfigError::invalid(
            at,
            format!("`{text}` has no valid scheme"),
        ));
    }
    match host.strip_prefix('*') {
        Some(suffix) if suffix.starts_with('.') && valid_host(&suffix[1..]) => {
            Ok(OriginMatch::Subdomains {
                scheme: format!("{scheme}://"),
                suffix: suffix.to_string(),
            })
        }
        None if valid_host(host) => Ok(OriginMatch::Exact(lower.clone())),
        _ => Err(ConfigError::invalid(
            at,
            format!("expected an origin `scheme://host[:port]`, found `{text}`"),
        )),
    }
}

fn origin_matcher(raw: &RawOriginMatcher, at: &str) -> Result<OriginMatch, ConfigError> {
    if raw.ignore_case && raw.regex.is_some() {
        // As Envoy: a regex says its own case rules.
        return Err(ConfigError::invalid(
            format!("{at}.ignore_case"),
            "has no effect on a regex (write `(?i)` in it)",
        ));
    }
    let lower = |v: &Option<String>| {
        v.as_ref()
            .map(|v| if raw.ignore_case { v.to_ascii_lowercase() } else { v.clone() })
    };
    let as_header = RawHeaderMatch {
        name: String::new(),
        exact: lower(&raw.exact),
        prefix: lower(&raw.prefix),
        suffix: lower(&raw.suffix),
        contains: lower(&raw.contains),
        regex: raw.regex.clone(),
        present: None,
    };
    match crate::matchers::string_match(&as_header, at)? {
        Some(matcher) => Ok(OriginMatch::Matcher {
            matcher,
            ignore_case: raw.ignore_case,
        }),
        None => Err(ConfigError::invalid(
            at,
            "expected one of `exact`, `prefix`, `suffix`, `contains` or `regex`",
        )),
    }
}

per_route_settings!(CorsConfig, RawCors, |raw, path, _| cors(raw, path));
