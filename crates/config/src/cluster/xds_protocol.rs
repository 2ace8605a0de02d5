//! How a cluster speaks HTTP to its hosts, from Envoy's two forms: the deprecated
//! `http_protocol_options` / `http2_protocol_options` / `common_http_protocol_options` on the
//! cluster, and `typed_extension_protocol_options` with the upstream `HttpProtocolOptions`.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{Http2ProtocolOptions, HttpProtocolOptions};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions as UpstreamOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
};

use crate::envoy::{ResourceError, duration, fields, headers, nothing_else};

/// The upstream HTTP options' key in `typed_extension_protocol_options`.
const UPSTREAM_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// A cluster's HTTP settings, as the file writes them.
#[derive(Debug, Default)]
pub(crate) struct UpstreamHttp {
    /// `http1`, `http2` or `auto`; `None`: the file's default (HTTP/1.1).
    pub(crate) protocol: Option<&'static str>,
    pub(crate) max_requests_per_connection: Option<u32>,
    pub(crate) idle_timeout: Option<std::time::Duration>,
    pub(crate) max_connection_duration: Option<std::time::Duration>,
    pub(crate) preserve_header_case: Option<bool>,
    pub(crate) initial_stream_window_size: Option<u32>,
    pub(crate) initial_connection_window_size: Option<u32>,
    pub(crate) max_concurrent_streams: Option<u32>,
    pub(crate) http2_keepalive: Option<crate::RawUpstreamKeepalive>,
    pub(crate) stream_error_on_invalid_http_message: Option<bool>,
    /// `upstream_http_protocol_options`.
    pub(crate) auto_sni: Option<bool>,
    pub(crate) auto_san_validation: Option<bool>,
    pub(crate) override_auto_sni_header: Option<String>,
    /// `HttpProtocolOptions.hash_policy` as sent: read (and checked) for a hashing cluster
    /// alone, as Envoy reads it.
    pub(crate) hash_policy:
        Vec<envoy_types::pb::envoy::config::route::v3::route_action::HashPolicy>,
    /// Where it was, for the errors it may give.
    pub(crate) hash_policy_at: String,
}

/// Takes the protocol fields out of `c`.
#[allow(deprecated)] // control planes still send the deprecated forms; they are read
pub(crate) fn upstream_http(c: &mut Cluster, at: &str) -> Result<UpstreamHttp, ResourceError> {
    let mut http = UpstreamHttp {
        max_requests_per_connection: c.max_requests_per_connection.take().map(|v| v.value),
        ..UpstreamHttp::default()
    };
    if let Some(h2) = c.http2_protocol_options.take() {
        h2_settings(h2, &mut http, at)?;
        http.protocol = Some("http2");
    }
    if let Some(h1) = c.http_protocol_options.take() {
        h1_settings(h1, &mut http, &format!("{at}.http_protocol_options"))?;
        http.protocol.get_or_insert("http1");
    }
    if let Some(common) = c.common_http_protocol_options.take() {
        common_options(
            common,
            &mut http,
            &format!("{at}.common_http_protocol_options"),
        )?;
    }
    if let Some(options) = c.upstream_http_protocol_options.take() {
        sni_options(options, &mut http);
    }
    if let Some(options) = c.typed_extension_protocol_options.remove(UPSTREAM_OPTIONS) {
        let at = format!("{at}.typed_extension_protocol_options");
        let options: UpstreamOptions =
            prost::Message::decode(options.value.as_slice()).map_err(|e| {
                ResourceError::invalid(&at, format!("cannot decode {UPSTREAM_OPTIONS}: {e}"))
            })?;
        typed_options(options, &mut http, &at)?;
    }
    Ok(http)
}

/// `auto_sni`, `auto_san_validation`, `override_auto_sni_header` (checked as the file's).
fn sni_options(
    options: envoy_types::pb::envoy::config::core::v3::UpstreamHttpProtocolOptions,
    http: &mut UpstreamHttp,
) {
    http.auto_sni = Some(options.auto_sni);
    http.auto_san_validation = Some(options.auto_san_validation);
    http.override_auto_sni_header =
        Some(options.override_auto_sni_header).filter(|h| !h.is_empty());
}

/// `max_requests_per_connection`, `idle_timeout` and `max_connection_duration` (`0s`: none,
/// as Envoy); the rest of the common options is refused.
fn common_options(
    mut common: HttpProtocolOptions,
    http: &mut UpstreamHttp,
    at: &str,
) -> Result<(), ResourceError> {
    if let Some(max) = common.max_requests_per_connection.take() {
        http.max_requests_per_connection = Some(max.value);
    }
    if let Some(idle) = duration(common.idle_timeout.take(), &format!("{at}.idle_timeout"))? {
        http.idle_timeout = Some(idle);
    }
    if let Some(max) = duration(
        common.max_connection_duration.take(),
        &format!("{at}.max_connection_duration"),
    )? {
        http.max_connection_duration = Some(max);
    }
    nothing_else(&common, fields::HTTP_PROTOCOL_OPTIONS, at)
}

