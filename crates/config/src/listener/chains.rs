//! A listener's filter chains: several sets of connection settings on one socket (a TLS
//! context, HTTP settings, filters and routes, or a TCP relay), each picked for a new
//! connection by what it shows: its SNI, ALPN, transport, addresses and ports, with the
//! rules of Envoy's `filter_chain_match`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize, Serializer};

use crate::*;

/// One chain: what picks it, and what its connections are served with.
#[derive(Debug, Clone, Serialize)]
pub struct FilterChainConfig {
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: ChainMatch,
    /// A listener's settings: the chain's own TLS, HTTP settings, filters, routes or TCP
    /// relay, access log and tracing. Its name, address and socket settings (limits, buffer
    /// limit, PROXY protocol, keep-alive) are the listener's.
    pub settings: Box<ListenerConfig>,
}

/// What a connection must show for a chain to serve it (Envoy's `filter_chain_match`). An
/// empty list or `None` asks nothing. Several chains may fit; the most specific wins, one
/// criterion after the other in Envoy's order: destination port, destination address,
/// server name, transport, application protocol, source address, source port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ChainMatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination_port: Option<u16>,
    /// The address the client connected to.
    #[serde(serialize_with = "nets", skip_serializing_if = "Vec::is_empty")]
    pub prefix_ranges: Vec<IpNet>,
    /// SNI names, lower case; `*.example.com` is any name under `example.com` (not itself).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub server_names: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_protocol: Option<TransportProtocol>,
    /// ALPN protocols the client offers (`h2`, `http/1.1`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub application_protocols: Vec<String>,
    #[serde(serialize_with = "nets", skip_serializing_if = "Vec::is_empty")]
    pub source_prefix_ranges: Vec<IpNet>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ports: Vec<u16>,
}

impl ChainMatch {
    /// Whether picking by this needs the connection's first bytes (its ClientHello).
    pub fn inspects(&self) -> bool {
        !self.server_names.is_empty()
            || self.transport_protocol.is_some()
            || !self.application_protocols.is_empty()
    }
}

/// What a connection's first bytes are: a TLS ClientHello or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportProtocol {
    Tls,
    RawBuffer,
    /// A QUIC connection (a `quic_only` listener's).
    Quic,
}

fn nets<S: Serializer>(nets: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(nets.iter().map(ToString::to_string))
}

/// A chain as the file writes it: a name, what picks it, and the listener keys it serves
/// its connections with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChain {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matcher: RawChainMatch,
    #[serde(default)]
    pub http: RawHttp,
    #[serde(default, deserialize_with = "crate::access_log::one_or_many")]
    pub access_log: Vec<RawAccessLog>,
    pub tls: Option<RawListenerTls>,
    pub tcp_proxy: Option<super::tcp_proxy::RawTcpProxy>,
    #[serde(default)]
    pub http_filters: Vec<RawChainFilter>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub virtual_hosts: Vec<RawVirtualHost>,
    pub ignore_port_in_host_matching: Option<bool>,
    pub tracing: Option<RawListenerTracing>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChainMatch {
    pub destination_port: Option<u32>,
    #[serde(default)]
    pub prefix_ranges: Vec<String>,
    #[serde(default)]
    pub server_names: Vec<String>,
    pub transport_protocol: Option<String>,
    #[serde(default)]
    pub application_protocols: Vec<String>,
    #[serde(default)]
    pub source_prefix_ranges: Vec<String>,
    #[serde(default)]
    pub source_ports: Vec<u32>,
}

