//! A listener, checked: its address, limits, HTTP settings, TLS, log, filters and routes.

use crate::values::*;
use crate::*;

pub(crate) fn listener(
    mut raw: RawListener,
    path: &str,
    cluster_index: &crate::cluster::ClusterIndex<'_>,
    clusters: &crate::route::memo::Clusters<'_>,
    traced: bool,
) -> Result<ListenerConfig, ConfigError> {
    let name = if raw.dynamic {
        dynamic_name(raw.name.clone(), path)?
    } else {
        name(raw.name.clone(), path)?
    };
    let address = socket_addr(&raw.address, &format!("{path}.address"))?;
    let filter_chains = super::chains::chains(&mut raw, path, &|body, at| {
        listener(body, at, cluster_index, clusters, traced)
    })?;
    let own = !raw.routes.is_empty() || !raw.virtual_hosts.is_empty() || raw.tcp_proxy.is_some();
    let default_chain = match raw.default_chain {
        None => filter_chains.is_empty() || own,
        Some(false) if filter_chains.is_empty() => {
            return Err(ConfigError::invalid(
                format!("{path}.default_chain"),
                "`false` needs `chains`: nothing would serve the listener's connections",
            ));
        }
        Some(false) if own || raw.tls.is_some() => {
            return Err(ConfigError::invalid(
                format!("{path}.default_chain"),
                "`false`: the listener's own routes, tcp_proxy and tls would serve nothing",
            ));
        }
        Some(on) => on,
    };
    if !default_chain
        && (raw.tls.is_some() || !raw.http_filters.is_empty() || !raw.access_log.is_empty())
    {
        return Err(ConfigError::invalid(
            path.to_owned(),
            "its chains serve every connection (it has no routes or tcp_proxy of its own): \
             `tls`, `http_filters` and `access_log` go in each chain",
        ));
    }
    let connection_limit = limit(raw.connection_limit, &format!("{path}.connection_limit"))?;
    let connection_balance = match raw.connection_balance.as_deref() {
        None | Some("reuse_port") => ConnectionBalance::ReusePort,
        Some("exact") => ConnectionBalance::Exact,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.connection_balance"),
                format!("expected `reuse_port` or `exact`, found `{other}`"),
            ));
        }
    };
    let max_connections_to_accept_per_socket_event =
        match raw.max_connections_to_accept_per_socket_event {
            Some(0) => {
                return Err(ConfigError::invalid(
                    format!("{path}.max_connections_to_accept_per_socket_event"),
                    "expected at least 1",
                ));
            }
            other => other,
        };
    let max_concurrent_streams = raw
        .http
        .max_concurrent_streams
        .unwrap_or(DEFAULT_MAX_CONCURRENT_STREAMS);
    if max_concurrent_streams == 0 {
        return Err(ConfigError::invalid(
            format!("{path}.http.max_concurrent_streams"),
            "expected at least 1",
        ));
    }
    let buffer_limit = buffer_limit(
        raw.per_connection_buffer_limit_bytes,
        &format!("{path}.per_connection_buffer_limit_bytes"),
    )?;
    if raw.ext_authz.is_some() {
        return Err(ConfigError::invalid(
            format!("{path}.ext_authz"),
            "ext_authz is a filter now: write it as `http_filters: [{ ext_authz: { ... } }]`",
        ));
    }
    let tcp_proxy = match raw.tcp_proxy.take() {
        None => None,
        Some(tcp) => {
            let at = format!("{path}.tcp_proxy");
            if !raw.routes.is_empty()
                || !raw.virtual_hosts.is_empty()
                || !raw.http_filters.is_empty()
                || raw.tracing.is_some()
            {
                return Err(ConfigError::invalid(
                    at,
                    "relays bytes, not HTTP: not with routes, virtual_hosts, http_filters \
                     or tracing",
                ));
            }
            // No protocol is offered by ALPN unless written: the bytes relayed are not HTTP.
            if let Some(tls) = &mut raw.tls {
                tls.alpn.get_or_insert_with(Vec::new);
            }
            Some(super::tcp_proxy::check(
                tcp,
                &at,
                cluster_index,
                clusters.all,
            )?)
        }
    };
    let http_filters = filters::http_filters(
        raw.http_filters,
        &format!("{path}.http_filters"),
        buffer_limit,
        cluster_index,
    )?;
    let path_normalization = path_normalization(
        raw.http.path_normalization.clone(),
        &format!("{path}.http.path_normalization"),
    )?;
    // Without a default chain the listener's own settings serve nothing: no routes.
    let mut route_config = if tcp_proxy.is_some() || !default_chain {
        RouteConfiguration::flat(Vec::new())
    } else {
        crate::route::check::route_configuration(
            raw.routes,
            raw.virtual_hosts,
            path,
            &crate::route::check::RouteCtx {
                cluster_index,
                clusters,
                chain: &http_filters,
                dynamic: raw.dynamic,
                path_normalization,
            },
        )?
    };
    route_config.ignore_port_in_host_matching = raw.ignore_port_in_host_matching.unwrap_or(false);
    let access_logs =
        crate::access_log::access_logs(raw.access_log, &format!("{path}.access_log"))?;
    let detection = super::client_address::client_detection(
        std::mem::take(&mut raw.http.original_ip_detection),
        &format!("{path}.http.original_ip_detection"),
    )?;
    if !detection.is_empty()
        && (raw.http.use_remote_address == Some(true)
            || raw.http.xff_num_trusted_hops.is_some_and(|n| n > 0))
    {
        return Err(ConfigError::invalid(
            format!("{path}.http.original_ip_detection"),
            "finds the client instead of `use_remote_address` and `xff_num_trusted_hops`: \
             not with them (as Envoy)",
        ));
    }
    let tls = raw
        .tls
        .map(|t| crate::tls::check::listener_tls(t, &format!("{path}.tls")))
        .transpose()?;
    let proxy_protocol = raw
        .proxy_protocol
        .map(|p| proxy_protocol(p, &format!("{path}.proxy_protocol")))
        .transpose()?;
    let http3 = raw
        .http3
        .map(|h| {
            let around = super::http3::Around {
                tls: tls.is_some(),
                tcp_proxy: tcp_proxy.is_some(),
                proxy_protocol: proxy_protocol.is_some(),
                filter_chains: !filter_chains.is_empty(),
                exact_balance: connection_balance == ConnectionBalance::Exact,
                default_chain,
            };
            super::http3::check(h, &around, &format!("{path}.http3"))
        })
        .transpose()?;
    if http3.as_ref().is_some_and(|h| h.quic_only) {
        super::http3::same_tls_server(
            default_chain.then_some(tls.as_ref()).flatten(),
            &filter_chains,
            path,
        )?;
    }
    if http3.as_ref().is_some_and(|h| h.early_data) {
        super::http3::early_data_possible(
            default_chain.then_some(tls.as_ref()).flatten(),
            &filter_chains,
            path,
        )?;
    }
    let mut config = ListenerConfig {
        filter_chains,
        default_chain,
        // `0s` is no limit, as Envoy's.
        listener_filters_timeout: Some(
            raw.listener_filters_timeout
                .unwrap_or(DEFAULT_LISTENER_FILTERS_TIMEOUT),
        )
        .filter(|t| !t.is_zero()),
        continue_on_listener_filters_timeout: raw
            .continue_on_listener_filters_timeout
            .unwrap_or(false),
        http_inspector: raw.http_inspector.unwrap_or(false),
        name,
        address,
        connection_limit,
        connection_balance,
        max_connections_to_accept_per_socket_event,
        bypass_overload_manager: raw.bypass_overload_manager.unwrap_or(false),
        ignore_global_conn_limit: raw.ignore_global_conn_limit.unwrap_or(false),
        tcp_keepalive: raw
            .tcp_keepalive
            .map(|k| crate::cluster::check::tcp_keepalive(k, &format!("{path}.tcp_keepalive")))
            .transpose()?,
        buffer_limit,
        access_logs,
        proxy_protocol,
        tls,
        http3,
        tracing: crate::tracing::listener_tracing(raw.tracing, path, traced)?,
        tcp_proxy,
        http_filters,
        http: HttpConfig {
            max_concurrent_streams,
            idle_timeout: positive(
                raw.http.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
                &format!("{path}.http.idle_timeout"),
            )?,
            request_headers_timeout: positive(
                raw.http
                    .request_headers_timeout
                    .unwrap_or(DEFAULT_REQUEST_HEADERS_TIMEOUT),
                &format!("{path}.http.request_headers_timeout"),
            )?,
            request_timeout: raw
                .http
                .request_timeout
                .map(|t| positive(t, &format!("{path}.http.request_timeout")))
                .transpose()?,
            // `0s` is no limit, as Envoy's.
            max_stream_duration: raw.http.max_stream_duration.filter(|d| !d.is_zero()),
            stream_idle_timeout: positive(
                raw.http
                    .stream_idle_timeout
                    .unwrap_or(DEFAULT_STREAM_IDLE_TIMEOUT),
                &format!("{path}.http.stream_idle_timeout"),
            )?,
            // 0 means no limit, as in Envoy and the peer-bench template.
            max_requests_per_connection: raw.http.max_requests_per_connection.filter(|n| *n > 0),
            path_normalization,
            http2_keepalive: raw
                .http
                .http2_keepalive
                .map(|k| -> Result<Keepalive, ConfigError> {
                    let at = format!("{path}.http.http2_keepalive");
                    Ok(Keepalive {
                        interval: positive(k.interval, &format!("{at}.interval"))?,
                        // Envoy's default: 20 s.
                        timeout: positive(
                            k.timeout.unwrap_or(Duration::from_secs(20)),
                            &format!("{at}.timeout"),
                        )?,
                    })
                })
                .transpose()?,
            http2_codec: match raw.http.http2_codec.as_deref() {
                None => Http2Codec::default(),
                Some("hyper") => Http2Codec::Hyper,
                Some("legate") => Http2Codec::Legate,
                Some(other) => {
                    return Err(ConfigError::invalid(
                        format!("{path}.http.http2_codec"),
                        format!("expected `hyper` or `legate`, found `{other}`"),
                    ));
                }
            },
            max_connection_duration: raw
                .http
                .max_connection_duration
                .map(|d| positive(d, &format!("{path}.http.max_connection_duration")))
                .transpose()?,
            headers_with_underscores_action: match raw
                .http
                .headers_with_underscores_action
                .as_deref()
            {
                None | Some("allow") => HeadersWithUnderscores::Allow,
                Some("reject_request") => HeadersWithUnderscores::RejectRequest,
                Some("drop_header") => HeadersWithUnderscores::DropHeader,
                Some(other) => {
                    return Err(ConfigError::invalid(
                        format!("{path}.http.headers_with_underscores_action"),
                        format!(
                            "expected `allow`, `reject_request` or `drop_header`, found `{other}`"
                        ),
                    ));
                }
            },
            initial_stream_window_size: window(
                raw.http.initial_stream_window_size,
                &format!("{path}.http.initial_stream_window_size"),
            )?,
            initial_connection_window_size: window(
                raw.http.initial_connection_window_size,
                &format!("{path}.http.initial_connection_window_size"),
            )?,
            server_header: server_header(
                raw.http.server_header_transformation.as_deref(),
                raw.http.server_name,
                &format!("{path}.http"),
            )?,
            suppress_proxy_headers: raw.http.suppress_proxy_headers.unwrap_or(false),
            accept_http_10: raw.http.accept_http_10.unwrap_or(true),
            ignore_http11_upgrade: crate::matchers::string_patterns(
                raw.http.ignore_http11_upgrade.clone(),
                &format!("{path}.http.ignore_http11_upgrade"),
            )?,
            preserve_header_case: raw.http.preserve_header_case.unwrap_or(false),
            serve_half_closed: raw.http.serve_half_closed.unwrap_or(false),
            default_host_for_http_10: match raw.http.default_host_for_http_10.clone() {
                Some(host)
                    if !host.is_empty()
                        && http::uri::Authority::try_from(host.as_str()).is_ok() =>
                {
                    Some(host)
                }
                Some(other) => {
                    return Err(ConfigError::invalid(
                        format!("{path}.http.default_host_for_http_10"),
                        format!(
                            "expected a host (`example.com` or `example.com:8080`), found `{other}`"
                        ),
                    ));
                }
                None => None,
            },
            strip_host_port: match raw.http.strip_host_port.as_deref() {
                None | Some("none") => StripHostPort::None,
                Some("any") => StripHostPort::Any,
                Some("matching") => StripHostPort::Matching,
                Some(other) => {
                    return Err(ConfigError::invalid(
                        format!("{path}.http.strip_host_port"),
                        format!("expected `none`, `any` or `matching`, found `{other}`"),
                    ));
                }
            },
            strip_trailing_host_dot: raw.http.strip_trailing_host_dot.unwrap_or(false),
            forward_client_cert: crate::listener::client_cert::ForwardClientCert::parse(
                raw.http.forward_client_cert.as_deref(),
                &format!("{path}.http.forward_client_cert"),
            )?,
            set_current_client_cert_details: raw
                .http
                .set_current_client_cert_details
                .unwrap_or_default(),
            request_id: {
                let raw = raw.http.request_id.clone().unwrap_or_default();
                RequestIdConfig {
                    generate: raw.generate.unwrap_or(true),
                    preserve_external: raw.preserve_external.unwrap_or(true),
                    always_set_in_response: raw.always_set_in_response.unwrap_or(false),
                }
            },
            // With ways to find the client, Envoy refuses these two: none is read then.
            use_remote_address: raw.http.use_remote_address.unwrap_or(detection.is_empty()),
            xff_num_trusted_hops: raw.http.xff_num_trusted_hops.unwrap_or(0),
            original_ip_detection: detection,
            local_reply: raw
                .http
                .local_reply
                .clone()
                .map(|r| crate::local_reply::local_reply(r, &format!("{path}.http.local_reply")))
                .transpose()?,
            early_header_mutation: raw
                .http
                .early_header_mutation
                .clone()
                .map(|m| {
                    crate::filters::headers::mutations(
                        m,
                        &format!("{path}.http.early_header_mutation"),
                        false,
                    )
                })
                .transpose()?,
            max_request_headers_kb: match raw.http.max_request_headers_kb {
                None => DEFAULT_MAX_REQUEST_HEADERS_KB,
                Some(kb @ 1..=8192) => kb,
                Some(other) => {
                    return Err(ConfigError::invalid(
                        format!("{path}.http.max_request_headers_kb"),
                        format!("expected 1 to 8192 (KiB), found {other}"),
                    ));
                }
            },
        },
        route_config,
    };
    super::chains::inherit(&mut config);
    Ok(config)
}

