//! The `jwt_authn` filter (Envoy's JWT authentication): the requirement that applies to a
//! request (a route's named one, else the first `rules` entry whose path matches) says which
//! providers' tokens must verify. A request that does not meet it gets 401 with
//! `www-authenticate: Bearer` and the reason as its body (403 for a token of another
//! audience); one that does goes on without its token (unless `forward`), with what the
//! verified tokens leave (payload and claim headers).
//!
//! ```text
//! mod.rs     the requirement for a request, and its evaluation
//! tokens.rs  where tokens are found, and what a verified one leaves on the request
//! jwks.rs    remote key sets: fetched through a cluster, cached, shared by the workers
//! ```

mod jwks;
mod tokens;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use jwt::{Jwks, Jwt, JwtError};

use super::{BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings};
use crate::catalog::JwtAuthnStats;
use crate::cluster::Cluster;
use crate::context::{JwtMetadata, RequestBody};
use crate::error::ProxyError;
use config::{JwksSource, JwtAuthnConfig, JwtProvider, JwtRequirement, JwtRoute, PathMatch};
use jwks::RemoteKeys;
use tokens::{Found, Place};

/// The filter on one worker. Boxed: the chain's other filters are a few words.
pub(crate) struct JwtAuthn(Box<Inner>);

struct Inner {
    providers: Box<[Provider]>,
    rules: Box<[(PathMatch, Option<Compiled>)]>,
    named: BTreeMap<String, Compiled>,
    /// Whose requirement applies, by route.
    select: PerRouteSettings<Select>,
    bypass_cors_preflight: bool,
    stats: Rc<JwtAuthnStats>,
}

struct Provider {
    config: JwtProvider,
    keys: Keys,
    /// The cluster remote keys are fetched through.
    cluster: Option<Rc<Cluster>>,
    /// The tokens that verified on this worker (`jwt_cache`).
    verified: Option<RefCell<jwt::VerifiedTokens>>,
}

/// A provider's keys: parsed once per generation, or fetched and shared.
#[derive(Clone)]
pub(crate) enum Keys {
    Local(Arc<Jwks>),
    Remote(Arc<RemoteKeys>),
}

/// Which requirement a route's requests meet.
enum Select {
    /// The first of `rules` whose path matches.
    Rules,
    /// The one of `requirement_map` with this name.
    Named(String),
}

/// A requirement, and the providers whose tokens it reads (worked out once, not per request).
struct Compiled {
    requirement: Requirement,
    reads: Box<[usize]>,
}

/// A requirement, its providers by index.
enum Requirement {
    Provider {
        index: usize,
        audiences: Option<Vec<String>>,
    },
    Any {
        of: Vec<Requirement>,
        allow_missing: bool,
        allow_missing_or_failed: bool,
    },
    All(Vec<Requirement>),
    AllowMissing,
    AllowMissingOrFailed,
}

impl HttpFilter for JwtAuthn {
    type Config = JwtAuthnConfig;
    /// Each provider's keys, in name order.
    type Shared = Vec<Keys>;
    type State = ();

    fn shared(config: &JwtAuthnConfig, _: &config::ListenerConfig, _: &str) -> Option<Vec<Keys>> {
        let keys = (config.providers.values())
            .map(|provider| match &provider.keys {
                // Checked at load; were it to fail, a set without keys verifies nothing.
                JwksSource::LocalJwks(text) => {
                    Keys::Local(Arc::new(Jwks::parse(text).unwrap_or_default()))
                }
                JwksSource::RemoteJwks(remote) => Keys::Remote(RemoteKeys::of(remote)),
            })
            .collect();
        Some(keys)
    }

