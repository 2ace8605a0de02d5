//! The `custom_response` filter (Envoy's): in the response phase, the first rule whose match
//! holds for the response (an upstream's or one made here) gives it a new status, body or
//! headers. A new body replaces the response's own, which is not read.

use config::CustomResponseConfig;

use super::{
    BodyFilter, BuildCtx, HttpFilter, PerRouteSettings, ReplyRewrite, ResponseCtx, ResponseHead,
};

pub(crate) struct CustomResponse {
    settings: PerRouteSettings<Rules>,
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
        Self {
            settings: PerRouteSettings::new(
                config,
                ctx.table,
                ctx.filter,
                |f| &f.custom_response,
                build,
            ),
        }
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        ctx: &ResponseCtx<'_>,
        _: &mut (),
    ) -> Option<BodyFilter> {
        let Rules(rules) = self.settings.get(ctx.exchange)?;
        let (_, rewrite) = rules
            .iter()
            .find(|(when, _)| when.holds(head.status, head.headers))?;
        let body = rewrite.apply(&mut head.status, head.headers, ctx.exchange)?;
        Some(BodyFilter::replace(body))
    }
}
