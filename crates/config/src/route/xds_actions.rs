//! The parts of Envoy's routes beyond one cluster by name: weighted clusters, mirror policies,
//! redirects, path rewrites and query matchers, as the config file writes them (Envoy's
//! string, regex and header matchers are in envoy/matchers.rs).

// Control planes still send deprecated fields (`total_weight`); they are read, not ignored.
#![allow(deprecated)]

use envoy_types::pb::envoy::config::route::v3::route_action::RequestMirrorPolicy;
use envoy_types::pb::envoy::config::route::v3::weighted_cluster::cluster_weight;
use envoy_types::pb::envoy::config::route::v3::{
    RedirectAction, RouteAction, WeightedCluster, redirect_action, weighted_cluster,
};
use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute;

use crate::envoy::matchers::regex;
use crate::envoy::unsupported;
use crate::envoy::{ResourceError, fields, nothing_else};
use crate::{
    RawInternalRedirect, RawMirrorPolicy, RawRedirect, RawRegexRewrite, RawWeightedCluster,
};

/// `weighted_clusters`: clusters of weight 0 are left out (they are never drawn).
/// And what draws one: the header whose number picks it (`random_value_specifier`), or
/// (`true`) the route's hash policy.
pub(crate) fn weighted_clusters(
    mut w: WeightedCluster,
    at: &str,
) -> Result<(Vec<RawWeightedCluster>, Option<String>, bool), ResourceError> {
    let mut clusters = Vec::new();
    let mut sum = 0u64;
    for (i, mut c) in std::mem::take(&mut w.clusters).into_iter().enumerate() {
        let at = format!("{at}.clusters[{i}]");
        let weight = c.weight.take().map_or(0, |w| w.value);
        sum += u64::from(weight);
        let name = std::mem::take(&mut c.name);
        let headers = crate::envoy::headers::rules(
            crate::envoy::headers::Lists {
                request_add: std::mem::take(&mut c.request_headers_to_add),
                request_remove: std::mem::take(&mut c.request_headers_to_remove),
                response_add: std::mem::take(&mut c.response_headers_to_add),
                response_remove: std::mem::take(&mut c.response_headers_to_remove),
            },
            &at,
        )?;
        // The literal is the oneof's only member.
        let host_rewrite = c
            .host_rewrite_specifier
            .take()
            .map(|cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(host)| host);
        let cluster_header = Some(std::mem::take(&mut c.cluster_header)).filter(|h| !h.is_empty());
        nothing_else(&c, fields::CLUSTER_WEIGHT, &at)?;
        if weight > 0 {
            clusters.push(RawWeightedCluster {
                cluster: name,
                cluster_header,
                weight,
                headers,
                host_rewrite,
            });
        }
    }
    // Deprecated, but when given it must be the sum, as Envoy checks.
    if let Some(total) = w.total_weight.take()
        && u64::from(total.value) != sum
    {
        return Err(ResourceError::invalid(
            format!("{at}.total_weight"),
            format!("{} is not the sum of the weights ({sum})", total.value),
        ));
    }
    // Runtime overrides of the weights: there is no runtime here, so the weights stand.
    w.runtime_key_prefix.clear();
    let (random_value_header, use_hash_policy) = match w.random_value_specifier.take() {
        Some(weighted_cluster::RandomValueSpecifier::HeaderName(name)) => (Some(name), false),
        Some(weighted_cluster::RandomValueSpecifier::UseHashPolicy(on)) => (None, on.value),
        None => (None, false),
    };
    nothing_else(&w, fields::WEIGHTED_CLUSTER, at)?;
    if clusters.is_empty() {
        return Err(ResourceError::invalid(
            at.to_owned(),
            "expected a cluster with a weight above 0",
        ));
    }
    Ok((clusters, random_value_header, use_hash_policy))
}