    fn new(config: &JwtAuthnConfig, shared: Option<&Vec<Keys>>, ctx: &BuildCtx<'_>) -> Self {
        let stats = Rc::new(ctx.catalog.jwt_authn(ctx.shard, &ctx.listener.name));
        let keys = shared
            .cloned()
            .unwrap_or_else(|| Self::shared(config, ctx.listener, ctx.filter).unwrap_or_default());
        let providers: Box<[Provider]> = (config.providers.values().zip(keys))
            .map(|(config, keys)| {
                let cluster = match &config.keys {
                    JwksSource::RemoteJwks(remote) => ctx.clusters.get(remote.cluster_index).cloned(),
                    JwksSource::LocalJwks(_) => None,
                };
                if let (Keys::Remote(remote), Some(cluster)) = (&keys, &cluster) {
                    // Fetched as the generation starts, by the first worker here, through
                    // this generation's cluster.
                    remote.prefer(cluster);
                    remote.refresh_if_due(cluster, &stats);
                }
                Provider {
                    verified: (config.jwt_cache).map(|c| {
                        RefCell::new(jwt::VerifiedTokens::new(c.size as usize, c.max_token_size as usize))
                    }),
                    config: config.clone(),
                    keys,
                    cluster,
                }
            })
            .collect();
        let names: Vec<&String> = config.providers.keys().collect();
        let compile = |r: &JwtRequirement| {
            let requirement = requirement(r, &names);
            let mut reads = Vec::new();
            requirement.providers(names.len(), &mut reads);
            Compiled {
                requirement,
                reads: reads.into(),
            }
        };
        let listener = JwtRoute {
            requirement_name: String::new(),
        };
        let select = PerRouteSettings::new(&listener, ctx.table, ctx.filter, |f| &f.jwt_authn, |r| {
            if r.requirement_name.is_empty() {
                Select::Rules
            } else {
                Select::Named(r.requirement_name.clone())
            }
        });
        JwtAuthn(Box::new(Inner {
            rules: (config.rules.iter())
                .map(|rule| (rule.when.clone(), rule.requires.as_ref().map(compile)))
                .collect(),
            named: (config.requirement_map.iter())
                .map(|(name, r)| (name.clone(), compile(r)))
                .collect(),
            providers,
            select,
            bypass_cors_preflight: config.bypass_cors_preflight,
            stats,
        }))
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        let inner = &*self.0;
        let go_on = Ok(HeadersFlow::Flow(Flow::Continue));
        let Some(select) = inner.select.get(exchange) else {
            return go_on;
        };
        if inner.bypass_cors_preflight && is_preflight(req) {
            inner.stats.cors_preflight_bypassed.inc();
            return go_on;
        }
        let requirement = match select {
            Select::Rules => {
                let path = req.uri().path();
                match inner.rules.iter().find(|(when, _)| when.matches_path(path)) {
                    Some((_, Some(requirement))) => requirement,
                    _ => return go_on,
                }
            }
            Select::Named(name) => match inner.named.get(name) {
                Some(requirement) => requirement,
                None => {
                    inner.stats.denied.inc();
                    let known: Vec<&str> = inner.named.keys().map(String::as_str).collect();
                    let body = format!(
                        "Failed JWT authentication: Wrong requirement_name: {name}. It should be one of [{}]",
                        known.join(",")
                    );
                    let reply = LocalReply::new(StatusCode::FORBIDDEN, Bytes::from(body));
                    return Ok(HeadersFlow::Flow(Flow::Respond(Box::new(reply))));
                }
            },
        };
        // Boxed: only requests that need a verification carry its future.
        let checked = Box::pin(inner.check(req, requirement)).await;
        match checked {
            Ok(claims_set) => {
                inner.stats.allowed.inc();
                Ok(HeadersFlow::Flow(if claims_set {
                    Flow::ClearRoute
                } else {
                    Flow::Continue
                }))
            }
            Err(error) => {
                inner.stats.denied.inc();
                let reply = denial(error, req, exchange);
                Ok(HeadersFlow::Flow(Flow::Respond(Box::new(reply))))
            }
        }
    }
}

