//! Settings of the `jwt_authn` filter (Envoy's JWT authentication): requests carry JSON Web
//! Tokens that are verified against the key sets of named providers before they go on.
//!
//! A provider says whose tokens it takes (`issuer`, `audiences`), where its keys come from
//! (`local_jwks` in the file, or `remote_jwks` fetched through a cluster and cached), where
//! the token is found in a request (headers, query parameters, cookies; by default
//! `authorization: Bearer` and `access_token`), and what a verified token leaves on the
//! request (`forward`, `forward_payload_header`, `claim_to_headers`). A requirement names
//! which providers must verify: one, any of several, all of several, and whether a request
//! without a token (`allow_missing`) or with a bad one (`allow_missing_or_failed`) still goes
//! on. `rules` give requirements by path, first match; a route may name one of
//! `requirement_map` instead, or turn the filter off.

pub(crate) mod xds;

use std::collections::BTreeMap;
use std::time::Duration;

use http::HeaderName;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::serialize as ser;
use crate::matchers::RawStringMatch;
use crate::units::de_opt_duration;
use crate::values::positive;
use crate::*;

/// A token is accepted this long after it expired, and this long before it is valid
/// (Envoy's default `clock_skew_seconds`).
pub const DEFAULT_CLOCK_SKEW_SECONDS: u64 = 60;
/// How long a fetched key set is used before it is fetched again (Envoy's default).
pub const DEFAULT_JWKS_CACHE_DURATION: Duration = Duration::from_secs(600);
/// After a failed fetch, when the keys are fetched again (Envoy's default).
pub const DEFAULT_JWKS_FAILED_REFETCH: Duration = Duration::from_secs(1);
/// A key set fetch's deadline when none is written.
pub const DEFAULT_JWKS_TIMEOUT: Duration = Duration::from_secs(5);

/// The filter's settings on a listener.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JwtAuthnConfig {
    pub providers: BTreeMap<String, JwtProvider>,
    /// Requirements by path: the first rule whose match takes the request applies; none:
    /// the request is not checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<JwtRule>,
    /// Requirements routes name (`requirement_name`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub requirement_map: BTreeMap<String, JwtRequirement>,
    /// CORS preflights (`OPTIONS` with `origin` and `access-control-request-method`) go on
    /// unchecked.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bypass_cors_preflight: bool,
}

/// Whose tokens are taken, with which keys, found where, and what a verified one leaves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JwtProvider {
    /// The token's `iss` must be this; `None`: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// One of the token's `aud` must be one of these; empty: any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// The token's `sub` must match.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "one_pattern")]
    pub subject: Option<StringMatch>,
    #[serde(flatten)]
    pub keys: JwksSource,
    /// Where tokens are looked for; empty: `authorization: Bearer <token>` and the
    /// `access_token` query parameter.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_headers: Vec<JwtHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_params: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_cookies: Vec<String>,
    /// Keep the token on the request going upstream (by default it is removed).
    pub forward: bool,
    /// A verified token's payload (base64url) is sent upstream in this header.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser::opt_header_name"
    )]
    pub forward_payload_header: Option<HeaderName>,
    /// The payload in `forward_payload_header` with base64 padding.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pad_forward_payload_header: bool,
    /// Claims of a verified token copied into request headers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claim_to_headers: Vec<ClaimToHeader>,
    /// After headers were set from claims, the route is matched again on them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub clear_route_cache: bool,
    pub clock_skew_seconds: u64,
    /// A token without `exp` is refused.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub require_expiration: bool,
    /// The key a verified payload is left under for the filters after this one (Envoy's
    /// dynamic metadata): an `rbac` rule's `metadata` reads its claims.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_in_metadata: Option<String>,
    /// Claims whose space-separated text is a list in that payload (`scope`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub space_delimited_claims: Vec<String>,
    /// Tokens whose signature verified are remembered (per worker), and not verified again
    /// while the provider's keys stay the same (Envoy's `jwt_cache_config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt_cache: Option<JwtCache>,
}

/// How many verified tokens a worker remembers per provider, and the longest it remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtCache {
    /// Envoy's default: 100.
    #[serde(default = "JwtCache::default_size")]
    pub size: u32,
    /// Envoy's default: 4096 bytes.
    #[serde(default = "JwtCache::default_max_token_size")]
    pub max_token_size: u32,
}

impl JwtCache {
    pub const DEFAULT_SIZE: u32 = 100;
    pub const DEFAULT_MAX_TOKEN_SIZE: u32 = 4096;

