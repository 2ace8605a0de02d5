//! Envoy resources as tests and benchmarks hand them to the [`crate::ManagementServer`]: a
//! listener whose routes come from RDS, route configurations, EDS clusters and their
//! endpoints, each with what a real Envoy needs (the ADS config sources) so that Envoy and
//! Legate can be given the same ones.

use std::net::SocketAddr;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress, address,
    config_source, socket_address,
};
use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route,
    route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
    ExtAuthz, ExtAuthzPerRoute, ext_authz, ext_authz_per_route,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};

use crate::xds::any;

/// An Envoy socket address.
pub fn socket(addr: SocketAddr) -> Option<Address> {
    Some(Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: addr.ip().to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                addr.port(),
            ))),
            ..Default::default()
        })),
    })
}

/// "From the ADS stream", as Envoy wants RDS and EDS sources written.
pub fn ads() -> Option<ConfigSource> {
    Some(ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    })
}

/// The ext_authz HTTP filter, checking with the gRPC service of `cluster`.
pub fn ext_authz_filter(cluster: &str) -> HttpFilter {
    let authz = ExtAuthz {
        services: Some(ext_authz::Services::GrpcService(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: cluster.into(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        })),
        ..Default::default()
    };
    HttpFilter {
        name: "envoy.filters.http.ext_authz".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&authz))),
        ..Default::default()
    }
}

/// `route` with ext_authz turned off.
pub fn without_ext_authz(mut route: Route) -> Route {
    route.typed_per_filter_config.insert(
        "envoy.filters.http.ext_authz".into(),
        any(&ExtAuthzPerRoute {
            r#override: Some(ext_authz_per_route::Override::Disabled(true)),
        }),
    );
    route
}

/// A listener on `addr`: one HTTP connection manager with the router, routes from RDS under
/// `routes`.
pub fn listener(name: &str, addr: SocketAddr, routes: &str) -> Listener {
    listener_with_filters(name, addr, routes, Vec::new())
}

/// As [`listener`], with `filters` before the router.
pub fn listener_with_filters(
    name: &str,
    addr: SocketAddr,
    routes: &str,
    mut filters: Vec<HttpFilter>,
) -> Listener {
    filters.push(HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(
            any(&Router::default()),
        )),
        ..Default::default()
    });
    let hcm = HttpConnectionManager {
        stat_prefix: name.into(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            route_config_name: routes.into(),
            config_source: ads(),
        })),
        http_filters: filters,
        ..Default::default()
    };
    Listener {
        name: name.into(),
        address: socket(addr),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One filter chain of a [`quic_listener`]: picked by `server_names`, serving the certificate
/// and key in those files, with routes from RDS under `routes`.
pub struct QuicChain<'a> {
    pub server_names: &'a [&'a str],
    pub cert_file: &'a str,
    pub key_file: &'a str,
    pub routes: &'a str,
}

