//! Listener + HttpConnectionManager -> a listener; its routes inline or by RDS name.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, Listener, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
};
use envoy_types::pb::google::protobuf::Any;

use crate::envoy::{
    ResourceError, decode, duration, fields, nothing_else, socket_address, type_url,
};
use crate::filters::api_key_auth::xds as api_key_auth;
use crate::filters::basic_auth::xds as basic_auth;
use crate::filters::buffer::xds as buffer;
use crate::filters::compression::xds as compression;
use crate::filters::csrf::xds as csrf;
use crate::filters::custom_response::xds as custom_response;
use crate::filters::ext_authz::xds::{self as ext_authz, XdsAuthz};
use crate::filters::ext_proc::xds::{self as ext_proc, XdsExtProc};
use crate::filters::fault::xds as fault;
use crate::filters::global_rate_limit::xds::{self as global_rate_limit, XdsGlobalRateLimit};
use crate::filters::grpc_web::xds as grpc_web;
use crate::filters::header_mutation::xds as header_mutation;
use crate::filters::health_check::xds as health_check;
use crate::filters::jwt_authn::xds as jwt_authn;
use crate::filters::local_rate_limit::xds as local_rate_limit;
use crate::filters::rbac::xds as rbac;
use crate::filters::{RawChainFilter, RawHttpFilter};
use crate::listener::client_address::{RawClientDetection, RawCustomHeader, RawXff};
use crate::route::xds::XdsRoutes;
use crate::tls::sds::{SecretRefs, Secrets};
use crate::tracing::xds::XdsCollector;
use crate::{RawCors, RawHttp, RawListener, RawPathNormalization, RawProxyProtocol};

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const CORS: &str = crate::filters::cors::xds::FILTER_TYPE_URL;
const GRPC_STATS: &str =
    "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig";
/// Listener filters that only look at the first bytes to pick a filter chain; with one chain
/// they change nothing.
const INSPECTORS: [&str; 2] = [
    "envoy.filters.listener.tls_inspector",
    "envoy.filters.listener.http_inspector",
];

const PROXY_PROTOCOL_FILTER: &str = "envoy.filters.listener.proxy_protocol";
const PROXY_PROTOCOL: &str =
    "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol";

/// The `envoy.filters.listener.proxy_protocol` listener filter as the listener's
/// `proxy_protocol`. TLVs are never read, so rules that keep them are refused.
fn proxy_protocol_filter(
    config: Option<listener_filter::ConfigType>,
    at: &str,
) -> Result<RawProxyProtocol, ResourceError> {
    let mut filter = match config {
        None => ProxyProtocol::default(),
        Some(listener_filter::ConfigType::TypedConfig(any)) => {
            decode::<ProxyProtocol>(&any, PROXY_PROTOCOL, "a ProxyProtocol listener filter")?
        }
        Some(_) => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec!["config_discovery".into()],
            });
        }
    };
    // `core.v3.ProxyProtocolConfig.Version`: V1 = 0, V2 = 1.
    let disallowed = std::mem::take(&mut filter.disallowed_versions);
    let versions = [(0, "v1"), (1, "v2")]
        .into_iter()
        .filter(|(number, _)| !disallowed.contains(number))
        .map(|(_, name)| name.to_owned())
        .collect();
    let required = !std::mem::take(&mut filter.allow_requests_without_proxy_protocol);
    filter.stat_prefix.clear();
    filter.tlv_location = 0;
    nothing_else(&filter, fields::PROXY_PROTOCOL, at)?;
    Ok(RawProxyProtocol {
        versions: Some(versions),
        required: Some(required),
    })
}

/// A listener from the management server.
#[derive(Debug, Clone)]
pub struct XdsListener {
    pub name: String,
    /// Its socket settings as the config file writes them, with no chain of its own.
    socket: RawListener,
    /// Its own chain: Envoy's only filter chain when nothing picks it, or its
    /// `default_filter_chain`. `None`: a connection no chain fits is closed.
    own: Option<XdsChain>,
    /// Its filter chains picked by `filter_chain_match`.
    chains: Vec<MatchedChain>,
}

#[derive(Debug, Clone)]
struct MatchedChain {
    name: String,
    matcher: crate::RawChainMatch,
    chain: XdsChain,
}

/// One filter chain from the management server: its TLS and HTTP connection manager (or TCP
/// relay).
#[derive(Debug, Clone)]
struct XdsChain {
    /// The chain as the config file would write a listener, without routes.
    raw: RawListener,
    /// Routes given with it.
    inline: Option<XdsRoutes>,
    /// The route configuration it takes from RDS.
    rds: Option<String>,
    /// Upgrades (`websocket`) every route allows.
    upgrades: Vec<String>,
    /// The HTTP filters before the router, in order.
    filters: Vec<XdsChainFilter>,
    /// Those of them off unless a virtual host or route turns them on (Envoy's `disabled`),
    /// by their names here.
    off_by_default: Vec<String>,
    /// The collector its connection manager's tracing names.
    collector: Option<XdsCollector>,
    /// Its connection manager's or TCP relay's loggers.
    logs: Vec<crate::access_log::xds::XdsAccessLog>,
    /// The secrets its TLS names (SDS): it warms until they are all there.
    secrets: SecretRefs,
    /// A QUIC listener's chain: its transport socket's `enable_early_data`.
    early_data: bool,
}

/// One HTTP filter of a listener from the management server, and its name here (the type, or
/// `TYPE/INSTANCE`).
#[derive(Debug, Clone)]
struct XdsChainFilter {
    name: String,
    filter: XdsHttpFilter,
}

#[derive(Debug, Clone)]
enum XdsHttpFilter {
    /// Its service's address is known once its cluster has a single host.
    ExtAuthz(XdsAuthz),
    /// Likewise its rate limit service's.
    GlobalRateLimit(XdsGlobalRateLimit),
    ExtProc(XdsExtProc),
    /// Settled as it came.
    Settled(RawHttpFilter),
}

impl XdsListener {
    pub fn decode(value: &Any) -> Result<Self, ResourceError> {
        let listener: Listener = decode(value, type_url::LISTENER, "a Listener")?;
        translate(listener)
    }

    fn all_chains(&self) -> impl Iterator<Item = &XdsChain> {
        self.own.iter().chain(self.chains.iter().map(|c| &c.chain))
    }

    /// The route configurations its chains take from RDS.
    pub fn route_names(&self) -> impl Iterator<Item = &str> {
        self.all_chains().filter_map(|c| c.rds.as_deref())
    }

