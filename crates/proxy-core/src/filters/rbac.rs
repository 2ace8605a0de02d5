//! The `rbac` filter (Envoy's): the first rule that holds for a request decides whether it
//! goes on (`allow`, `log`) or is answered 403 `RBAC: access denied` (`deny`); `on_no_match`
//! decides when none holds. Shadow rules are evaluated and counted, never enforced. A route
//! or virtual host may carry rules of its own, which replace the listener's, or turn the
//! filter off.

use bytes::Bytes;
use http::{Request, StatusCode};

use super::{BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings};
use crate::catalog::{RbacShadowStats, RbacStats};
use crate::context::{ConnCtx, JwtMetadata, RequestBody};
use crate::error::ProxyError;
use crate::pseudo_headers::request_header;
use config::{RbacAction, RbacConfig, RbacMatch, RbacRules};

/// The filter on one worker.
pub(crate) struct Rbac {
    settings: PerRouteSettings<Engines>,
}

/// One level's rules with their counters on this worker.
struct Engines {
    enforced: Option<(RbacRules, RbacStats)>,
    shadow: Option<(RbacRules, RbacShadowStats)>,
}

impl HttpFilter for Rbac {
    type Config = RbacConfig;
    type Shared = ();
    type State = ();

    fn new(config: &RbacConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        let listener = ctx.listener.name.as_str();
        // As in Envoy, the listener's filter names the counters; a route's rules count there.
        let (prefix, shadow_prefix) = (&config.rules_stat_prefix, &config.shadow_rules_stat_prefix);
        let engines = |level: &RbacConfig| Engines {
            enforced: (level.rules.clone())
                .map(|rules| (rules, ctx.catalog.rbac(ctx.shard, listener, prefix))),
            shadow: (level.shadow_rules.clone())
                .map(|rules| (rules, ctx.catalog.rbac_shadow(ctx.shard, listener, shadow_prefix))),
        };
        Self {
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.rbac, engines),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        let Some(engines) = self.settings.get(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        let request = RequestView {
            req: Some(req),
            conn: exchange.conn,
            client: exchange.client.ip(exchange.conn),
        };
        if let Some((rules, stats)) = &engines.shadow {
            match decide(rules, &request) {
                RbacAction::Deny => stats.shadow_denied.inc(),
                RbacAction::Allow | RbacAction::Log => stats.shadow_allowed.inc(),
            }
        }
        let Some((rules, stats)) = &engines.enforced else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        if decide(rules, &request) != RbacAction::Deny {
            stats.allowed.inc();
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        stats.denied.inc();
        Ok(HeadersFlow::Flow(Flow::Respond(Box::new(LocalReply::new(
            StatusCode::FORBIDDEN,
            Bytes::from_static(b"RBAC: access denied"),
        )))))
    }
}

/// What rules read of a request: its head (none for a relayed TCP connection), its
/// connection and its client's address.
struct RequestView<'a> {
    req: Option<&'a Request<RequestBody>>,
    conn: &'a ConnCtx,
    client: std::net::IpAddr,
}

/// The decision of `rules` for a TCP connection (the network `rbac` filter): they read what
/// the connection shows, its client being its peer (after a PROXY protocol header).
pub(crate) fn decide_connection(rules: &RbacRules, conn: &ConnCtx) -> RbacAction {
    decide(
        rules,
        &RequestView {
            req: None,
            conn,
            client: conn.peer.ip(),
        },
    )
}

/// The action of the first rule that holds, else the rules' `on_no_match`.
fn decide(rules: &RbacRules, request: &RequestView<'_>) -> RbacAction {
    (rules.matchers.iter())
        .find(|rule| holds(&rule.when, request))
        .map_or(rules.on_no_match, |rule| rule.action)
}

fn holds(m: &RbacMatch, request: &RequestView<'_>) -> bool {
    let RequestView { req, conn, client } = request;
    match m {
        RbacMatch::Any => true,
        RbacMatch::And(all) => all.iter().all(|m| holds(m, request)),
        RbacMatch::Or(any) => any.iter().any(|m| holds(m, request)),
        RbacMatch::Not(inner) => !holds(inner, request),
        // A TCP listener's rules read no request (checked at load).
        RbacMatch::Header { .. } | RbacMatch::Path(_) | RbacMatch::Metadata(_) => {
            req.is_some_and(|req| holds_on_request(m, req, conn))
        }
        RbacMatch::DestinationPort { start, end } => {
            (*start..*end).contains(&u32::from(conn.local.port()))
        }
        RbacMatch::DestinationIp(nets) => in_any(nets, conn.local.ip()),
        RbacMatch::RemoteIp(nets) => in_any(nets, *client),
        RbacMatch::SourceIp(nets) => in_any(nets, conn.peer.ip()),
        RbacMatch::DirectRemoteIp(nets) => in_any(nets, conn.socket_peer.ip()),
        RbacMatch::RequestedServerName(pattern) => {
            pattern.matches(conn.server_name.as_deref().unwrap_or("").as_bytes())
        }
        RbacMatch::Authenticated(name) => match (&conn.client_cert, name) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(cert), Some(pattern)) => {
                let names = cert.names();
                (names.uris.iter().chain(&names.dns_names))
                    .any(|n| pattern.matches(n.as_bytes()))
                    || pattern.matches(names.subject.as_bytes())
            }
        },
    }
}

/// A rule that reads the request's head or what filters left on it.
fn holds_on_request(m: &RbacMatch, req: &Request<RequestBody>, conn: &ConnCtx) -> bool {
    match m {
        RbacMatch::Header { name, value } if name.starts_with(':') => {
            let tls = conn.listener.tls;
            value.matches_value(request_header(req.method(), req.uri(), req.headers(), tls, name))
        }
        RbacMatch::Header { name, value } => {
            let values = req.headers().get_all(name.as_str()).iter();
            value.matches_header(name, values.map(|v| v.as_bytes()))
        }
        RbacMatch::Path(pattern) => pattern.matches(req.uri().path().as_bytes()),
        RbacMatch::Metadata(m) => m.matches(JwtMetadata::of(req)),
        _ => false,
    }
}

/// Whether `ip` is in one of `nets`; an IPv4 address a dual-stack socket maps into IPv6 is
/// read as the IPv4 address it is.
fn in_any(nets: &[ipnet::IpNet], ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    nets.iter().any(|n| n.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_clients_of_a_dual_stack_socket_match_ipv4_ranges() {
        let nets = ["10.0.0.0/8".parse().unwrap()];
        let mapped: std::net::IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert!(in_any(&nets, mapped));
        assert!(in_any(&nets, "10.9.9.9".parse().unwrap()));
        assert!(!in_any(&nets, "::ffff:11.1.2.3".parse().unwrap()));
        let v6 = ["2001:db8::/32".parse().unwrap()];
        assert!(in_any(&v6, "2001:db8::1".parse().unwrap()));
        assert!(!in_any(&v6, mapped));
    }
}