/// A CORS preflight: `OPTIONS` with `origin` and `access-control-request-method`.
fn is_preflight(req: &Request<RequestBody>) -> bool {
    req.method() == Method::OPTIONS
        && req.headers().contains_key(http::header::ORIGIN)
        && req
            .headers()
            .contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The config's requirement with providers by index (names were checked at load).
fn requirement(r: &JwtRequirement, names: &[&String]) -> Requirement {
    match r {
        JwtRequirement::Provider { name, audiences } => Requirement::Provider {
            index: names.iter().position(|n| *n == name).unwrap_or(usize::MAX),
            audiences: audiences.clone(),
        },
        JwtRequirement::Any(list) => {
            let words = |word: &JwtRequirement| list.iter().any(|r| r == word);
            let children = list.iter().filter(|r| {
                !matches!(r, JwtRequirement::AllowMissing | JwtRequirement::AllowMissingOrFailed)
            });
            // Only the words: what they say alone, over all providers.
            if children.count() == 0 {
                return if words(&JwtRequirement::AllowMissingOrFailed) {
                    Requirement::AllowMissingOrFailed
                } else {
                    Requirement::AllowMissing
                };
            }
            Requirement::Any {
                of: (list.iter())
                    .filter(|r| {
                        !matches!(
                            r,
                            JwtRequirement::AllowMissing | JwtRequirement::AllowMissingOrFailed
                        )
                    })
                    .map(|r| requirement(r, names))
                    .collect(),
                allow_missing: words(&JwtRequirement::AllowMissing),
                allow_missing_or_failed: words(&JwtRequirement::AllowMissingOrFailed),
            }
        }
        JwtRequirement::All(list) => {
            Requirement::All(list.iter().map(|r| requirement(r, names)).collect())
        }
        JwtRequirement::AllowMissing => Requirement::AllowMissing,
        JwtRequirement::AllowMissingOrFailed => Requirement::AllowMissingOrFailed,
    }
}

impl Requirement {
    /// The providers it reads tokens of (all, for the allow words alone).
    fn providers(&self, count: usize, into: &mut Vec<usize>) {
        match self {
            Requirement::Provider { index, .. } => {
                if *index < count && !into.contains(index) {
                    into.push(*index);
                }
            }
            Requirement::Any { of, .. } | Requirement::All(of) => {
                of.iter().for_each(|r| r.providers(count, into));
            }
            Requirement::AllowMissing | Requirement::AllowMissingOrFailed => {
                into.clear();
                into.extend(0..count);
            }
        }
    }
}

/// What one request's evaluation reads: each provider's tokens and keys.
struct Evaluation<'a> {
    providers: &'a [Provider],
    /// By provider index; `None` for providers the requirement does not read.
    found: Vec<Option<Vec<Found>>>,
    keys: Vec<Option<Arc<Jwks>>>,
    now: u64,
    /// A claim header was set by a provider that asks for the route to be matched again.
    clear_route: Cell<bool>,
    /// Verified payloads for the filters after this one, by `payload_in_metadata` key.
    metadata: RefCell<Vec<(String, serde_json::Value)>>,
}

impl Inner {
    /// Evaluates `requirement` for the request; `Ok(true)` when claim headers were set that
    /// the route is to be matched again on.
    async fn check(
        &self,
        req: &mut Request<RequestBody>,
        Compiled { requirement, reads }: &Compiled,
    ) -> Result<bool, JwtError> {
        let count = self.providers.len();
        let mut eval = Evaluation {
            providers: &self.providers,
            found: (0..count).map(|_| None).collect(),
            keys: vec![None; count],
            now: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            clear_route: Cell::new(false),
            metadata: RefCell::new(Vec::new()),
        };
        let mut waits = Vec::new();
        for &i in reads.iter() {
            let provider = &self.providers[i];
            // What verified tokens set is the filter's to set: a client's own is dropped.
            let headers = req.headers_mut();
            if let Some(name) = &provider.config.forward_payload_header {
                headers.remove(name);
            }
            for claim in &provider.config.claim_to_headers {
                headers.remove(&claim.header_name);
            }
            let found = tokens::find(&provider.config, req.headers(), req.uri());
            if !found.is_empty() {
                match &provider.keys {
                    Keys::Local(jwks) => eval.keys[i] = Some(Arc::clone(jwks)),
                    Keys::Remote(remote) => {
                        if let Some(cluster) = &provider.cluster {
                            remote.refresh_if_due(cluster, &self.stats);
                        }
                        match remote.current() {
                            Some(jwks) => eval.keys[i] = Some(jwks),
                            None => waits.push(i),
                        }
                    }
                }
            }
            eval.found[i] = Some(found);
        }
        // Providers without keys yet wait for their fetches together, not one after another.
        if !waits.is_empty() {
            let fetched = futures_util::future::join_all(waits.iter().map(|&i| async move {
                match &self.providers[i].keys {
                    Keys::Remote(remote) => remote.for_request().await,
                    Keys::Local(jwks) => Some(Arc::clone(jwks)),
                }
            }))
            .await;
            for (i, keys) in waits.into_iter().zip(fetched) {
                eval.keys[i] = keys;
            }
        }
        let outcome = eval.meet(requirement, req.headers_mut());
        for (key, payload) in eval.metadata.take() {
            JwtMetadata::set(req, &key, payload);
        }
        outcome.map(|()| eval.clear_route.get())
    }
}

