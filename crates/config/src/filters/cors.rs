//! Settings of the `cors` filter, validated.

use std::time::Duration;

use http::{HeaderName, Method};
use serde::{Deserialize, Serialize, Serializer};

use crate::serialize as ser;
use crate::units::de_opt_duration;
use crate::*;

/// Cross-origin resource sharing (the Fetch standard's CORS protocol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorsConfig {
    /// Origins allowed to read responses.
    pub allow_origins: Vec<OriginMatch>,
    /// Methods a preflight allows; empty: the one asked for.
    #[serde(serialize_with = "methods")]
    pub allow_methods: Vec<Method>,
    /// Request headers a preflight allows; empty: those asked for.
    #[serde(serialize_with = "ser::header_names")]
    pub allow_headers: Vec<HeaderName>,
    /// Response headers scripts may read.
    #[serde(serialize_with = "ser::header_names")]
    pub expose_headers: Vec<HeaderName>,
    /// How long browsers may cache a preflight answer.
    #[serde(serialize_with = "ser::opt_duration")]
    pub max_age: Option<Duration>,
    /// Requests with credentials (cookies) may be read.
    pub allow_credentials: bool,
}

/// An origin as written: `https://app.example.com`, `https://*.example.com` or `*`.
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
}

impl Serialize for OriginMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OriginMatch::Any => s.serialize_str("*"),
            OriginMatch::Exact(origin) => s.serialize_str(origin),
            OriginMatch::Subdomains { scheme, suffix } => {
                s.collect_str(&format_args!("{scheme}*{suffix}"))
            }
        }
    }
}

fn methods<S: Serializer>(methods: &[Method], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(methods.iter().map(Method::as_str))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCors {
    #[serde(default)]
    pub allow_origins: Vec<String>,
    #[serde(default)]
    pub allow_methods: Vec<String>,
    #[serde(default)]
    pub allow_headers: Vec<String>,
    #[serde(default)]
    pub expose_headers: Vec<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_age: Option<Duration>,
    pub allow_credentials: Option<bool>,
}

pub(super) fn cors(raw: RawCors, path: &str) -> Result<CorsConfig, ConfigError> {
    if raw.allow_origins.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.allow_origins"),
            "expected at least one origin (`https://app.example.com`, `https://*.example.com` or `*`)",
        ));
    }
    let allow_credentials = raw.allow_credentials.unwrap_or(false);
    let mut allow_origins = Vec::with_capacity(raw.allow_origins.len());
    for (i, text) in raw.allow_origins.iter().enumerate() {
        let at = format!("{path}.allow_origins[{i}]");
        let lower = text.trim().to_ascii_lowercase();
        let origin = if lower == "*" {
            if allow_credentials {
                // The Fetch standard refuses `*` with credentials; say so at load, not in
                // every browser's console.
                return Err(ConfigError::invalid(
                    at,
                    "`*` cannot be used with `allow_credentials: true`; list the origins",
                ));
            }
            OriginMatch::Any
        } else {
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
                    OriginMatch::Subdomains {
                        scheme: format!("{scheme}://"),
                        suffix: suffix.to_string(),
                    }
                }
                None if valid_host(host) => OriginMatch::Exact(lower.clone()),
                _ => {
                    return Err(ConfigError::invalid(
                        at,
                        format!("expected an origin `scheme://host[:port]`, found `{text}`"),
                    ));
                }
            }
        };
        allow_origins.push(origin);
    }
    let allow_methods = raw
        .allow_methods
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Method::from_bytes(m.trim().as_bytes()).map_err(|_| {
                ConfigError::invalid(
                    format!("{path}.allow_methods[{i}]"),
                    format!("expected a method such as GET, found `{m}`"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CorsConfig {
        allow_origins,
        allow_methods,
        allow_headers: super::ext_authz::header_names(
            &raw.allow_headers,
            &format!("{path}.allow_headers"),
        )?,
        expose_headers: super::ext_authz::header_names(
            &raw.expose_headers,
            &format!("{path}.expose_headers"),
        )?,
        max_age: raw.max_age,
        allow_credentials,
    })
}

per_route_settings!(CorsConfig, RawCors, |raw, path, _| cors(raw, path));