    fn default_size() -> u32 {
        Self::DEFAULT_SIZE
    }

    fn default_max_token_size() -> u32 {
        Self::DEFAULT_MAX_TOKEN_SIZE
    }
}

/// A string match as its one key (`prefix: spiffe://`).
fn one_pattern<S: Serializer>(pattern: &Option<StringMatch>, s: S) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(1))?;
    if let Some(pattern) = pattern {
        pattern.write(&mut map)?;
    }
    map.end()
}

/// Where a provider's keys come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JwksSource {
    /// A JWKS document, checked at load.
    LocalJwks(String),
    /// Fetched through a cluster and cached.
    RemoteJwks(RemoteJwks),
}

/// A key set fetched over HTTP through a cluster: at load, again `cache_duration` later,
/// and `failed_refetch_duration` after a failure. Requests meanwhile use the keys fetched
/// last; the first ones, before any, wait for the fetch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RemoteJwks {
    pub cluster: String,
    /// The cluster's place in the config (how workers find it).
    #[serde(skip)]
    pub cluster_index: usize,
    /// Its path and host are the request's.
    #[serde(serialize_with = "ser::display")]
    pub uri: http::Uri,
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub cache_duration: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub failed_refetch_duration: Duration,
    /// Tries after the first of one fetch.
    pub retries: u32,
    pub retry_back_off: RetryBackOff,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JwtHeader {
    #[serde(serialize_with = "ser::header_name")]
    pub name: HeaderName,
    /// The token follows this in the header's value (`Bearer `).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub value_prefix: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimToHeader {
    #[serde(serialize_with = "ser::header_name")]
    pub header_name: HeaderName,
    /// A claim of the payload; `a.b` is claim `b` of the object in claim `a`.
    pub claim_name: String,
}

/// A path and the requirement for requests to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JwtRule {
    #[serde(rename = "match")]
    pub when: PathMatch,
    /// `None`: requests it takes are not checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires: Option<JwtRequirement>,
}

/// Which providers must verify a request's tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum JwtRequirement {
    /// This provider's token must be there and verify; `audiences`, where given, instead of
    /// the provider's.
    Provider {
        name: String,
        audiences: Option<Vec<String>>,
    },
    /// One of these holds.
    Any(Vec<JwtRequirement>),
    /// All of these hold.
    All(Vec<JwtRequirement>),
    /// Tokens of any provider there are must verify; a request without one goes on.
    AllowMissing,
    /// Tokens are verified (and leave their headers) where they do; the request goes on
    /// whatever the outcome.
    AllowMissingOrFailed,
}

impl Serialize for JwtRequirement {
    /// As written.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            JwtRequirement::Provider {
                name,
                audiences: None,
            } => s.serialize_str(name),
            JwtRequirement::AllowMissing => s.serialize_str("allow_missing"),
            JwtRequirement::AllowMissingOrFailed => s.serialize_str("allow_missing_or_failed"),
            JwtRequirement::Provider {
                name,
                audiences: Some(audiences),
            } => {
                let mut map = s.serialize_map(Some(2))?;
                map.serialize_entry("provider", name)?;
                map.serialize_entry("audiences", audiences)?;
                map.end()
            }
            JwtRequirement::Any(list) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("any", list)?;
                map.end()
            }
            JwtRequirement::All(list) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("all", list)?;
                map.end()
            }
        }
    }
}

