//! A listener's `http_filters` and a route's `filters`.

use crate::config::raw::{RawHttpFilter, RawPerRoute, RawRouteFilters};
use crate::config::*;

pub(super) fn http_filters(
    raw: Vec<RawHttpFilter>,
    path: &str,
    buffer_limit: u32,
) -> Result<Vec<HttpFilterConfig>, ConfigError> {
    let mut chain: Vec<HttpFilterConfig> = Vec::with_capacity(raw.len());
    for (i, filter) in raw.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        let name = filter.name();
        // Routes name filters by type, so a type appears once.
        if chain.iter().any(|f| f.name() == name) {
            return Err(ConfigError::invalid(
                format!("{at}.{name}"),
                format!("`{name}` is already in the chain; a filter may appear once"),
            ));
        }
        let at = format!("{at}.{name}");
        chain.push(match filter {
            RawHttpFilter::ExtAuthz(raw) => HttpFilterConfig::ExtAuthz(
                super::ext_authz::listener_authz(raw, &at, buffer_limit)?,
            ),
            RawHttpFilter::LocalRateLimit(raw) => HttpFilterConfig::LocalRateLimit(
                super::local_rate_limit::local_rate_limit(raw.unwrap_or_default(), &at, false)?,
            ),
            RawHttpFilter::Headers(raw) => HttpFilterConfig::Headers(
                super::header_rules::header_rules(raw.unwrap_or_default(), &at)?,
            ),
            RawHttpFilter::Compression(raw) => HttpFilterConfig::Compression(
                super::compression::compression(raw.unwrap_or_default(), &at)?,
            ),
            RawHttpFilter::Cors(raw) => {
                HttpFilterConfig::Cors(super::cors::cors(raw.unwrap_or_default(), &at)?)
            }
        });
    }
    Ok(chain)
}

pub(super) fn route_filters(
    raw: Option<RawRouteFilters>,
    path: &str,
    chain: &[HttpFilterConfig],
) -> Result<RouteFilters, ConfigError> {
    let Some(raw) = raw else {
        return Ok(RouteFilters::default());
    };
    let in_chain = |name: &str, given: bool| {
        if given && !chain.iter().any(|f| f.name() == name) {
            return Err(ConfigError::invalid(
                format!("{path}.{name}"),
                format!("the listener has no `{name}` filter in its http_filters"),
            ));
        }
        Ok(())
    };
    in_chain("ext_authz", raw.ext_authz.is_some())?;
    in_chain("local_rate_limit", raw.local_rate_limit.is_some())?;
    in_chain("headers", raw.headers.is_some())?;
    in_chain("compression", raw.compression.is_some())?;
    in_chain("cors", raw.cors.is_some())?;
    Ok(RouteFilters {
        ext_authz: super::ext_authz::route_authz(raw.ext_authz, &format!("{path}.ext_authz"))?,
        local_rate_limit: per_route(
            raw.local_rate_limit,
            &format!("{path}.local_rate_limit"),
            |raw, at| super::local_rate_limit::local_rate_limit(raw, at, true),
        )?,
        headers: per_route(
            raw.headers,
            &format!("{path}.headers"),
            super::header_rules::header_rules,
        )?,
        compression: per_route(
            raw.compression,
            &format!("{path}.compression"),
            super::compression::compression,
        )?,
        cors: per_route(raw.cors, &format!("{path}.cors"), super::cors::cors)?,
    })
}

fn per_route<R, T>(
    raw: Option<RawPerRoute<R>>,
    path: &str,
    settings: impl FnOnce(R, &str) -> Result<T, ConfigError>,
) -> Result<PerRoute<T>, ConfigError> {
    match raw {
        None => Ok(PerRoute::Inherit),
        Some(RawPerRoute::Word(word)) if word == "disabled" => Ok(PerRoute::Disabled),
        Some(RawPerRoute::Word(other)) => Err(ConfigError::invalid(
            path,
            format!("expected `disabled` or the route's settings, found `{other}`"),
        )),
        Some(RawPerRoute::Settings(raw)) => {
            settings(raw, path).map(|s| PerRoute::Override(Box::new(s)))
        }
    }
}
