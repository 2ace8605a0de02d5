//! A route's or virtual host's `typed_per_filter_config`: each entry given to its filter's
//! mapping by the type of its settings (`FilterConfig` wrappers unwrapped), so a filter's
//! per-route form lives in its own module. Settings for a filter Legate does not have are
//! refused, unless marked optional.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::route::v3::FilterConfig;
use envoy_types::pb::google::protobuf::Any;

use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;

use super::{
    RawPerRoute, RawRouteFilters, api_key_auth, basic_auth, buffer, compression, cors, csrf,
    custom_response, ext_authz, ext_proc, fault, global_rate_limit, jwt_authn, local_rate_limit,
    rbac,
};
use crate::envoy::{ResourceError, decode};

const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

/// The filters Envoy names in a chain, and the name each has in `filters:` here.
const NAMES: [(&str, &str); 15] = [
    ("envoy.filters.http.api_key_auth", "api_key_auth"),
    ("envoy.filters.http.buffer", "buffer"),
    ("envoy.filters.http.cors", "cors"),
    ("envoy.filters.http.csrf", "csrf"),
    ("envoy.filters.http.custom_response", "custom_response"),
    ("envoy.filters.http.ext_authz", "ext_authz"),
    ("envoy.filters.http.ext_proc", "ext_proc"),
    ("envoy.filters.http.fault", "fault"),
    ("envoy.filters.http.grpc_web", "grpc_web"),
    ("envoy.filters.http.header_mutation", "header_mutation"),
    ("envoy.filters.http.jwt_authn", "jwt_authn"),
    ("envoy.filters.http.basic_auth", "basic_auth"),
    ("envoy.filters.http.local_ratelimit", "local_rate_limit"),
    ("envoy.filters.http.rbac", "rbac"),
    ("envoy.filters.http.ratelimit", "global_rate_limit"),
];

/// Envoy Gateway names a second RBAC filter `envoy.filters.http.rbac.SUFFIX`: the filter
/// `rbac/SUFFIX` here.
const RBAC_DOTTED: &str = "envoy.filters.http.rbac.";

/// The name here of the filter Envoy's chain calls `name` (`NAME/suffix` and the compressors'
/// `envoy.filters.http.compressor.LIBRARY` included).
fn legate_name(name: &str) -> Option<&'static str> {
    let base = name.split('/').next().unwrap_or_default();
    if base == "envoy.filters.http.compressor" || base.starts_with("envoy.filters.http.compressor.")
    {
        return Some("compression");
    }
    if base
        .strip_prefix(RBAC_DOTTED)
        .is_some_and(|s| !s.is_empty())
    {
        return Some("rbac");
    }
    NAMES
        .iter()
        .find(|(envoy, _)| *envoy == base)
        .map(|(_, here)| *here)
}

/// The name here of a chain's filter of type `kind` that Envoy calls `envoy_name`: the type,
/// with Envoy's `/INSTANCE` suffix where the name has one (Envoy Gateway's one filter per
/// policy, `envoy.filters.http.ext_authz/securitypolicy/NS/NAME`). The compressors are one
/// filter here, never named apart.
pub(crate) fn chain_name(envoy_name: &str, kind: &'static str) -> String {
    if kind == "rbac"
        && let Some(suffix) = envoy_name.strip_prefix(RBAC_DOTTED)
        && !suffix.is_empty()
    {
        return format!("rbac/{suffix}");
    }
    match envoy_name.split_once('/') {
        Some((base, instance))
            if kind != "compression" && !instance.is_empty() && legate_name(base) == Some(kind) =>
        {
            format!("{kind}/{instance}")
        }
        _ => kind.to_owned(),
    }
}

/// The name here of the chain's filter a `typed_per_filter_config` key names.
fn filter_name(key: &str) -> Option<String> {
    legate_name(key).map(|kind| chain_name(key, kind))
}

