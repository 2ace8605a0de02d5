//! Envoy's `envoy.filters.http.jwt_authn` read into the filter's settings: its
//! `JwtAuthentication` (Envoy Gateway's providers with remote key sets and a requirement per
//! route; Istio's providers with inline key sets and one rule for `/`) and its
//! `PerRouteConfig`. What would change a decision and is not here is refused by name: filter
//! state rules, tokens only extracted, metadata other than the payload's, rules on headers
//! or query parameters.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    HttpUri, RetryPolicy, http_uri,
};
use envoy_types::pb::envoy::config::route::v3::{RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwksAsyncFetch, JwtAuthentication, JwtClaimToHeader, JwtProvider, JwtRequirement,
    PerRouteConfig, RemoteJwks, RequirementRule, jwt_provider, jwt_requirement, per_route_config,
    requirement_rule,
};
use envoy_types::pb::google::protobuf::Any;

use super::{
    RawClaimToHeader, RawJwtAuthn, RawJwtHeader, RawJwtProvider, RawJwtRoute, RawJwtRule,
    RawPathMatch, RawRemoteJwks, RawRequirement,
};
use crate::RawRetryBackOff;
use crate::envoy::{
    NO_TIMEOUT, ResourceError, decode, duration, fields, matchers, nothing_else, retry_back_off,
    unsupported,
};
use crate::filters::RawPerRoute;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.PerRouteConfig";

/// Requirements nested deeper are refused.
const MAX_DEPTH: usize = 32;

const JWT_AUTHENTICATION: &[(u32, &str)] = &[
    (1, "providers"),
    (2, "rules"),
    (3, "filter_state_rules"),
    (4, "bypass_cors_preflight"),
    (5, "requirement_map"),
    (6, "strip_failure_response"),
    (7, "stat_prefix"),
];

const JWT_PROVIDER: &[(u32, &str)] = &[
    (1, "issuer"),
    (2, "audiences"),
    (3, "remote_jwks"),
    (4, "local_jwks"),
    (5, "forward"),
    (6, "from_headers"),
    (7, "from_params"),
    (8, "forward_payload_header"),
    (9, "payload_in_metadata"),
    (10, "clock_skew_seconds"),
    (11, "pad_forward_payload_header"),
    (12, "jwt_cache_config"),
    (13, "from_cookies"),
    (14, "header_in_metadata"),
    (15, "claim_to_headers"),
    (16, "failed_status_in_metadata"),
    (17, "clear_route_cache"),
    (18, "normalize_payload_in_metadata"),
    (19, "subjects"),
    (20, "require_expiration"),
    (21, "max_lifetime"),
];

/// `envoy.config.core.v3.RetryPolicy` (a route's retry policy is another message).
const CORE_RETRY_POLICY: &[(u32, &str)] = &[
    (1, "retry_back_off"),
    (2, "num_retries"),
    (3, "retry_on"),
    (4, "retry_priority"),
    (5, "retry_host_predicate"),
    (6, "host_selection_retry_max_attempts"),
];