    /// The secrets its chains' TLS names (SDS).
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        self.all_chains().flat_map(|c| c.secrets.names())
    }

    /// Whether every secret its chains name has arrived.
    pub fn secrets_ready(&self, secrets: &Secrets) -> bool {
        self.all_chains().all(|c| c.secrets.ready(secrets))
    }

    /// The clusters its TCP relays go to.
    pub fn tcp_clusters(&self) -> impl Iterator<Item = &str> {
        self.all_chains().flat_map(XdsChain::tcp_clusters)
    }

    /// The clusters its tracing collectors are found in.
    pub fn tracing_clusters(&self) -> impl Iterator<Item = &str> {
        self.all_chains().filter_map(XdsChain::tracing_cluster)
    }

    /// The clusters its loggers' collectors are found in.
    pub fn log_clusters(&self) -> impl Iterator<Item = &str> {
        self.all_chains().flat_map(XdsChain::log_clusters)
    }

    /// The clusters its services (authorization, rate limit) are found in.
    pub fn authz_clusters(&self) -> impl Iterator<Item = &str> {
        self.all_chains().flat_map(XdsChain::authz_clusters)
    }

    /// The clusters its JWT providers fetch their key sets through.
    pub fn jwks_clusters(&self) -> impl Iterator<Item = &str> {
        self.all_chains().flat_map(XdsChain::jwks_clusters)
    }

    /// As the config file writes it, each chain with its routes (`routes` finds those from
    /// RDS); `None` while a chain's authorization, tracing or log cluster has no single host.
    /// `memo`: where the chains' routes are kept checked, and what they are sectioned from
    /// besides themselves (see `route/memo.rs`).
    pub(crate) fn section<'r>(
        &self,
        routes: &dyn Fn(&str) -> Option<&'r XdsRoutes>,
        clusters: &dyn crate::cluster::xds::ReadyClusters,
        secrets: &Secrets,
        mut memo: Option<(
            &mut crate::route::memo::RouteMemo,
            crate::route::memo::Inputs,
        )>,
    ) -> Option<RawListener> {
        let mut body = |i: usize, chain: &XdsChain| {
            let from_rds = chain.rds.as_deref().and_then(routes);
            let memo = memo.as_mut().and_then(|(memo, inputs)| {
                let table = from_rds.or(chain.inline.as_ref())?;
                Some(memo.chain(&self.name, i, *inputs, table.settings_digest()))
            });
            chain.section(from_rds, clusters, secrets, memo)
        };
        let mut raw = match &self.own {
            Some(own) => body(0, own)?,
            None => {
                let mut raw = self.socket.clone();
                raw.default_chain = Some(false);
                raw
            }
        };
        for (i, matched) in self.chains.iter().enumerate() {
            let chain = body(i + 1, &matched.chain)?;
            // One collector per process (checked when the listener came).
            if raw.tracing_provider.is_none() {
                raw.tracing_provider = chain.tracing_provider;
            }
            raw.chains.push(crate::RawChain {
                name: matched.name.clone(),
                matcher: matched.matcher.clone(),
                http: chain.http,
                access_log: chain.access_log,
                tls: chain.tls,
                tcp_proxy: chain.tcp_proxy,
                http_filters: chain.http_filters,
                routes: chain.routes,
                virtual_hosts: chain.virtual_hosts,
                ignore_port_in_host_matching: chain.ignore_port_in_host_matching,
                tracing: chain.tracing,
            });
        }
        Some(raw)
    }
}

impl XdsListener {
    /// A QUIC listener's 0-RTT, from its chains' transport sockets: they share one TLS
    /// server, so they must agree.
    fn early_data(&mut self, at: &str) -> Result<(), ResourceError> {
        let mut all = (self.own.iter()).chain(self.chains.iter().map(|c| &c.chain));
        let first = all.next().is_some_and(|c| c.early_data);
        if all.any(|c| c.early_data != first) {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec![
                    "enable_early_data differing between chains (one TLS server serves them all)"
                        .into(),
                ],
            });
        }
        let raws = std::iter::once(&mut self.socket)
            .chain(self.own.iter_mut().map(|c| &mut c.raw))
            .chain(self.chains.iter_mut().map(|c| &mut c.chain.raw));
        for raw in raws {
            if let Some(http3) = &mut raw.http3 {
                http3.early_data = Some(first);
            }
        }
        Ok(())
    }
}

impl XdsChain {
    /// The clusters its TCP relay goes to.
    fn tcp_clusters(&self) -> impl Iterator<Item = &str> {
        let tcp = self.raw.tcp_proxy.iter();
        tcp.flat_map(|t| {
            let weighted = t.weighted_clusters.iter().map(|w| w.cluster.as_str());
            std::iter::once(t.cluster.as_str())
                .filter(|c| !c.is_empty())
                .chain(weighted)
        })
    }

    /// The clusters its JWT providers fetch their key sets through.
    fn jwks_clusters(&self) -> impl Iterator<Item = &str> {
        self.filters.iter().flat_map(|f| match &f.filter {
            XdsHttpFilter::Settled(RawHttpFilter::JwtAuthn(jwt)) => (jwt.providers.values())
                .filter_map(|p| p.remote_jwks.as_ref().map(|r| r.cluster.as_str()))
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
    }

    /// The cluster its tracing collector is found in, if any.
    fn tracing_cluster(&self) -> Option<&str> {
        self.collector.as_ref().map(|c| c.cluster.as_str())
    }

    /// The clusters its loggers' collectors are found in.
    fn log_clusters(&self) -> impl Iterator<Item = &str> {
        self.logs.iter().filter_map(|l| l.cluster())
    }

    /// The clusters its services (authorization, rate limit) are found in.
    fn authz_clusters(&self) -> impl Iterator<Item = &str> {
        self.filters.iter().filter_map(|f| match &f.filter {
            XdsHttpFilter::ExtAuthz(authz) => authz.cluster(),
            XdsHttpFilter::GlobalRateLimit(limit) => limit.cluster(),
            XdsHttpFilter::ExtProc(processor) => processor.cluster(),
            XdsHttpFilter::Settled(_) => None,
        })
    }

    /// As the config file writes it, with `routes` (from RDS) when it takes them from there;
    /// `None` while its authorization cluster has no single host to call.
    fn section(
        &self,
        routes: Option<&XdsRoutes>,
        clusters: &dyn crate::cluster::xds::ReadyClusters,
        secrets: &Secrets,
        memo: Option<&mut crate::route::memo::ChainMemo>,
    ) -> Option<RawListener> {
        let mut raw = self.raw.clone();
        if let Some(tls) = &mut raw.tls {
            self.secrets.fill_listener(tls, secrets)?;
        }
        if let Some(collector) = &self.collector {
            raw.tracing_provider = Some(collector.section(clusters)?);
        }
        raw.access_log = self
            .logs
            .iter()
            .map(|log| log.section(clusters))
            .collect::<Option<_>>()?;
        let routes = routes.or(self.inline.as_ref());
        raw.http_filters.clear();
        for XdsChainFilter { name, filter } in &self.filters {
            raw.http_filters.push(RawChainFilter {
                name: name.clone(),
                filter: match filter {
                    XdsHttpFilter::ExtAuthz(authz) => {
                        RawHttpFilter::ExtAuthz(authz.section(clusters)?)
                    }
                    XdsHttpFilter::GlobalRateLimit(limit) => {
                        RawHttpFilter::GlobalRateLimit(limit.section(clusters)?)
                    }
                    XdsHttpFilter::ExtProc(processor) => {
                        RawHttpFilter::ExtProc(processor.section(clusters)?)
                    }
                    XdsHttpFilter::Settled(filter) => filter.clone(),
                },
            });
        }
        // The routes' header mutations, last: Envoy's router applies them after every filter.
        if let Some(rules) = routes.and_then(XdsRoutes::headers_filter) {
            raw.http_filters
                .push(RawHttpFilter::Headers(rules.clone()).into());
        }
        if let Some(routes) = routes {
            let chain: Vec<&str> = raw.http_filters.iter().map(|f| f.name.as_str()).collect();
            raw.virtual_hosts = routes.section(clusters, &self.upgrades, &chain, memo);
            // A request no virtual host takes meets the listener's settings here; Envoy runs
            // no filter that only routes turn on for it. A catch-all host without routes (its
            // answer is the same 404) keeps such filters off there too.
            let catch_all = (raw.virtual_hosts.iter()).any(|h| h.domains.iter().any(|d| d == "*"));
            if !self.off_by_default.is_empty() && !catch_all {
                raw.virtual_hosts.push(crate::RawVirtualHost {
                    name: "no_virtual_host".into(),
                    domains: vec!["*".into()],
                    retry_policy: None,
                    rate_limits: Vec::new(),
                    include_request_attempt_count: None,
                    include_attempt_count_in_response: None,
                    filters: None,
                    routes: Vec::new(),
                    remembered: Vec::new(),
                });
            }
            // Off at each virtual host that says nothing of it; its routes inherit that.
            for host in &mut raw.virtual_hosts {
                for name in &self.off_by_default {
                    host.filters
                        .get_or_insert_with(Default::default)
                        .off_unless_set(name);
                }
            }
            raw.ignore_port_in_host_matching = Some(routes.ignore_port_in_host_matching);
        }
        Some(raw)
    }
}

/// TCP keep-alive on accepted connections: Envoy's `tcp_keepalive`, or the `socket_options`
/// control planes set for it (SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, which
/// accepted sockets inherit from the listening one). Any other socket option is refused.
fn keepalive(l: &mut Listener, at: &str) -> Result<Option<crate::RawTcpKeepalive>, ResourceError> {
    use envoy_types::pb::envoy::config::core::v3::socket_option::Value;
    const SOL_SOCKET: i64 = 1;
    const SO_KEEPALIVE: i64 = 9;
    const IPPROTO_TCP: i64 = 6;
    const TCP_KEEPIDLE: i64 = 4;
    const TCP_KEEPINTVL: i64 = 5;
    const TCP_KEEPCNT: i64 = 6;
    let mut keepalive = l.tcp_keepalive.take().map(|k| crate::RawTcpKeepalive {
        probes: k.keepalive_probes.map(|v| v.value),
        time: k
            .keepalive_time
            .map(|v| Duration::from_secs(v.value.into())),
        interval: k
            .keepalive_interval
            .map(|v| Duration::from_secs(v.value.into())),
    });
    let mut on = keepalive.is_some();
    for (i, option) in std::mem::take(&mut l.socket_options)
        .into_iter()
        .enumerate()
    {
        let at = format!("{at}.socket_options[{i}]");
        let value = match option.value {
            Some(Value::IntValue(v)) if option.r#type.is_none() && option.ip_version == 0 => v,
            _ => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec!["a socket option other than an int for any IP version".into()],
                });
            }
        };
        let seconds = || {
            u32::try_from(value)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| ResourceError::invalid(&at, "expected a positive number"))
        };
        let settings = keepalive.get_or_insert_with(Default::default);
        match (option.level, option.name) {
            (SOL_SOCKET, SO_KEEPALIVE) => on = value != 0,
            (IPPROTO_TCP, TCP_KEEPIDLE) => {
                settings.time = Some(Duration::from_secs(seconds()?.into()))
            }
            (IPPROTO_TCP, TCP_KEEPINTVL) => {
                settings.interval = Some(Duration::from_secs(seconds()?.into()))
            }
            (IPPROTO_TCP, TCP_KEEPCNT) => settings.probes = Some(seconds()?),
            (level, name) => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!(
                        "socket option level {level} name {name} (TCP keep-alive only)"
                    )],
                });
            }
        }
    }
    // Probe settings without SO_KEEPALIVE turn nothing on.
    Ok(keepalive.filter(|_| on))
}