/// The entries of `config`, as a route's or host's `filters:`; `None` when there are none.
/// Also the level's CORS policy as Envoy sent it: a route's takes what it leaves empty from
/// its virtual host's (`cors_parent`).
pub(crate) fn route_filters(
    config: HashMap<String, Any>,
    at: &(impl std::fmt::Display + ?Sized),
    cors_parent: Option<&CorsPolicy>,
) -> Result<(Option<RawRouteFilters>, Option<CorsPolicy>), ResourceError> {
    let mut filters = RawRouteFilters::default();
    let mut cors_policy = None;
    let mut entries: Vec<(String, Any)> = config.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, mut value) in entries {
        let at = format!("{at}.typed_per_filter_config.{name}");
        let mut optional = false;
        if value.type_url == FILTER_CONFIG {
            let wrapper: FilterConfig = decode(&value, FILTER_CONFIG, "a FilterConfig")?;
            optional = wrapper.is_optional;
            let here = filter_name(&name);
            // An empty `config` (Envoy Gateway's and kgateway's way of turning a filter on)
            // is none, as Envoy reads it.
            let config =
                (wrapper.config).filter(|c| !(c.type_url.is_empty() && c.value.is_empty()));
            match (here, wrapper.disabled, config) {
                // Off, or on with the listener's settings (where its chain has it off).
                (Some(here), disabled, None) => {
                    set_once(&mut filters, &here, !disabled, &at)?;
                    continue;
                }
                (Some(here), true, Some(_)) => {
                    set_once(&mut filters, &here, false, &at)?;
                    continue;
                }
                (None, _, _) if optional => continue,
                (None, true, _) => {
                    return Err(ResourceError::Unsupported {
                        at,
                        fields: vec![format!("settings for `{name}`")],
                    });
                }
                (None, false, None) => {
                    return Err(ResourceError::Unsupported {
                        at,
                        fields: vec![format!("settings for `{name}` (a filter not known here)")],
                    });
                }
                (_, false, Some(inner)) => value = inner,
            }
        }
        // Settings of the filter the key names (one of several of its type), else of the
        // chain's one filter of the settings' type.
        let here = filter_name(&name);
        if let (Some(here), Some(kind)) = (&here, settings_kind(&value.type_url))
            && here.split('/').next() != Some(kind)
        {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![format!(
                    "`{kind}` settings under the name of a `{here}` filter"
                )],
            });
        }
        let level = match &here {
            Some(here) => filters.for_filter(here),
            None => &mut filters,
        };
        match value.type_url.as_str() {
            ext_authz::xds::PER_ROUTE => {
                if let Some(entry) = ext_authz::xds::per_route(&value, &at)? {
                    level.ext_authz = Some(entry);
                }
            }
            cors::xds::TYPE_URL => {
                let policy = cors::xds::decode_policy(&value)?;
                level.cors = Some(cors::xds::settings(policy.clone(), cors_parent, &at)?);
                cors_policy = Some(policy);
            }
            csrf::xds::TYPE_URL => {
                level.csrf = Some(RawPerRoute::Settings(csrf::xds::settings(&value, &at)?));
            }
            fault::xds::TYPE_URL => {
                level.fault = Some(RawPerRoute::Settings(fault::xds::settings(&value, &at)?));
            }
            custom_response::xds::TYPE_URL => {
                level.custom_response = Some(RawPerRoute::Settings(
                    custom_response::xds::settings(&value, &at)?,
                ));
            }
            buffer::xds::PER_ROUTE => {
                if let Some(entry) = buffer::xds::per_route(&value)? {
                    level.buffer = Some(entry);
                }
            }
            compression::xds::PER_ROUTE => {
                if let Some(on) = compression::xds::per_route(&value, &at)? {
                    set_once(level, "compression", on, &at)?;
                }
            }
            local_rate_limit::xds::TYPE_URL => {
                level.local_rate_limit = Some(RawPerRoute::Settings(
                    local_rate_limit::xds::settings(&value, &at)?,
                ));
            }
            rbac::xds::PER_ROUTE => {
                level.rbac = Some(rbac::xds::per_route(&value, &at)?);
            }
            jwt_authn::xds::PER_ROUTE => {
                level.jwt_authn = Some(jwt_authn::xds::per_route(&value, &at)?);
            }
            basic_auth::xds::PER_ROUTE => {
                level.basic_auth = Some(basic_auth::xds::per_route(&value, &at)?);
            }
            api_key_auth::xds::PER_ROUTE => {
                level.api_key_auth = Some(api_key_auth::xds::per_route(&value, &at)?);
            }
            global_rate_limit::xds::PER_ROUTE => {
                level.global_rate_limit = Some(global_rate_limit::xds::per_route(&value, &at)?);
            }
            ext_proc::xds::PER_ROUTE => {
                level.ext_proc = Some(ext_proc::xds::per_route(&value, &at)?);
            }
            _ if optional => {}
            other => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!(
                        "settings for `{name}` ({})",
                        other.rsplit('/').next().unwrap_or(other)
                    )],
                });
            }
        }
    }
    // Named filters whose entries said nothing.
    filters.instances.retain(|_, f| !f.is_empty());
    Ok(((!filters.is_empty()).then_some(filters), cors_policy))
}

/// The filter (its name here) whose per-route settings have the type `type_url`.
fn settings_kind(type_url: &str) -> Option<&'static str> {
    Some(match type_url {
        ext_authz::xds::PER_ROUTE => "ext_authz",
        cors::xds::TYPE_URL => "cors",
        csrf::xds::TYPE_URL => "csrf",
        fault::xds::TYPE_URL => "fault",
        custom_response::xds::TYPE_URL => "custom_response",
        buffer::xds::PER_ROUTE => "buffer",
        compression::xds::PER_ROUTE => "compression",
        local_rate_limit::xds::TYPE_URL => "local_rate_limit",
        rbac::xds::PER_ROUTE => "rbac",
        jwt_authn::xds::PER_ROUTE => "jwt_authn",
        basic_auth::xds::PER_ROUTE => "basic_auth",
        api_key_auth::xds::PER_ROUTE => "api_key_auth",
        global_rate_limit::xds::PER_ROUTE => "global_rate_limit",
        ext_proc::xds::PER_ROUTE => "ext_proc",
        _ => return None,
    })
}

/// Turns the filter `here` on (with its listener's settings) or off at this level; the
/// compressors, one filter here, must agree.
fn set_once(
    filters: &mut RawRouteFilters,
    here: &str,
    on: bool,
    at: &str,
) -> Result<(), ResourceError> {
    if here == "compression"
        && let Some(RawPerRoute::Word(before)) = &filters.compression
        && (before == "enabled") != on
    {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec![
                "compressors turned on and off on one route (one compression filter here)".into(),
            ],
        });
    }
    filters.switch(here, on);
    Ok(())
}
