//! A route's or virtual host's `typed_per_filter_config`: each entry given to its filter's
//! mapping by the type of its settings (`FilterConfig` wrappers unwrapped), so a filter's
//! per-route form lives in its own module. Settings for a filter Legate does not have are
//! refused, unless marked optional.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::route::v3::FilterConfig;
use envoy_types::pb::google::protobuf::Any;

use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;

use super::{
    RawPerRoute, RawRouteAuthz, RawRouteFilters, cors, ext_authz, fault, local_rate_limit,
};
use crate::envoy::{ResourceError, decode};

const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

/// The filters Envoy names in a chain, and the name each has in `filters:` here.
const NAMES: [(&str, &str); 4] = [
    ("envoy.filters.http.cors", "cors"),
    ("envoy.filters.http.ext_authz", "ext_authz"),
    ("envoy.filters.http.fault", "fault"),
    ("envoy.filters.http.local_ratelimit", "local_rate_limit"),
];

/// The entries of `config`, as a route's or host's `filters:`; `None` when there are none.
/// Also the level's CORS policy as Envoy sent it: a route's takes what it leaves empty from
/// its virtual host's (`cors_parent`).
pub(crate) fn route_filters(
    config: HashMap<String, Any>,
    at: &str,
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
            if wrapper.disabled {
                // Off for this route: the filter is known by its name in the chain.
                let base = name.split('/').next().unwrap_or_default();
                match NAMES.iter().find(|(envoy, _)| *envoy == base) {
                    Some((_, "ext_authz")) => {
                        filters.ext_authz = Some(RawRouteAuthz::Word("disabled".into()));
                    }
                    Some((_, "fault")) => {
                        filters.fault = Some(RawPerRoute::Word("disabled".into()))
                    }
                    Some((_, "cors")) => filters.cors = Some(RawPerRoute::Word("disabled".into())),
                    Some((_, "local_rate_limit")) => {
                        filters.local_rate_limit = Some(RawPerRoute::Word("disabled".into()))
                    }
                    _ if optional => {}
                    _ => {
                        return Err(ResourceError::Unsupported {
                            at,
                            fields: vec![format!("settings for `{name}`")],
                        });
                    }
                }
                continue;
            }
            match wrapper.config {
                Some(inner) => value = inner,
                None => continue,
            }
        }
        match value.type_url.as_str() {
            ext_authz::xds::PER_ROUTE => {
                if let Some(entry) = ext_authz::xds::per_route(&value, &at)? {
                    filters.ext_authz = Some(entry);
                }
            }
            cors::xds::TYPE_URL => {
                let policy = cors::xds::decode_policy(&value)?;
                filters.cors = Some(cors::xds::settings(policy.clone(), cors_parent, &at)?);
                cors_policy = Some(policy);
            }
            fault::xds::TYPE_URL => {
                filters.fault = Some(RawPerRoute::Settings(fault::xds::settings(&value, &at)?));
            }
            local_rate_limit::xds::TYPE_URL => {
                filters.local_rate_limit = Some(RawPerRoute::Settings(
                    local_rate_limit::xds::settings(&value, &at)?,
                ));
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
    Ok(((!filters.is_empty()).then_some(filters), cors_policy))
}