/// `connection_balance_config.exact_balance`: the file's `connection_balance: exact`;
/// `enable_reuse_port` (Envoy's default on Linux) may only say so, as each worker has its own
/// socket here unless balancing is exact.
fn balance(l: &mut Listener, at: &str) -> Result<Option<String>, ResourceError> {
    use envoy_types::pb::envoy::config::listener::v3::listener::connection_balance_config::BalanceType;
    if l.enable_reuse_port.take().is_some_and(|v| !v.value) {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["enable_reuse_port: false (a socket per worker)".into()],
        });
    }
    match l
        .connection_balance_config
        .take()
        .and_then(|c| c.balance_type)
    {
        None => Ok(None),
        Some(BalanceType::ExactBalance(_)) => Ok(Some("exact".into())),
        Some(_) => Err(ResourceError::Unsupported {
            at: format!("{at}.connection_balance_config"),
            fields: vec!["balance_type (exact_balance only)".into()],
        }),
    }
}

fn translate(mut l: Listener) -> Result<XdsListener, ResourceError> {
    let name = std::mem::take(&mut l.name);
    let at = format!("listener `{name}`");
    let (address, udp) = listener_address(l.address.take(), &format!("{at}.address"))?;
    let quic = match (udp, l.udp_listener_config.take()) {
        (true, config) => Some(quic_listener(config, &at)?),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec!["udp_listener_config (on a TCP listener)".into()],
            });
        }
    };
    // Envoy's MODIFY_ONLY differs from DEFAULT only on `/healthcheck/fail`, which drains no
    // listener here: the two drain alike (on removal, change, upgrade and shutdown).
    l.drain_type = 0;
    let buffer = l
        .per_connection_buffer_limit_bytes
        .take()
        .map(|v| u64::from(v.value));
    let accept_per_event = l
        .max_connections_to_accept_per_socket_event
        .take()
        .map(|v| v.value);
    let bypass_overload_manager = std::mem::take(&mut l.bypass_overload_manager);
    let ignore_global_conn_limit = std::mem::take(&mut l.ignore_global_conn_limit);
    let tcp_keepalive = keepalive(&mut l, &at)?;
    let connection_balance = balance(&mut l, &at)?;
    let mut proxy_protocol = None;
    let mut http_inspector = false;
    for (i, f) in std::mem::take(&mut l.listener_filters)
        .into_iter()
        .enumerate()
    {
        if quic.is_some() {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.listener_filters[{i}]"),
                fields: vec![format!("listener filter `{}` (on a QUIC listener)", f.name)],
            });
        }
        if f.name == PROXY_PROTOCOL_FILTER {
            proxy_protocol = Some(proxy_protocol_filter(
                f.config_type,
                &format!("{at}.listener_filters[{i}]"),
            )?);
            continue;
        }
        let harmless = INSPECTORS.contains(&f.name.as_str())
            && matches!(
                f.config_type,
                None | Some(listener_filter::ConfigType::TypedConfig(_))
            );
        if !harmless {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.listener_filters[{i}]"),
                fields: vec![format!("listener filter `{}`", f.name)],
            });
        }
        http_inspector |= f.name == INSPECTORS[1];
    }
    // `0s` is no limit; Envoy's default is 15 s.
    let listener_filters_timeout = duration(
        l.listener_filters_timeout.take(),
        &format!("{at}.listener_filters_timeout"),
    )?;
    let continue_on_timeout = std::mem::take(&mut l.continue_on_listener_filters_timeout);
    let chains = std::mem::take(&mut l.filter_chains);
    let default = l.default_filter_chain.take();
    let listener_logs = std::mem::take(&mut l.access_log);
    crate::access_log::xds::listener_logs(&listener_logs, &at)?;
    l.stat_prefix.clear();
    l.metadata = None;
    l.traffic_direction = 0;
    nothing_else(&l, fields::LISTENER, &at)?;

    let socket = RawListener {
        name: name.clone(),
        address,
        connection_limit: None,
        connection_balance,
        max_connections_to_accept_per_socket_event: accept_per_event,
        bypass_overload_manager: Some(bypass_overload_manager),
        ignore_global_conn_limit: Some(ignore_global_conn_limit),
        tcp_keepalive,
        per_connection_buffer_limit_bytes: buffer,
        http: RawHttp::default(),
        access_log: Vec::new(),
        proxy_protocol,
        tls: None,
        http3: quic.as_ref().map(|(http3, _)| http3.clone()),
        tcp_proxy: None,
        ext_authz: None,
        http_filters: Vec::new(),
        routes: Vec::new(),
        virtual_hosts: Vec::new(),
        ignore_port_in_host_matching: None,
        tracing: None,
        tracing_provider: None,
        chains: Vec::new(),
        default_chain: None,
        listener_filters_timeout: Some(
            listener_filters_timeout.unwrap_or(crate::listener::DEFAULT_LISTENER_FILTERS_TIMEOUT),
        ),
        continue_on_listener_filters_timeout: Some(continue_on_timeout),
        http_inspector: Some(http_inspector),
        dynamic: true,
    };
    let quic_handshake = quic.map(|(_, handshake)| handshake);
    let picks_nothing = |c: &FilterChain| {
        c.filter_chain_match
            .as_ref()
            .is_none_or(|m| *m == Default::default())
    };
    // One chain that nothing picks is the listener's own, as a default chain is.
    let (own, matched) = match (chains, default) {
        (chains, None) if chains.len() == 1 && picks_nothing(&chains[0]) => {
            (chains.into_iter().next(), Vec::new())
        }
        (chains, default) => (default, chains),
    };
    if own.is_none() && matched.is_empty() {
        return Err(ResourceError::invalid(at, "no filter chains"));
    }
    // Its log is of connections no chain takes; with one that takes them all it never
    // writes, but without one such connections are closed unlogged here (counted only).
    if own.is_none() && !listener_logs.is_empty() {
        return Err(ResourceError::Unsupported {
            at,
            fields: vec!["access_log (connections no filter chain takes are not logged)".into()],
        });
    }
    let own = own
        .map(|chain| {
            let chain_at = if matched.is_empty() {
                format!("{at}.filter_chains[0]")
            } else {
                format!("{at}.default_filter_chain")
            };
            translate_chain(chain, &socket, quic_handshake, &chain_at)
        })
        .transpose()?;
    let mut chains: Vec<MatchedChain> = Vec::with_capacity(matched.len());
    let mut raw_matches = Vec::with_capacity(matched.len());
    for (i, chain) in matched.iter().enumerate() {
        let match_at = format!("{at}.filter_chains[{i}].filter_chain_match");
        let raw = chain_match(
            chain.filter_chain_match.clone().unwrap_or_default(),
            &match_at,
        )?;
        raw_matches.push((raw, match_at));
    }
    // Checked here too, as Envoy checks a listener when it comes: not only once its routes
    // and clusters have made it whole.
    crate::listener::chains::checked_matches(raw_matches.iter().cloned()).map_err(|e| match e {
        crate::ConfigError::Invalid { path, message } => ResourceError::invalid(path, message),
        other => ResourceError::invalid(at.clone(), other.to_string()),
    })?;
    for (i, (mut chain, (matcher, _))) in matched.into_iter().zip(raw_matches).enumerate() {
        let chain_at = format!("{at}.filter_chains[{i}]");
        chain.filter_chain_match = None;
        // Names must be unique here; Envoy's may be empty.
        let mut chain_name = std::mem::take(&mut chain.name);
        if chain_name.is_empty() || chains.iter().any(|c| c.name == chain_name) {
            chain_name = format!("{chain_name}#{i}");
        }
        let chain = translate_chain(chain, &socket, quic_handshake, &chain_at)?;
        if let (Some(a), Some(b)) = (
            own.iter()
                .chain(chains.iter().map(|c| &c.chain))
                .find_map(|c| c.collector.as_ref()),
            chain.collector.as_ref(),
        ) && format!("{a:?}") != format!("{b:?}")
        {
            return Err(ResourceError::Unsupported {
                at: chain_at,
                fields: vec!["tracing providers that differ between chains".into()],
            });
        }
        chains.push(MatchedChain {
            name: chain_name,
            matcher,
            chain,
        });
    }
    let mut listener = XdsListener {
        name,
        socket,
        own,
        chains,
    };
    if quic_handshake.is_some() {
        listener.early_data(&at)?;
    }
    Ok(listener)
}

