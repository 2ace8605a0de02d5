//! The `cors` filter's settings.

use http::Method;

use crate::config::raw::RawCors;
use crate::config::*;

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