impl Evaluation<'_> {
    fn meet(&self, requirement: &Requirement, headers: &mut HeaderMap) -> Result<(), JwtError> {
        match requirement {
            Requirement::Provider { index, audiences } => {
                self.verify_provider(*index, audiences.as_deref(), headers)
            }
            Requirement::All(all) => {
                for r in all {
                    self.meet(r, headers)?;
                }
                Ok(())
            }
            Requirement::Any {
                of,
                allow_missing,
                allow_missing_or_failed,
            } => {
                // As Envoy: the first child that holds is enough; else the last failure other
                // than a missing token, a token of another issuer over a missing one, and
                // only a missing token is what `allow_missing` lets on.
                let mut outcome = JwtError::Missing;
                for r in of {
                    match self.meet(r, headers) {
                        Ok(()) => return Ok(()),
                        Err(JwtError::Missing) => {}
                        Err(JwtError::UnknownIssuer) => {
                            if outcome == JwtError::Missing {
                                outcome = JwtError::UnknownIssuer;
                            }
                        }
                        Err(error) => outcome = error,
                    }
                }
                match outcome {
                    _ if *allow_missing_or_failed => Ok(()),
                    JwtError::Missing if *allow_missing => Ok(()),
                    error => Err(error),
                }
            }
            // Only a request without any token is let on for missing one.
            Requirement::AllowMissing => match self.verify_any_issuer(headers, false) {
                Err(JwtError::Missing) => Ok(()),
                other => other,
            },
            Requirement::AllowMissingOrFailed => {
                let _ = self.verify_any_issuer(headers, true);
                Ok(())
            }
        }
    }

    /// Provider `index`'s tokens in the request: all must verify; none is "missing".
    fn verify_provider(
        &self,
        index: usize,
        audiences: Option<&[String]>,
        headers: &mut HeaderMap,
    ) -> Result<(), JwtError> {
        let tokens = match self.found.get(index) {
            Some(Some(found)) if !found.is_empty() => found.len(),
            _ => return Err(JwtError::Missing),
        };
        for t in 0..tokens {
            let Some(provider) = self.providers.get(index) else {
                return Err(JwtError::Missing);
            };
            let token = self.found[index].as_ref().map_or("", |f| f[t].token.as_str());
            let jwt = Jwt::parse(token)?;
            if let Some(issuer) = &provider.config.issuer
                && jwt.issuer() != Some(issuer.as_str())
            {
                return Err(JwtError::UnknownIssuer);
            }
            self.verify_token(index, t, &jwt, audiences, headers)?;
        }
        Ok(())
    }

    /// Every token in any provider's places, each verified by the provider of its issuer
    /// among those that look in its place (Envoy's verifier for `allow_missing` alone): a
    /// token no such provider takes is of an unknown issuer. None at all is "missing".
    /// `keep_going`: verify all (what verified ones leave is left) whatever fails.
    fn verify_any_issuer(&self, headers: &mut HeaderMap, keep_going: bool) -> Result<(), JwtError> {
        let mut seen: Vec<(&str, &Place)> = Vec::new();
        let mut outcome = Err(JwtError::Missing);
        for found in self.found.iter().flatten() {
            for Found { token, place } in found {
                if seen.iter().any(|(t, p)| t == token && *p == place) {
                    continue;
                }
                seen.push((token, place));
                let result = Jwt::parse(token).and_then(|jwt| match self.provider_of(&jwt, token, place) {
                    None => Err(JwtError::UnknownIssuer),
                    Some((p, at)) => self.verify_token(p, at, &jwt, None, headers),
                });
                match result {
                    Ok(()) if outcome == Err(JwtError::Missing) => outcome = Ok(()),
                    Ok(()) => {}
                    Err(error) if !keep_going => return Err(error),
                    Err(error) => outcome = Err(error),
                }
            }
        }
        outcome
    }

    /// The provider for `token` found at `place`: of those that look there, the first whose
    /// issuer is the token's, else the first that takes any issuer (as Envoy picks by
    /// issuer); with the token's index among that provider's.
    fn provider_of(&self, jwt: &Jwt<'_>, token: &str, place: &Place) -> Option<(usize, usize)> {
        let found_here = |p: usize| {
            let found = self.found[p].as_ref()?;
            found.iter().position(|f| f.token == token && f.place == *place)
        };
        let issuer_of = |p: usize| self.providers[p].config.issuer.as_deref();
        let exact = (0..self.providers.len())
            .filter(|&p| issuer_of(p).is_some() && issuer_of(p) == jwt.issuer())
            .find_map(|p| Some((p, found_here(p)?)));
        exact.or_else(|| {
            (0..self.providers.len())
                .filter(|&p| issuer_of(p).is_none())
                .find_map(|p| Some((p, found_here(p)?)))
        })
    }

    /// Checks token `t` of provider `index` (its issuer already matched): times, audience,
    /// subject, signature; then leaves what it leaves on the request.
    fn verify_token(
        &self,
        index: usize,
        t: usize,
        jwt: &Jwt<'_>,
        audiences: Option<&[String]>,
        headers: &mut HeaderMap,
    ) -> Result<(), JwtError> {
        let provider = &self.providers[index];
        let config = &provider.config;
        jwt.check_time(self.now, config.clock_skew_seconds, config.require_expiration)?;
        jwt.audience_allowed(audiences.unwrap_or(&config.audiences))?;
        if let Some(subject) = &config.subject {
            let sub = jwt.claims().get("sub").and_then(|s| s.as_str()).unwrap_or("");
            if !subject.matches(sub.as_bytes()) {
                return Err(JwtError::VerificationFails);
            }
        }
        let keys = self.keys[index].as_ref().ok_or(JwtError::JwksFetchFailed)?;
        let token = (self.found[index].as_ref()).map_or("", |f| f[t].token.as_str());
        // A token that verified against this very key set needs no second verification.
        let remembered = (provider.verified.as_ref()).is_some_and(|v| v.borrow_mut().contains(token, keys));
        if !remembered {
            jwt.verify(keys)?;
            if let Some(verified) = &provider.verified {
                verified.borrow_mut().insert(token, keys);
            }
        }
        if tokens::leave(config, jwt, headers) && config.clear_route_cache {
            self.clear_route.set(true);
        }
        if let Some(key) = &config.payload_in_metadata {
            let payload = tokens::normalized(jwt.claims(), &config.space_delimited_claims);
            self.metadata.borrow_mut().push((key.clone(), payload));
        }
        let header = (self.found[index].as_ref()).and_then(|f| f[t].place.header().cloned());
        if !config.forward
            && let Some(name) = header
        {
            headers.remove(name);
        }
        Ok(())
    }
}

/// 401 (403 for a token of another audience) with Envoy's reason and `www-authenticate`.
fn denial(error: JwtError, req: &Request<RequestBody>, exchange: &Exchange<'_>) -> LocalReply {
    let status = if error.forbidden() {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::UNAUTHORIZED
    };
    let mut reply = LocalReply::new(status, Bytes::from(error.to_string()));
    let realm = exchange.realm(req.uri());
    let value = match error {
        JwtError::Missing => format!("Bearer realm=\"{realm}\""),
        _ => format!("Bearer realm=\"{realm}\", error=\"invalid_token\""),
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        reply.headers.insert(http::header::WWW_AUTHENTICATE, value);
    }
    reply
}