/// Envoy's `filter_chain_match` as the file's `match`.
fn chain_match(
    mut m: envoy_types::pb::envoy::config::listener::v3::FilterChainMatch,
    at: &str,
) -> Result<crate::RawChainMatch, ResourceError> {
    let ranges = |list: Vec<envoy_types::pb::envoy::config::core::v3::CidrRange>| {
        list.into_iter()
            .map(|c| {
                let len = c.prefix_len.as_ref().map_or(0, |l| l.value);
                format!("{}/{len}", c.address_prefix)
            })
            .collect::<Vec<_>>()
    };
    let matcher = crate::RawChainMatch {
        destination_port: m.destination_port.take().map(|p| p.value),
        prefix_ranges: ranges(std::mem::take(&mut m.prefix_ranges)),
        server_names: std::mem::take(&mut m.server_names),
        transport_protocol: Some(std::mem::take(&mut m.transport_protocol))
            .filter(|t| !t.is_empty()),
        application_protocols: std::mem::take(&mut m.application_protocols),
        source_prefix_ranges: ranges(std::mem::take(&mut m.source_prefix_ranges)),
        source_ports: std::mem::take(&mut m.source_ports),
    };
    nothing_else(&m, fields::FILTER_CHAIN_MATCH, at)?;
    Ok(matcher)
}

/// Envoy's UDP listener address (`protocol: UDP`) serves QUIC here; a TCP one, TCP.
fn listener_address(
    mut address: Option<envoy_types::pb::envoy::config::core::v3::Address>,
    at: &str,
) -> Result<(String, bool), ResourceError> {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address::Protocol};
    let mut udp = false;
    if let Some(address::Address::SocketAddress(socket)) =
        address.as_mut().and_then(|a| a.address.as_mut())
    {
        udp = socket.protocol == Protocol::Udp as i32;
        socket.protocol = Protocol::Tcp as i32;
    }
    Ok((socket_address(address, at)?, udp))
}

/// Envoy's defaults for a QUIC listener: streams per connection, the idle time, and the
/// time a client has for its handshake.
const QUIC_MAX_STREAMS: u32 = 100;
const QUIC_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
const QUIC_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);

/// Envoy's UDP listener with `quic_options`: HTTP/3 alone on its address (`quic_only`), and
/// the time its chains give a handshake.
fn quic_listener(
    config: Option<envoy_types::pb::envoy::config::listener::v3::UdpListenerConfig>,
    at: &str,
) -> Result<(crate::listener::http3::RawHttp3, Duration), ResourceError> {
    let at = format!("{at}.udp_listener_config");
    let mut config = config.unwrap_or_default();
    let Some(mut quic) = config.quic_options.take() else {
        return Err(ResourceError::Unsupported {
            at,
            fields: vec!["a UDP listener without quic_options (UDP proxying)".into()],
        });
    };
    if let Some(mut socket) = config.downstream_socket_config.take() {
        // GRO is used wherever the kernel has it.
        if socket.prefer_gro.take().is_some_and(|on| !on.value) {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.downstream_socket_config"),
                fields: vec!["prefer_gro: false".into()],
            });
        }
        nothing_else(
            &socket,
            fields::UDP_SOCKET_CONFIG,
            &format!("{at}.downstream_socket_config"),
        )?;
    }
    nothing_else(&config, fields::UDP_LISTENER_CONFIG, &at)?;
    let at = format!("{at}.quic_options");
    let mut max_streams = None;
    if let Some(mut protocol) = quic.quic_protocol_options.take() {
        max_streams = protocol.max_concurrent_streams.take().map(|v| v.value);
        nothing_else(
            &protocol,
            fields::QUIC_PROTOCOL_OPTIONS,
            &format!("{at}.quic_protocol_options"),
        )?;
    }
    let idle = duration(quic.idle_timeout.take(), &format!("{at}.idle_timeout"))?;
    let handshake = duration(
        quic.crypto_handshake_timeout.take(),
        &format!("{at}.crypto_handshake_timeout"),
    )?;
    // Its runtime key names a runtime value no layer sets here: the default decides.
    if let Some(enabled) = quic.enabled.take()
        && enabled.default_value.is_some_and(|on| !on.value)
    {
        return Err(ResourceError::Unsupported {
            at,
            fields: vec!["enabled: false (a listener serving nothing)".into()],
        });
    }
    nothing_else(&quic, fields::QUIC_LISTENER_OPTIONS, &at)?;
    // Envoy raises an idle timeout under 1 ms to 1 ms, a handshake timeout under 5 s to 5 s.
    let http3 = crate::listener::http3::RawHttp3 {
        alt_svc_max_age: None,
        quic_only: Some(true),
        max_concurrent_streams: Some(max_streams.unwrap_or(QUIC_MAX_STREAMS)),
        idle_timeout: Some(
            idle.unwrap_or(QUIC_IDLE_TIMEOUT)
                .max(Duration::from_millis(1)),
        ),
        // Each chain's transport socket says (`enable_early_data`), once they are read.
        early_data: None,
    };
    let handshake = handshake
        .unwrap_or(QUIC_HANDSHAKE_TIMEOUT)
        .max(Duration::from_secs(5));
    Ok((http3, handshake))
}

