//! The `headers` filter: header changes to requests before they are forwarded and to
//! responses before the client gets them, with a few variables. A route's rules apply after
//! its listener's, so a route's `set` wins (or before them, where the listener says
//! `most_specific_wins: false`, as Envoy's route configurations do by default).

use std::cell::RefCell;
use std::io::Write as _;

use http::{HeaderMap, HeaderName, HeaderValue, Request};

use super::{
    BodyFilter, BuildCtx, Exchange, HeadersFlow, HttpFilter, PerRouteSettings, ResponseCtx,
    ResponseHead,
};
use crate::error::ProxyError;
use crate::context::RequestBody;
use crate::context::request_id::X_REQUEST_ID;
use config::{
    HeaderMutations, HeaderRulesConfig, HeaderTemplate, RouteAction, RouteConfiguration,
    StringMatch, TemplatePart,
};

/// The filter on one worker: rules with their static values made into headers once.
pub(crate) struct Headers {
    rules: PerRouteSettings<Rules>,
    /// Per route, the rules of each cluster of its `weighted_clusters` (empty without one):
    /// applied first, to the requests drawn there (Envoy's order).
    weighted: Box<[Box<[Option<Rules>]>]>,
    /// Levels applied listener first (the route's `set` wins), or route first.
    most_specific_wins: bool,
    /// Where templated values are written before they become header values: one buffer per
    /// worker, so rendering allocates only the value itself.
    scratch: RefCell<Vec<u8>>,
}

struct Rules {
    request: Mutations,
    response: Mutations,
}

/// One direction's changes, ready to apply (also the headers another filter puts on its
/// local replies).
pub(crate) struct Mutations {
    remove: Vec<HeaderName>,
    remove_matching: Vec<StringMatch>,
    set: Vec<(HeaderName, Value)>,
    add: Vec<(HeaderName, Value)>,
    add_if_absent: Vec<(HeaderName, Value)>,
    /// A value writes `%REQ_ID%`.
    uses_request_id: bool,
}

enum Value {
    Static(HeaderValue),
    // A value that is one variable: the header value the exchange already has, shared.
    ClientIp,
    RequestId,
    UpstreamHost,
    Template(HeaderTemplate),
}

/// What variables stand for in one exchange.
struct Vars<'a> {
    exchange: &'a Exchange<'a>,
    request_id: Option<&'a HeaderValue>,
    upstream: Option<&'a HeaderValue>,
    scratch: &'a RefCell<Vec<u8>>,
}

impl HttpFilter for Headers {
    type Config = HeaderRulesConfig;
    type Shared = ();
    type State = ();

    fn new(config: &HeaderRulesConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self::from_table(config, ctx.table, ctx.filter)
    }

    /// Whether a rule writes `%REQ_ID%`: the request then gets its id before the filters run.
    fn uses_request_id(&self) -> bool {
        let weighted = self.weighted.iter().flat_map(|r| r.iter().flatten());
        (self.rules.all().chain(weighted))
            .any(|r| r.request.uses_request_id || r.response.uses_request_id)
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        self.on_request(req, exchange);
        Ok(HeadersFlow::Flow(super::Flow::Continue))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        ctx: &ResponseCtx<'_>,
        _: &mut (),
    ) -> Option<BodyFilter> {
        let vars = Vars {
            exchange: ctx.exchange,
            request_id: ctx.request_id,
            upstream: ctx.info.upstream,
            scratch: &self.scratch,
        };
        for rules in self.in_order(ctx.exchange) {
            if !rules.response.is_empty() {
                rules.response.apply(head.headers, &vars);
            }
        }
        None
    }
}