/// The listener `raw`'s chains, checked; `raw` keeps its own settings (its default chain).
pub(crate) fn chains(
    raw: &mut RawListener,
    path: &str,
    check: &dyn Fn(RawListener, &str) -> Result<ListenerConfig, ConfigError>,
) -> Result<Vec<FilterChainConfig>, ConfigError> {
    let raws = std::mem::take(&mut raw.chains);
    let quic_http3 = raw.http3.clone().filter(|h| h.quic_only == Some(true));
    let mut chains: Vec<FilterChainConfig> = Vec::with_capacity(raws.len());
    let mut matchers = checked_matches(
        raws.iter()
            .enumerate()
            .map(|(i, c)| (c.matcher.clone(), format!("{path}.chains[{i}].match"))),
    )?
    .into_iter();
    for (i, chain) in raws.into_iter().enumerate() {
        let at = format!("{path}.chains[{i}]");
        if chains.iter().any(|c| c.name == chain.name) || chain.name.is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!("expected a name no other chain has, found `{}`", chain.name),
            ));
        }
        let matcher = matchers.next().unwrap_or_default();
        // One QUIC transport serves all of a QUIC-only listener's chains: its streams and
        // windows are the listener's, not a chain's.
        let transport = [
            (
                "max_concurrent_streams",
                chain.http.max_concurrent_streams.is_some(),
            ),
            (
                "initial_stream_window_size",
                chain.http.initial_stream_window_size.is_some(),
            ),
            (
                "initial_connection_window_size",
                chain.http.initial_connection_window_size.is_some(),
            ),
        ];
        let body = RawListener {
            name: raw.name.clone(),
            address: raw.address.clone(),
            connection_limit: None,
            connection_balance: None,
            max_connections_to_accept_per_socket_event: None,
            bypass_overload_manager: None,
            ignore_global_conn_limit: None,
            tcp_keepalive: None,
            per_connection_buffer_limit_bytes: raw.per_connection_buffer_limit_bytes,
            http: chain.http,
            access_log: chain.access_log,
            proxy_protocol: None,
            tls: chain.tls,
            // A QUIC-only listener's chains serve QUIC alone, as it does.
            http3: quic_http3.clone(),
            tcp_proxy: chain.tcp_proxy,
            ext_authz: None,
            http_filters: chain.http_filters,
            routes: chain.routes,
            virtual_hosts: chain.virtual_hosts,
            ignore_port_in_host_matching: chain.ignore_port_in_host_matching,
            tracing: chain.tracing,
            tracing_provider: None,
            chains: Vec::new(),
            default_chain: None,
            listener_filters_timeout: None,
            continue_on_listener_filters_timeout: None,
            http_inspector: None,
            dynamic: raw.dynamic,
        };
        if quic_http3.is_some() {
            quic_match(&matcher, &format!("{at}.match"))?;
            if let Some((field, _)) = transport.iter().find(|(_, set)| *set) {
                return Err(ConfigError::invalid(
                    format!("{at}.http.{field}"),
                    "a QUIC-only listener's chains share its QUIC transport: set streams on \
                     the listener's `http3`, windows on the listener's `http`",
                ));
            }
        } else if matcher.transport_protocol == Some(TransportProtocol::Quic) {
            return Err(ConfigError::invalid(
                format!("{at}.match.transport_protocol"),
                "`quic` picks QUIC connections: only on a `quic_only` listener (`http3`)",
            ));
        }
        let settings = check(body, &at)?;
        let plain = matcher.transport_protocol == Some(TransportProtocol::RawBuffer);
        let inspects_http = raw.http_inspector == Some(true);
        if plain && !matcher.application_protocols.is_empty() && !inspects_http {
            return Err(ConfigError::invalid(
                format!("{at}.match.application_protocols"),
                "plain-text connections show no protocol unless the listener has \
                 `http_inspector: true`: the chain would never be picked",
            ));
        }
        // Protocols pick plain text only with `raw_buffer` (and the HTTP inspector); without
        // a transport they pick TLS connections too.
        let picks_tls = !matcher.server_names.is_empty()
            || (!matcher.application_protocols.is_empty() && !plain)
            || matcher.transport_protocol == Some(TransportProtocol::Tls);
        if picks_tls && settings.tls.is_none() && settings.tcp_proxy.is_none() {
            return Err(ConfigError::invalid(
                at,
                "picks TLS connections (by server_names, application_protocols or \
                 transport_protocol: tls) but neither terminates TLS (`tls`) nor relays it \
                 (`tcp_proxy`)",
            ));
        }
        if matcher.transport_protocol == Some(TransportProtocol::RawBuffer)
            && settings.tls.is_some()
        {
            return Err(ConfigError::invalid(
                format!("{at}.tls"),
                "the chain picks connections that are not TLS (transport_protocol: raw_buffer)",
            ));
        }
        chains.push(FilterChainConfig {
            name: chain.name,
            matcher,
            settings: Box::new(settings),
        });
    }
    Ok(chains)
}