/// One filter chain: its TLS, and its connection manager or TCP relay, on the listener's
/// socket settings. `quic_handshake`: the chain is a QUIC listener's, whose handshakes get
/// that long.
fn translate_chain(
    mut chain: FilterChain,
    socket: &RawListener,
    quic_handshake: Option<Duration>,
    at: &str,
) -> Result<XdsChain, ResourceError> {
    let name = socket.name.clone();
    let at = at.to_owned();
    let filters = std::mem::take(&mut chain.filters);
    let quic = quic_handshake.is_some();
    let mut early_data = false;
    let (mut tls, secrets) = match chain.transport_socket.take() {
        Some(transport) if quic != crate::tls::xds::is_quic(&transport) => {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.transport_socket"),
                fields: vec![if quic {
                    format!("transport socket `{}` on a QUIC listener", transport.name)
                } else {
                    "envoy.transport_sockets.quic on a TCP listener".into()
                }],
            });
        }
        Some(transport) if quic => {
            let (mut tls, secrets, early) = crate::tls::xds::quic_listener_tls(transport, &at)?;
            tls.handshake_timeout = quic_handshake;
            early_data = early;
            (Some(tls), secrets)
        }
        Some(transport) => {
            let (tls, secrets) = crate::tls::xds::listener_tls(transport, &at)?;
            (Some(tls), secrets)
        }
        None if quic => {
            return Err(ResourceError::invalid(
                format!("{at}.transport_socket"),
                "a QUIC listener's chain needs its envoy.transport_sockets.quic",
            ));
        }
        None => (None, SecretRefs::default()),
    };
    // The time a client has to finish the transport's handshake: TLS's (a plain chain has
    // none to time). `0s` is no limit in Envoy; here the handshake keeps its default.
    let connect_timeout = duration(
        chain.transport_socket_connect_timeout.take(),
        &format!("{at}.transport_socket_connect_timeout"),
    )?
    .filter(|t| !t.is_zero());
    if let (Some(tls), Some(timeout)) = (&mut tls, connect_timeout) {
        tls.handshake_timeout = Some(timeout);
    }
    chain.name.clear();
    chain.metadata = None;
    chain.filter_chain_match = None;
    nothing_else(&chain, fields::FILTER_CHAIN, &at)?;
    // A TCP proxy (after a network RBAC filter, where there is one): no HTTP, no routes.
    let typed = |f: &Filter| match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => Some(any.clone()),
        _ => None,
    };
    let network_rbac = crate::filters::rbac::xds::NETWORK_TYPE_URL;
    let tcp_url = crate::listener::tcp_proxy::xds::TYPE_URL;
    let relay = match filters.as_slice() {
        [only] => typed(only)
            .filter(|a| a.type_url == tcp_url)
            .map(|a| (None, a)),
        [rbac, only] => match (typed(rbac), typed(only)) {
            (Some(r), Some(a)) if r.type_url == network_rbac && a.type_url == tcp_url => {
                Some((Some(r), a))
            }
            _ => None,
        },
        _ => None,
    };
    if let Some((rbac, any)) = relay {
        let last = filters.len() - 1;
        let (mut tcp, logs) =
            crate::listener::tcp_proxy::xds::tcp_proxy(&any, &format!("{at}.filters[{last}]"))?;
        if let Some(rbac) = rbac {
            tcp.rbac = Some(crate::filters::rbac::xds::network(
                &rbac,
                &format!("{at}.filters[0]"),
            )?);
        }
        let raw = RawListener {
            tls,
            tcp_proxy: Some(tcp),
            ..socket.clone()
        };
        return Ok(XdsChain {
            raw,
            inline: None,
            rds: None,
            upgrades: Vec::new(),
            filters: Vec::new(),
            off_by_default: Vec::new(),
            collector: None,
            logs,
            secrets,
            early_data,
        });
    }
    let mut hcm = match filters.as_slice() {
        [only] => match &only.config_type {
            Some(filter::ConfigType::TypedConfig(any)) if any.type_url == HCM => {
                decode::<HttpConnectionManager>(any, HCM, "an HttpConnectionManager")?
            }
            _ => {
                return Err(ResourceError::Unsupported {
                    at: format!("{at}.filters[0]"),
                    fields: vec![format!(
                        "network filter `{}` (http_connection_manager, and tcp_proxy after an rbac filter or alone, only)",
                        only.name
                    )],
                });
            }
        },
        _ => {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec!["filters (exactly one: http_connection_manager or tcp_proxy)".into()],
            });
        }
    };
    let logs = crate::access_log::xds::connection_manager_logs(
        std::mem::take(&mut hcm.access_log),
        &format!("{at}.filters[0]"),
    )?;
    let (tracing, collector) =
        crate::tracing::xds::tracing(hcm.tracing.take(), &format!("{at}.filters[0]"))?;
    let mut raw = RawListener {
        tls,
        tracing: Some(tracing),
        ..socket.clone()
    };
    let (inline, rds, upgrades, (filters, off_by_default)) =
        connection_manager(hcm, &mut raw.http, quic, &name, &format!("{at}.filters[0]"))?;
    Ok(XdsChain {
        raw,
        inline,
        rds,
        upgrades,
        filters,
        off_by_default,
        collector,
        logs,
        secrets,
        early_data,
    })
}

type Routing = (
    Option<XdsRoutes>,
    Option<String>,
    Vec<String>,
    (Vec<XdsChainFilter>, Vec<String>),
);