impl Headers {
    pub(crate) fn from_table(
        config: &HeaderRulesConfig,
        table: &RouteConfiguration,
        filter: &str,
    ) -> Self {
        // A weighted cluster's rules belong to the chain's `headers` filter (not to another
        // one named `headers/...`), so they apply once.
        let weighted = (table.routes.iter())
            .filter(|_| filter == "headers")
            .map(|route| match &route.action {
                RouteAction::Forward(forward) => (forward.split.iter())
                    .flat_map(|split| &split.clusters)
                    .map(|c| c.headers.as_ref().map(Rules::new))
                    .collect(),
                _ => Box::default(),
            })
            .collect();
        Self {
            rules: PerRouteSettings::new(config, table, filter, |f| &f.headers, Rules::new),
            weighted,
            most_specific_wins: config.most_specific_wins,
            scratch: RefCell::new(Vec::with_capacity(128)),
        }
    }

    /// The rules in the order they apply (the last one's `set` wins): the drawn weighted
    /// cluster's first, then the levels'.
    fn in_order<'a>(&'a self, exchange: &Exchange<'_>) -> impl Iterator<Item = &'a Rules> + Clone {
        let mut levels = self.rules.layered(exchange);
        if !self.most_specific_wins {
            levels.reverse();
        }
        let drawn = exchange
            .route
            .zip(exchange.weighted_cluster)
            .and_then(|(route, drawn)| self.weighted.get(route)?.get(drawn)?.as_ref());
        drawn.into_iter().chain(levels.into_iter().flatten())
    }

    fn on_request(&self, req: &mut Request<RequestBody>, exchange: &Exchange<'_>) {
        let rules = self.in_order(exchange).filter(|r| !r.request.is_empty());
        // Most requests meet no rule, or rules without variables: look nothing up for them.
        if rules.clone().next().is_none() {
            return;
        }
        let request_id = if rules.clone().any(|r| r.request.uses_request_id) {
            req.headers().get(&X_REQUEST_ID).cloned()
        } else {
            None
        };
        let vars = Vars {
            exchange,
            request_id: request_id.as_ref(),
            upstream: None,
            scratch: &self.scratch,
        };
        for rules in rules {
            rules.request.apply(req.headers_mut(), &vars);
        }
    }

}

impl Rules {
    fn new(config: &HeaderRulesConfig) -> Self {
        Self {
            request: Mutations::new(&config.request),
            response: Mutations::new(&config.response),
        }
    }
}

impl Mutations {
    pub(crate) fn new(config: &HeaderMutations) -> Self {
        let values = |entries: &[(HeaderName, HeaderTemplate)]| {
            entries
                .iter()
                .map(|(name, template)| (name.clone(), Value::new(template)))
                .collect()
        };
        let uses_request_id = config
            .set
            .iter()
            .chain(&config.add)
            .chain(&config.add_if_absent)
            .any(|(_, template)| template.uses(&TemplatePart::RequestId));
        Self {
            remove: config.remove.clone(),
            remove_matching: config.remove_matching.clone(),
            set: values(&config.set),
            add: values(&config.add),
            add_if_absent: values(&config.add_if_absent),
            uses_request_id,
        }
    }

    /// Applies the changes to a request before it is routed (a listener's early header
    /// mutation): no route, host or upstream known yet.
    pub(crate) fn apply_to_request(&self, headers: &mut HeaderMap, exchange: &Exchange<'_>) {
        let request_id = if self.uses_request_id {
            headers.get(&X_REQUEST_ID).cloned()
        } else {
            None
        };
        let vars = Vars {
            exchange,
            request_id: request_id.as_ref(),
            upstream: None,
            scratch: &RefCell::new(Vec::new()),
        };
        self.apply(headers, &vars);
    }

    /// Applies the changes to a reply made here: no upstream, and a request id only if the
    /// reply carries one already.
    pub(crate) fn apply_to_reply(&self, headers: &mut HeaderMap, exchange: &Exchange<'_>) {
        let request_id = headers.get(&X_REQUEST_ID).cloned();
        let scratch = RefCell::new(Vec::new());
        let vars = Vars {
            exchange,
            request_id: request_id.as_ref(),
            upstream: None,
            scratch: &scratch,
        };
        self.apply(headers, &vars);
    }