/// A QUIC listener on `addr` as Envoy Gateway sends one beside its TCP listener: a UDP
/// address with `quic_options`, `drain_type: MODIFY_ONLY`, and per chain a QUIC transport
/// socket and a connection manager with `codec_type: HTTP3`.
pub fn quic_listener(name: &str, addr: SocketAddr, chains: &[QuicChain<'_>]) -> Listener {
    use envoy_types::pb::envoy::config::core::v3::{
        DataSource, Http3ProtocolOptions, TransportSocket, data_source, transport_socket,
    };
    use envoy_types::pb::envoy::config::listener::v3::{
        FilterChainMatch, QuicProtocolOptions, UdpListenerConfig, listener::DrainType,
    };
    use envoy_types::pb::envoy::extensions::transport_sockets::quic::v3::QuicDownstreamTransport;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, DownstreamTlsContext, TlsCertificate,
    };
    let file = |path: &str| {
        Some(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.into())),
            ..Default::default()
        })
    };
    let mut address = socket(addr);
    if let Some(Address {
        address: Some(address::Address::SocketAddress(socket)),
    }) = &mut address
    {
        socket.protocol = socket_address::Protocol::Udp as i32;
    }
    let filter_chains = chains
        .iter()
        .map(|chain| {
            let mut template = listener(name, addr, chain.routes).filter_chains.remove(0);
            let Some(filter::ConfigType::TypedConfig(hcm)) = &template.filters[0].config_type
            else {
                unreachable!("the template's connection manager is inline");
            };
            let mut hcm: HttpConnectionManager =
                prost::Message::decode(hcm.value.as_slice()).expect("the template decodes");
            hcm.codec_type = http_connection_manager::CodecType::Http3 as i32;
            hcm.http3_protocol_options = Some(Http3ProtocolOptions::default());
            template.filters[0].config_type = Some(filter::ConfigType::TypedConfig(any(&hcm)));
            let tls = DownstreamTlsContext {
                common_tls_context: Some(CommonTlsContext {
                    alpn_protocols: vec!["h3".into()],
                    tls_certificates: vec![TlsCertificate {
                        certificate_chain: file(chain.cert_file),
                        private_key: file(chain.key_file),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            let quic = QuicDownstreamTransport {
                downstream_tls_context: Some(tls),
                ..Default::default()
            };
            FilterChain {
                name: format!("{name}/{}", chain.server_names.join(",")),
                filter_chain_match: Some(FilterChainMatch {
                    server_names: chain.server_names.iter().map(|n| (*n).into()).collect(),
                    ..Default::default()
                }),
                transport_socket: Some(TransportSocket {
                    name: "envoy.transport_sockets.quic".into(),
                    config_type: Some(transport_socket::ConfigType::TypedConfig(any(&quic))),
                }),
                ..template
            }
        })
        .collect();
    Listener {
        name: name.into(),
        address,
        drain_type: DrainType::ModifyOnly as i32,
        udp_listener_config: Some(UdpListenerConfig {
            quic_options: Some(QuicProtocolOptions::default()),
            ..Default::default()
        }),
        filter_chains,
        ..Default::default()
    }
}

fn prefix(prefix: &str) -> Option<RouteMatch> {
    Some(RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Prefix(prefix.into())),
        ..Default::default()
    })
}

/// Requests under `path_prefix` go to `cluster`.
pub fn forward(path_prefix: &str, cluster: &str) -> Route {
    Route {
        r#match: prefix(path_prefix),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Requests under `path_prefix` are answered `status` with no body.
pub fn direct(path_prefix: &str, status: u32) -> Route {
    Route {
        r#match: prefix(path_prefix),
        action: Some(route::Action::DirectResponse(DirectResponseAction {
            status,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// One virtual host for every domain, with `routes` in order.
pub fn route_config(name: &str, routes: Vec<Route>) -> RouteConfiguration {
    RouteConfiguration {
        name: name.into(),
        virtual_hosts: vec![VirtualHost {
            name: "all".into(),
            domains: vec!["*".into()],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A cluster whose endpoints come from EDS (under its own name).
pub fn eds_cluster(name: &str, policy: cluster::LbPolicy) -> Cluster {
    Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: ads(),
            service_name: String::new(),
        }),
        lb_policy: policy as i32,
        ..Default::default()
    }
}

/// The endpoints of `cluster`, weight 1 each.
pub fn assignment(cluster: &str, hosts: &[SocketAddr]) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: cluster.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: hosts
                .iter()
                .map(|h| LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: socket(*h),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Envoy Gateway's authorization for one route: an `RBACPerRoute` in the matcher form that
/// allows (`rule`) requests whose `header` is `value` (`ignore_case` as given) and denies
/// the rest.
pub fn rbac_allowing_header(
    rule: &str,
    header: &str,
    value: &str,
    ignore_case: bool,
) -> envoy_types::pb::envoy::extensions::filters::http::rbac::v3::RbacPerRoute {
    use envoy_types::pb::envoy::config::rbac::v3::Action;
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::{Rbac, RbacPerRoute};
    use envoy_types::pb::envoy::r#type::matcher::v3::HttpRequestHeaderMatchInput;
    use envoy_types::pb::xds::core::v3::TypedExtensionConfig;
    use envoy_types::pb::xds::r#type::matcher::v3 as xm;
    use xm::matcher::matcher_list::predicate::{MatchType, SinglePredicate, single_predicate};
    use xm::matcher::matcher_list::{FieldMatcher, Predicate};
    use xm::matcher::{MatcherList, MatcherType, OnMatch, on_match};

    let action = |name: &str, action: i32| OnMatch {
        on_match: Some(on_match::OnMatch::Action(TypedExtensionConfig {
            name: name.into(),
            typed_config: Some(any(&Action {
                name: name.into(),
                action,
            })),
        })),
        keep_matching: false,
    };
    let predicate = Predicate {
        match_type: Some(MatchType::SinglePredicate(SinglePredicate {
            input: Some(TypedExtensionConfig {
                name: "header".into(),
                typed_config: Some(any(&HttpRequestHeaderMatchInput {
                    header_name: header.into(),
                })),
            }),
            matcher: Some(single_predicate::Matcher::ValueMatch(xm::StringMatcher {
                match_pattern: Some(xm::string_matcher::MatchPattern::Exact(value.into())),
                ignore_case,
            })),
        })),
    };
    RbacPerRoute {
        rbac: Some(Rbac {
            matcher: Some(xm::Matcher {
                matcher_type: Some(MatcherType::MatcherList(MatcherList {
                    matchers: vec![FieldMatcher {
                        predicate: Some(predicate),
                        on_match: Some(action(rule, 0)),
                    }],
                })),
                on_no_match: Some(Box::new(action("DENY", 1))),
            }),
            ..Default::default()
        }),
    }
}