/// `quic`: the connection manager of a QUIC listener's chain, which serves HTTP/3.
fn connection_manager(
    mut hcm: HttpConnectionManager,
    http: &mut RawHttp,
    quic: bool,
    listener: &str,
    at: &str,
) -> Result<Routing, ResourceError> {
    use http_connection_manager::CodecType;
    match (quic, CodecType::try_from(hcm.codec_type)) {
        (false, Ok(CodecType::Auto)) | (true, Ok(CodecType::Http3)) => {}
        (false, _) => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec![
                    "codec_type (AUTO only: both HTTP/1.1 and HTTP/2 are served; HTTP/3 on a \
                     QUIC listener)"
                        .into(),
                ],
            });
        }
        (true, _) => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec!["codec_type (HTTP3 only, on a QUIC listener)".into()],
            });
        }
    }
    hcm.codec_type = 0;
    if !quic && hcm.http3_protocol_options.is_some() {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["http3_protocol_options (on a TCP listener)".into()],
        });
    }
    if quic {
        if let Some(h3) = hcm.http3_protocol_options.take() {
            nothing_else(
                &h3,
                fields::HTTP3_PROTOCOL_OPTIONS,
                &format!("{at}.http3_protocol_options"),
            )?;
        }
        // Envoy's HTTP/3 codec reads none of HTTP/2's options (streams and windows are the
        // QUIC listener's), so none is taken from them here.
        hcm.http2_protocol_options = None;
    }
    hcm.stat_prefix.clear();
    let (inline, rds) = match hcm.route_specifier.take() {
        Some(http_connection_manager::RouteSpecifier::Rds(rds)) => {
            (None, Some(rds.route_config_name))
        }
        Some(http_connection_manager::RouteSpecifier::RouteConfig(config)) => {
            (Some(XdsRoutes::translate(config, Some(listener))?), None)
        }
        _ => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec!["route_specifier (rds or route_config)".into()],
            });
        }
    };
    let filters = http_filters(std::mem::take(&mut hcm.http_filters), http, at)?;
    // Requests go to an HTTP/2 upstream with the scheme of its transport (TLS or not), which
    // is what `match_upstream` asks; a fixed scheme is not written.
    if let Some(scheme) = hcm.scheme_header_transformation.take()
        && scheme.transformation.is_some()
    {
        return Err(ResourceError::Unsupported {
            at: format!("{at}.scheme_header_transformation"),
            fields: vec!["scheme_to_overwrite".into()],
        });
    }
    // Envoy's default is `OVERWRITE` with its own name; here the name is this proxy's.
    let name = std::mem::take(&mut hcm.server_name);
    let name = if name.is_empty() {
        "legate".to_owned()
    } else {
        name
    };
    match std::mem::take(&mut hcm.server_header_transformation) {
        0 => {
            http.server_header_transformation = Some("overwrite".into());
            http.server_name = Some(name);
        }
        1 => {
            http.server_header_transformation = Some("append_if_absent".into());
            http.server_name = Some(name);
        }
        2 => http.server_header_transformation = Some("pass_through".into()),
        other => {
            return Err(ResourceError::invalid(
                format!("{at}.server_header_transformation"),
                format!("unknown transformation {other}"),
            ));
        }
    }
    if let Some(common) = hcm.common_http_protocol_options.take() {
        common_options(common, http, &format!("{at}.common_http_protocol_options"))?;
    }
    // Envoy answers HTTP/1.0 with 426 unless told otherwise.
    http.accept_http_10 = Some(false);
    if let Some(h1) = hcm.http_protocol_options.take() {
        h1_options(h1, http, &format!("{at}.http_protocol_options"))?;
    }
    if let Some(h2) = hcm.http2_protocol_options.take() {
        h2_options(h2, http, &format!("{at}.http2_protocol_options"))?;
    }
    http.max_request_headers_kb = hcm.max_request_headers_kb.take().map(|v| v.value);
    let strip_any = matches!(
        hcm.strip_port_mode.take(),
        Some(http_connection_manager::StripPortMode::StripAnyHostPort(
            true
        ))
    );
    let strip_matching = std::mem::take(&mut hcm.strip_matching_host_port);
    http.strip_host_port = Some(
        match (strip_any, strip_matching) {
            (true, true) => {
                return Err(ResourceError::invalid(
                    at.to_owned(),
                    "strip_any_host_port and strip_matching_host_port together",
                ));
            }
            (true, false) => "any",
            (false, true) => "matching",
            (false, false) => "none",
        }
        .to_owned(),
    );
    http.strip_trailing_host_dot = Some(std::mem::take(&mut hcm.strip_trailing_host_dot));
    http.forward_client_cert = Some(
        match std::mem::take(&mut hcm.forward_client_cert_details) {
            1 => "forward_only",
            2 => "append_forward",
            3 => "sanitize_set",
            4 => "always_forward_only",
            _ => "sanitize",
        }
        .to_owned(),
    );
    if let Some(details) = hcm.set_current_client_cert_details.take() {
        http.set_current_client_cert_details =
            Some(crate::listener::client_cert::ClientCertDetails {
                cert: details.cert,
                chain: details.chain,
                subject: details.subject.is_some_and(|v| v.value),
                uri: details.uri,
                dns: details.dns,
            });
    }
    // `0s` is Envoy's default, "no timeout"; Legate keeps its own (a slow-headers defence).
    http.request_headers_timeout = duration(
        hcm.request_headers_timeout.take(),
        &format!("{at}.request_headers_timeout"),
    )?
    .filter(|t| !t.is_zero());
    // `0s` (Envoy's default) is no request timeout.
    http.request_timeout = duration(hcm.request_timeout.take(), &format!("{at}.request_timeout"))?
        .filter(|t| !t.is_zero());
    // `0s` turns Envoy's stream idle timer off.
    http.stream_idle_timeout = duration(
        hcm.stream_idle_timeout.take(),
        &format!("{at}.stream_idle_timeout"),
    )?
    .map(|t| {
        if t.is_zero() {
            crate::envoy::NO_TIMEOUT
        } else {
            t
        }
    });
    let mut upgrades = Vec::new();
    for (i, upgrade) in std::mem::take(&mut hcm.upgrade_configs)
        .into_iter()
        .enumerate()
    {
        if upgrade.enabled.is_some_and(|e| !e.value) || !upgrade.filters.is_empty() {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.upgrade_configs[{i}]"),
                fields: vec!["enabled: false / filters".into()],
            });
        }
        upgrades.push(upgrade.upgrade_type.to_ascii_lowercase());
    }
    // Envoy's defaults, not the config file's: a listener from a control plane behaves as
    // the same listener would in Envoy (which trusts no client's id unless told).
    http.request_id = Some(crate::RawRequestId {
        generate: Some(hcm.generate_request_id.take().is_none_or(|v| v.value)),
        preserve_external: Some(std::mem::take(&mut hcm.preserve_external_request_id)),
        always_set_in_response: Some(std::mem::take(&mut hcm.always_set_request_id_in_response)),
    });
    if let Some(extension) = hcm.request_id_extension.take() {
        request_id_extension(extension, &format!("{at}.request_id_extension"))?;
    }
    http.use_remote_address = Some(hcm.use_remote_address.take().is_some_and(|v| v.value));
    http.xff_num_trusted_hops = Some(std::mem::take(&mut hcm.xff_num_trusted_hops));
    if let Some(config) = hcm.local_reply_config.take() {
        http.local_reply = Some(crate::local_reply::xds::local_reply(
            config,
            &format!("{at}.local_reply_config"),
        )?);
    }
    http.early_header_mutation = early_header_mutation(
        std::mem::take(&mut hcm.early_header_mutation_extensions),
        &format!("{at}.early_header_mutation_extensions"),
    )?;
    http.original_ip_detection = original_ip_detection(
        std::mem::take(&mut hcm.original_ip_detection_extensions),
        &format!("{at}.original_ip_detection_extensions"),
    )?;
    if !http.original_ip_detection.is_empty() {
        if http.use_remote_address == Some(true) || http.xff_num_trusted_hops != Some(0) {
            return Err(ResourceError::invalid(
                format!("{at}.original_ip_detection_extensions"),
                "may not be mixed with use_remote_address or xff_num_trusted_hops (as Envoy)",
            ));
        }
        // Left to the file's defaults, which follow the extensions.
        http.use_remote_address = None;
        http.xff_num_trusted_hops = None;
    }
    // Path normalisation is on in Legate unless turned off. `normalize_path` says either
    // way; `merge_slashes` is a plain bool whose `false` (the default) cannot be told from
    // unset, so it can only turn merging on.
    let escaped_slashes = match std::mem::take(&mut hcm.path_with_escaped_slashes_action) {
        0 => None,
        1 => Some("keep"),
        2 => Some("reject"),
        3 => Some("unescape_and_redirect"),
        4 => Some("unescape_and_forward"),
        other => {
            return Err(ResourceError::invalid(
                format!("{at}.path_with_escaped_slashes_action"),
                format!("unknown action {other}"),
            ));
        }
    };
    http.path_normalization = Some(RawPathNormalization {
        normalize: hcm.normalize_path.take().map(|v| v.value),
        merge_slashes: std::mem::take(&mut hcm.merge_slashes).then_some(true),
        escaped_slashes: escaped_slashes.map(str::to_owned),
    });
    nothing_else(&hcm, fields::HTTP_CONNECTION_MANAGER, at)?;
    Ok((inline, rds, upgrades, filters))
}

/// Envoy's UUID request ids (Istio sends the extension on every connection manager): the ids
/// made here are UUIDs v4. Its two settings act on the connection manager's `tracing` only
/// (the trace decision packed into the id, sampling by the id), which is refused: with no
/// tracing there, Envoy leaves the ids as made too.
fn request_id_extension(
    extension: envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::RequestIdExtension,
    at: &str,
) -> Result<(), ResourceError> {
    use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
    const UUID: &str =
        "type.googleapis.com/envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig";
    match extension.typed_config {
        Some(any) if any.type_url == UUID => {
            let UuidRequestIdConfig {
                pack_trace_reason: _,
                use_request_id_for_trace_sampling: _,
            } = decode(&any, UUID, "a UuidRequestIdConfig")?;
            Ok(())
        }
        Some(any) => Err(ResourceError::Unsupported {
            at: format!("{at}.typed_config"),
            fields: vec![format!(
                "request id extension {} (UUIDs only)",
                any.type_url.rsplit('/').next().unwrap_or_default()
            )],
        }),
        None => Err(ResourceError::invalid(
            at.to_owned(),
            "expected a typed_config",
        )),
    }
}

