//! The `local_rate_limit` filter (Envoy's local rate limit): a request takes a token from its
//! buckets, or gets `status` (429) with `x-ratelimit-*` and `retry-after` headers. A bucket per
//! listener or per route, shared by the workers or one per worker, and optionally one per
//! client IP or header value; and buckets for the requests its descriptors name (`rate_limit_actions`
//! says how a request is described), taken from slowest first, as Envoy does.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Request};
use tokio::time::Instant;


use super::rate_limit_actions::Described;

use super::headers::Mutations;
use super::token_bucket::{KeyedBuckets, Taken, TokenBucket};
use super::{
    BodyFilter, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings,
    ResponseCtx, ResponseHead,
};
use crate::error::ProxyError;
use crate::catalog::RateLimitStats;
use crate::context::RequestBody;
use crate::error::ResponseFlag;
use crate::random::drawn;
use config::{
    LocalRateLimitConfig, PerRoute, RateLimitHeaders, RateLimitKey, RateLimitScope,
    RouteConfiguration, RouteFilters,
};

static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// One configured limit: its buckets and how to answer.
pub(crate) struct Limiter {
    config: LocalRateLimitConfig,
    /// `token_bucket`'s: `None` when the config has only descriptors.
    default: Option<DefaultBucket>,
    /// One per configured descriptor, in its order.
    descriptors: Box<[DescriptorBucket]>,
    /// The response headers of a refused request, made once.
    response_headers: Option<Mutations>,
}

/// The default bucket, or one per key.
struct DefaultBucket {
    max_tokens: u32,
    /// Requests without a key (or all of them, when there is no key).
    unkeyed: TokenBucket,
    keyed: Option<KeyedBuckets>,
}

/// A descriptor's bucket, or one per distinct list where it leaves a value out.
struct DescriptorBucket {
    max_tokens: u32,
    /// Tokens per second: the slowest bucket is taken from first, as Envoy does.
    fill_rate: f64,
    shadow_mode: bool,
    buckets: DescriptorBuckets,
}

enum DescriptorBuckets {
    One(TokenBucket),
    /// A bucket per distinct list of values (the descriptor leaves a value out).
    PerValue(Box<KeyedBuckets>),
}

impl Limiter {
    /// `None` for a config without a bucket (the filter then limits only routes with one).
    fn new(config: &LocalRateLimitConfig) -> Option<Self> {
        if config.token_bucket.is_none() && config.descriptors.is_empty() {
            return None;
        }
        let now = Instant::now();
        let default = config.token_bucket.map(|bucket| DefaultBucket {
            max_tokens: bucket.max_tokens,
            unkeyed: TokenBucket::new(bucket, now),
            keyed: config
                .key
                .as_ref()
                .map(|_| KeyedBuckets::new(bucket, config.max_keys)),
        });
        let descriptors = config
            .descriptors
            .iter()
            .map(|d| {
                let bucket = d.token_bucket;
                DescriptorBucket {
                    max_tokens: bucket.max_tokens,
                    fill_rate: f64::from(bucket.tokens_per_fill)
                        / bucket.fill_interval.as_secs_f64(),
                    shadow_mode: d.shadow_mode,
                    buckets: if d.is_dynamic() {
                        DescriptorBuckets::PerValue(Box::new(KeyedBuckets::new(bucket, config.max_keys)))
                    } else {
                        DescriptorBuckets::One(TokenBucket::new(bucket, now))
                    },
                }
            })
            .collect();
        Some(Self {
            config: config.clone(),
            default,
            descriptors,
            response_headers: (!config.response_headers.is_empty())
                .then(|| Mutations::new(&config.response_headers)),
        })
    }

    /// The buckets the request's descriptors name, slowest first, with the key of a
    /// dynamic one's bucket.
    fn matched(&self, described: &Described<'_>) -> Vec<(&DescriptorBucket, Vec<u8>)> {
        let mut matched = Vec::new();
        if self.descriptors.is_empty() {
            return matched;
        }
        for rule in &self.config.rate_limits {
            let Some(entries) = described.entries(rule) else {
                continue;
            };
            // A descriptor that names every value wins over one that leaves values out.
            let configured = &self.config.descriptors;
            let found = (configured.iter().enumerate())
                .find(|(_, d)| !d.is_dynamic() && d.matches(&entries))
                .or_else(|| {
                    (configured.iter().enumerate())
                        .find(|(_, d)| d.is_dynamic() && d.matches(&entries))
                });
            if let Some((i, _)) = found {
                let bucket = &self.descriptors[i];
                let key = match bucket.buckets {
                    DescriptorBuckets::PerValue(_) => dynamic_key(&entries),
                    DescriptorBuckets::One(_) => Vec::new(),
                };
                matched.push((bucket, key));
            }
        }
        matched.sort_by(|a, b| a.0.fill_rate.total_cmp(&b.0.fill_rate));
        matched
    }