/// What a route or virtual host says: use the named requirement of the listener's
/// `requirement_map`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JwtRoute {
    pub requirement_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwtAuthn {
    #[serde(default)]
    pub providers: BTreeMap<String, RawJwtProvider>,
    #[serde(default)]
    pub rules: Vec<RawJwtRule>,
    #[serde(default)]
    pub requirement_map: BTreeMap<String, RawRequirement>,
    pub bypass_cors_preflight: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwtProvider {
    pub issuer: Option<String>,
    #[serde(default)]
    pub audiences: Vec<String>,
    pub subject: Option<RawStringMatch>,
    /// A JWKS document.
    pub local_jwks: Option<String>,
    /// A file holding one, read at load.
    pub local_jwks_file: Option<String>,
    pub remote_jwks: Option<RawRemoteJwks>,
    #[serde(default)]
    pub from_headers: Vec<RawJwtHeader>,
    #[serde(default)]
    pub from_params: Vec<String>,
    #[serde(default)]
    pub from_cookies: Vec<String>,
    pub forward: Option<bool>,
    pub forward_payload_header: Option<String>,
    pub pad_forward_payload_header: Option<bool>,
    #[serde(default)]
    pub claim_to_headers: Vec<RawClaimToHeader>,
    pub clear_route_cache: Option<bool>,
    pub clock_skew_seconds: Option<u64>,
    pub require_expiration: Option<bool>,
    pub payload_in_metadata: Option<String>,
    pub normalize_payload_in_metadata: Option<RawNormalizePayload>,
    pub jwt_cache: Option<JwtCache>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNormalizePayload {
    #[serde(default)]
    pub space_delimited_claims: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRemoteJwks {
    pub cluster: String,
    pub uri: String,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub cache_duration: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub failed_refetch_duration: Option<Duration>,
    pub retries: Option<u32>,
    pub retry_back_off: Option<RawRetryBackOff>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwtHeader {
    pub name: String,
    #[serde(default)]
    pub value_prefix: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClaimToHeader {
    pub header_name: String,
    pub claim_name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwtRule {
    #[serde(rename = "match")]
    pub when: RawPathMatch,
    pub requires: Option<RawRequirement>,
}

/// A rule's path: one of these.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPathMatch {
    pub prefix: Option<String>,
    pub path: Option<String>,
    pub path_separated_prefix: Option<String>,
    /// The whole path, without the query.
    pub regex: Option<String>,
}

/// A provider's name or `allow_missing` / `allow_missing_or_failed`; `{provider, audiences}`;
/// `{any: [...]}`; `{all: [...]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawRequirement {
    Word(String),
    Provider {
        provider: String,
        audiences: Vec<String>,
    },
    Any {
        any: Vec<RawRequirement>,
    },
    All {
        all: Vec<RawRequirement>,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwtRoute {
    pub requirement_name: String,
}

impl FilterSettings for JwtAuthnConfig {
    type Raw = RawJwtAuthn;
    type RawRoute = RawPerRoute<RawJwtRoute>;
    type Route = PerRoute<JwtRoute>;

    fn check(raw: RawJwtAuthn, path: &str, chain: &ChainCtx<'_>) -> Result<Self, ConfigError> {
        jwt_authn(raw, path, chain)
    }

    fn check_route(raw: Self::RawRoute, path: &str) -> Result<Self::Route, ConfigError> {
        per_route(raw, path, |raw, _| {
            Ok(JwtRoute {
                requirement_name: raw.requirement_name,
            })
        })
    }

    fn route_switch(on: bool) -> Self::RawRoute {
        RawPerRoute::Word(if on { "enabled" } else { "disabled" }.into())
    }
}

fn jwt_authn(raw: RawJwtAuthn, path: &str, chain: &ChainCtx<'_>) -> Result<JwtAuthnConfig, ConfigError> {
    let mut providers = BTreeMap::new();
    for (name, provider) in raw.providers {
        let at = format!("{path}.providers.{name}");
        if ["allow_missing", "allow_missing_or_failed"].contains(&name.as_str()) {
            return Err(ConfigError::invalid(
                at,
                "a provider may not be named as a requirement word",
            ));
        }
        providers.insert(name, check_provider(provider, &at, chain)?);
    }
    let names = |p: &BTreeMap<String, JwtProvider>| p.keys().cloned().collect::<Vec<_>>();
    let known = names(&providers);
    let rules = (raw.rules.into_iter().enumerate())
        .map(|(i, rule)| {
            let at = format!("{path}.rules[{i}]");
            Ok(JwtRule {
                when: path_match(rule.when, &format!("{at}.match"))?,
                requires: (rule.requires)
                    .map(|r| requirement(r, &format!("{at}.requires"), &known))
                    .transpose()?,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let requirement_map = (raw.requirement_map.into_iter())
        .map(|(name, r)| {
            let at = format!("{path}.requirement_map.{name}");
            Ok((name, requirement(r, &at, &known)?))
        })
        .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
    Ok(JwtAuthnConfig {
        providers,
        rules,
        requirement_map,
        bypass_cors_preflight: raw.bypass_cors_preflight.unwrap_or(false),
    })
}

fn check_provider(
    raw: RawJwtProvider,
    path: &str,
    chain: &ChainCtx<'_>,
) -> Result<JwtProvider, ConfigError> {
    let keys = match (raw.local_jwks, raw.local_jwks_file, raw.remote_jwks) {
        (Some(text), None, None) => JwksSource::LocalJwks(local_jwks(text, &format!("{path}.local_jwks"))?),
        (None, Some(file), None) => {
            let at = format!("{path}.local_jwks_file");
            let text = std::fs::read_to_string(&file)
                .map_err(|e| ConfigError::invalid(&at, format!("cannot read `{file}`: {e}")))?;
            JwksSource::LocalJwks(local_jwks(text, &at)?)
        }
        (None, None, Some(remote)) => {
            JwksSource::RemoteJwks(remote_jwks(remote, &format!("{path}.remote_jwks"), chain)?)
        }
        _ => {
            return Err(ConfigError::invalid(
                path,
                "expected one of `local_jwks`, `local_jwks_file` or `remote_jwks`",
            ));
        }
    };
    let from_headers = (raw.from_headers.into_iter().enumerate())
        .map(|(i, h)| {
            Ok(JwtHeader {
                name: header_name(&h.name, &format!("{path}.from_headers[{i}].name"))?,
                value_prefix: h.value_prefix,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let forward_payload_header = (raw.forward_payload_header)
        .map(|h| settable_header(&h, &format!("{path}.forward_payload_header")))
        .transpose()?;
    let claim_to_headers = (raw.claim_to_headers.into_iter().enumerate())
        .map(|(i, c)| {
            let at = format!("{path}.claim_to_headers[{i}]");
            if c.claim_name.is_empty() || c.claim_name.split('.').any(str::is_empty) {
                return Err(ConfigError::invalid(
                    format!("{at}.claim_name"),
                    "expected a claim name, nested ones joined by `.`",
                ));
            }
            Ok(ClaimToHeader {
                header_name: settable_header(&c.header_name, &format!("{at}.header_name"))?,
                claim_name: c.claim_name,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    for (i, param) in raw.from_params.iter().chain(&raw.from_cookies).enumerate() {
        if param.is_empty() {
            return Err(ConfigError::invalid(
                path,
                format!("from_params / from_cookies entry {i}: expected a name"),
            ));
        }
    }
    Ok(JwtProvider {
        issuer: raw.issuer.filter(|i| !i.is_empty()),
        audiences: raw.audiences,
        subject: (raw.subject)
            .map(|s| crate::matchers::string_pattern(s, &format!("{path}.subject")))
            .transpose()?,
        keys,
        from_headers,
        from_params: raw.from_params,
        from_cookies: raw.from_cookies,
        forward: raw.forward.unwrap_or(false),
        forward_payload_header,
        pad_forward_payload_header: raw.pad_forward_payload_header.unwrap_or(false),
        claim_to_headers,
        clear_route_cache: raw.clear_route_cache.unwrap_or(false),
        clock_skew_seconds: raw
            .clock_skew_seconds
            .unwrap_or(DEFAULT_CLOCK_SKEW_SECONDS),
        require_expiration: raw.require_expiration.unwrap_or(false),
        payload_in_metadata: raw.payload_in_metadata.filter(|p| !p.is_empty()),
        space_delimited_claims: (raw.normalize_payload_in_metadata)
            .map(|n| n.space_delimited_claims)
            .unwrap_or_default(),
        jwt_cache: match raw.jwt_cache {
            Some(cache) if cache.size == 0 || cache.max_token_size == 0 => {
                return Err(ConfigError::invalid(
                    format!("{path}.jwt_cache"),
                    "expected a size and a max_token_size of at least 1",
                ));
            }
            other => other,
        },
    })
}

fn local_jwks(text: String, path: &str) -> Result<String, ConfigError> {
    jwt::Jwks::parse(&text).map_err(|e| ConfigError::invalid(path, e.to_string()))?;
    Ok(text)
}

fn remote_jwks(
    raw: RawRemoteJwks,
    path: &str,
    chain: &ChainCtx<'_>,
) -> Result<RemoteJwks, ConfigError> {
    let Some(&cluster_index) = chain.cluster_index.get(raw.cluster.as_str()) else {
        return Err(ConfigError::invalid(
            format!("{path}.cluster"),
            format!("no cluster named `{}`", raw.cluster),
        ));
    };
    let at = format!("{path}.uri");
    let uri: http::Uri = raw
        .uri
        .parse()
        .map_err(|e| ConfigError::invalid(&at, format!("`{}`: {e}", raw.uri)))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(ConfigError::invalid(
            at,
            format!("expected an http:// or https:// URL with a host, found `{}`", raw.uri),
        ));
    }
    Ok(RemoteJwks {
        cluster: raw.cluster,
        cluster_index,
        uri,
        timeout: positive(
            raw.timeout.unwrap_or(DEFAULT_JWKS_TIMEOUT),
            &format!("{path}.timeout"),
        )?,
        cache_duration: positive(
            raw.cache_duration.unwrap_or(DEFAULT_JWKS_CACHE_DURATION),
            &format!("{path}.cache_duration"),
        )?,
        failed_refetch_duration: positive(
            raw.failed_refetch_duration.unwrap_or(DEFAULT_JWKS_FAILED_REFETCH),
            &format!("{path}.failed_refetch_duration"),
        )?,
        retries: raw.retries.unwrap_or(1),
        retry_back_off: crate::values::retry_back_off(
            raw.retry_back_off,
            Duration::from_secs(1),
            path,
        )?,
    })
}

fn header_name(name: &str, path: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
        .map_err(|_| ConfigError::invalid(path, format!("`{name}` is not a header name")))
}

/// A header the filter sets on requests: not one of their framing or host headers.
fn settable_header(name: &str, path: &str) -> Result<HeaderName, ConfigError> {
    let header = header_name(name, path)?;
    if crate::values::framing_or_host(&header) {
        return Err(ConfigError::invalid(
            path,
            format!("`{name}` frames or routes the request: it is not set from a token"),
        ));
    }
    Ok(header)
}

fn path_match(raw: RawPathMatch, path: &str) -> Result<PathMatch, ConfigError> {
    Ok(
        match (raw.prefix, raw.path, raw.path_separated_prefix, raw.regex) {
            (Some(p), None, None, None) if p.starts_with('/') => PathMatch::Prefix(p),
            (None, Some(p), None, None) if p.starts_with('/') => PathMatch::Exact(p),
            (None, None, Some(p), None) if p.starts_with('/') && !p.ends_with('/') => {
                PathMatch::SeparatedPrefix(p)
            }
            (None, None, None, Some(r)) => {
                PathMatch::Regex(crate::matchers::pattern(&r, false, &format!("{path}.regex"))?)
            }
            _ => {
                return Err(ConfigError::invalid(
                    path,
                    "expected one of `prefix`, `path`, `path_separated_prefix` (each starting \
                     with `/`) or `regex`",
                ));
            }
        },
    )
}

fn requirement(
    raw: RawRequirement,
    path: &str,
    providers: &[String],
) -> Result<JwtRequirement, ConfigError> {
    let provider = |name: String, audiences| {
        if providers.contains(&name) {
            Ok(JwtRequirement::Provider { name, audiences })
        } else {
            Err(ConfigError::invalid(
                path,
                format!("no provider named `{name}`; known: {}", providers.join(", ")),
            ))
        }
    };
    let list = |list: Vec<RawRequirement>, key: &str| {
        if list.len() < 2 {
            return Err(ConfigError::invalid(
                format!("{path}.{key}"),
                "expected at least two requirements",
            ));
        }
        (list.into_iter().enumerate())
            .map(|(i, r)| requirement(r, &format!("{path}.{key}[{i}]"), providers))
            .collect::<Result<Vec<_>, _>>()
    };
    match raw {
        RawRequirement::Word(word) if word == "allow_missing" => Ok(JwtRequirement::AllowMissing),
        RawRequirement::Word(word) if word == "allow_missing_or_failed" => {
            Ok(JwtRequirement::AllowMissingOrFailed)
        }
        RawRequirement::Word(name) => provider(name, None),
        // No audiences: the provider's, as Envoy reads an empty list.
        RawRequirement::Provider {
            provider: name,
            audiences,
        } => provider(name, Some(audiences).filter(|a| !a.is_empty())),
        RawRequirement::Any { any } => Ok(JwtRequirement::Any(list(any, "any")?)),
        RawRequirement::All { all } => Ok(JwtRequirement::All(list(all, "all")?)),
    }
}

impl PathMatch {
    /// Whether `path` (without its query) matches, letter case counting.
    pub fn matches_path(&self, path: &str) -> bool {
        match self {
            PathMatch::Prefix(prefix) => path.starts_with(prefix.as_str()),
            PathMatch::Exact(exact) => path == exact,
            PathMatch::SeparatedPrefix(prefix) => path
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
            PathMatch::Regex(pattern) => pattern.is_match(path.as_bytes()),
            PathMatch::Connect => path.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests;