/// An HTTP/2 flow-control window: RFC 9113's range, as Envoy's (65535 to 2^31 - 1).
/// `server_header_transformation` (`pass_through`, `overwrite`, `append_if_absent`) and
/// `server_name`. A name alone means `overwrite`; nothing means `pass_through`.
fn server_header(
    transformation: Option<&str>,
    name: Option<String>,
    path: &str,
) -> Result<ServerHeader, ConfigError> {
    let name = name
        .map(|n| {
            if n.is_empty()
                || !n
                    .bytes()
                    .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
            {
                Err(ConfigError::invalid(
                    format!("{path}.server_name"),
                    "expected a header value: visible ASCII, not empty",
                ))
            } else {
                Ok(n)
            }
        })
        .transpose()?;
    match (transformation, name) {
        (None, None) | (Some("pass_through"), None) => Ok(ServerHeader::PassThrough),
        (Some("pass_through"), Some(_)) => Err(ConfigError::invalid(
            format!("{path}.server_name"),
            "a name is never sent with `server_header_transformation: pass_through`",
        )),
        (None | Some("overwrite"), Some(name)) => Ok(ServerHeader::Overwrite(name)),
        (Some("append_if_absent"), Some(name)) => Ok(ServerHeader::AppendIfAbsent(name)),
        (Some("overwrite" | "append_if_absent"), None) => Err(ConfigError::invalid(
            format!("{path}.server_name"),
            "expected the name the `server` header is to carry",
        )),
        (Some(other), _) => Err(ConfigError::invalid(
            format!("{path}.server_header_transformation"),
            format!("expected `pass_through`, `overwrite` or `append_if_absent`, found `{other}`"),
        )),
    }
}

