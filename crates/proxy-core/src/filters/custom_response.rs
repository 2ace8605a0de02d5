//! The `custom_response` filter (Envoy's): in the response phase, the first rule whose match
//! holds for the response (an upstream's or one made here) gives it a new status, body or
//! headers. A new body replaces the response's own, which is not read.

use config::CustomResponseConfig;

use super::per_route::Level;
use super::{
    BodyFilter, BuildCtx, HttpFilter, PerRouteSettings, ReplyRewrite, ResponseCtx, ResponseHead,
};

pub(crate) struct CustomResponse {
    settings: PerRouteSettings<Rules>,
    /// A rule's header values read the request id.
    uses_request_id: bool,
}

/// A level's rules, each with its rewrite made for this worker.
struct Rules(Box<[(config::ResponseMatch, ReplyRewrite)]>);

impl HttpFilter for CustomResponse {
    type Config = CustomResponseConfig;
    type Shared = ();
    type State = ();

    fn new(config: &CustomResponseConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        let build = |config: &CustomResponseConfig| {
            Rules(
                (config.rules.iter())
                    .map(|rule| (rule.when.clone(), ReplyRewrite::new(&rule.rewrite)))
                    .collect(),
            )
        };
        let settings =
            PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.custom_response, build);
        let uses_request_id = [Level::Listener]
            .into_iter()
            .chain((0..ctx.table.virtual_hosts.len()).map(Level::Host))
            .chain((0..ctx.table.routes.len()).map(Level::Route))
            .filter_map(|level| settings.at(level))
            .any(|Rules(rules)| rules.iter().any(|(_, rewrite)| rewrite.uses_request_id()));
        Self {
            settings,
            uses_request_id,
        }
    }

    /// Its header values may name the request id (`%REQ_ID%`).
    fn uses_request_id(&self) -> bool {
        self.uses_request_id
    }

    /// The route's rules, then its virtual host's, then the listener's: the first rule that
    /// matches, at the most specific level that has one (Envoy's order). Its answer is a new
    /// response, as Envoy's local reply: its own status, headers and body (empty without
    /// one).
    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        ctx: &ResponseCtx<'_>,
        _: &mut (),
    ) -> Option<BodyFilter> {
        if ctx.info.upgraded || head.replaced {
            return None;
        }
        // A reply the proxy made has no upstream.
        let local = ctx.info.upstream.is_none();
        let (_, rewrite) = (self.settings.layered(ctx.exchange).into_iter().rev())
            .flatten()
            .flat_map(|Rules(rules)| rules.iter())
            .find(|(when, _)| when.holds(head.status, head.headers, local))?;
        head.headers.clear();
        let scratch = std::cell::RefCell::new(Vec::new());
        let body = rewrite.apply(&mut head.status, head.headers, |rules, headers| {
            rules.apply_in(headers, ctx.exchange, ctx.request_id, ctx.info.upstream, &scratch)
        });
        head.replaced = true;
        if ctx.info.grpc_request {
            // Envoy's local reply to a gRPC call: trailers-only, the body as its message.
            let body = body.unwrap_or_default();
            let head_request = ctx.info.head_request;
            crate::context::grpc::local_reply(&mut head.status, head.headers, &body, None, head_request);
            return Some(BodyFilter::replace(bytes::Bytes::new()));
        }
        let body = body.unwrap_or_else(|| {
            head.headers
                .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(0));
            bytes::Bytes::new()
        });
        Some(BodyFilter::replace(body))
    }
}
