//! The `ext_authz` sections of listeners and routes.

use http::{HeaderName, StatusCode};

use crate::config::raw::{RawExtAuthz, RawRouteAuthz};
use crate::config::*;

pub(super) fn listener_authz(
    raw: RawExtAuthz,
    path: &str,
    buffer_limit: u32,
) -> Result<ExtAuthzConfig, ConfigError> {
    let service = match (raw.grpc, raw.http) {
        (Some(grpc), None) => AuthzService::Grpc {
            endpoint: super::service_endpoint(&grpc.address, &format!("{path}.grpc.address"))?,
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
            AuthzService::Http {
                endpoint: super::service_endpoint(&http.address, &format!("{path}.http.address"))?,
                path_prefix: prefix,
                allowed_headers: header_names(
                    &http.allowed_headers,
                    &format!("{path}.http.allowed_headers"),
                )?,
                allowed_upstream_headers: header_names(
                    &http.allowed_upstream_headers,
                    &format!("{path}.http.allowed_upstream_headers"),
                )?,
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
    Ok(ExtAuthzConfig {
        service,
        timeout: super::positive(
            raw.timeout.unwrap_or(DEFAULT_AUTHZ_TIMEOUT),
            &format!("{path}.timeout"),
        )?,
        failure_mode_allow: raw.failure_mode_allow.unwrap_or(false),
        status_on_error,
        with_request_body,
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
        Some(RawRouteAuthz::Word(other)) => Err(ConfigError::invalid(
            path,
            format!("expected `disabled` or `{{ context_extensions: {{...}} }}`, found `{other}`"),
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