/// `request_mirror_policies`, each with its `runtime_fraction`'s default share.
pub(crate) fn mirrors(
    policies: Vec<RequestMirrorPolicy>,
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<RawMirrorPolicy>, ResourceError> {
    policies
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            let at = format!("{at}.request_mirror_policies[{i}]");
            let percent = match m.runtime_fraction.take().and_then(|f| f.default_value) {
                None => 100.0,
                Some(share) => {
                    crate::envoy::fractional_percent(
                        &share,
                        &format!("{at}.runtime_fraction.default_value"),
                    )?
                    .0
                }
            };
            let cluster = std::mem::take(&mut m.cluster);
            let cluster_header =
                Some(std::mem::take(&mut m.cluster_header)).filter(|h| !h.is_empty());
            let disable_suffix = std::mem::take(&mut m.disable_shadow_host_suffix_append);
            // Tracing is not done here: nothing to sample.
            m.trace_sampled = None;
            nothing_else(&m, fields::REQUEST_MIRROR_POLICY, &at)?;
            Ok(RawMirrorPolicy {
                cluster,
                cluster_header,
                fraction: Some(serde_yaml::Value::Number(percent.into())),
                disable_shadow_host_suffix_append: Some(disable_suffix),
            })
        })
        .collect()
}

/// A route's `redirect` action.
pub(crate) fn redirect(mut r: RedirectAction, at: &str) -> Result<RawRedirect, ResourceError> {
    use redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier};
    let scheme = match r.scheme_rewrite_specifier.take() {
        None | Some(SchemeRewriteSpecifier::HttpsRedirect(false)) => None,
        Some(SchemeRewriteSpecifier::HttpsRedirect(true)) => Some("https".to_owned()),
        Some(SchemeRewriteSpecifier::SchemeRedirect(scheme)) => Some(scheme),
    };
    let (mut path, mut prefix_rewrite, mut regex_rewrite) = (None, None, None);
    match r.path_rewrite_specifier.take() {
        None => {}
        Some(PathRewriteSpecifier::PathRedirect(p)) => path = Some(p),
        Some(PathRewriteSpecifier::PrefixRewrite(prefix)) => prefix_rewrite = Some(prefix),
        Some(PathRewriteSpecifier::RegexRewrite(rewrite)) => {
            regex_rewrite = Some(self::regex_rewrite(
                rewrite,
                &format!("{at}.regex_rewrite"),
            )?)
        }
        Some(PathRewriteSpecifier::PathRewrite(_)) => {
            return Err(unsupported(
                at,
                "path_rewrite (URI templates; path_redirect, prefix_rewrite and regex_rewrite only)",
            ));
        }
    }
    let status = match RedirectResponseCode::try_from(r.response_code) {
        Ok(RedirectResponseCode::MovedPermanently) => 301,
        Ok(RedirectResponseCode::Found) => 302,
        Ok(RedirectResponseCode::SeeOther) => 303,
        Ok(RedirectResponseCode::TemporaryRedirect) => 307,
        Ok(RedirectResponseCode::PermanentRedirect) => 308,
        Err(_) => {
            return Err(ResourceError::invalid(
                format!("{at}.response_code"),
                format!("unknown response code {}", r.response_code),
            ));
        }
    };
    let mut port = match std::mem::take(&mut r.port_redirect) {
        0 => None,
        port => Some(u16::try_from(port).map_err(|_| {
            ResourceError::invalid(format!("{at}.port_redirect"), format!("{port} is no port"))
        })?),
    };
    let mut host = Some(std::mem::take(&mut r.host_redirect)).filter(|h| !h.is_empty());
    // `host_redirect` may carry a port (`example.com:8443`); `port_redirect` wins over it.
    if let Some(name) = &host
        && let Some((bare, given)) = name.rsplit_once(':')
        && !bare.is_empty()
        && (!bare.contains(':') || bare.ends_with(']'))
        && let Ok(given) = given.parse::<u16>()
    {
        port = port.or(Some(given));
        host = Some(bare.to_owned());
    }
    let strip_query = std::mem::take(&mut r.strip_query);
    r.response_code = 0;
    nothing_else(&r, fields::REDIRECT_ACTION, at)?;
    Ok(RawRedirect {
        scheme,
        host,
        port,
        path,
        prefix_rewrite,
        regex_rewrite,
        status: Some(status),
        strip_query,
    })
}