/// The listener's filter.
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawJwtAuthn, ResourceError> {
    let mut filter: JwtAuthentication = decode(any, TYPE_URL, "a JwtAuthentication")?;
    // In name order: the same resource gives the same first error.
    let providers: BTreeMap<String, JwtProvider> =
        std::mem::take(&mut filter.providers).into_iter().collect();
    let requirement_map: BTreeMap<String, JwtRequirement> =
        std::mem::take(&mut filter.requirement_map).into_iter().collect();
    let rules = std::mem::take(&mut filter.rules);
    let bypass_cors_preflight = std::mem::take(&mut filter.bypass_cors_preflight);
    // Left: `filter_state_rules` (requirements chosen by a filter state nothing here sets),
    // `strip_failure_response` and `stat_prefix`.
    nothing_else(&filter, JWT_AUTHENTICATION, at)?;
    let providers = (providers.into_iter())
        .map(|(name, p)| {
            let raw = provider(p, &format!("{at}.providers.{name}"))?;
            Ok((name, raw))
        })
        .collect::<Result<BTreeMap<_, _>, ResourceError>>()?;
    let rules = (rules.into_iter().enumerate())
        .map(|(i, r)| rule(r, &format!("{at}.rules[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let requirement_map = (requirement_map.into_iter())
        .map(|(name, r)| {
            let raw = requirement(r, &format!("{at}.requirement_map.{name}"), 0)?;
            Ok((name, raw))
        })
        .collect::<Result<BTreeMap<_, _>, ResourceError>>()?;
    Ok(RawJwtAuthn {
        providers,
        rules,
        requirement_map,
        bypass_cors_preflight: Some(bypass_cors_preflight),
    })
}

/// A route's or virtual host's entry: the filter off, or the listener's requirement of that
/// name.
pub(crate) fn per_route(any: &Any, at: &str) -> Result<RawPerRoute<RawJwtRoute>, ResourceError> {
    use per_route_config::RequirementSpecifier;
    let config: PerRouteConfig = decode(any, PER_ROUTE, "a jwt_authn PerRouteConfig")?;
    match config.requirement_specifier {
        Some(RequirementSpecifier::Disabled(true)) => Ok(RawPerRoute::Word("disabled".into())),
        Some(RequirementSpecifier::RequirementName(requirement_name))
            if !requirement_name.is_empty() =>
        {
            Ok(RawPerRoute::Settings(RawJwtRoute { requirement_name }))
        }
        _ => Err(ResourceError::invalid(
            at,
            "expected `disabled: true` or a requirement_name",
        )),
    }
}

fn provider(mut p: JwtProvider, at: &str) -> Result<RawJwtProvider, ResourceError> {
    use jwt_provider::JwksSourceSpecifier;
    let (local_jwks, local_jwks_file, remote) = match p.jwks_source_specifier.take() {
        Some(JwksSourceSpecifier::LocalJwks(source)) => {
            let (text, file) = crate::envoy::data_source(source, &format!("{at}.local_jwks"), "a JWKS document")?;
            (text, file, None)
        }
        Some(JwksSourceSpecifier::RemoteJwks(remote)) => (
            None,
            None,
            Some(remote_jwks(remote, &format!("{at}.remote_jwks"))?),
        ),
        None => {
            return Err(ResourceError::invalid(
                at,
                "expected remote_jwks or local_jwks",
            ));
        }
    };
    let subject = (p.subjects.take())
        .map(|s| matchers::pattern_of(s, &format!("{at}.subjects")))
        .transpose()?;
    let from_headers = (std::mem::take(&mut p.from_headers).into_iter())
        .map(|h| RawJwtHeader {
            name: h.name,
            value_prefix: h.value_prefix,
        })
        .collect();
    let claim_to_headers = (std::mem::take(&mut p.claim_to_headers).into_iter().enumerate())
        .map(|(i, c)| claim_to_header(c, &format!("{at}.claim_to_headers[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let normalize = (p.normalize_payload_in_metadata.take()).map(|n| super::RawNormalizePayload {
        space_delimited_claims: n.space_delimited_claims,
    });
    let text = |s: String| Some(s).filter(|s| !s.is_empty());
    let raw = RawJwtProvider {
        issuer: text(std::mem::take(&mut p.issuer)),
        audiences: std::mem::take(&mut p.audiences),
        subject,
        local_jwks,
        local_jwks_file,
        remote_jwks: remote,
        from_headers,
        from_params: std::mem::take(&mut p.from_params),
        from_cookies: std::mem::take(&mut p.from_cookies),
        forward: Some(std::mem::take(&mut p.forward)),
        forward_payload_header: text(std::mem::take(&mut p.forward_payload_header)),
        pad_forward_payload_header: Some(std::mem::take(&mut p.pad_forward_payload_header)),
        claim_to_headers,
        clear_route_cache: Some(std::mem::take(&mut p.clear_route_cache)),
        // Envoy's 0 (unset) is its default, 60 seconds.
        clock_skew_seconds: match std::mem::take(&mut p.clock_skew_seconds) {
            0 => None,
            seconds => Some(u64::from(seconds)),
        },
        require_expiration: Some(std::mem::take(&mut p.require_expiration)),
        payload_in_metadata: text(std::mem::take(&mut p.payload_in_metadata)),
        normalize_payload_in_metadata: normalize,
        // Envoy's 0s are its defaults.
        jwt_cache: p.jwt_cache_config.take().map(|c| super::JwtCache {
            size: Some(c.jwt_cache_size).filter(|&n| n > 0).unwrap_or(super::JwtCache::DEFAULT_SIZE),
            max_token_size: Some(c.jwt_max_token_size)
                .filter(|&n| n > 0)
                .unwrap_or(super::JwtCache::DEFAULT_MAX_TOKEN_SIZE),
        }),
    };
    // Left: `header_in_metadata`, `failed_status_in_metadata` and `max_lifetime`.
    nothing_else(&p, JWT_PROVIDER, at)?;
    Ok(raw)
}

/// A key set fetched through a cluster.
fn remote_jwks(remote: RemoteJwks, at: &str) -> Result<RawRemoteJwks, ResourceError> {
    let RemoteJwks {
        http_uri,
        cache_duration,
        async_fetch,
        retry_policy,
    } = remote;
    let uri_at = format!("{at}.http_uri");
    let Some(HttpUri {
        uri,
        http_upstream_type,
        timeout,
    }) = http_uri
    else {
        return Err(ResourceError::invalid(at, "expected an http_uri"));
    };
    let Some(http_uri::HttpUpstreamType::Cluster(cluster)) = http_upstream_type else {
        return Err(ResourceError::invalid(&uri_at, "expected a cluster"));
    };
    // Envoy's `0s` is no deadline for the fetch (its async client's zero timeout is none):
    // here the longest wait there is.
    let timeout = match duration(timeout, &format!("{uri_at}.timeout"))? {
        Some(t) if t.is_zero() => Some(NO_TIMEOUT),
        other => other,
    };
    // Keys here are always fetched at load and refreshed in the background, as Envoy does
    // with `async_fetch`; without it Envoy fetches them for the first request that needs
    // them, which differs only in when the first fetch starts. `fast_listener` (whether the
    // listener waits for that fetch) changes nothing here: requests before the first keys
    // wait for them.
    let failed_refetch_duration = match async_fetch {
        Some(JwksAsyncFetch {
            fast_listener: _,
            failed_refetch_duration,
        }) => duration(
            failed_refetch_duration,
            &format!("{at}.async_fetch.failed_refetch_duration"),
        )?,
        None => None,
    };
    let (retries, retry_back_off) = match retry_policy {
        // Without a policy Envoy tries each fetch once.
        None => (0, None),
        Some(policy) => jwks_retry(policy, &format!("{at}.retry_policy"))?,
    };
    Ok(RawRemoteJwks {
        cluster,
        uri,
        timeout,
        cache_duration: duration(cache_duration, &format!("{at}.cache_duration"))?,
        failed_refetch_duration,
        retries: Some(retries),
        retry_back_off,
    })
}

/// A key set fetch's retries and back-off. Envoy's JWKS fetcher takes only `num_retries`
/// (1 when unset) and `retry_back_off` from the policy: it retries on
/// `5xx,gateway-error,connect-failure,reset` whatever `retry_on` says
/// (`Http::Utility::convertCoreToRouteRetryPolicy`), so `retry_on` is accepted and ignored
/// here as there.
fn jwks_retry(
    mut policy: RetryPolicy,
    at: &str,
) -> Result<(u32, Option<RawRetryBackOff>), ResourceError> {
    policy.retry_on.clear();
    let retries = policy.num_retries.take().map_or(1, |n| n.value);
    let back_off = (policy.retry_back_off.take())
        .map(|b| retry_back_off(b.base_interval, b.max_interval, at))
        .transpose()?;
    // Left: `retry_priority`, `retry_host_predicate`, `host_selection_retry_max_attempts`.
    nothing_else(&policy, CORE_RETRY_POLICY, at)?;
    Ok((retries, back_off))
}

/// A claim copied into a header: `claim_name` (nested claims joined by `.`), or
/// `claim_path`, its keys joined the same way where none holds a `.`.
fn claim_to_header(c: JwtClaimToHeader, at: &str) -> Result<RawClaimToHeader, ResourceError> {
    let JwtClaimToHeader {
        header_name,
        claim_name,
        claim_path,
    } = c;
    let claim_name = match (claim_name.is_empty(), claim_path.is_empty()) {
        (false, true) => claim_name,
        (true, false) if claim_path.iter().all(|s| !s.key.contains('.')) => (claim_path.into_iter())
            .map(|s| s.key)
            .collect::<Vec<_>>()
            .join("."),
        (true, false) => {
            return Err(unsupported(
                at,
                "claim_path with a key holding `.` (claims are named by `.`-joined paths here)",
            ));
        }
        _ => {
            return Err(ResourceError::invalid(
                at,
                "expected one of claim_name and claim_path",
            ));
        }
    };
    Ok(RawClaimToHeader {
        header_name,
        claim_name,
    })
}

fn rule(r: RequirementRule, at: &str) -> Result<RawJwtRule, ResourceError> {
    use requirement_rule::RequirementType;
    let Some(when) = r.r#match else {
        return Err(ResourceError::invalid(at, "expected a match"));
    };
    let when = path_match(when, &format!("{at}.match"))?;
    let requires = match r.requirement_type {
        Some(RequirementType::Requires(requires)) => {
            Some(requirement(requires, &format!("{at}.requires"), 0)?)
        }
        Some(RequirementType::RequirementName(_)) => {
            return Err(unsupported(at, "requirement_name"));
        }
        // The requests it takes are not checked.
        None => None,
    };
    Ok(RawJwtRule { when, requires })
}

/// A rule's `RouteMatch`: its path alone, letter case counting.
fn path_match(mut m: RouteMatch, at: &str) -> Result<RawPathMatch, ResourceError> {
    use route_match::PathSpecifier;
    let mut raw = RawPathMatch::default();
    match m.path_specifier.take() {
        Some(PathSpecifier::Prefix(p)) => raw.prefix = Some(p),
        Some(PathSpecifier::Path(p)) => raw.path = Some(p),
        Some(PathSpecifier::PathSeparatedPrefix(p)) => raw.path_separated_prefix = Some(p),
        Some(PathSpecifier::SafeRegex(r)) => raw.regex = Some(matchers::regex(r)),
        Some(PathSpecifier::ConnectMatcher(_)) => return Err(unsupported(at, "connect_matcher")),
        Some(PathSpecifier::PathMatchPolicy(policy)) => {
            return Err(unsupported(
                at,
                format!("path_match_policy `{}`", policy.name),
            ));
        }
        None => return Err(ResourceError::invalid(at, "expected a path_specifier")),
    }
    if m.case_sensitive.take().is_some_and(|c| !c.value) {
        return Err(unsupported(at, "case_sensitive: false"));
    }
    // Left: headers, query_parameters, cookies, grpc, runtime_fraction, tls_context,
    // dynamic_metadata, filter_state.
    nothing_else(&m, fields::ROUTE_MATCH, at)?;
    Ok(raw)
}

/// A requirement as the file writes it. A list of one (which Envoy's own validation
/// refuses) is that one requirement.
fn requirement(r: JwtRequirement, at: &str, depth: usize) -> Result<RawRequirement, ResourceError> {
    use jwt_requirement::RequiresType;
    if depth >= MAX_DEPTH {
        return Err(ResourceError::invalid(
            at,
            format!("nested more than {MAX_DEPTH} deep"),
        ));
    }
    let list = |list: Vec<JwtRequirement>, key: &str| {
        (list.into_iter().enumerate())
            .map(|(i, r)| requirement(r, &format!("{at}.{key}.requirements[{i}]"), depth + 1))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match r.requires_type {
        Some(RequiresType::ProviderName(name)) => RawRequirement::Word(name),
        // No audiences: the provider's own, as Envoy's verifier given none.
        Some(RequiresType::ProviderAndAudiences(p)) if p.audiences.is_empty() => {
            RawRequirement::Word(p.provider_name)
        }
        Some(RequiresType::ProviderAndAudiences(p)) => RawRequirement::Provider {
            provider: p.provider_name,
            audiences: p.audiences,
        },
        Some(RequiresType::RequiresAny(any)) => {
            collapsed(list(any.requirements, "requires_any")?, |any| {
                RawRequirement::Any { any }
            })
        }
        Some(RequiresType::RequiresAll(all)) => {
            collapsed(list(all.requirements, "requires_all")?, |all| {
                RawRequirement::All { all }
            })
        }
        Some(RequiresType::AllowMissing(_)) => RawRequirement::Word("allow_missing".into()),
        Some(RequiresType::AllowMissingOrFailed(_)) => {
            RawRequirement::Word("allow_missing_or_failed".into())
        }
        Some(RequiresType::ExtractOnlyWithoutValidation(_)) => {
            return Err(unsupported(at, "extract_only_without_validation"));
        }
        None => return Err(ResourceError::invalid(at, "expected a requirement")),
    })
}

/// `list` as one of `wrap`'s lists, or its only entry.
fn collapsed(
    mut list: Vec<RawRequirement>,
    wrap: fn(Vec<RawRequirement>) -> RawRequirement,
) -> RawRequirement {
    if list.len() == 1
        && let Some(only) = list.pop()
    {
        return only;
    }
    wrap(list)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
    use envoy_types::pb::envoy::config::core::v3::BackoffStrategy;
    use envoy_types::pb::envoy::config::route::v3::HeaderMatcher;
    use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
        JwtCacheConfig, JwtRequirementAndList, JwtRequirementOrList, ProviderWithAudiences,
        jwt_claim_to_header,
    };
    use envoy_types::pb::google::protobuf::{BoolValue, Empty, UInt32Value};

    use super::*;
    use crate::filters::ChainCtx;

    const JWKS: &str = r#"{"keys":[{"kty":"oct","kid":"k","k":"c2VjcmV0"}]}"#;

    fn pack<M: prost::Message + prost::Name>(message: &M) -> Any {
        testbed::xds::any(message)
    }

    fn secs(seconds: i64) -> Option<envoy_types::pb::google::protobuf::Duration> {
        Some(envoy_types::pb::google::protobuf::Duration { seconds, nanos: 0 })
    }

    fn with(requires: jwt_requirement::RequiresType) -> JwtRequirement {
        JwtRequirement {
            requires_type: Some(requires),
        }
    }

    fn name(provider: &str) -> JwtRequirement {
        with(jwt_requirement::RequiresType::ProviderName(provider.into()))
    }

    fn allow_missing() -> JwtRequirement {
        with(jwt_requirement::RequiresType::AllowMissing(Empty {}))
    }

    fn any_of(requirements: Vec<JwtRequirement>) -> JwtRequirement {
        with(jwt_requirement::RequiresType::RequiresAny(
            JwtRequirementOrList { requirements },
        ))
    }

    fn all_of(requirements: Vec<JwtRequirement>) -> JwtRequirement {
        with(jwt_requirement::RequiresType::RequiresAll(
            JwtRequirementAndList { requirements },
        ))
    }

    /// A requirement in a short form: `name`, `name["aud"]`, `any(...)`, `all(...)`.
    fn render(r: &RawRequirement) -> String {
        let join = |list: &[RawRequirement]| list.iter().map(render).collect::<Vec<_>>().join(", ");
        match r {
            RawRequirement::Word(word) => word.clone(),
            RawRequirement::Provider {
                provider,
                audiences,
            } => format!("{provider}{audiences:?}"),
            RawRequirement::Any { any } => format!("any({})", join(any.as_slice())),
            RawRequirement::All { all } => format!("all({})", join(all.as_slice())),
        }
    }

    fn inline(text: &str) -> DataSource {
        DataSource {
            specifier: Some(data_source::Specifier::InlineString(text.into())),
            ..Default::default()
        }
    }

    fn local_provider() -> JwtProvider {
        JwtProvider {
            issuer: "testing@secure.istio.io".into(),
            jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::LocalJwks(inline(
                JWKS,
            ))),
            ..Default::default()
        }
    }

    fn remote(remote: RemoteJwks) -> JwtProvider {
        JwtProvider {
            jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::RemoteJwks(remote)),
            ..Default::default()
        }
    }

    fn http_uri(timeout: i64) -> Option<HttpUri> {
        Some(HttpUri {
            uri: "https://auth.example.com/.well-known/jwks.json".into(),
            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster("jwks".into())),
            timeout: secs(timeout),
        })
    }

    fn one_provider(provider: JwtProvider) -> JwtAuthentication {
        JwtAuthentication {
            providers: HashMap::from([("p".to_string(), provider)]),
            ..Default::default()
        }
    }

    fn error(filter: &JwtAuthentication) -> String {
        settings(&pack(filter), "jwt_authn").unwrap_err().to_string()
    }

    fn check(raw: RawJwtAuthn, clusters: &[(&str, usize)]) -> super::super::JwtAuthnConfig {
        let clusters: crate::cluster::ClusterIndex<'_> = clusters.iter().copied().collect();
        let ctx = ChainCtx {
            buffer_limit: 32 * 1024,
            cluster_index: &clusters,
        };
        super::super::jwt_authn(raw, "jwt_authn", &ctx).unwrap()
    }

    /// Envoy Gateway's SecurityPolicy: a remote key set through a cluster, fetched in the
    /// background with retries, the payload kept, a claim in a header; the requirement named
    /// by the route (optional tokens: any of the provider or none).
    #[test]
    fn envoy_gateways_provider_translates() {
        let provider = JwtProvider {
            issuer: "https://auth.example.com".into(),
            audiences: vec!["api".into()],
            forward: true,
            payload_in_metadata: "example".into(),
            normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
                space_delimited_claims: vec!["scope".into()],
            }),
            claim_to_headers: vec![JwtClaimToHeader {
                header_name: "x-user".into(),
                claim_name: "sub".into(),
                claim_path: Vec::new(),
            }],
            ..remote(RemoteJwks {
                http_uri: http_uri(10),
                cache_duration: secs(300),
                async_fetch: Some(JwksAsyncFetch::default()),
                retry_policy: Some(RetryPolicy {
                    num_retries: Some(UInt32Value { value: 3 }),
                    retry_back_off: Some(BackoffStrategy {
                        base_interval: secs(1),
                        max_interval: secs(10),
                    }),
                    ..Default::default()
                }),
            })
        };
        let route = "httproute/default/backend/rule/0/match/0/www_example_com";
        let filter = JwtAuthentication {
            providers: HashMap::from([("example".to_string(), provider)]),
            requirement_map: HashMap::from([(
                route.to_string(),
                any_of(vec![name("example"), allow_missing()]),
            )]),
            ..Default::default()
        };
        let raw = settings(&pack(&filter), "jwt_authn").unwrap();
        let p = &raw.providers["example"];
        assert_eq!(p.issuer.as_deref(), Some("https://auth.example.com"));
        assert_eq!(p.audiences, ["api"]);
        assert!(p.local_jwks.is_none() && p.local_jwks_file.is_none());
        let keys = p.remote_jwks.as_ref().expect("remote keys");
        assert_eq!(keys.cluster, "jwks");
        assert_eq!(keys.uri, "https://auth.example.com/.well-known/jwks.json");
        assert_eq!(keys.timeout, Some(Duration::from_secs(10)));
        assert_eq!(keys.cache_duration, Some(Duration::from_secs(300)));
        assert_eq!(keys.failed_refetch_duration, None);
        assert_eq!(keys.retries, Some(3));
        let back_off = keys.retry_back_off.as_ref().expect("a back-off");
        assert_eq!(back_off.base_interval, Duration::from_secs(1));
        assert_eq!(back_off.max_interval, Some(Duration::from_secs(10)));
        assert_eq!(p.forward, Some(true));
        assert_eq!(p.payload_in_metadata.as_deref(), Some("example"));
        assert_eq!(p.claim_to_headers.len(), 1);
        assert_eq!(p.claim_to_headers[0].header_name, "x-user");
        assert_eq!(p.claim_to_headers[0].claim_name, "sub");
        assert_eq!(p.clock_skew_seconds, None);
        assert_eq!(p.forward_payload_header, None);
        assert!(raw.rules.is_empty());
        assert_eq!(render(&raw.requirement_map[route]), "any(example, allow_missing)");
        assert_eq!(raw.bypass_cors_preflight, Some(false));

        let config = check(raw, &[("jwks", 2)]);
        assert_eq!(config.providers["example"].clock_skew_seconds, 60);
        assert!(config.requirement_map.contains_key(route));
    }

    /// Istio's RequestAuthentication: an inline key set, one rule for every path that takes
    /// a token of the provider or none, CORS preflights let through, the payload upstream in
    /// a header.
    #[test]
    fn istios_provider_translates() {
        let provider = JwtProvider {
            forward_payload_header: "x-jwt-payload".into(),
            payload_in_metadata: "testing@secure.istio.io".into(),
            ..local_provider()
        };
        let filter = JwtAuthentication {
            providers: HashMap::from([("origins-0".to_string(), provider)]),
            rules: vec![RequirementRule {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                requirement_type: Some(requirement_rule::RequirementType::Requires(any_of(
                    vec![name("origins-0"), allow_missing()],
                ))),
            }],
            bypass_cors_preflight: true,
            ..Default::default()
        };
        let raw = settings(&pack(&filter), "jwt_authn").unwrap();
        let p = &raw.providers["origins-0"];
        assert_eq!(p.issuer.as_deref(), Some("testing@secure.istio.io"));
        assert_eq!(p.local_jwks.as_deref(), Some(JWKS));
        assert!(p.remote_jwks.is_none());
        assert_eq!(p.forward_payload_header.as_deref(), Some("x-jwt-payload"));
        assert_eq!(p.forward, Some(false));
        assert_eq!(raw.rules.len(), 1);
        assert_eq!(raw.rules[0].when.prefix.as_deref(), Some("/"));
        assert_eq!(raw.rules[0].when.path, None);
        assert_eq!(
            raw.rules[0].requires.as_ref().map(render).as_deref(),
            Some("any(origins-0, allow_missing)")
        );
        assert_eq!(raw.bypass_cors_preflight, Some(true));

        let config = check(raw, &[]);
        assert!(config.bypass_cors_preflight);
        assert_eq!(config.rules.len(), 1);
    }

    #[test]
    fn fields_that_change_decisions_are_refused_by_name() {
        // The verified-token cache is taken, Envoy's 0s its defaults.
        let cached = JwtProvider {
            jwt_cache_config: Some(JwtCacheConfig {
                jwt_cache_size: 50,
                jwt_max_token_size: 0,
            }),
            ..local_provider()
        };
        let raw = provider(cached, "p").unwrap();
        assert_eq!(
            raw.jwt_cache,
            Some(super::super::JwtCache {
                size: 50,
                max_token_size: 4096
            })
        );

        let header = JwtProvider {
            header_in_metadata: "jwt_header".into(),
            ..local_provider()
        };
        assert!(error(&one_provider(header)).contains("header_in_metadata"));

        let strip = JwtAuthentication {
            strip_failure_response: true,
            ..one_provider(local_provider())
        };
        assert!(error(&strip).contains("strip_failure_response"));

        let extract = JwtAuthentication {
            requirement_map: HashMap::from([(
                "r".to_string(),
                with(jwt_requirement::RequiresType::ExtractOnlyWithoutValidation(
                    Default::default(),
                )),
            )]),
            ..one_provider(local_provider())
        };
        assert!(error(&extract).contains("extract_only_without_validation"));

        let predicates = remote(RemoteJwks {
            http_uri: http_uri(5),
            retry_policy: Some(RetryPolicy {
                retry_on: "5xx".into(),
                host_selection_retry_max_attempts: 3,
                ..Default::default()
            }),
            ..Default::default()
        });
        let message = error(&one_provider(predicates));
        assert!(message.contains("host_selection_retry_max_attempts"), "{message}");
        assert!(!message.contains("retry_on"), "{message}");

        let rule_with = |m: RouteMatch| JwtAuthentication {
            rules: vec![RequirementRule {
                r#match: Some(m),
                requirement_type: None,
            }],
            ..one_provider(local_provider())
        };
        let prefix = Some(route_match::PathSpecifier::Prefix("/".into()));
        let headers = RouteMatch {
            path_specifier: prefix.clone(),
            headers: vec![HeaderMatcher {
                name: "x-a".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(error(&rule_with(headers)).contains("headers"));
        let folded = RouteMatch {
            path_specifier: prefix.clone(),
            case_sensitive: Some(BoolValue { value: false }),
            ..Default::default()
        };
        assert!(error(&rule_with(folded)).contains("case_sensitive"));
        let named = JwtAuthentication {
            rules: vec![RequirementRule {
                r#match: Some(RouteMatch {
                    path_specifier: prefix,
                    ..Default::default()
                }),
                requirement_type: Some(requirement_rule::RequirementType::RequirementName(
                    "r".into(),
                )),
            }],
            ..one_provider(local_provider())
        };
        assert!(error(&named).contains("requirement_name"));
    }

    #[test]
    fn requirements_take_the_files_forms() {
        let render_of = |r: JwtRequirement| render(&requirement(r, "r", 0).unwrap());
        // A list of one is its entry.
        assert_eq!(render_of(any_of(vec![name("a")])), "a");
        let with_audiences = with(jwt_requirement::RequiresType::ProviderAndAudiences(
            ProviderWithAudiences {
                provider_name: "a".into(),
                audiences: vec!["x".into()],
            },
        ));
        let or_failed = with(jwt_requirement::RequiresType::AllowMissingOrFailed(Empty {}));
        assert_eq!(
            render_of(all_of(vec![with_audiences, or_failed])),
            r#"all(a["x"], allow_missing_or_failed)"#
        );
        // No audiences: the provider's own.
        let without = with(jwt_requirement::RequiresType::ProviderAndAudiences(
            ProviderWithAudiences {
                provider_name: "b".into(),
                audiences: Vec::new(),
            },
        ));
        assert_eq!(render_of(without), "b");

        let message = requirement(JwtRequirement::default(), "r", 0)
            .unwrap_err()
            .to_string();
        assert!(message.contains("expected a requirement"), "{message}");
        let mut deep = name("a");
        for _ in 0..40 {
            deep = any_of(vec![deep]);
        }
        let message = requirement(deep, "r", 0).unwrap_err().to_string();
        assert!(message.contains("nested more than 32 deep"), "{message}");
    }

    #[test]
    fn key_sources_and_claim_paths() {
        let source = |specifier| JwtProvider {
            jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::LocalJwks(
                DataSource {
                    specifier: Some(specifier),
                    ..Default::default()
                },
            )),
            ..Default::default()
        };
        let raw = settings(
            &pack(&one_provider(source(data_source::Specifier::Filename(
                "/etc/jwks.json".into(),
            )))),
            "jwt_authn",
        )
        .unwrap();
        assert_eq!(raw.providers["p"].local_jwks_file.as_deref(), Some("/etc/jwks.json"));
        let raw = settings(
            &pack(&one_provider(source(data_source::Specifier::InlineBytes(
                JWKS.as_bytes().to_vec(),
            )))),
            "jwt_authn",
        )
        .unwrap();
        assert_eq!(raw.providers["p"].local_jwks.as_deref(), Some(JWKS));
        let message = error(&one_provider(source(data_source::Specifier::InlineBytes(vec![
            0xff, 0xfe,
        ]))));
        assert!(message.contains("inline_bytes"), "{message}");
        let message = error(&one_provider(source(
            data_source::Specifier::EnvironmentVariable("JWKS".into()),
        )));
        assert!(message.contains("environment_variable"), "{message}");

        let path = |keys: &[&str]| JwtClaimToHeader {
            header_name: "x-claim".into(),
            claim_name: String::new(),
            claim_path: (keys.iter())
                .map(|k| jwt_claim_to_header::PathSegment {
                    key: (*k).to_string(),
                })
                .collect(),
        };
        let nested = JwtProvider {
            claim_to_headers: vec![path(&["org", "id"])],
            ..local_provider()
        };
        let raw = settings(&pack(&one_provider(nested)), "jwt_authn").unwrap();
        assert_eq!(raw.providers["p"].claim_to_headers[0].claim_name, "org.id");
        let dotted = JwtProvider {
            claim_to_headers: vec![path(&["http://example.org/parent_token"])],
            ..local_provider()
        };
        assert!(error(&one_provider(dotted)).contains("claim_path"));
    }

    /// No retry policy: one try per fetch; with one, Envoy's default of one retry. A zero
    /// timeout is none.
    #[test]
    fn remote_fetches_take_envoys_retry_defaults() {
        let plain = remote(RemoteJwks {
            http_uri: http_uri(0),
            async_fetch: Some(JwksAsyncFetch {
                fast_listener: true,
                failed_refetch_duration: secs(7),
            }),
            ..Default::default()
        });
        let raw = settings(&pack(&one_provider(plain)), "jwt_authn").unwrap();
        let keys = raw.providers["p"].remote_jwks.clone().expect("remote keys");
        assert_eq!(keys.retries, Some(0));
        assert!(keys.retry_back_off.is_none());
        assert_eq!(keys.timeout, Some(NO_TIMEOUT));
        assert_eq!(keys.failed_refetch_duration, Some(Duration::from_secs(7)));
        assert_eq!(keys.cache_duration, None);

        let retried = remote(RemoteJwks {
            http_uri: http_uri(5),
            retry_policy: Some(RetryPolicy {
                retry_on: "connect-failure".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let raw = settings(&pack(&one_provider(retried)), "jwt_authn").unwrap();
        let keys = raw.providers["p"].remote_jwks.clone().expect("remote keys");
        assert_eq!(keys.retries, Some(1));
        assert!(keys.retry_back_off.is_none());

        let other = remote(RemoteJwks {
            http_uri: Some(HttpUri {
                http_upstream_type: None,
                ..http_uri(5).expect("a uri")
            }),
            ..Default::default()
        });
        assert!(error(&one_provider(other)).contains("expected a cluster"));
    }

    #[test]
    fn routes_turn_the_filter_off_or_name_a_requirement() {
        let entry = |specifier| PerRouteConfig {
            requirement_specifier: Some(specifier),
        };
        let off = per_route(
            &pack(&entry(per_route_config::RequirementSpecifier::Disabled(true))),
            "route",
        )
        .unwrap();
        assert!(matches!(off, RawPerRoute::Word(w) if w == "disabled"));
        let named = per_route(
            &pack(&entry(per_route_config::RequirementSpecifier::RequirementName(
                "httproute/default/backend".into(),
            ))),
            "route",
        )
        .unwrap();
        assert!(matches!(
            named,
            RawPerRoute::Settings(RawJwtRoute { requirement_name }) if requirement_name == "httproute/default/backend"
        ));
        let message = per_route(&pack(&PerRouteConfig::default()), "route")
            .unwrap_err()
            .to_string();
        assert!(message.contains("route"), "{message}");
        assert!(
            per_route(
                &pack(&entry(per_route_config::RequirementSpecifier::Disabled(false))),
                "route"
            )
            .is_err()
        );
    }
}