    /// Takes from the descriptors' buckets, slowest first, then from the default one (when
    /// no descriptor matched, or always when configured). The first empty bucket decides.
    fn check(&self, described: &Described<'_>, now: Instant) -> Check {
        let mut first = None;
        let matched = self.matched(described);
        for (bucket, key) in &matched {
            let taken = match &bucket.buckets {
                DescriptorBuckets::PerValue(buckets) => buckets.try_take(key, now),
                DescriptorBuckets::One(one) => one.try_take(now),
            };
            let verdict = Verdict {
                limit: bucket.max_tokens,
                taken,
            };
            if !taken.allowed {
                return if bucket.shadow_mode {
                    Check::Shadowed(verdict)
                } else {
                    Check::Limited(verdict)
                };
            }
            first.get_or_insert(verdict);
        }
        if let Some(default) = &self.default
            && (matched.is_empty() || self.config.always_consume_default_token_bucket)
        {
            let taken = default.try_take(described, &self.config, now);
            let verdict = Verdict {
                limit: default.max_tokens,
                taken,
            };
            if !taken.allowed {
                return Check::Limited(verdict);
            }
            first.get_or_insert(verdict);
        }
        Check::Allowed(first)
    }
}

/// What the buckets said.
enum Check {
    /// The bucket whose headers the response carries, if any took part.
    Allowed(Option<Verdict>),
    /// A shadow descriptor's bucket was empty: counted, let through.
    Shadowed(Verdict),
    Limited(Verdict),
}

/// A dynamic descriptor's bucket key: the request's values, each ended by a NUL byte (no
/// header or parameter value holds one, so distinct lists never share a key).
fn dynamic_key(entries: &[(String, String)]) -> Vec<u8> {
    let mut key = Vec::with_capacity(entries.iter().map(|(_, v)| v.len() + 1).sum());
    for (_, value) in entries {
        key.extend_from_slice(value.as_bytes());
        key.push(0);
    }
    key
}

impl DefaultBucket {
    fn try_take(
        &self,
        described: &Described<'_>,
        config: &LocalRateLimitConfig,
        now: Instant,
    ) -> Taken {
        let Some(keyed) = &self.keyed else {
            return self.unkeyed.try_take(now);
        };
        match &config.key {
            Some(RateLimitKey::ClientIp) => {
                match described.exchange.client.ip(described.exchange.conn) {
                    IpAddr::V4(ip) => keyed.try_take(&ip.octets(), now),
                    IpAddr::V6(ip) => keyed.try_take(&ip.octets(), now),
                }
            }
            Some(RateLimitKey::Header(name)) => match described.req.headers().get(name) {
                Some(value) => keyed.try_take(value.as_bytes(), now),
                None => self.unkeyed.try_take(now),
            },
            None => self.unkeyed.try_take(now),
        }
    }
}

/// Buckets by where they are set: the listener's, a virtual host's (shared by its routes
/// without one of their own) and each route's. `None` where the settings make no bucket.
type Buckets = PerRouteSettings<Option<Arc<Limiter>>>;

fn bucket_settings(filters: &RouteFilters) -> &PerRoute<LocalRateLimitConfig> {
    &filters.local_rate_limit
}

/// The limits of one listener's filter that every worker shares (`scope: process`), made
/// once per config version.
pub(crate) struct SharedLimits(Buckets);

impl SharedLimits {
    pub(crate) fn new(
        listener: &LocalRateLimitConfig,
        table: &RouteConfiguration,
        filter: &str,
    ) -> Self {
        Self(PerRouteSettings::new(
            listener,
            table,
            filter,
            bucket_settings,
            |config| {
                (config.scope == RateLimitScope::Process)
                    .then(|| Limiter::new(config).map(Arc::new))
                    .flatten()
            },
        ))
    }
}

/// The filter on one worker.
pub(crate) struct LocalRateLimit {
    buckets: Buckets,
    stats: RateLimitStats,
}

/// What the request phase found, for the response's `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Verdict {
    limit: u32,
    taken: Taken,
}

impl HttpFilter for LocalRateLimit {
    type Config = LocalRateLimitConfig;
    type Shared = Arc<SharedLimits>;
    /// The verdict, for `x-ratelimit-*` headers on the response.
    type State = Option<Verdict>;