/// The connection manager's `early_header_mutation_extensions`: Envoy's `header_mutation`
/// ones, whose mutations apply in order before routing.
fn early_header_mutation(
    extensions: Vec<envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig>,
    at: &str,
) -> Result<Option<crate::RawHeaderMutations>, ResourceError> {
    use envoy_types::pb::envoy::extensions::http::early_header_mutation::header_mutation::v3::HeaderMutation;
    const HEADER_MUTATION: &str = "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation";
    let mut list = Vec::new();
    for (i, extension) in extensions.into_iter().enumerate() {
        let Some(any) = extension
            .typed_config
            .filter(|a| a.type_url == HEADER_MUTATION)
        else {
            return Err(ResourceError::Unsupported {
                at: format!("{at}[{i}]"),
                fields: vec![format!(
                    "extension `{}` (envoy.http.early_header_mutation.header_mutation only)",
                    extension.name
                )],
            });
        };
        let mutation: HeaderMutation = decode(&any, HEADER_MUTATION, "a HeaderMutation")?;
        list.extend(mutation.mutations);
    }
    crate::envoy::headers::ordered(list, &format!("{at}.mutations"))
}

/// The connection manager's `original_ip_detection_extensions`: `custom_header` (its
/// address marked trusted, as Envoy Gateway sends it) and `xff` by trusted hops, in order.
fn original_ip_detection(
    extensions: Vec<envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig>,
    at: &str,
) -> Result<Vec<RawClientDetection>, ResourceError> {
    use envoy_types::pb::envoy::extensions::http::original_ip_detection::custom_header::v3::CustomHeaderConfig;
    use envoy_types::pb::envoy::extensions::http::original_ip_detection::xff::v3::XffConfig;
    const CUSTOM_HEADER: &str = "type.googleapis.com/envoy.extensions.http.original_ip_detection.custom_header.v3.CustomHeaderConfig";
    const XFF: &str =
        "type.googleapis.com/envoy.extensions.http.original_ip_detection.xff.v3.XffConfig";
    let mut ways = Vec::with_capacity(extensions.len());
    for (i, extension) in extensions.into_iter().enumerate() {
        let at = format!("{at}[{i}]");
        let unsupported = |what: &str| ResourceError::Unsupported {
            at: at.clone(),
            fields: vec![what.to_owned()],
        };
        let Some(any) = extension.typed_config else {
            return Err(ResourceError::invalid(at, "expected a typed_config"));
        };
        match any.type_url.as_str() {
            CUSTOM_HEADER => {
                let header: CustomHeaderConfig =
                    decode(&any, CUSTOM_HEADER, "a CustomHeaderConfig")?;
                if !header.allow_extension_to_set_address_as_trusted {
                    // Legate's trust follows the address found; Envoy's would not.
                    return Err(unsupported(
                        "allow_extension_to_set_address_as_trusted: false",
                    ));
                }
                ways.push(RawClientDetection {
                    custom_header: Some(RawCustomHeader {
                        name: header.header_name,
                        // Envoy answers 403 for a status outside 400-511.
                        reject_with_status: header.reject_with_status.map(|s| {
                            u16::try_from(s.code)
                                .ok()
                                .filter(|c| (400..=511).contains(c))
                                .unwrap_or(403)
                        }),
                    }),
                    xff: None,
                });
            }
            XFF => {
                let xff: XffConfig = decode(&any, XFF, "an XffConfig")?;
                let trusted_cidrs = xff
                    .xff_trusted_cidrs
                    .map(|list| {
                        list.cidrs
                            .iter()
                            .map(|c| {
                                let len = c.prefix_len.as_ref().map_or(0, |l| l.value);
                                format!("{}/{len}", c.address_prefix)
                            })
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                ways.push(RawClientDetection {
                    custom_header: None,
                    xff: Some(RawXff {
                        num_trusted_hops: (xff.xff_num_trusted_hops > 0
                            || trusted_cidrs.is_empty())
                        .then_some(xff.xff_num_trusted_hops),
                        trusted_cidrs,
                        // Unset: skipped, as Envoy (for backward compatibility).
                        append_peer: xff.skip_xff_append.is_some_and(|skip| !skip.value),
                    }),
                });
            }
            _ => {
                return Err(unsupported(&format!(
                    "extension `{}` (custom_header and xff only)",
                    extension.name
                )));
            }
        }
    }
    Ok(ways)
}

/// The chain before the router, and the names of its filters that are off unless a route
/// turns them on (`disabled`, as Envoy).
fn http_filters(
    filters: Vec<HttpFilter>,
    http: &mut RawHttp,
    at: &str,
) -> Result<(Vec<XdsChainFilter>, Vec<String>), ResourceError> {
    let typed = |f: &HttpFilter| match &f.config_type {
        Some(http_filter::ConfigType::TypedConfig(any)) => Some(any.clone()),
        _ => None,
    };
    let is_router = |f: &HttpFilter| match typed(f) {
        Some(any) => any.type_url == ROUTER,
        None => f.name == "envoy.filters.http.router",
    };
    let mut chain: Vec<XdsChainFilter> = Vec::new();
    // The filters off unless a route turns them on, by their names here.
    let mut off: Vec<String> = Vec::new();
    for (i, f) in filters.iter().enumerate() {
        let at = format!("{at}.http_filters[{i}]");
        if is_router(f) {
            if let Some(any) = typed(f) {
                router(&any, http, &at)?;
            }
            if i + 1 != filters.len() {
                return Err(ResourceError::invalid(
                    at,
                    "the router must be the last filter",
                ));
            }
            continue;
        }
        let filter = match typed(f) {
            Some(any) if any.type_url == ext_authz::TYPE_URL => {
                XdsHttpFilter::ExtAuthz(XdsAuthz::decode(&any, &at)?)
            }
            Some(any) if any.type_url == global_rate_limit::TYPE_URL => {
                XdsHttpFilter::GlobalRateLimit(XdsGlobalRateLimit::decode(&any, &at)?)
            }
            Some(any) if any.type_url == ext_proc::TYPE_URL => {
                XdsHttpFilter::ExtProc(XdsExtProc::decode(&any, &at)?)
            }
            Some(any) if any.type_url == fault::TYPE_URL => {
                XdsHttpFilter::Settled(RawHttpFilter::Fault(fault::settings(&any, &at)?))
            }
            Some(any) if any.type_url == custom_response::TYPE_URL => XdsHttpFilter::Settled(
                RawHttpFilter::CustomResponse(custom_response::settings(&any, &at)?),
            ),
            Some(any) if any.type_url == health_check::TYPE_URL => XdsHttpFilter::Settled(
                RawHttpFilter::HealthCheck(health_check::settings(&any, &at)?),
            ),
            Some(any) if any.type_url == local_rate_limit::TYPE_URL => XdsHttpFilter::Settled(
                RawHttpFilter::LocalRateLimit(local_rate_limit::settings(&any, &at)?),
            ),
            // Envoy's CORS filter holds no settings (v3): it acts on the policies of routes
            // and hosts. Here, a listener entry without origins: routes' policies only.
            Some(any) if any.type_url == CORS => {
                decode::<Cors>(&any, CORS, "a Cors filter")?;
                XdsHttpFilter::Settled(RawHttpFilter::Cors(RawCors::default()))
            }
            Some(any) if any.type_url == api_key_auth::TYPE_URL => XdsHttpFilter::Settled(
                RawHttpFilter::ApiKeyAuth(api_key_auth::settings(&any, &at)?),
            ),
            Some(any) if any.type_url == basic_auth::TYPE_URL => {
                XdsHttpFilter::Settled(RawHttpFilter::BasicAuth(basic_auth::settings(&any, &at)?))
            }
            Some(any) if any.type_url == csrf::TYPE_URL => {
                XdsHttpFilter::Settled(RawHttpFilter::Csrf(csrf::settings(&any, &at)?))
            }
            Some(any) if any.type_url == buffer::TYPE_URL => {
                XdsHttpFilter::Settled(RawHttpFilter::Buffer(buffer::settings(&any)?))
            }
            Some(any) if any.type_url == grpc_web::TYPE_URL => {
                XdsHttpFilter::Settled(RawHttpFilter::GrpcWeb(grpc_web::settings(&any)?))
            }
            Some(any) if any.type_url == header_mutation::TYPE_URL => XdsHttpFilter::Settled(
                RawHttpFilter::HeaderMutation(header_mutation::settings(&any, &at)?),
            ),
            Some(any) if any.type_url == compression::TYPE_URL => {
                let (raw, first) = compression::settings(&any, &at)?;
                // Envoy's compressors, one per library, are one filter here.
                let before = chain.iter_mut().find_map(|f| match &mut f.filter {
                    XdsHttpFilter::Settled(RawHttpFilter::Compression(c)) => Some(c),
                    _ => None,
                });
                if let Some(before) = before {
                    if off.iter().any(|name| name == "compression") != f.disabled {
                        return Err(ResourceError::Unsupported {
                            at,
                            fields: vec![
                                "compressors on and off by default in one chain (one compression filter here)"
                                    .into(),
                            ],
                        });
                    }
                    compression::merge(before, raw, first, &at)?;
                    continue;
                }
                XdsHttpFilter::Settled(RawHttpFilter::Compression(raw))
            }
            // gRPC statistics only (counters per method, filter state for other filters):
            // nothing a request meets. Its counters are not kept here.
            Some(any) if any.type_url == GRPC_STATS => continue,
            Some(any) if any.type_url == rbac::TYPE_URL => {
                XdsHttpFilter::Settled(RawHttpFilter::Rbac(rbac::settings(&any, &at)?))
            }
            Some(any) if any.type_url == jwt_authn::TYPE_URL => {
                XdsHttpFilter::Settled(RawHttpFilter::JwtAuthn(jwt_authn::settings(&any, &at)?))
            }
            // An optional filter that is not known is skipped, as Envoy does; so is one off
            // by default: a route that turns it on names settings this proxy refuses.
            _ if f.is_optional || f.disabled => continue,
            _ => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!(
                        "HTTP filter `{}` (api_key_auth, basic_auth, buffer, compressor, cors, csrf, custom_response, ext_authz, ext_proc, fault, grpc_web, header_mutation, health_check, jwt_authn, local_ratelimit, ratelimit, rbac and the router only)",
                        f.name
                    )],
                });
            }
        };
        let kind = match &filter {
            XdsHttpFilter::ExtAuthz(_) => "ext_authz",
            XdsHttpFilter::GlobalRateLimit(_) => "global_rate_limit",
            XdsHttpFilter::ExtProc(_) => "ext_proc",
            XdsHttpFilter::Settled(raw) => raw.name(),
        };
        let mut name = crate::filters::xds::chain_name(&f.name, kind);
        // Istio's chains repeat `envoy.filters.http.rbac` (an audit, a deny and an allow
        // filter): each is kept, told apart by its place.
        if kind == "rbac" && chain.iter().any(|f| f.name == name) {
            let repeated = format!("{name}{}", crate::filters::REPEATED);
            let before = chain
                .iter()
                .filter(|f| f.name.starts_with(&repeated))
                .count();
            name = format!("{repeated}{}", before + 2);
        }
        if chain.iter().any(|f| f.name == name) {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![format!(
                    "a second `{kind}` filter named `{}` (several of a type are told apart by `NAME/INSTANCE`)",
                    f.name
                )],
            });
        }
        if f.disabled {
            if kind == "health_check" {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec!["disabled (a health_check filter is the listener's)".into()],
                });
            }
            off.push(name.clone());
        }
        chain.push(XdsChainFilter { name, filter });
    }
    if !filters.last().is_some_and(is_router) {
        return Err(ResourceError::invalid(
            format!("{at}.http_filters"),
            "expected the router as the last filter",
        ));
    }
    Ok((chain, off))
}