/// A QUIC-only listener's chain is picked by what its handshake shows: its certificate is
/// chosen by SNI before any address is looked at, so a chain picked by address could get
/// another chain's certificate. Such matches, and ones no QUIC connection fits, are refused.
fn quic_match(matcher: &ChainMatch, at: &str) -> Result<(), ConfigError> {
    let by_address = [
        ("prefix_ranges", !matcher.prefix_ranges.is_empty()),
        (
            "source_prefix_ranges",
            !matcher.source_prefix_ranges.is_empty(),
        ),
        ("source_ports", !matcher.source_ports.is_empty()),
    ];
    if let Some((field, _)) = by_address.iter().find(|(_, set)| *set) {
        return Err(ConfigError::invalid(
            format!("{at}.{field}"),
            "a QUIC connection's certificate is chosen by SNI alone: its chains are picked \
             by server_names (and port), not by address",
        ));
    }
    if matches!(
        matcher.transport_protocol,
        Some(TransportProtocol::Tls | TransportProtocol::RawBuffer)
    ) {
        return Err(ConfigError::invalid(
            format!("{at}.transport_protocol"),
            "a QUIC listener's connections are `quic`: the chain would never be picked",
        ));
    }
    if let Some(other) = (matcher.application_protocols.iter()).find(|p| p.as_str() != "h3") {
        return Err(ConfigError::invalid(
            format!("{at}.application_protocols"),
            format!("QUIC connections here speak `h3` only: `{other}` would never be picked"),
        ));
    }
    Ok(())
}

/// Chains' matches, checked, and checked against each other: two that one connection could
/// fit equally are refused (as Envoy). `at` names each in errors.
pub(crate) fn checked_matches(
    raws: impl Iterator<Item = (RawChainMatch, String)>,
) -> Result<Vec<ChainMatch>, ConfigError> {
    let mut seen: HashMap<Combination, usize> = HashMap::new();
    let mut matches = Vec::new();
    for (i, (raw, at)) in raws.enumerate() {
        let matcher = chain_match(raw, &at)?;
        let points = [
            matcher.prefix_ranges.len(),
            matcher.server_names.len(),
            matcher.application_protocols.len(),
            matcher.source_prefix_ranges.len(),
            matcher.source_ports.len(),
        ]
        .iter()
        .try_fold(1usize, |n, len| n.checked_mul((*len).max(1)));
        if points.is_none_or(|n| n > MAX_MATCH_POINTS) {
            return Err(ConfigError::invalid(
                at,
                format!(
                    "its lists make over {MAX_MATCH_POINTS} combinations: split it into chains"
                ),
            ));
        }
        for combination in combinations(&matcher) {
            if let Some(other) = seen.insert(combination, i) {
                return Err(ConfigError::invalid(
                    at,
                    format!("matches what chain {other} matches: one connection would fit both"),
                ));
            }
        }
        matches.push(matcher);
    }
    Ok(matches)
}

/// A chain's settings take the listener's socket settings (one socket serves them all).
pub(crate) fn inherit(listener: &mut ListenerConfig) {
    let mut chains = std::mem::take(&mut listener.filter_chains);
    for chain in &mut chains {
        let settings = &mut chain.settings;
        settings.name.clone_from(&listener.name);
        settings.address = listener.address;
        settings.connection_limit = listener.connection_limit;
        settings.connection_balance = listener.connection_balance;
        settings.max_connections_to_accept_per_socket_event =
            listener.max_connections_to_accept_per_socket_event;
        settings.bypass_overload_manager = listener.bypass_overload_manager;
        settings.ignore_global_conn_limit = listener.ignore_global_conn_limit;
        settings.tcp_keepalive = listener.tcp_keepalive;
        settings.buffer_limit = listener.buffer_limit;
        settings.proxy_protocol = listener.proxy_protocol;
        settings.listener_filters_timeout = listener.listener_filters_timeout;
        settings.continue_on_listener_filters_timeout =
            listener.continue_on_listener_filters_timeout;
    }
    listener.filter_chains = chains;
}

