//! Envoy's `HealthCheck` filter (`envoy.filters.http.health_check`) as the `health_check`
//! filter: without pass-through, the probes it matches are answered by the proxy.

use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
use envoy_types::pb::google::protobuf::Any;

use super::RawProbe;
use crate::envoy::{ResourceError, decode};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck";

pub(crate) fn settings(any: &Any, at: &str) -> Result<RawProbe, ResourceError> {
    let HealthCheck {
        pass_through_mode,
        cache_time,
        cluster_min_healthy_percentages,
        headers,
    } = decode(any, TYPE_URL, "a HealthCheck filter")?;
    let unsupported = |field: &str| ResourceError::Unsupported {
        at: at.to_owned(),
        fields: vec![field.to_owned()],
    };
    match pass_through_mode {
        None => {
            return Err(ResourceError::invalid(
                format!("{at}.pass_through_mode"),
                "required",
            ));
        }
        Some(v) if v.value => return Err(unsupported("pass_through_mode: true")),
        Some(_) => {}
    }
    if cache_time.is_some() {
        return Err(unsupported("cache_time"));
    }
    if !cluster_min_healthy_percentages.is_empty() {
        return Err(unsupported("cluster_min_healthy_percentages"));
    }
    let mut raw = RawProbe::default();
    for (i, h) in headers.into_iter().enumerate() {
        let at = format!("{at}.headers[{i}]");
        let name = h.name.clone();
        let matcher = crate::envoy::matchers::header(h, &at)?;
        match name.as_str() {
            // Envoy's `:path` is the request target, query included.
            ":path" => match matcher.exact {
                Some(target) if matcher.prefix.is_none() && matcher.regex.is_none() => {
                    raw.path = Some(target);
                }
                _ => return Err(unsupported("`:path` matched other than exactly")),
            },
            pseudo if pseudo.starts_with(':') => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!("a match on `{pseudo}`")],
                });
            }
            _ => raw.headers.push(matcher),
        }
    }
    Ok(raw)
}