/// HTTP/1.1: the `preserve_case` header formatter; `enable_trailers` (trailers go on both
/// ways here anyway); `accept_http_10` and `default_host_for_http_10`, which only Envoy's
/// server side reads (its upstream codec takes HTTP/1.0 responses either way, as here).
fn h1_settings(
    mut h1: envoy_types::pb::envoy::config::core::v3::Http1ProtocolOptions,
    http: &mut UpstreamHttp,
    at: &str,
) -> Result<(), ResourceError> {
    http.preserve_header_case = Some(headers::preserve_case(&mut h1, at)?);
    h1.enable_trailers = false;
    h1.accept_http_10 = false;
    h1.default_host_for_http_10 = String::new();
    if h1 != Default::default() {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["http_protocol_options settings".into()],
        });
    }
    Ok(())
}

/// HTTP/2: the initial stream and connection windows, the streams per connection, PINGs;
/// other settings are refused.
fn h2_settings(
    mut h2: Http2ProtocolOptions,
    http: &mut UpstreamHttp,
    at: &str,
) -> Result<(), ResourceError> {
    let at = format!("{at}.http2_protocol_options");
    http.initial_stream_window_size = h2.initial_stream_window_size.take().map(|v| v.value);
    http.initial_connection_window_size = h2.initial_connection_window_size.take().map(|v| v.value);
    http.max_concurrent_streams = h2.max_concurrent_streams.take().map(|v| v.value);
    if let Some(mut keepalive) = h2.connection_keepalive.take() {
        let at = format!("{at}.connection_keepalive");
        let ping = crate::RawUpstreamKeepalive {
            // Envoy: zero sends no interval PINGs.
            interval: duration(keepalive.interval.take(), &format!("{at}.interval"))?,
            timeout: duration(keepalive.timeout.take(), &format!("{at}.timeout"))?,
            interval_jitter: keepalive.interval_jitter.take().map(|p| p.value),
            connection_idle_interval: duration(
                keepalive.connection_idle_interval.take(),
                &format!("{at}.connection_idle_interval"),
            )?,
        };
        if ping.timeout.is_none() {
            // Required in Envoy's proto.
            return Err(ResourceError::invalid(
                format!("{at}.timeout"),
                "a keep-alive needs its timeout",
            ));
        }
        nothing_else(&keepalive, fields::KEEPALIVE_SETTINGS, &at)?;
        http.http2_keepalive = Some(ping);
    }
    // The override wins over the deprecated field, as in Envoy; both unset: `false`.
    #[allow(deprecated)]
    let deprecated = std::mem::take(&mut h2.stream_error_on_invalid_http_messaging);
    http.stream_error_on_invalid_http_message = Some(
        h2.override_stream_error_on_invalid_http_message
            .take()
            .map_or(deprecated, |v| v.value),
    )
    .filter(|on| *on);
    nothing_else(&h2, fields::HTTP2_PROTOCOL_OPTIONS, &at)
}

/// The upstream `HttpProtocolOptions`: `explicit_http_config` or `auto_config`, the common
/// options.
fn typed_options(
    mut options: UpstreamOptions,
    http: &mut UpstreamHttp,
    at: &str,
) -> Result<(), ResourceError> {
    if let Some(common) = options.common_http_protocol_options.take() {
        common_options(common, http, &format!("{at}.common_http_protocol_options"))?;
    }
    if let Some(sni) = options.upstream_http_protocol_options.take() {
        sni_options(sni, http);
    }
    http.hash_policy = std::mem::take(&mut options.hash_policy);
    http.hash_policy_at = at.to_owned();
    http.protocol = Some(match options.upstream_protocol_options.take() {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(explicit)) => {
            match explicit.protocol_config {
                Some(ProtocolConfig::HttpProtocolOptions(h1)) => {
                    h1_settings(h1, http, at)?;
                    "http1"
                }
                Some(ProtocolConfig::Http2ProtocolOptions(h2)) => {
                    h2_settings(h2, http, at)?;
                    "http2"
                }
                _ => {
                    return Err(ResourceError::Unsupported {
                        at: at.to_owned(),
                        fields: vec!["http3_protocol_options".into()],
                    });
                }
            }
        }
        // HTTP/2 or HTTP/1.1 as each host chooses by ALPN (the cluster must use TLS).
        Some(UpstreamProtocolOptions::AutoConfig(mut auto)) => {
            let at = format!("{at}.auto_config");
            if auto.http3_protocol_options.is_some()
                || auto.alternate_protocols_cache_options.is_some()
            {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![
                        "http3_protocol_options / alternate_protocols_cache_options".into(),
                    ],
                });
            }
            if let Some(h1) = auto.http_protocol_options.take() {
                h1_settings(h1, http, &format!("{at}.http_protocol_options"))?;
            }
            if let Some(h2) = auto.http2_protocol_options.take() {
                h2_settings(h2, http, &at)?;
            }
            "auto"
        }
        None => "http1",
        // The client's protocol, HTTP/1.1 or HTTP/2, each with its settings.
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(mut downstream)) => {
            let at = format!("{at}.use_downstream_protocol_config");
            if downstream.http3_protocol_options.is_some() {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec!["http3_protocol_options".into()],
                });
            }
            if let Some(h1) = downstream.http_protocol_options.take() {
                h1_settings(h1, http, &format!("{at}.http_protocol_options"))?;
            }
            if let Some(h2) = downstream.http2_protocol_options.take() {
                h2_settings(h2, http, &at)?;
            }
            "downstream"
        }
    });
    // Upstream filters, cluster-level hash, retry and mirror policies, ...: named as set.
    nothing_else(&options, fields::UPSTREAM_HTTP_PROTOCOL_OPTIONS, at)
}