fn chain_match(raw: RawChainMatch, at: &str) -> Result<ChainMatch, ConfigError> {
    let port = |p: u32, at: String| match u16::try_from(p) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ConfigError::invalid(
            at,
            format!("expected a port (1 to 65535), found {p}"),
        )),
    };
    let ranges = |list: Vec<String>, at: String| -> Result<Vec<IpNet>, ConfigError> {
        list.into_iter()
            .map(|text| {
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| {
                        ConfigError::invalid(
                            at.clone(),
                            format!("expected an address range (`10.0.0.0/8`), found `{text}`"),
                        )
                    })
            })
            .collect()
    };
    let server_names = raw
        .server_names
        .into_iter()
        .map(|name| server_name(&name, &format!("{at}.server_names")))
        .collect::<Result<Vec<_>, _>>()?;
    let transport_protocol = match raw.transport_protocol.as_deref() {
        None | Some("") => None,
        Some("tls") => Some(TransportProtocol::Tls),
        Some("raw_buffer") => Some(TransportProtocol::RawBuffer),
        Some("quic") => Some(TransportProtocol::Quic),
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{at}.transport_protocol"),
                format!("expected `tls`, `raw_buffer` or `quic`, found `{other}`"),
            ));
        }
    };
    if raw.application_protocols.iter().any(String::is_empty) {
        return Err(ConfigError::invalid(
            format!("{at}.application_protocols"),
            "expected protocol names (`h2`, `http/1.1`), found an empty one",
        ));
    }
    Ok(ChainMatch {
        destination_port: raw
            .destination_port
            .map(|p| port(p, format!("{at}.destination_port")))
            .transpose()?,
        prefix_ranges: ranges(raw.prefix_ranges, format!("{at}.prefix_ranges"))?,
        server_names,
        transport_protocol,
        application_protocols: raw.application_protocols,
        source_prefix_ranges: ranges(
            raw.source_prefix_ranges,
            format!("{at}.source_prefix_ranges"),
        )?,
        source_ports: raw
            .source_ports
            .into_iter()
            .map(|p| port(p, format!("{at}.source_ports")))
            .collect::<Result<_, _>>()?,
    })
}

/// An SNI name to match: a host name, or `*.` and one (Envoy's only wildcard).
fn server_name(name: &str, at: &str) -> Result<String, ConfigError> {
    let lower = name.to_ascii_lowercase();
    if !crate::tls::is_host_name(&lower) {
        return Err(ConfigError::invalid(
            at,
            format!(
                "expected a host name or `*.` and one (`*.example.com`; no other wildcard), \
                 found `{name}`"
            ),
        ));
    }
    Ok(lower)
}

/// Combinations one chain's match may make (each list's length multiplied).
const MAX_MATCH_POINTS: usize = 10_000;

/// One point of a match's space: one value or "any" per criterion.
type Combination = (
    Option<u16>,
    Option<IpNet>,
    Option<String>,
    Option<TransportProtocol>,
    Option<String>,
    Option<IpNet>,
    Option<u16>,
);

