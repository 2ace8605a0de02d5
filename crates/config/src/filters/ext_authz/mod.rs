//! External authorization settings of listeners and routes, validated.

pub(crate) mod xds;

use std::time::Duration;

use http::{HeaderName, StatusCode};
use serde::{Deserialize, Serialize, Serializer};

use crate::ServiceEndpoint;
use crate::serialize as ser;
use crate::units::{de_opt_duration, de_opt_size};
use crate::*;

/// How long an authorization check may take, unless configured (Envoy's default).
pub const DEFAULT_AUTHZ_TIMEOUT: Duration = Duration::from_millis(200);

/// A listener's external authorization: every request is checked before it is routed on,
/// unless its route turns the check off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExtAuthzConfig {
    #[serde(flatten)]
    pub service: AuthzService,
    /// A check with no answer within this is an error.
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// On an error or timeout, let the request through (marked with
    /// `x-legate-auth-failure-mode-allowed: true`) instead of answering `status_on_error`.
    pub failure_mode_allow: bool,
    #[serde(serialize_with = "ser::status")]
    pub status_on_error: StatusCode,
    /// Send the request body (or its start) with the check.
    pub with_request_body: Option<AuthzBodyConfig>,
    /// The namespaces of the route's `metadata` sent with each check (gRPC mode, Envoy's
    /// `route_metadata_context`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub route_metadata_context_namespaces: Vec<String>,
    /// After an allow that changed the request's headers, the route is matched again on
    /// them: the filters after this one and the route's action follow the new match.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub clear_route_cache: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthzService {
    /// `envoy.service.auth.v3.Authorization/Check`.
    Grpc {
        #[serde(rename = "address", serialize_with = "ser::display")]
        endpoint: ServiceEndpoint,
        /// The calls' `:authority` (`ext-authz` when not given).
        #[serde(skip_serializing_if = "Option::is_none")]
        authority: Option<String>,
        /// TLS to the service (a TCP address).
        #[serde(skip_serializing_if = "Option::is_none")]
        tls: Option<crate::ClusterTlsConfig>,
        /// The request headers sent (lowercase; `:authority`, `:method` and `:path` may be
        /// named); `None`: all of them.
        #[serde(skip_serializing_if = "Option::is_none")]
        allowed_headers: Option<Vec<String>>,
        /// Failed calls tried again (Envoy's `grpc_service.retry_policy`).
        #[serde(skip_serializing_if = "Option::is_none")]
        retry_policy: Option<AuthzRetry>,
    },
    /// Plain HTTP: a 200 allows; a 5xx is an error (the failure mode answers).
    Http {
        #[serde(rename = "address", serialize_with = "ser::display")]
        endpoint: ServiceEndpoint,
        path_prefix: String,
        /// The path of every check, instead of the request's behind `path_prefix`.
        #[serde(skip_serializing_if = "Option::is_none")]
        path_override: Option<String>,
        /// Failed checks tried again (Envoy's `http_service.retry_policy`).
        #[serde(skip_serializing_if = "Option::is_none")]
        retry_policy: Option<AuthzRetry>,
        #[serde(serialize_with = "ser::header_names")]
        allowed_headers: Vec<HeaderName>,
        #[serde(serialize_with = "ser::header_names")]
        allowed_upstream_headers: Vec<HeaderName>,
        /// The other header lists of checks and their answers (boxed: most services have
        /// none).
        #[serde(flatten)]
        header_lists: Box<AuthzHeaderLists>,
        /// TLS to the service (a TCP address).
        #[serde(skip_serializing_if = "Option::is_none")]
        tls: Option<crate::ClusterTlsConfig>,
    },
}

/// An HTTP service's header lists beyond the request headers sent and an allow's headers
/// for the upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AuthzHeaderLists {
    /// Headers of an allow appended to the upstream request's.
    #[serde(
        serialize_with = "ser::header_names",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allowed_upstream_headers_to_append: Vec<HeaderName>,
    /// Headers of an allow added to the client's response.
    #[serde(
        serialize_with = "ser::header_names",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allowed_client_headers_on_success: Vec<HeaderName>,
    /// Headers of a denial the client gets (with `www-authenticate` and `location`); `None`:
    /// all of them.
    #[serde(
        serialize_with = "ser::opt_header_names",
        skip_serializing_if = "Option::is_none"
    )]
    pub allowed_client_headers: Option<Vec<HeaderName>>,
    /// Set on every check request.
    #[serde(
        serialize_with = "ser::header_pairs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub headers_to_add: Vec<(HeaderName, http::HeaderValue)>,
}