/// The router's settings: `suppress_envoy_headers` (this proxy's own headers); the stats
/// switches change no behaviour.
fn router(any: &Any, http: &mut RawHttp, at: &str) -> Result<(), ResourceError> {
    let mut router = decode::<Router>(any, ROUTER, "a Router")?;
    http.suppress_proxy_headers = Some(std::mem::take(&mut router.suppress_envoy_headers));
    router.dynamic_stats = None;
    router.suppress_grpc_request_failure_code_stats = false;
    nothing_else(&router, fields::ROUTER, at)
}

fn common_options(
    mut common: HttpProtocolOptions,
    http: &mut RawHttp,
    at: &str,
) -> Result<(), ResourceError> {
    http.idle_timeout =
        duration(common.idle_timeout.take(), &format!("{at}.idle_timeout"))?.map(|t| {
            if t.is_zero() {
                crate::envoy::NO_TIMEOUT
            } else {
                t
            }
        });
    http.max_requests_per_connection = common.max_requests_per_connection.take().map(|v| v.value);
    http.max_stream_duration = duration(
        common.max_stream_duration.take(),
        &format!("{at}.max_stream_duration"),
    )?
    .filter(|d| !d.is_zero());
    // `0s` (or none) is no limit, as Envoy's.
    http.max_connection_duration = duration(
        common.max_connection_duration.take(),
        &format!("{at}.max_connection_duration"),
    )?
    .filter(|d| !d.is_zero());
    http.headers_with_underscores_action = Some(
        match std::mem::take(&mut common.headers_with_underscores_action) {
            0 => "allow",
            1 => "reject_request",
            2 => "drop_header",
            other => {
                return Err(ResourceError::invalid(
                    format!("{at}.headers_with_underscores_action"),
                    format!("unknown action {other}"),
                ));
            }
        }
        .to_owned(),
    );
    nothing_else(&common, fields::HTTP_PROTOCOL_OPTIONS, at)
}

fn h1_options(
    mut h1: Http1ProtocolOptions,
    http: &mut RawHttp,
    at: &str,
) -> Result<(), ResourceError> {
    http.accept_http_10 = Some(std::mem::take(&mut h1.accept_http_10));
    http.ignore_http11_upgrade = std::mem::take(&mut h1.ignore_http_11_upgrade)
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            crate::envoy::matchers::pattern_of(m, &format!("{at}.ignore_http_11_upgrade[{i}]"))
        })
        .collect::<Result<_, ResourceError>>()?;
    http.preserve_header_case =
        Some(crate::envoy::headers::preserve_case(&mut h1, at)?).filter(|keep| *keep);
    let host = std::mem::take(&mut h1.default_host_for_http_10);
    http.default_host_for_http_10 = (!host.is_empty()).then_some(host);
    // Absolute request targets are taken, as Envoy's default; the parser is this proxy's own.
    if h1.allow_absolute_url.take().is_some_and(|v| !v.value) {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["allow_absolute_url: false".into()],
        });
    }
    #[allow(deprecated)]
    {
        h1.use_balsa_parser = None;
    }
    // HTTP/1.1 trailers go on both ways here (those a request declares in `trailer`), which
    // is what `true` asks; Envoy's default, `false`, drops them, and is not done here.
    h1.enable_trailers = false;
    nothing_else(&h1, fields::HTTP1_PROTOCOL_OPTIONS, at)
}

fn h2_options(
    mut h2: Http2ProtocolOptions,
    http: &mut RawHttp,
    at: &str,
) -> Result<(), ResourceError> {
    http.max_concurrent_streams = h2.max_concurrent_streams.take().map(|v| v.value);
    http.initial_stream_window_size = h2.initial_stream_window_size.take().map(|v| v.value);
    http.initial_connection_window_size = h2.initial_connection_window_size.take().map(|v| v.value);
    if let Some(mut keepalive) = h2.connection_keepalive.take() {
        let at = format!("{at}.connection_keepalive");
        let interval = duration(keepalive.interval.take(), &format!("{at}.interval"))?;
        let timeout = duration(keepalive.timeout.take(), &format!("{at}.timeout"))?;
        // hyper pings at the interval itself: the jitter that spreads Envoy's pings is not
        // applied (it changes when, not whether, a dead peer is found).
        keepalive.interval_jitter = None;
        // A ping ahead of a new stream on an idle connection: a server opens no streams, so
        // Envoy sends none on the connection manager's side either.
        keepalive.connection_idle_interval = None;
        nothing_else(&keepalive, fields::KEEPALIVE_SETTINGS, &at)?;
        http.http2_keepalive = interval.map(|interval| crate::RawKeepalive { interval, timeout });
    }
    nothing_else(&h2, fields::HTTP2_PROTOCOL_OPTIONS, at)
}