/// Every point a match covers; two chains covering one point are ambiguous (Envoy refuses
/// them too).
fn combinations(m: &ChainMatch) -> HashSet<Combination> {
    fn any<T: Clone>(list: &[T]) -> Vec<Option<T>> {
        if list.is_empty() {
            vec![None]
        } else {
            list.iter().cloned().map(Some).collect()
        }
    }
    let mut out = HashSet::new();
    for net in any(&m.prefix_ranges) {
        for name in any(&m.server_names) {
            for alpn in any(&m.application_protocols) {
                for source in any(&m.source_prefix_ranges) {
                    for port in any(&m.source_ports) {
                        out.insert((
                            m.destination_port,
                            net,
                            name.clone(),
                            m.transport_protocol,
                            alpn.clone(),
                            source,
                            port,
                        ));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn load(chains: &str) -> Result<Config, crate::ConfigError> {
        Config::from_yaml(&format!(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    chains:\n{chains}clusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n"
        ))
    }

    #[test]
    fn chains_take_the_listener_socket_settings_and_no_default_without_routes() {
        let config = load(
            "      - name: a\n        match: { server_names: [A.example.com, '*.b.example.com'] }\n        tcp_proxy: { cluster: c }\n",
        )
        .expect("valid");
        let listener = &config.listeners[0];
        assert!(!listener.default_chain);
        let chain = &listener.filter_chains[0];
        assert_eq!(chain.settings.name, "l");
        assert_eq!(
            chain.matcher.server_names,
            ["a.example.com", "*.b.example.com"]
        );
    }

    #[test]
    fn overlapping_matches_and_bad_names_are_refused() {
        let error = load(
            "      - name: a\n        match: { server_names: [a.example.com, b.example.com] }\n        tcp_proxy: { cluster: c }\n      - name: b\n        match: { server_names: [b.example.com] }\n        tcp_proxy: { cluster: c }\n",
        )
        .expect_err("ambiguous");
        assert!(error.to_string().contains("chains[1].match"), "{error}");
        let error = load(
            "      - name: a\n        match: { server_names: ['www.*.com'] }\n        tcp_proxy: { cluster: c }\n",
        )
        .expect_err("partial wildcard");
        assert!(error.to_string().contains("server_names"), "{error}");
        let error = load(
            "      - name: a\n        match: { transport_protocol: quic }\n        tcp_proxy: { cluster: c }\n",
        )
        .expect_err("unknown transport");
        assert!(error.to_string().contains("transport_protocol"), "{error}");
        let error = load(
            "      - name: a\n        match: { server_names: [a.example.com] }\n        routes: [{ match: { prefix: / }, cluster: c }]\n",
        )
        .expect_err("picked by SNI, served as plain HTTP");
        assert!(error.to_string().contains("neither terminates"), "{error}");
    }

    fn quic_only(chains: &str) -> Result<Config, crate::ConfigError> {
        Config::from_yaml(&format!(
            "listeners:\n  - name: q\n    address: 127.0.0.1:8443\n    http3: {{ quic_only: true }}\n    chains:\n{chains}  - name: t\n    address: 127.0.0.1:8443\n    routes: [{{ match: {{ prefix: / }}, cluster: c }}]\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n"
        ))
    }

    /// A folder with `cert.pem`, `key.pem`, and two CAs (`ca.pem`, `other-ca.pem`), for the
    /// files TLS settings name (config reads them).
    fn pem_files_dir(test: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("legate-{test}-{}", std::process::id()))
    }

    fn pem_files(test: &str) -> std::path::PathBuf {
        let dir = pem_files_dir(test);
        std::fs::create_dir_all(&dir).unwrap();
        for (cert, key, names) in [
            ("cert.pem", Some("key.pem"), "a.example.com"),
            ("ca.pem", None, "ca"),
            ("other-ca.pem", None, "other ca"),
        ] {
            let pair = rcgen::generate_simple_self_signed(vec![names.to_owned()]).unwrap();
            std::fs::write(dir.join(cert), pair.cert.pem()).unwrap();
            if let Some(key) = key {
                std::fs::write(dir.join(key), pair.signing_key.serialize_pem()).unwrap();
            }
        }
        dir
    }

    #[test]
    fn a_quic_only_listener_picks_its_chains_by_sni_beside_a_tcp_listener() {
        let dir = pem_files("quic-chains");
        let dir = dir.display();
        let tls_with = |client: &str| {
            format!(
                "tls: {{ certificates: [{{ cert_chain: {dir}/cert.pem, private_key: {dir}/key.pem }}]{client} }}"
            )
        };
        let tls = tls_with("");
        let chain = |name: &str, matcher: &str| {
            format!(
                "      - name: {name}\n        match: {matcher}\n        {tls}\n        routes: [{{ match: {{ prefix: / }}, cluster: c }}]\n"
            )
        };
        let config = quic_only(
            &(chain("a", "{ server_names: [a.example.com] }")
                + &chain("b", "{ transport_protocol: quic }")),
        )
        .expect("chains by SNI, and one for any QUIC connection");
        let quic = &config.listeners[0];
        assert!(!quic.serves_tcp() && config.listeners[1].serves_tcp());
        assert!(
            quic.filter_chains[0].settings.http3.is_some(),
            "chains serve QUIC"
        );
        for (matcher, field) in [
            (
                "{ source_prefix_ranges: [10.0.0.0/8] }",
                "source_prefix_ranges",
            ),
            ("{ prefix_ranges: [127.0.0.1] }", "prefix_ranges"),
            ("{ source_ports: [5000] }", "source_ports"),
            ("{ transport_protocol: tls }", "transport_protocol"),
            ("{ application_protocols: [h2] }", "application_protocols"),
        ] {
            let error = quic_only(&chain("a", matcher)).expect_err(field);
            assert!(error.to_string().contains(field), "{error}");
        }
        // One TLS server checks client certificates for all chains: the same in each.
        let with_client = |name: &str, names: &str, ca: &str| {
            let tls = tls_with(&format!(", client_certificate: {{ ca: {dir}/{ca} }}"));
            format!(
                "      - name: {name}\n        match: {{ server_names: [{names}] }}\n        {tls}\n        routes: [{{ match: {{ prefix: / }}, cluster: c }}]\n"
            )
        };
        quic_only(
            &(with_client("a", "a.example.com", "ca.pem")
                + &with_client("b", "b.example.com", "ca.pem")),
        )
        .expect("the same client check");
        let error = quic_only(
            &(with_client("a", "a.example.com", "ca.pem")
                + &with_client("b", "b.example.com", "other-ca.pem")),
        )
        .expect_err("different client checks");
        assert!(error.to_string().contains("client_certificate"), "{error}");
        let error = quic_only(&format!(
            "      - name: a\n        match: {{ server_names: [a.example.com] }}\n        {tls}\n        http: {{ max_concurrent_streams: 10 }}\n        routes: [{{ match: {{ prefix: / }}, cluster: c }}]\n"
        ))
        .expect_err("the transport is the listener's");
        assert!(
            error.to_string().contains("max_concurrent_streams"),
            "{error}"
        );
        // Two QUIC listeners, or QUIC beside a TCP listener's HTTP/3, on one address clash.
        let error = Config::from_yaml(&format!(
            "listeners:\n  - name: q\n    address: 127.0.0.1:8443\n    http3: {{ quic_only: true }}\n    {tls}\n    routes: [{{ match: {{ prefix: / }}, cluster: c }}]\n  - name: t\n    address: 127.0.0.1:8443\n    http3: {{}}\n    {tls}\n    routes: [{{ match: {{ prefix: / }}, cluster: c }}]\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n"
        ))
        .expect_err("both serve QUIC on the port");
        assert!(error.to_string().contains("already used"), "{error}");
        let _ = std::fs::remove_dir_all(pem_files_dir("quic-chains"));
    }

    /// 0-RTT resumes a session, before any client certificate: a listener with
    /// `early_data` must resume sessions and ask for none, in every chain.
    #[test]
    fn early_data_needs_resumption_and_no_client_certificate() {
        let dir = pem_files("quic-early-data");
        let dir = dir.display();
        let tls_with = |more: &str| {
            format!(
                "tls: {{ certificates: [{{ cert_chain: {dir}/cert.pem, private_key: {dir}/key.pem }}]{more} }}"
            )
        };
        let listener = |more: &str| {
            Config::from_yaml(&format!(
                "listeners:\n  - name: l\n    address: 127.0.0.1:8443\n    http3: {{ early_data: true }}\n    {}\n    routes: [{{ match: {{ prefix: / }}, cluster: c }}]\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n",
                tls_with(more)
            ))
        };
        let config = listener("").expect("tickets resume sessions");
        assert!(config.listeners[0].http3.as_ref().unwrap().early_data);
        listener(", session_tickets: false").expect("the session cache resumes them");
        for (more, words) in [
            (", session_cache_size: 0", "session_cache_size"),
            (
                &format!(", client_certificate: {{ ca: {dir}/ca.pem }}") as &str,
                "client_certificate",
            ),
        ] {
            let error = listener(more).expect_err(words);
            assert!(error.to_string().contains(words), "{error}");
            assert!(error.to_string().contains("early_data"), "{error}");
        }
        // A QUIC-only listener's chains too.
        let chain = |more: &str| {
            format!(
                "      - name: a\n        match: {{ server_names: [a.example.com] }}\n        {}\n        routes: [{{ match: {{ prefix: / }}, cluster: c }}]\n",
                tls_with(more)
            )
        };
        let quic = |chains: &str| {
            Config::from_yaml(&format!(
                "listeners:\n  - name: q\n    address: 127.0.0.1:8443\n    http3: {{ quic_only: true, early_data: true }}\n    chains:\n{chains}clusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n"
            ))
        };
        quic(&chain("")).expect("a chain that resumes sessions");
        let error = quic(&chain(&format!(
            ", client_certificate: {{ ca: {dir}/ca.pem }}"
        )))
        .expect_err("a chain asking for certificates");
        assert!(error.to_string().contains("chains[0].tls"), "{error}");
        let _ = std::fs::remove_dir_all(pem_files_dir("quic-early-data"));
    }

    #[test]
    fn plain_text_protocols_need_the_http_inspector() {
        let chain = "      - name: a\n        match: { transport_protocol: raw_buffer, application_protocols: [h2c] }\n        routes: [{ match: { prefix: / }, cluster: c }]\n";
        let error = load(chain).expect_err("never picked");
        assert!(error.to_string().contains("http_inspector"), "{error}");
        let config = Config::from_yaml(&format!(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    http_inspector: true\n    chains:\n{chain}clusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n"
        ))
        .expect("with the inspector");
        assert!(config.listeners[0].http_inspector);
        // Without a transport, protocols pick TLS connections too: such a chain must take TLS.
        let error = Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    http_inspector: true\n    chains:\n      - name: a\n        match: { application_protocols: [http/1.1] }\n        routes: [{ match: { prefix: / }, cluster: c }]\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n",
        )
        .expect_err("picks TLS");
        assert!(error.to_string().contains("neither terminates"), "{error}");
    }
}
