//! The `fault` filter (Envoy's fault injection): a share of requests waits before going on,
//! and a share is answered with an error in the upstream's place. Fixed, or asked for by the
//! request's `x-envoy-fault-*` headers where the settings say `header`; a route's settings
//! replace the listener's. Delays come first, then aborts, as Envoy's.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};

use super::{BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings};
use crate::catalog::FaultStats;
use crate::context::RequestBody;
use crate::error::{ProxyError, ResponseFlag};
use crate::random::next_u64;
use config::{AbortSource, DelaySource, FaultConfig, FaultShare};

const DELAY_REQUEST: &str = "x-envoy-fault-delay-request";
const DELAY_PERCENTAGE: &str = "x-envoy-fault-delay-request-percentage";
const ABORT_REQUEST: &str = "x-envoy-fault-abort-request";
const ABORT_GRPC_REQUEST: &str = "x-envoy-fault-abort-grpc-request";
const ABORT_PERCENTAGE: &str = "x-envoy-fault-abort-request-percentage";

/// The filter on one worker.
pub(crate) struct Fault {
    settings: PerRouteSettings<FaultConfig>,
    stats: FaultStats,
}

impl HttpFilter for Fault {
    type Config = FaultConfig;
    type Shared = ();
    type State = ();

    fn new(config: &FaultConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self {
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.fault, Clone::clone),
            stats: ctx.catalog.fault(ctx.shard, &ctx.listener.name),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        let Some(config) = self.settings.get(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        if let Some(delay) = config.delay.as_ref().and_then(|d| delay_for(d, req.headers())) {
            self.stats.delays_injected.inc();
            tokio::time::sleep(delay).await;
        }
        let Some(abort) = config.abort.as_ref() else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        let Some(answer) = abort_for(abort, req.headers()) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        self.stats.aborts_injected.inc();
        let mut reply = reply(answer, &abort.body);
        reply.flag = Some(ResponseFlag::FaultInjected);
        Ok(HeadersFlow::Flow(Flow::Respond(Box::new(reply))))
    }
}

/// How a request is aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Http(StatusCode),
    Grpc(u32),
}

/// The abort's reply: a gRPC status is a 200 whose gRPC status, for a gRPC request, is the
/// abort's (the local reply's gRPC form carries it); any other request gets the 200 with
/// the body, as Envoy's.
fn reply(answer: Answer, body: &str) -> LocalReply {
    match answer {
        Answer::Http(status) => LocalReply::new(status, Bytes::from(body.to_owned())),
        Answer::Grpc(code) => {
            let mut reply = LocalReply::new(StatusCode::OK, Bytes::from(body.to_owned()));
            reply.grpc_status = Some(code);
            reply
        }
    }
}

/// A number from a request header, if it carries one.
fn header_number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Whether this request falls in `share`, or in the smaller share its header asks for.
fn rolled(share: &FaultShare, headers: &HeaderMap, percentage_header: Option<&str>) -> bool {
    let asked = percentage_header
        .and_then(|name| header_number(headers, name))
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let per_million = share.with_header(asked);
    per_million > 0 && (next_u64() % 1_000_000) < u64::from(per_million)
}

/// The delay for this request, if it gets one.
fn delay_for(delay: &config::FaultDelay, headers: &HeaderMap) -> Option<Duration> {
    match delay.source {
        DelaySource::Fixed(fixed) => rolled(&delay.share, headers, None).then_some(fixed),
        DelaySource::Header => {
            // Asked for by the request, in milliseconds; no header, no delay.
            let millis = header_number(headers, DELAY_REQUEST)?;
            rolled(&delay.share, headers, Some(DELAY_PERCENTAGE))
                .then(|| Duration::from_millis(millis.min(24 * 3600 * 1000)))
        }
    }
}

/// How this request is aborted, if it is.
fn abort_for(abort: &config::FaultAbort, headers: &HeaderMap) -> Option<Answer> {
    match abort.source {
        AbortSource::Status(status) => {
            rolled(&abort.share, headers, None).then_some(Answer::Http(status))
        }
        AbortSource::GrpcStatus(code) => {
            rolled(&abort.share, headers, None).then_some(Answer::Grpc(code))
        }
        AbortSource::Header => {
            // Asked for by the request: an HTTP status (one outside 200..600 is ignored, as
            // Envoy), or else a gRPC status.
            let http = header_number(headers, ABORT_REQUEST)
                .and_then(|n| u16::try_from(n).ok())
                .filter(|code| (200..600).contains(code))
                .and_then(|code| StatusCode::from_u16(code).ok());
            let answer = match http {
                Some(status) => Answer::Http(status),
                None => Answer::Grpc(
                    u32::try_from(header_number(headers, ABORT_GRPC_REQUEST)?).ok()?,
                ),
            };
            rolled(&abort.share, headers, Some(ABORT_PERCENTAGE)).then_some(answer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::{FaultAbort, FaultDelay};

    fn share(percent: u32) -> FaultShare {
        FaultShare {
            per_million: percent * 10_000,
            header_denominator: 100,
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, http::HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn a_grpc_abort_is_a_200_that_carries_its_grpc_status() {
        let reply = reply(Answer::Grpc(14), "fault filter abort");
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.grpc_status, Some(14));
        assert_eq!(&reply.body[..], b"fault filter abort");
        let http = reply_for(Answer::Http(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(http.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(http.grpc_status, None);
    }

    fn reply_for(answer: Answer) -> LocalReply {
        reply(answer, "fault filter abort")
    }

    #[test]
    fn all_or_nothing_shares_decide_alone() {
        let always = FaultDelay {
            source: DelaySource::Fixed(Duration::from_millis(5)),
            share: share(100),
        };
        let never = FaultDelay {
            share: share(0),
            ..always.clone()
        };
        for _ in 0..1000 {
            assert_eq!(delay_for(&always, &HeaderMap::new()), Some(Duration::from_millis(5)));
            assert_eq!(delay_for(&never, &HeaderMap::new()), None);
        }
    }

    #[test]
    fn header_faults_need_their_header_and_are_capped_by_the_share() {
        let abort = FaultAbort {
            source: AbortSource::Header,
            share: share(100),
            body: "fault filter abort".into(),
        };
        assert_eq!(abort_for(&abort, &HeaderMap::new()), None);
        let asked = headers(&[(ABORT_REQUEST, "503")]);
        assert_eq!(
            abort_for(&abort, &asked),
            Some(Answer::Http(StatusCode::SERVICE_UNAVAILABLE))
        );
        // A status outside 200..600 asks for nothing.
        assert_eq!(abort_for(&abort, &headers(&[(ABORT_REQUEST, "700")])), None);
        // A gRPC status, where no HTTP one is asked for.
        let grpc = headers(&[(ABORT_GRPC_REQUEST, "14")]);
        assert_eq!(abort_for(&abort, &grpc), Some(Answer::Grpc(14)));
        // The request's own percentage: 0 of 100.
        let none = headers(&[(ABORT_REQUEST, "503"), (ABORT_PERCENTAGE, "0")]);
        assert_eq!(abort_for(&abort, &none), None);
        // A share of 0% caps whatever the request asks.
        let capped = FaultAbort {
            share: share(0),
            ..abort
        };
        let all = headers(&[(ABORT_REQUEST, "503"), (ABORT_PERCENTAGE, "100")]);
        assert_eq!(abort_for(&capped, &all), None);
        let delay = FaultDelay {
            source: DelaySource::Header,
            share: share(100),
        };
        assert_eq!(
            delay_for(&delay, &headers(&[(DELAY_REQUEST, "250")])),
            Some(Duration::from_millis(250))
        );
    }
}