/// A route's `regex_rewrite`.
pub(crate) fn regex_rewrite(
    r: RegexMatchAndSubstitute,
    at: &str,
) -> Result<RawRegexRewrite, ResourceError> {
    let pattern = r
        .pattern
        .ok_or_else(|| ResourceError::invalid(format!("{at}.pattern"), "expected a pattern"))?;
    Ok(RawRegexRewrite {
        pattern: regex(pattern),
        substitution: r.substitution,
    })
}

const PREVIOUS_ROUTES: &str = "type.googleapis.com/envoy.extensions.internal_redirect.previous_routes.v3.PreviousRoutesConfig";
const SAFE_CROSS_SCHEME: &str = "type.googleapis.com/envoy.extensions.internal_redirect.safe_cross_scheme.v3.SafeCrossSchemeConfig";

/// A route's `internal_redirect_policy`, or the deprecated `internal_redirect_action:
/// HANDLE_INTERNAL_REDIRECT` with `max_internal_redirects` (the policy wins, as in Envoy).
pub(crate) fn internal_redirect(
    a: &mut RouteAction,
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<RawInternalRedirect>, ResourceError> {
    #[allow(deprecated)]
    let (action, legacy_max) = (
        std::mem::take(&mut a.internal_redirect_action),
        a.max_internal_redirects.take(),
    );
    let Some(mut policy) = a.internal_redirect_policy.take() else {
        // 0: PASS_THROUGH_INTERNAL_REDIRECT, the default.
        return Ok((action == 1).then(|| RawInternalRedirect {
            max_internal_redirects: Some(legacy_max.map_or(1, |m| m.value)),
            ..Default::default()
        }));
    };
    let at = format!("{at}.internal_redirect_policy");
    let mut raw = RawInternalRedirect {
        max_internal_redirects: Some(policy.max_internal_redirects.take().map_or(1, |m| m.value)),
        allow_cross_scheme_redirect: Some(std::mem::take(&mut policy.allow_cross_scheme_redirect)),
        response_headers_to_copy: std::mem::take(&mut policy.response_headers_to_copy),
        ..Default::default()
    };
    // Envoy takes the 3xx codes it can follow and leaves the others out: 302 when none are
    // listed, nothing followed when none listed is one.
    let listed = std::mem::take(&mut policy.redirect_response_codes);
    let followed: Vec<u16> = (listed.iter())
        .filter_map(|c| u16::try_from(*c).ok())
        .filter(|c| [301, 302, 303, 307, 308].contains(c))
        .collect();
    if !listed.is_empty() && followed.is_empty() {
        return Ok(None);
    }
    raw.redirect_response_codes = followed;
    for (i, predicate) in std::mem::take(&mut policy.predicates)
        .into_iter()
        .enumerate()
    {
        let type_url = predicate.typed_config.as_ref().map(|c| c.type_url.as_str());
        match type_url {
            Some(PREVIOUS_ROUTES) => raw.previous_routes = Some(true),
            Some(SAFE_CROSS_SCHEME) => raw.safe_cross_scheme = Some(true),
            _ => {
                return Err(unsupported(
                    &format!("{at}.predicates[{i}]"),
                    format!(
                        "predicate `{}` (previous_routes and safe_cross_scheme only)",
                        predicate.name
                    ),
                ));
            }
        }
    }
    nothing_else(&policy, fields::INTERNAL_REDIRECT_POLICY, &at)?;
    Ok(Some(raw))
}
