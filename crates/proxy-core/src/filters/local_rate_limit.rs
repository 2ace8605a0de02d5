//! The `local_rate_limit` filter (Envoy's local rate limit): a request takes a token from its
//! bucket, or gets `status` (429) with `x-ratelimit-*` and `retry-after` headers. A bucket per
//! listener or per route, shared by the workers or one per worker, and optionally one per
//! client IP or header value.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Request};
use tokio::time::Instant;

use super::token_bucket::{KeyedBuckets, Taken, TokenBucket};
use super::{
    BodyFilter, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings,
    ResponseCtx, ResponseHead,
};
use crate::error::ProxyError;
use crate::catalog::RateLimitStats;
use crate::context::RequestBody;
use crate::error::ResponseFlag;
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
    /// The bucket's size, for `x-ratelimit-limit`.
    max_tokens: u32,
    /// Requests without a key (or all of them, when there is no key).
    unkeyed: TokenBucket,
    keyed: Option<KeyedBuckets>,
}

impl Limiter {
    /// `None` for a config without a bucket (the filter then limits only routes with one).
    fn new(config: &LocalRateLimitConfig) -> Option<Self> {
        let bucket = config.token_bucket?;
        Some(Self {
            config: config.clone(),
            max_tokens: bucket.max_tokens,
            unkeyed: TokenBucket::new(bucket, Instant::now()),
            keyed: config
                .key
                .as_ref()
                .map(|_| KeyedBuckets::new(bucket, config.max_keys)),
        })
    }

    fn try_take(&self, headers: &HeaderMap, client: IpAddr, now: Instant) -> Taken {
        let Some(keyed) = &self.keyed else {
            return self.unkeyed.try_take(now);
        };
        match &self.config.key {
            Some(RateLimitKey::ClientIp) => match client {
                IpAddr::V4(ip) => keyed.try_take(&ip.octets(), now),
                IpAddr::V6(ip) => keyed.try_take(&ip.octets(), now),
            },
            Some(RateLimitKey::Header(name)) => match headers.get(name) {
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
    pub(crate) fn new(listener: &LocalRateLimitConfig, table: &RouteConfiguration) -> Self {
        Self(PerRouteSettings::new(
            listener,
            table,
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
    fn shared(config: &LocalRateLimitConfig, listener: &config::ListenerConfig) -> Option<Self::Shared> {
        Some(Arc::new(SharedLimits::new(config, &listener.route_config)))
    }

    fn new(
        config: &LocalRateLimitConfig,
        shared: Option<&Arc<SharedLimits>>,
        ctx: &BuildCtx<'_>,
    ) -> Self {
        let stats = ctx.catalog.rate_limit(ctx.shard, &ctx.listener.name);
        Self::with_buckets(config, ctx.table, shared, stats)
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
        shared: Option<&Arc<SharedLimits>>,
        stats: RateLimitStats,
    ) -> Self {
        let buckets =
            PerRouteSettings::new_at(config, table, bucket_settings, |level, config| match config
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

    /// Takes a token from the request's bucket, or answers with the configured status.
    fn take(
        &self,
        req: &Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut Option<Verdict>,
    ) -> Flow {
        let Some(limiter) = self.limiter(exchange) else {
            return Flow::Continue;
        };
        let taken = limiter.try_take(
            req.headers(),
            exchange.client.ip(exchange.conn),
            Instant::now(),
        );
        let config = &limiter.config;
        let verdict = Verdict {
            limit: limiter.max_tokens,
            taken,
        };
        if taken.allowed {
            self.stats.ok.inc();
            if config.x_ratelimit_headers == RateLimitHeaders::Always {
                *state = Some(verdict);
            }
            return Flow::Continue;
        }
        self.stats.rate_limited.inc();
        let mut reply = LocalReply::new(config.status, Bytes::from_static(b"rate limited\n"));
        if config.x_ratelimit_headers != RateLimitHeaders::Never {
            verdict.add_headers(&mut reply.headers);
        }
        reply
            .headers
            .insert(RETRY_AFTER, reset_seconds(verdict.taken).into());
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