    /// The buckets with `scope: process`, which every worker takes from.
    fn shared(
        config: &LocalRateLimitConfig,
        listener: &config::ListenerConfig,
        filter: &str,
    ) -> Option<Self::Shared> {
        Some(Arc::new(SharedLimits::new(config, &listener.route_config, filter)))
    }

    fn new(
        config: &LocalRateLimitConfig,
        shared: Option<&Arc<SharedLimits>>,
        ctx: &BuildCtx<'_>,
    ) -> Self {
        let stats = ctx.catalog.rate_limit(ctx.shard, &ctx.listener.name);
        Self::with_buckets(config, ctx.table, ctx.filter, shared, stats)
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut Option<Verdict>,
    ) -> Result<HeadersFlow, ProxyError> {
        Ok(HeadersFlow::Flow(self.take(req, exchange, state)))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        _: &ResponseCtx<'_>,
        state: &mut Option<Verdict>,
    ) -> Option<BodyFilter> {
        if let Some(verdict) = state.take() {
            verdict.add_headers(head.headers);
        }
        None
    }
}

impl LocalRateLimit {
    /// Buckets with `scope: process` come from `shared`; per-worker ones are made here.
    fn with_buckets(
        config: &LocalRateLimitConfig,
        table: &RouteConfiguration,
        filter: &str,
        shared: Option<&Arc<SharedLimits>>,
        stats: RateLimitStats,
    ) -> Self {
        let buckets =
            PerRouteSettings::new_at(config, table, filter, bucket_settings, |level, config| match config
                .scope
            {
                RateLimitScope::Process => {
                    shared.and_then(|s| s.0.at(level)).and_then(Clone::clone)
                }
                RateLimitScope::Worker => Limiter::new(config).map(Arc::new),
            });
        Self { buckets, stats }
    }

    /// The most specific level's bucket: the route's, its host's, or the listener's.
    fn limiter(&self, exchange: &Exchange<'_>) -> Option<&Limiter> {
        self.buckets.get(exchange).and_then(Option::as_deref)
    }

    /// Takes a token from the request's buckets, or answers with the configured status.
    fn take(
        &self,
        req: &Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut Option<Verdict>,
    ) -> Flow {
        let Some(limiter) = self.limiter(exchange) else {
            return Flow::Continue;
        };
        let config = &limiter.config;
        if !drawn(config.enabled) {
            return Flow::Continue;
        }
        let described = Described { req, exchange };
        let headers_always = config.x_ratelimit_headers == RateLimitHeaders::Always;
        let verdict = match limiter.check(&described, Instant::now()) {
            Check::Allowed(verdict) => {
                self.stats.ok.inc();
                if headers_always {
                    *state = verdict;
                }
                return Flow::Continue;
            }
            Check::Shadowed(verdict) => {
                self.stats.shadow_mode.inc();
                if headers_always {
                    *state = Some(verdict);
                }
                return Flow::Continue;
            }
            Check::Limited(verdict) => verdict,
        };
        self.stats.rate_limited.inc();
        if !drawn(config.enforced) {
            if headers_always {
                *state = Some(verdict);
            }
            return Flow::Continue;
        }
        self.stats.enforced.inc();
        let mut reply = LocalReply::new(config.status, Bytes::from_static(b"rate limited\n"));
        if config.x_ratelimit_headers != RateLimitHeaders::Never {
            verdict.add_headers(&mut reply.headers);
        }
        if config.retry_after {
            reply
                .headers
                .insert(RETRY_AFTER, reset_seconds(verdict.taken).into());
        }
        if let Some(mutations) = &limiter.response_headers {
            mutations.apply_to_reply(&mut reply.headers, exchange);
        }
        reply.flag = Some(ResponseFlag::RateLimited);
        Flow::Respond(Box::new(reply))
    }
}


impl Verdict {
    /// The IETF draft's headers, as Envoy writes them: the bucket's size, what is left, and
    /// the seconds until it refills.
    fn add_headers(&self, headers: &mut HeaderMap) {
        headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(self.limit));
        headers.insert(
            X_RATELIMIT_REMAINING.clone(),
            HeaderValue::from(self.taken.remaining),
        );
        headers.insert(X_RATELIMIT_RESET.clone(), reset_seconds(self.taken).into());
    }
}

/// Whole seconds until the next fill, rounded up (a client waiting that long finds a token).
fn reset_seconds(taken: Taken) -> u64 {
    taken.reset.as_millis().div_ceil(1000) as u64
}