    /// Applies the changes with what the exchange knows at this point: its request id, and
    /// (for a response) the upstream host that answered.
    pub(crate) fn apply_in(
        &self,
        headers: &mut HeaderMap,
        exchange: &Exchange<'_>,
        request_id: Option<&HeaderValue>,
        upstream: Option<&HeaderValue>,
        scratch: &RefCell<Vec<u8>>,
    ) {
        let vars = Vars {
            exchange,
            request_id,
            upstream,
            scratch,
        };
        self.apply(headers, &vars);
    }

    /// A value writes `%REQ_ID%`.
    pub(crate) fn uses_request_id(&self) -> bool {
        self.uses_request_id
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remove.is_empty()
            && self.remove_matching.is_empty()
            && self.set.is_empty()
            && self.add.is_empty()
            && self.add_if_absent.is_empty()
    }

    fn apply(&self, headers: &mut HeaderMap, vars: &Vars<'_>) {
        for name in &self.remove {
            headers.remove(name);
        }
        if !self.remove_matching.is_empty() {
            let matched: Vec<HeaderName> = headers
                .keys()
                .filter(|name| {
                    config::changeable(name)
                        && self
                            .remove_matching
                            .iter()
                            .any(|m| m.matches(name.as_str().as_bytes()))
                })
                .cloned()
                .collect();
            for name in matched {
                headers.remove(name);
            }
        }
        for (name, value) in &self.set {
            if let Some(value) = value.render(vars) {
                headers.insert(name.clone(), value);
            }
        }
        for (name, value) in &self.add {
            if let Some(value) = value.render(vars) {
                headers.append(name.clone(), value);
            }
        }
        for (name, value) in &self.add_if_absent {
            if !headers.contains_key(name)
                && let Some(value) = value.render(vars)
            {
                headers.insert(name.clone(), value);
            }
        }
    }
}

impl Value {
    fn new(template: &HeaderTemplate) -> Self {
        match template.0.as_slice() {
            [] => Value::Static(HeaderValue::from_static("")),
            [TemplatePart::Literal(text)] => match HeaderValue::from_str(text) {
                Ok(value) => Value::Static(value),
                // Validated at load; kept as a template that renders the same bytes.
                Err(_) => Value::Template(template.clone()),
            },
            [TemplatePart::ClientIp] => Value::ClientIp,
            [TemplatePart::RequestId] => Value::RequestId,
            [TemplatePart::UpstreamHost] => Value::UpstreamHost,
            _ => Value::Template(template.clone()),
        }
    }

    /// The value for this exchange; `None` when a variable has nothing to stand for (a header
    /// with an empty value would only mislead).
    fn render(&self, vars: &Vars<'_>) -> Option<HeaderValue> {
        let template = match self {
            Value::Static(value) => return Some(value.clone()),
            Value::ClientIp => {
                return Some(vars.exchange.client.ip_text(vars.exchange.conn));
            }
            Value::RequestId => return vars.request_id.cloned(),
            Value::UpstreamHost => return vars.upstream.cloned(),
            Value::Template(template) => template,
        };
        let mut out = vars.scratch.borrow_mut();
        out.clear();
        let client = vars.exchange.client;
        for part in &template.0 {
            match part {
                TemplatePart::Literal(text) => out.extend_from_slice(text.as_bytes()),
                TemplatePart::ClientAddress => {
                    let _ = write!(out, "{}", client.addr(vars.exchange.conn));
                }
                TemplatePart::ClientIp => match client.ip(vars.exchange.conn) {
                    std::net::IpAddr::V4(ip) => {
                        let _ = write!(out, "{ip}");
                    }
                    std::net::IpAddr::V6(ip) => {
                        let _ = write!(out, "{ip}");
                    }
                },
                TemplatePart::RequestId => out.extend_from_slice(vars.request_id?.as_bytes()),
                TemplatePart::UpstreamHost => out.extend_from_slice(vars.upstream?.as_bytes()),
            }
        }
        HeaderValue::from_bytes(&out).ok()
    }
}