/// Retries of failed checks, within the check's timeout: after a connection failure, a reset
/// or an answer `retry_on` names (a gRPC call's by the `grpc-status` of a trailers-only
/// answer), another try follows a jittered back-off, up to `num_retries` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AuthzRetry {
    pub retry_on: crate::RetryOn,
    pub num_retries: u32,
    pub back_off: crate::RetryBackOff,
}

/// The back-off base of a check's retries when none is given (Envoy's `core.v3.RetryPolicy`).
pub const DEFAULT_AUTHZ_RETRY_BASE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AuthzBodyConfig {
    /// Bytes of body sent at most; at most the listener's buffer limit.
    pub max_request_bytes: u32,
    /// A longer body: send its first `max_request_bytes` (true) or answer 413 (false).
    pub allow_partial_message: bool,
}

/// A route's view of its listener's check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteAuthz {
    /// No check for this route.
    pub disabled: bool,
    /// Sent with every check of this route (gRPC mode).
    pub context_extensions: Vec<(String, String)>,
}

impl Serialize for RouteAuthz {
    /// As written: `disabled`, or the context extensions.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.disabled {
            return s.serialize_str("disabled");
        }
        let mut map = s.serialize_map(Some(1))?;
        let extensions: std::collections::BTreeMap<_, _> =
            self.context_extensions.iter().cloned().collect();
        map.serialize_entry("context_extensions", &extensions)?;
        map.end()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExtAuthz {
    pub grpc: Option<RawAuthzGrpc>,
    pub http: Option<Box<RawAuthzHttp>>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    pub failure_mode_allow: Option<bool>,
    pub status_on_error: Option<u16>,
    pub with_request_body: Option<RawAuthzBody>,
    /// gRPC: the route `metadata` namespaces sent with each check.
    #[serde(default)]
    pub route_metadata_context_namespaces: Vec<String>,
    /// Match the route again after an allow that changed the request's headers.
    pub clear_route_cache: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzGrpc {
    pub address: String,
    pub authority: Option<String>,
    /// The keys of a cluster's `tls`: the service's CA and name, a client certificate.
    pub tls: Option<crate::tls::raw::RawClusterTls>,
    /// Only these request headers are sent (default: all).
    pub allowed_headers: Option<Vec<String>>,
    pub retry_policy: Option<RawAuthzRetry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzHttp {
    pub address: String,
    pub path_prefix: Option<String>,
    /// Every check's path, instead of the request's (not with `path_prefix`).
    pub path_override: Option<String>,
    pub retry_policy: Option<RawAuthzRetry>,
    #[serde(default)]
    pub allowed_headers: Vec<String>,
    #[serde(default)]
    pub allowed_upstream_headers: Vec<String>,
    #[serde(default)]
    pub allowed_upstream_headers_to_append: Vec<String>,
    #[serde(default)]
    pub allowed_client_headers_on_success: Vec<String>,
    pub allowed_client_headers: Option<Vec<String>>,
    /// `{ name: value }` set on every check request.
    #[serde(default)]
    pub headers_to_add: std::collections::BTreeMap<String, String>,
    /// The keys of a cluster's `tls`: the service's CA and name, a client certificate.
    pub tls: Option<crate::tls::raw::RawClusterTls>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzRetry {
    pub retry_on: Vec<String>,
    pub num_retries: Option<u32>,
    pub retry_back_off: Option<crate::RawRetryBackOff>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzBody {
    #[serde(default, deserialize_with = "de_opt_size")]
    pub max_request_bytes: Option<u64>,
    pub allow_partial_message: Option<bool>,
}

/// `ext_authz: disabled`, `ext_authz: enabled` or `ext_authz: { context_extensions: { k: v } }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawRouteAuthz {
    Word(String),
    Settings(RawRouteAuthzSettings),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteAuthzSettings {
    pub disabled: Option<bool>,
    #[serde(default)]
    pub context_extensions: std::collections::BTreeMap<String, String>,
}

/// A gRPC check's `allowed_headers`: header names, or the pseudo-headers it carries.
fn grpc_header_names(names: Vec<String>, path: &str) -> Result<Vec<String>, ConfigError> {
    names
        .into_iter()
        .map(|name| {
            let lower = name.to_ascii_lowercase();
            let pseudo = [":authority", ":method", ":path", ":scheme"].contains(&lower.as_str());
            if pseudo || HeaderName::from_bytes(lower.as_bytes()).is_ok() {
                Ok(lower)
            } else {
                Err(ConfigError::invalid(
                    path,
                    format!("`{name}` is not a header name"),
                ))
            }
        })
        .collect()
}

pub(super) fn listener_authz(
    raw: RawExtAuthz,
    path: &str,
    buffer_limit: u32,
) -> Result<ExtAuthzConfig, ConfigError> {
    let service = match (raw.grpc, raw.http) {
        (Some(grpc), None) => AuthzService::Grpc {
            tls: crate::tls::check::service_tls(grpc.tls, &grpc.address, &format!("{path}.grpc"))?,
            endpoint: crate::values::service_endpoint(
                &grpc.address,
                &format!("{path}.grpc.address"),
            )?,
            authority: match grpc.authority {
                Some(a) if a.parse::<http::uri::Authority>().is_err() => {
                    return Err(ConfigError::invalid(
                        format!("{path}.grpc.authority"),
                        format!("expected a host name (and port), found `{a}`"),
                    ));
                }
                other => other,
            },
            allowed_headers: grpc
                .allowed_headers
                .map(|names| grpc_header_names(names, &format!("{path}.grpc.allowed_headers")))
                .transpose()?,
            retry_policy: grpc
                .retry_policy
                .map(|r| authz_retry(r, &format!("{path}.grpc.retry_policy")))
                .transpose()?,
        },
        (None, Some(http)) => {
            let prefix = http.path_prefix.unwrap_or_default();
            if !prefix.is_empty() && (!prefix.starts_with('/') || prefix.ends_with('/')) {
                return Err(ConfigError::invalid(
                    format!("{path}.http.path_prefix"),
                    format!(
                        "expected a path such as `/authz` (leading /, no trailing /), found `{prefix}`"
                    ),
                ));
            }
            let path_override = http
                .path_override
                .map(|p| check_path_override(p, !prefix.is_empty(), path))
                .transpose()?;
            let retry_policy = http
                .retry_policy
                .map(|r| authz_retry(r, &format!("{path}.http.retry_policy")))
                .transpose()?;
            AuthzService::Http {
                path_override,
                retry_policy,
                tls: crate::tls::check::service_tls(http.tls, &http.address, &format!("{path}.http"))?,
                endpoint: crate::values::service_endpoint(
                    &http.address,
                    &format!("{path}.http.address"),
                )?,
                path_prefix: prefix,
                allowed_headers: header_names(
                    &http.allowed_headers,
                    &format!("{path}.http.allowed_headers"),
                )?,
                allowed_upstream_headers: header_names(
                    &http.allowed_upstream_headers,
                    &format!("{path}.http.allowed_upstream_headers"),
                )?,
                header_lists: Box::new(AuthzHeaderLists {
                allowed_upstream_headers_to_append: header_names(
                    &http.allowed_upstream_headers_to_append,
                    &format!("{path}.http.allowed_upstream_headers_to_append"),
                )?,
                allowed_client_headers_on_success: header_names(
                    &http.allowed_client_headers_on_success,
                    &format!("{path}.http.allowed_client_headers_on_success"),
                )?,
                // An empty list is no list, as Envoy reads it: every header goes.
                allowed_client_headers: (http.allowed_client_headers)
                    .filter(|names| !names.is_empty())
                    .map(|names| header_names(&names, &format!("{path}.http.allowed_client_headers")))
                    .transpose()?,
                headers_to_add: (http.headers_to_add.into_iter())
                    .map(|(name, value)| check_header_to_add(name, value, path))
                    .collect::<Result<_, _>>()?,
                }),
            }
        }
        _ => {
            return Err(ConfigError::invalid(
                path,
                "expected exactly one of `grpc: { address: ... }` or `http: { address: ... }`",
            ));
        }
    };
    let status_on_error = match raw.status_on_error {
        None => StatusCode::FORBIDDEN,
        Some(code) => StatusCode::from_u16(code)
            .ok()
            .filter(|s| s.as_u16() >= 200)
            .ok_or_else(|| {
                ConfigError::invalid(
                    format!("{path}.status_on_error"),
                    format!("expected an HTTP status from 200 to 599, found {code}"),
                )
            })?,
    };
    let with_request_body = raw
        .with_request_body
        .map(|body| -> Result<_, ConfigError> {
            let max = body.max_request_bytes.unwrap_or(u64::from(buffer_limit));
            if max == 0 || max > u64::from(buffer_limit) {
                return Err(ConfigError::invalid(
                    format!("{path}.with_request_body.max_request_bytes"),
                    format!("expected 1 byte up to the listener's buffer limit ({buffer_limit} bytes), found {max}"),
                ));
            }
            Ok(AuthzBodyConfig {
                max_request_bytes: max as u32,
                allow_partial_message: body.allow_partial_message.unwrap_or(false),
            })
        })
        .transpose()?;
    if !raw.route_metadata_context_namespaces.is_empty()
        && matches!(service, AuthzService::Http { .. })
    {
        return Err(ConfigError::invalid(
            format!("{path}.route_metadata_context_namespaces"),
            "the route's metadata goes with gRPC checks only",
        ));
    }
    Ok(ExtAuthzConfig {
        service,
        timeout: crate::values::positive(
            raw.timeout.unwrap_or(DEFAULT_AUTHZ_TIMEOUT),
            &format!("{path}.timeout"),
        )?,
        failure_mode_allow: raw.failure_mode_allow.unwrap_or(false),
        status_on_error,
        with_request_body,
        route_metadata_context_namespaces: raw.route_metadata_context_namespaces,
        clear_route_cache: raw.clear_route_cache.unwrap_or(false),
    })
}

/// One of `headers_to_add`: a header the check request may carry, with a literal value.
fn check_header_to_add(
    name: String,
    value: String,
    path: &str,
) -> Result<(HeaderName, http::HeaderValue), ConfigError> {
    let at = format!("{path}.http.headers_to_add.{name}");
    let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
        return Err(ConfigError::invalid(
            at,
            format!("expected a header name, found `{name}`"),
        ));
    };
    if crate::values::framing_or_host(&header) {
        return Err(ConfigError::invalid(
            at,
            "the check request's own header (framing, connection, host)",
        ));
    }
    if value.contains('%') {
        return Err(ConfigError::invalid(
            at,
            "a value with command operators (%...%) is not supported: literal values only",
        ));
    }
    let value = http::HeaderValue::from_str(&value)
        .map_err(|_| ConfigError::invalid(at, "expected a header value (visible ASCII)"))?;
    Ok((header, value))
}

/// A check path for every request: a path (and query), not with a prefix.
fn check_path_override(value: String, with_prefix: bool, path: &str) -> Result<String, ConfigError> {
    let at = format!("{path}.http.path_override");
    if with_prefix {
        return Err(ConfigError::invalid(
            at,
            "`path_prefix` and `path_override` do not go together",
        ));
    }
    if !value.starts_with('/') || value.parse::<http::uri::PathAndQuery>().is_err() {
        return Err(ConfigError::invalid(
            at,
            format!("expected a path such as `/auth/check`, found `{value}`"),
        ));
    }
    Ok(value)
}

fn authz_retry(raw: RawAuthzRetry, path: &str) -> Result<AuthzRetry, ConfigError> {
    let retry_on = crate::values::retry_conditions(&raw.retry_on, path)?;
    // A core retry policy has no lists of codes or headers for these to name.
    if retry_on.retriable_status_codes || retry_on.retriable_headers {
        return Err(ConfigError::invalid(
            format!("{path}.retry_on"),
            "`retriable-status-codes` and `retriable-headers` need lists a check's retry policy does not have",
        ));
    }
    Ok(AuthzRetry {
        retry_on,
        num_retries: raw.num_retries.unwrap_or(1),
        back_off: crate::values::retry_back_off(
            raw.retry_back_off,
            DEFAULT_AUTHZ_RETRY_BASE_INTERVAL,
            path,
        )?,
    })
}

pub(super) fn route_authz(
    raw: Option<RawRouteAuthz>,
    path: &str,
) -> Result<RouteAuthz, ConfigError> {
    match raw {
        None => Ok(RouteAuthz::default()),
        Some(RawRouteAuthz::Word(word)) if word == "disabled" => Ok(RouteAuthz {
            disabled: true,
            context_extensions: Vec::new(),
        }),
        // Checked here even where its virtual host turns the check off.
        Some(RawRouteAuthz::Word(word)) if word == "enabled" => Ok(RouteAuthz::default()),
        Some(RawRouteAuthz::Word(other)) => Err(ConfigError::invalid(
            path,
            format!(
                "expected `disabled`, `enabled` or `{{ context_extensions: {{...}} }}`, found `{other}`"
            ),
        )),
        Some(RawRouteAuthz::Settings(settings)) => Ok(RouteAuthz {
            disabled: settings.disabled.unwrap_or(false),
            context_extensions: settings.context_extensions.into_iter().collect(),
        }),
    }
}

pub(super) fn header_names(values: &[String], path: &str) -> Result<Vec<HeaderName>, ConfigError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            HeaderName::from_bytes(v.as_bytes()).map_err(|_| {
                ConfigError::invalid(
                    format!("{path}[{i}]"),
                    format!("expected a header name, found `{v}`"),
                )
            })
        })
        .collect()
}

impl FilterSettings for ExtAuthzConfig {
    type Raw = RawExtAuthz;
    type RawRoute = RawRouteAuthz;
    type Route = RouteAuthz;

    fn check(raw: RawExtAuthz, path: &str, chain: &ChainCtx) -> Result<Self, ConfigError> {
        listener_authz(raw, path, chain.buffer_limit)
    }

    fn check_route(raw: RawRouteAuthz, path: &str) -> Result<RouteAuthz, ConfigError> {
        route_authz(Some(raw), path)
    }

    fn route_switch(on: bool) -> RawRouteAuthz {
        RawRouteAuthz::Word(if on { "enabled" } else { "disabled" }.into())
    }
}