/// `proxy_protocol: { versions: [v1, v2], required: true }` (both versions and required by
/// default).
pub(crate) fn proxy_protocol(
    raw: RawProxyProtocol,
    path: &str,
) -> Result<ProxyProtocolConfig, ConfigError> {
    let mut versions = ProxyProtocolVersions {
        v1: raw.versions.is_none(),
        v2: raw.versions.is_none(),
    };
    for (i, v) in raw.versions.iter().flatten().enumerate() {
        match v.as_str() {
            "v1" => versions.v1 = true,
            "v2" => versions.v2 = true,
            other => {
                return Err(ConfigError::invalid(
                    format!("{path}.versions[{i}]"),
                    format!("expected `v1` or `v2`, found `{other}`"),
                ));
            }
        }
    }
    if !versions.v1 && !versions.v2 {
        return Err(ConfigError::invalid(
            format!("{path}.versions"),
            "expected at least one of `v1` and `v2`",
        ));
    }
    Ok(ProxyProtocolConfig {
        versions,
        required: raw.required.unwrap_or(true),
    })
}

pub(crate) fn path_normalization(
    raw: Option<RawPathNormalization>,
    path: &str,
) -> Result<PathNormalization, ConfigError> {
    let defaults = PathNormalization::default();
    let Some(raw) = raw else {
        return Ok(defaults);
    };
    let escaped_slashes = match raw.escaped_slashes.as_deref() {
        None => defaults.escaped_slashes,
        Some("keep") => EscapedSlashes::Keep,
        Some("reject") => EscapedSlashes::Reject,
        Some("unescape_and_redirect") => EscapedSlashes::UnescapeAndRedirect,
        Some("unescape_and_forward") => EscapedSlashes::UnescapeAndForward,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.escaped_slashes"),
                format!(
                    "expected `keep`, `reject`, `unescape_and_redirect` or `unescape_and_forward`, found `{other}`"
                ),
            ));
        }
    };
    Ok(PathNormalization {
        normalize: raw.normalize.unwrap_or(defaults.normalize),
        merge_slashes: raw.merge_slashes.unwrap_or(defaults.merge_slashes),
        escaped_slashes,
    })
}
