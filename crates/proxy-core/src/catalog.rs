//! The stats catalogue: every family the proxy records, with Envoy's names where Envoy has
//! one, and the per-worker handles the request path records through. Handles are made once
//! per worker when it starts; recording is then a worker-local store (see the `stats` crate).
//!
//! Each family is declared once, in the `catalog!` table below: its handle (in the group of
//! handles a worker makes for a listener, a cluster, a host, ...), its kind, its name and its
//! help. The table writes the [`Catalog`] of families, their declaration on the registry, each
//! group's handle struct and the method that makes it. docs/stats.md lists them (a test holds
//! the two together).

use std::sync::Arc;

use http::StatusCode;
use stats::{CounterFamily, GaugeFamily, HistogramFamily, Registry, Shard};

/// Writes the catalogue from its table: groups of handles, each field
/// `handle: kind["extra label": VALUES]? = family("name", "help")` (labels: the group's, then
/// the extra one, whose values make the handle an array), then the `process` families that are
/// recorded where they are used, `family: kind("name", [labels], "help")`. Kinds: `counter`,
/// `gauge`, `histogram`; `shared_gauge` (one value for all workers); `per_shard_counter` and
/// `per_shard_gauge` (exported per worker).
macro_rules! catalog {
    (@family counter) => { CounterFamily };
    (@family per_shard_counter) => { CounterFamily };
    (@family gauge) => { GaugeFamily };
    (@family shared_gauge) => { GaugeFamily };
    (@family per_shard_gauge) => { GaugeFamily };
    (@family histogram) => { HistogramFamily };
    (@declare $r:ident, $kind:ident, $name:literal, $help:literal, ($($scope:ident),*), ($($label:literal)?)) => {
        catalog!(@register $r, $kind, $name, $help, &[$(stringify!($scope),)* $($label)?])
    };
    (@register $r:ident, counter, $($rest:tt)*) => { $r.counter($($rest)*) };
    (@register $r:ident, per_shard_counter, $($rest:tt)*) => { $r.per_shard_counter($($rest)*) };
    (@register $r:ident, gauge, $($rest:tt)*) => { $r.gauge($($rest)*) };
    (@register $r:ident, shared_gauge, $($rest:tt)*) => { $r.gauge($($rest)*) };
    (@register $r:ident, per_shard_gauge, $($rest:tt)*) => { $r.per_shard_gauge($($rest)*) };
    (@register $r:ident, histogram, $($rest:tt)*) => { $r.histogram($($rest)*) };
    (@handle_type counter) => { stats::Counter };
    (@handle_type per_shard_counter) => { stats::Counter };
    (@handle_type gauge) => { stats::Gauge };
    (@handle_type per_shard_gauge) => { stats::Gauge };
    (@handle_type shared_gauge) => { stats::SharedGauge };
    (@handle_type histogram) => { stats::Histogram };
    (@handle_type $kind:ident, ()) => { catalog!(@handle_type $kind) };
    (@handle_type $kind:ident, ($values:expr)) => { [catalog!(@handle_type $kind); $values.len()] };
    (@handle $shard:ident, counter, $family:expr, $labels:expr) => { $shard.counter($family, $labels) };
    (@handle $shard:ident, per_shard_counter, $family:expr, $labels:expr) => { $shard.counter($family, $labels) };
    (@handle $shard:ident, gauge, $family:expr, $labels:expr) => { $shard.gauge($family, $labels) };
    (@handle $shard:ident, per_shard_gauge, $family:expr, $labels:expr) => { $shard.gauge($family, $labels) };
    (@handle $shard:ident, shared_gauge, $family:expr, $labels:expr) => { $shard.shared_gauge($family, $labels) };
    (@handle $shard:ident, histogram, $family:expr, $labels:expr) => { $shard.histogram($family, $labels) };
    (@handles $shard:ident, $kind:ident, $family:expr, ($($scope:ident),*), ()) => {
        catalog!(@handle $shard, $kind, $family, &[$($scope),*])
    };
    (@handles $shard:ident, $kind:ident, $family:expr, ($($scope:ident),*), ($values:expr)) => {
        $values.map(|value| catalog!(@handle $shard, $kind, $family, &[$($scope,)* value]))
    };
    (@method [$(#[$doc:meta])*] $group:ident, $Handles:ident, ($($scope:ident),*), $scopes:tt,
        { $($field:ident, $kind:ident, $family:ident, $values:tt;)* }) => {
        $(#[$doc])*
        pub(crate) fn $group(&self, shard: &Shard, $($scope: &str),*) -> $Handles {
            $Handles {
                $($field: catalog!(@handles shard, $kind, self.$family, $scopes, $values),)*
            }
        }
    };
    (
        $(
            $(#[$gdoc:meta])*
            $group:ident -> $Handles:ident $scopes:tt {
                $(
                    $(#[$hdoc:meta])*
                    $field:ident: $kind:ident $([$label:literal: $values:expr])? =
                        $family:ident($name:literal, $help:literal $(,)?),
                )*
            }
        )*
        @process {
            $(
                $pfamily:ident: $pkind:ident($pname:literal, [$($plabel:literal),*], $phelp:literal),
            )*
        }
    ) => {
        /// The families, each declared once on the registry.
        #[derive(Clone, Copy)]
        pub(crate) struct Catalog {
            $($($family: catalog!(@family $kind),)*)*
            $(pub(crate) $pfamily: catalog!(@family $pkind),)*
        }

        impl Catalog {
            pub(crate) fn declare(r: &Registry) -> Catalog {
                Catalog {
                    $($(
                        $family: catalog!(@declare r, $kind, $name, $help, $scopes, ($($label)?)),
                    )*)*
                    $($pfamily: catalog!(@register r, $pkind, $pname, $phelp, &[$($plabel),*]),)*
                }
            }

            $(
                catalog!(@method [$(#[$gdoc])*] $group, $Handles, $scopes, $scopes, {
                    $($field, $kind, $family, ($($values)?);)*
                });
            )*
        }

        $(
            $(#[$gdoc])*
            pub(crate) struct $Handles {
                $($(#[$hdoc])* pub(crate) $field: catalog!(@handle_type $kind, ($($values)?)),)*
            }
        )*
    };
}

catalog! {
    /// One worker's handles for one listener.
    listener -> ListenerStats(listener) {
        cx_total: counter = downstream_cx_total(
            "downstream_cx_total",
            "Downstream connections accepted.",
        ),
        cx_active: gauge = downstream_cx_active(
            "downstream_cx_active",
            "Downstream connections open.",
        ),
        cx_destroy: counter = downstream_cx_destroy(
            "downstream_cx_destroy",
            "Downstream connections closed.",
        ),
        cx_overflow: counter = downstream_cx_overflow(
            "downstream_cx_overflow",
            "Connections closed at accept: the listener's connection_limit or the process's max_connections was reached.",
        ),
        cx_idle_timeout: counter = downstream_cx_idle_timeout(
            "downstream_cx_idle_timeout",
            "Connections closed after idle_timeout without a request.",
        ),
        cx_max_requests: counter = downstream_cx_max_requests(
            "downstream_cx_max_requests_reached",
            "Client connections retired after max_requests_per_connection (connection: close or GOAWAY).",
        ),
        rq_rejected_underscores: counter = downstream_rq_rejected_underscores(
            "downstream_rq_rejected_with_underscores_in_headers",
            "Requests answered 400 for a header named with an underscore (headers_with_underscores_action: reject_request).",
        ),
        headers_dropped_underscores: counter = downstream_headers_dropped_underscores(
            "downstream_headers_dropped_with_underscores",
            "Request headers named with an underscore removed (headers_with_underscores_action: drop_header).",
        ),
        rq_max_duration: counter = downstream_rq_max_duration(
            "downstream_rq_max_duration_reached",
            "Requests ended by max_stream_duration: 408 or 504 before the response began, a reset stream after.",
        ),
        cx_max_duration: counter = downstream_cx_max_duration(
            "downstream_cx_max_duration_reached",
            "Client connections retired after max_connection_duration (connection: close, a close when idle, or GOAWAY).",
        ),
        cx_http3_total: counter = downstream_cx_http3_total(
            "downstream_cx_http3_total",
            "HTTP/3 connections accepted (QUIC handshakes completed; with 0-RTT, from the client's first flight).",
        ),
        cx_http3_active: gauge = downstream_cx_http3_active(
            "downstream_cx_http3_active",
            "HTTP/3 connections open.",
        ),
        cx_http3_refused: counter = downstream_cx_http3_refused(
            "downstream_cx_http3_refused",
            "QUIC connection attempts refused at their first packet: the overload manager, the listener's connection_limit or the process's max_connections.",
        ),
        cx_http3_retry: counter = downstream_cx_http3_retry(
            "downstream_cx_http3_retry",
            "QUIC connection attempts answered with a Retry (the client proves its address first) while the overload manager disables keep-alive.",
        ),
        /// Indexed as [`QUIC_CLOSE_REASONS`].
        cx_http3_close: counter["reason": QUIC_CLOSE_REASONS] = downstream_cx_http3_close(
            "downstream_cx_http3_close",
            "HTTP/3 connections ended, by why: idle_timeout, closed_here (GOAWAY, drain or the proxy's close), peer_application_close, peer_transport_close, transport_error (the peer broke QUIC), stateless_reset, version_mismatch, cids_exhausted, http3_error (the client broke HTTP/3).",
        ),
        cx_http3_lost_packets: counter = downstream_cx_http3_lost_packets(
            "downstream_cx_http3_lost_packets",
            "Packets HTTP/3 connections sent and declared lost (counted as each connection ends).",
        ),
        cx_http3_handshake_error: counter = downstream_cx_http3_handshake_error(
            "downstream_cx_http3_handshake_error",
            "QUIC handshakes that failed or timed out, including those of 0-RTT connections not finished in time or lost first.",
        ),
        rq_early_data: counter = downstream_rq_early_data(
            "downstream_rq_early_data",
            "HTTP/3 requests that came in 0-RTT early data, before the client's handshake ended (http3.early_data).",
        ),
        rq_too_early: counter = downstream_rq_too_early(
            "downstream_rq_too_early",
            "Requests in 0-RTT early data of a method that is not safe, answered 425 Too Early for the client to send again once its handshake is done.",
        ),
        cx_h2_flood: counter = downstream_cx_h2_flood(
            "downstream_cx_h2_flood",
            "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM: a flood of resets (rapid reset) or of stream errors.",
        ),
        cx_h2_continuation_flood: counter = downstream_cx_h2_continuation_flood(
            "downstream_cx_h2_continuation_flood",
            "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM for a header block of too many CONTINUATION frames.",
        ),
        cx_h2_control_flood: counter = downstream_cx_h2_control_flood(
            "downstream_cx_h2_control_flood",
            "HTTP/2 connections closed for more than 1000 PING or SETTINGS frames in a 10-second window with no response data or headers sent between them.",
        ),
        cx_headers_timeout: counter = downstream_cx_headers_timeout(
            "downstream_cx_headers_timeout",
            "Connections closed because a request head did not arrive within request_headers_timeout.",
        ),
        cx_proxy_proto_error: counter = downstream_cx_proxy_proto_error(
            "downstream_cx_proxy_proto_error",
            "Connections closed because their PROXY protocol header was missing, malformed, too long, of a version not accepted, or late (request_headers_timeout).",
        ),
        cx_no_filter_chain_match: counter = downstream_cx_no_filter_chain_match(
            "downstream_cx_no_filter_chain_match",
            "Connections closed because none of the listener's filter chains matched them and it has no default chain (Envoy's no_filter_chain_match).",
        ),
        cx_client_hello_too_large: counter = downstream_cx_client_hello_too_large(
            "downstream_cx_client_hello_too_large",
            "Connections closed because their TLS ClientHello, read to pick a filter chain, was over 64 KiB (Envoy's tls_inspector client_hello_too_large).",
        ),
        cx_pre_timeout: counter = downstream_pre_cx_timeout(
            "downstream_pre_cx_timeout",
            "Connections whose first bytes, read to pick a filter chain, did not arrive within listener_filters_timeout: closed, or served as plain bytes with continue_on_listener_filters_timeout.",
        ),
        cx_parked: gauge = downstream_cx_parked(
            "downstream_cx_parked",
            "Idle HTTP/1.1 connections held as their sockets alone, without a task (idle for a second or more).",
        ),
        rq_total: counter = downstream_rq_total(
            "downstream_rq_total",
            "Downstream requests received.",
        ),
        rq_active: gauge = downstream_rq_active(
            "downstream_rq_active",
            "Downstream requests not yet fully answered.",
        ),
        rq_class: counter["code_class": CLASSES] = downstream_rq_class(
            "downstream_rq_xx",
            "Downstream responses by status class.",
        ),
        rq_time: histogram = downstream_rq_time(
            "downstream_rq_time",
            "Time from request head to the last response byte handed to the codec.",
        ),
        upgrades: counter = upgrades(
            "downstream_cx_upgrades_total",
            "Connections upgraded (WebSocket over HTTP/1.1 or HTTP/2 extended CONNECT) and relayed as bytes.",
        ),
        upgrades_active: gauge = upgrades_active(
            "downstream_cx_upgrades_active",
            "Upgraded connections being relayed.",
        ),
        upgrades_failed: counter = upgrades_failed(
            "downstream_rq_upgrade_failed",
            "Upgrade requests the upstream did not accept or that could not be relayed (the client got the upstream's answer or an error).",
        ),
    }
    /// One worker's handles for one TLS listener.
    tls -> TlsStats(listener) {
        handshake: counter = ssl_handshake(
            "ssl_handshake",
            "TLS handshakes completed.",
        ),
        connection_error: counter = ssl_connection_error(
            "ssl_connection_error",
            "TLS handshakes that failed (bad or no TLS, no certificate for the name, client certificate refused, timeout).",
        ),
        handshake_timeout: counter = ssl_handshake_timeout(
            "ssl_handshake_timeout",
            "TLS handshakes not finished within handshake_timeout (also counted in ssl_connection_error).",
        ),
        no_certificate: counter = ssl_no_certificate(
            "ssl_no_certificate",
            "TLS connections established without a client certificate.",
        ),
        session_reused: counter = ssl_session_reused(
            "ssl_session_reused",
            "TLS handshakes that resumed a session (ticket or session id).",
        ),
        versions: counter["version": TLS_VERSIONS] = ssl_versions(
            "ssl_versions",
            "TLS connections by protocol version.",
        ),
        alpn: counter["protocol": ALPN_LABELS] = ssl_alpn(
            "ssl_alpn",
            "TLS connections by the protocol ALPN chose (`none` without ALPN).",
        ),
        handshake_time: histogram = ssl_handshake_time(
            "ssl_handshake_time",
            "Time from accept to the end of the TLS handshake.",
        ),
    }
    /// One worker's handles for one listener's external authorization.
    authz -> AuthzStats(listener) {
        ok: counter = ext_authz_ok(
            "ext_authz_ok",
            "Requests the authorization service allowed.",
        ),
        denied: counter = ext_authz_denied(
            "ext_authz_denied",
            "Requests the authorization service denied (answered with its status, headers and body).",
        ),
        error: counter = ext_authz_error(
            "ext_authz_error",
            "Checks that got no decision: service unreachable, timeout, gRPC error, error response.",
        ),
        timeout: counter = ext_authz_timeout(
            "ext_authz_timeout",
            "Checks not answered within the timeout (also counted in ext_authz_error).",
        ),
        failure_mode_allowed: counter = ext_authz_failure_mode_allowed(
            "ext_authz_failure_mode_allowed",
            "Requests let through after a failed check (failure_mode_allow).",
        ),
        time: histogram = ext_authz_time(
            "ext_authz_time",
            "Time an authorization check took, answered or not.",
        ),
    }
    /// One worker's handles for one listener's local rate limit.
    rate_limit -> RateLimitStats(listener) {
        ok: counter = http_local_rate_limit_ok(
            "http_local_rate_limit_ok",
            "Requests a local rate limit let through (a token was taken).",
        ),
        rate_limited: counter = http_local_rate_limit_rate_limited(
            "http_local_rate_limit_rate_limited",
            "Requests over a local rate limit (refused, or let through where not enforced).",
        ),
        enforced: counter = http_local_rate_limit_enforced(
            "http_local_rate_limit_enforced",
            "Requests a local rate limit refused (429 unless configured; flag RL).",
        ),
        shadow_mode: counter = http_local_rate_limit_shadow_mode(
            "http_local_rate_limit_shadow_mode",
            "Requests over a shadow-mode descriptor's limit, let through.",
        ),
    }
    /// One worker's handles for one `tcp_proxy` listener's relays.
    tcp_proxy -> TcpProxyStats(listener) {
        cx_total: counter = tcp_proxy_cx_total(
            "tcp_proxy_cx_total",
            "Connections a tcp_proxy listener relayed to an upstream (connected).",
        ),
        cx_no_upstream: counter = tcp_proxy_cx_no_upstream(
            "tcp_proxy_cx_no_upstream",
            "Connections closed without an upstream: no healthy host, the cluster's connections at their limit, or every connect attempt failed.",
        ),
        rx_bytes: counter = tcp_proxy_downstream_rx_bytes_total(
            "tcp_proxy_downstream_rx_bytes_total",
            "Bytes received from clients and relayed upstream.",
        ),
        tx_bytes: counter = tcp_proxy_downstream_tx_bytes_total(
            "tcp_proxy_downstream_tx_bytes_total",
            "Bytes received from upstreams and relayed to clients.",
        ),
        idle_timeout: counter = tcp_proxy_idle_timeout(
            "tcp_proxy_idle_timeout",
            "Relays closed with nothing moved either way for the idle timeout.",
        ),
        max_duration_reached: counter = tcp_proxy_max_downstream_connection_duration(
            "tcp_proxy_max_downstream_connection_duration",
            "Relays closed at max_downstream_connection_duration.",
        ),
        rbac_allowed: counter = tcp_rbac_allowed(
            "tcp_rbac_allowed",
            "Connections a tcp_proxy listener's enforced rbac rules allowed.",
        ),
        rbac_denied: counter = tcp_rbac_denied(
            "tcp_rbac_denied",
            "Connections a tcp_proxy listener's enforced rbac rules denied (closed, never relayed).",
        ),
        rbac_shadow_allowed: counter = tcp_rbac_shadow_allowed(
            "tcp_rbac_shadow_allowed",
            "Connections a tcp_proxy listener's shadow rbac rules would have allowed.",
        ),
        rbac_shadow_denied: counter = tcp_rbac_shadow_denied(
            "tcp_rbac_shadow_denied",
            "Connections a tcp_proxy listener's shadow rbac rules would have denied (relayed).",
        ),
    }
    /// One worker's handles for one listener's CSRF filter.
    csrf -> CsrfStats(listener) {
        request_valid: counter = http_csrf_request_valid(
            "http_csrf_request_valid",
            "State-changing requests the csrf filter checked and found from their own or an allowed origin.",
        ),
        request_invalid: counter = http_csrf_request_invalid(
            "http_csrf_request_invalid",
            "State-changing requests from another origin (refused 403 where enforced, counted only where shadowed).",
        ),
        missing_source_origin: counter = http_csrf_missing_source_origin(
            "http_csrf_missing_source_origin",
            "State-changing requests the csrf filter checked that had neither origin nor referer.",
        ),
    }
    /// One worker's handles for one listener's RBAC rules with one stat prefix.
    rbac -> RbacStats(listener, prefix) {
        allowed: counter = http_rbac_allowed(
            "http_rbac_allowed",
            "Requests the rbac filter's enforced rules allowed (`log` rules included).",
        ),
        denied: counter = http_rbac_denied(
            "http_rbac_denied",
            "Requests the rbac filter's enforced rules denied (answered 403).",
        ),
    }
    /// One worker's handles for one listener's RBAC shadow rules with one stat prefix.
    rbac_shadow -> RbacShadowStats(listener, prefix) {
        shadow_allowed: counter = http_rbac_shadow_allowed(
            "http_rbac_shadow_allowed",
            "Requests the rbac filter's shadow rules would have allowed.",
        ),
        shadow_denied: counter = http_rbac_shadow_denied(
            "http_rbac_shadow_denied",
            "Requests the rbac filter's shadow rules would have denied (let through).",
        ),
    }
    /// One worker's handles for one listener's global rate limit filter.
    global_rate_limit -> GlobalRateLimitStats(listener) {
        ok: counter = http_ratelimit_ok(
            "http_ratelimit_ok",
            "Requests the rate limit service let on (global_rate_limit).",
        ),
        over_limit: counter = http_ratelimit_over_limit(
            "http_ratelimit_over_limit",
            "Requests the rate limit service found over a limit (refused, 429 by default).",
        ),
        error: counter = http_ratelimit_error(
            "http_ratelimit_error",
            "Rate limit calls that failed: no connection, a timeout, a bad or UNKNOWN answer.",
        ),
        failure_mode_allowed: counter = http_ratelimit_failure_mode_allowed(
            "http_ratelimit_failure_mode_allowed",
            "Requests let on after a failed rate limit call (failure_mode_deny off).",
        ),
    }
    /// One worker's handles for one listener's external processing filter.
    ext_proc -> ExtProcStats(listener) {
        streams_started: counter = http_ext_proc_streams_started(
            "http_ext_proc_streams_started",
            "Streams opened to the external processor (one per exchange it is sent).",
        ),
        stream_msgs_sent: counter = http_ext_proc_stream_msgs_sent(
            "http_ext_proc_stream_msgs_sent",
            "Messages sent to the external processor.",
        ),
        stream_msgs_received: counter = http_ext_proc_stream_msgs_received(
            "http_ext_proc_stream_msgs_received",
            "Answers received from the external processor.",
        ),
        spurious_msgs_received: counter = http_ext_proc_spurious_msgs_received(
            "http_ext_proc_spurious_msgs_received",
            "Answers out of turn (for a message not sent): the stream fails.",
        ),
        streams_closed: counter = http_ext_proc_streams_closed(
            "http_ext_proc_streams_closed",
            "Streams ended once the exchange was processed.",
        ),
        streams_failed: counter = http_ext_proc_streams_failed(
            "http_ext_proc_streams_failed",
            "Streams that failed: no connection, an error status, a reset, a bad answer.",
        ),
        message_timeouts: counter = http_ext_proc_message_timeouts(
            "http_ext_proc_message_timeouts",
            "Messages the processor did not answer within message_timeout.",
        ),
        failure_mode_allowed: counter = http_ext_proc_failure_mode_allowed(
            "http_ext_proc_failure_mode_allowed",
            "Exchanges let on unprocessed after the processor failed (failure_mode_allow).",
        ),
        rejected_header_mutations: counter = http_ext_proc_rejected_header_mutations(
            "http_ext_proc_rejected_header_mutations",
            "Header changes the processor asked for and the filter refused to make.",
        ),
        immediate_responses: counter = http_ext_proc_immediate_responses(
            "http_ext_proc_immediate_responses",
            "Exchanges the processor answered itself (an immediate response).",
        ),
    }
    /// One worker's handles for one listener's API key authentication filter.
    api_key_auth -> ApiKeyAuthStats(listener) {
        allowed: counter = http_api_key_auth_allowed(
            "http_api_key_auth_allowed",
            "Requests the api_key_auth filter let on (a listed key of an allowed client).",
        ),
        unauthorized: counter = http_api_key_auth_unauthorized(
            "http_api_key_auth_unauthorized",
            "Requests the api_key_auth filter refused 401 (no key, or a key not listed).",
        ),
        forbidden: counter = http_api_key_auth_forbidden(
            "http_api_key_auth_forbidden",
            "Requests the api_key_auth filter refused 403 (a client the route does not allow).",
        ),
    }
    /// One worker's handles for one listener's basic authentication filter.
    basic_auth -> BasicAuthStats(listener) {
        allowed: counter = http_basic_auth_allowed(
            "http_basic_auth_allowed",
            "Requests the basic_auth filter let on (a listed user and its password).",
        ),
        denied: counter = http_basic_auth_denied(
            "http_basic_auth_denied",
            "Requests the basic_auth filter refused 401 (no, malformed or wrong credentials).",
        ),
    }
    /// One worker's handles for one listener's JWT authentication filter.
    jwt_authn -> JwtAuthnStats(listener) {
        allowed: counter = http_jwt_authn_allowed(
            "http_jwt_authn_allowed",
            "Requests the jwt_authn filter checked and let on (their requirement met).",
        ),
        denied: counter = http_jwt_authn_denied(
            "http_jwt_authn_denied",
            "Requests the jwt_authn filter refused (401, or 403 for another audience or an unknown requirement_name).",
        ),
        cors_preflight_bypassed: counter = http_jwt_authn_cors_preflight_bypassed(
            "http_jwt_authn_cors_preflight_bypassed",
            "CORS preflights the jwt_authn filter let on unchecked (bypass_cors_preflight).",
        ),
        jwks_fetch_success: counter = http_jwt_authn_jwks_fetch_success(
            "http_jwt_authn_jwks_fetch_success",
            "Remote key sets fetched and taken (counted on the listener whose worker fetched).",
        ),
        jwks_fetch_failed: counter = http_jwt_authn_jwks_fetch_failed(
            "http_jwt_authn_jwks_fetch_failed",
            "Remote key set fetches that failed after their retries (no answer, not 200, not a usable JWKS).",
        ),
    }
    /// One worker's handles for one listener's fault filter.
    fault -> FaultStats(listener) {
        delays_injected: counter = http_fault_delays_injected(
            "http_fault_delays_injected",
            "Requests the fault filter delayed.",
        ),
        aborts_injected: counter = http_fault_aborts_injected(
            "http_fault_aborts_injected",
            "Requests the fault filter answered in the upstream's place (flag FI).",
        ),
    }
    /// One worker's handles for one listener's compression.
    compression -> CompressionStats(listener) {
        /// Indexed by `config::Encoding as usize`.
        compressed: counter["encoding": ENCODINGS] = compression_compressed(
            "compression_compressed",
            "Responses compressed, by encoding.",
        ),
        not_compressed: counter = compression_not_compressed(
            "compression_not_compressed",
            "Responses of a compressible type sent uncompressed (not accepted, too short, already encoded, partial, no-transform, or bodiless).",
        ),
        uncompressed_bytes: counter = compression_uncompressed_bytes(
            "compression_uncompressed_bytes",
            "Body bytes that went into the compressor.",
        ),
        compressed_bytes: counter = compression_compressed_bytes(
            "compression_compressed_bytes",
            "Body bytes that came out of the compressor.",
        ),
    }
    /// One worker's handles for one cluster.
    cluster -> ClusterStats(cluster) {
        ssl_handshake: counter = upstream_ssl_handshake(
            "upstream_ssl_handshake",
            "TLS handshakes completed with upstream hosts.",
        ),
        ssl_connection_error: counter = upstream_ssl_connection_error(
            "upstream_ssl_connection_error",
            "TLS handshakes with upstream hosts that failed (certificate not trusted, expired or for another name; protocol error). Also counted in upstream_cx_connect_fail.",
        ),
        cx_total: counter = upstream_cx_total(
            "upstream_cx_total",
            "Upstream connections opened.",
        ),
        cx_active: gauge = upstream_cx_active(
            "upstream_cx_active",
            "Upstream connections open.",
        ),
        cx_connect_fail: counter = upstream_cx_connect_fail(
            "upstream_cx_connect_fail",
            "Upstream connects refused or failed.",
        ),
        cx_idle_timeout: counter = upstream_cx_idle_timeout(
            "upstream_cx_idle_timeout",
            "Upstream connections closed after idle_timeout without a request.",
        ),
        cx_max_duration_reached: counter = upstream_cx_max_duration_reached(
            "upstream_cx_max_duration_reached",
            "Upstream connections retired at max_connection_duration.",
        ),
        cx_max_requests: counter = upstream_cx_max_requests(
            "upstream_cx_max_requests",
            "Upstream connections retired after max_requests_per_connection.",
        ),
        cx_connect_timeout: counter = upstream_cx_connect_timeout(
            "upstream_cx_connect_timeout",
            "Upstream connects that timed out.",
        ),
        cx_connect_time: histogram = upstream_cx_connect_time(
            "upstream_cx_connect_time",
            "Time to establish an upstream connection (Envoy's upstream_cx_connect_ms).",
        ),
        rq_total: counter = upstream_rq_total(
            "upstream_rq_total",
            "Requests sent upstream.",
        ),
        rq_active: gauge = upstream_rq_active(
            "upstream_rq_active",
            "Upstream requests not yet complete.",
        ),
        rq_pending_active: gauge = upstream_rq_pending_active(
            "upstream_rq_pending_active",
            "Requests waiting for an upstream connection.",
        ),
        rq_timeout: counter = upstream_rq_timeout(
            "upstream_rq_timeout",
            "Requests that hit the route timeout.",
        ),
        rq_class: counter["code_class": CLASSES] = upstream_rq_class(
            "upstream_rq_xx",
            "Upstream responses by status class.",
        ),
        rq_time: histogram = upstream_rq_time(
            "upstream_rq_time",
            "Time from sending a request upstream to the end of its response.",
        ),
        cx_overflow: counter = upstream_cx_overflow(
            "upstream_cx_overflow",
            "Times a request found max_connections reached (it then waits in the pending queue, if there is room).",
        ),
        cx_pool_overflow: counter = upstream_cx_pool_overflow(
            "upstream_cx_pool_overflow",
            "Requests refused with 503 because a new connection pool would pass max_connection_pools.",
        ),
        rq_pending_overflow: counter = upstream_rq_pending_overflow(
            "upstream_rq_pending_overflow",
            "Requests refused with 503 because max_requests or max_pending_requests was reached (as Envoy counts them).",
        ),
        rq_pending_total: counter = upstream_rq_pending_total(
            "upstream_rq_pending_total",
            "Requests that waited for an upstream connection.",
        ),
        rq_pending_timeout: counter = upstream_rq_pending_timeout(
            "upstream_rq_pending_timeout",
            "Requests refused with 503 after waiting pending_timeout for a connection.",
        ),
        rq_retry: counter = upstream_rq_retry(
            "upstream_rq_retry",
            "Retries sent.",
        ),
        rq_retry_success: counter = upstream_rq_retry_success(
            "upstream_rq_retry_success",
            "Retries that got a response not itself retried.",
        ),
        rq_retry_overflow: counter = upstream_rq_retry_overflow(
            "upstream_rq_retry_overflow",
            "Retries not sent because max_retries was reached.",
        ),
        rq_retry_limit_exceeded: counter = upstream_rq_retry_limit_exceeded(
            "upstream_rq_retry_limit_exceeded",
            "Requests still failing after num_retries retries.",
        ),
        rq_shadow: counter = upstream_rq_shadow(
            "upstream_rq_shadow",
            "Copies of requests sent to this cluster by routes' request_mirror_policies.",
        ),
        rq_shadow_failed: counter = upstream_rq_shadow_failed(
            "upstream_rq_shadow_failed",
            "Copies that got no response: refused (no host, a full breaker), failed, timed out, or given up when the original's body outgrew the buffer limit.",
        ),
        lb_zone_routing_all_directly: counter = lb_zone_routing_all_directly(
            "lb_zone_routing_all_directly",
            "Requests zone-aware routing sent to the local zone, which has enough hosts for all of it.",
        ),
        lb_zone_routing_sampled: counter = lb_zone_routing_sampled(
            "lb_zone_routing_sampled",
            "Requests zone-aware routing kept in the local zone, within the share its hosts can take.",
        ),
        lb_zone_routing_cross_zone: counter = lb_zone_routing_cross_zone(
            "lb_zone_routing_cross_zone",
            "Requests zone-aware routing sent to another zone, past the share the local zone's hosts can take.",
        ),
        lb_zone_no_capacity_left: counter = lb_zone_no_capacity_left(
            "lb_zone_no_capacity_left",
            "Cross-zone requests sent to a random zone because no zone had spare capacity (also in lb_zone_routing_cross_zone).",
        ),
        lb_local_cluster_not_ok: counter = lb_local_cluster_not_ok(
            "lb_local_cluster_not_ok",
            "Requests not routed by zone because the local cluster was in panic, and recalculations that found the local cluster without a host in this proxy's zone.",
        ),
        lb_zone_cluster_too_small: counter = lb_zone_cluster_too_small(
            "lb_zone_cluster_too_small",
            "Zone-routing recalculations that found fewer healthy hosts than min_cluster_size.",
        ),
        lb_recalculate_zone_structures: counter = lb_recalculate_zone_structures(
            "lb_recalculate_zone_structures",
            "Times zone routing was recalculated (the balancer's tables rebuilt, per worker).",
        ),
        outlier_detection_ejections_enforced_total: counter = outlier_detection_ejections_enforced_total(
            "outlier_detection_ejections_enforced_total",
            "Hosts ejected by outlier detection.",
        ),
        outlier_detection_ejections_overflow: counter = outlier_detection_ejections_overflow(
            "outlier_detection_ejections_overflow",
            "Ejections skipped because max_ejection_percent was reached.",
        ),
        outlier_detection_ejections_detected_success_rate: counter = outlier_detection_ejections_detected_success_rate(
            "outlier_detection_ejections_detected_success_rate",
            "Hosts found below the success-rate threshold of an interval, ejected or not.",
        ),
        outlier_detection_ejections_enforced_success_rate: counter = outlier_detection_ejections_enforced_success_rate(
            "outlier_detection_ejections_enforced_success_rate",
            "Hosts ejected for their success rate.",
        ),
        outlier_detection_ejections_detected_failure_percentage: counter = outlier_detection_ejections_detected_failure_percentage(
            "outlier_detection_ejections_detected_failure_percentage",
            "Hosts found at or above the failure-percentage threshold of an interval, ejected or not.",
        ),
        outlier_detection_ejections_enforced_failure_percentage: counter = outlier_detection_ejections_enforced_failure_percentage(
            "outlier_detection_ejections_enforced_failure_percentage",
            "Hosts ejected for their failure percentage.",
        ),
        health_check_attempt: counter = health_check_attempt(
            "health_check_attempt",
            "Active health checks made.",
        ),
        health_check_success: counter = health_check_success(
            "health_check_success",
            "Active health checks passed.",
        ),
        health_check_failure: counter = health_check_failure(
            "health_check_failure",
            "Active health checks failed (status, timeout or connection).",
        ),
        update_attempt: counter = update_attempt(
            "update_attempt",
            "DNS lookups of the cluster's endpoint names.",
        ),
        update_success: counter = update_success(
            "update_success",
            "DNS lookups answered (an answer with no address included).",
        ),
        update_failure: counter = update_failure(
            "update_failure",
            "DNS lookups that failed (timeout, server failure); the last answer stays in use.",
        ),
        rq_pending_time: histogram = upstream_rq_pending_time(
            "upstream_rq_pending_time",
            "Time requests waited for an upstream connection.",
        ),
    }
    /// A cluster's process-wide gauges.
    cluster_gauges -> ClusterGauges(cluster) {
        cx_open: shared_gauge = circuit_breakers_cx_open(
            "circuit_breakers_cx_open",
            "1 while max_connections is reached.",
        ),
        rq_pending_open: shared_gauge = circuit_breakers_rq_pending_open(
            "circuit_breakers_rq_pending_open",
            "1 while max_pending_requests is reached.",
        ),
        rq_open: shared_gauge = circuit_breakers_rq_open(
            "circuit_breakers_rq_open",
            "1 while max_requests is reached.",
        ),
        rq_retry_open: shared_gauge = circuit_breakers_rq_retry_open(
            "circuit_breakers_rq_retry_open",
            "1 while max_retries is reached.",
        ),
        remaining_cx: shared_gauge = circuit_breakers_remaining_cx(
            "circuit_breakers_remaining_cx",
            "Upstream connections left before max_connections.",
        ),
        remaining_pending: shared_gauge = circuit_breakers_remaining_pending(
            "circuit_breakers_remaining_pending",
            "Pending requests left before max_pending_requests.",
        ),
        remaining_rq: shared_gauge = circuit_breakers_remaining_rq(
            "circuit_breakers_remaining_rq",
            "Requests left before max_requests.",
        ),
        remaining_retries: shared_gauge = circuit_breakers_remaining_retries(
            "circuit_breakers_remaining_retries",
            "Retries left before max_retries.",
        ),
        rq_headroom: shared_gauge = circuit_breakers_rq_headroom(
            "circuit_breakers_rq_headroom",
            "max_requests over the requests in flight on average in the last 10 s (rate x mean latency), in percent: 200 = the breaker trips at twice the current load. 100000 when idle.",
        ),
        pending_headroom: shared_gauge = circuit_breakers_pending_headroom(
            "circuit_breakers_pending_headroom",
            "max_pending_requests over the requests pending on average in the last 10 s, in percent. 100000 when none waited.",
        ),
        membership_healthy: shared_gauge = membership_healthy(
            "membership_healthy",
            "Hosts of the cluster that may take traffic (not failing health checks, not ejected).",
        ),
        ejections_active: shared_gauge = outlier_detection_ejections_active(
            "outlier_detection_ejections_active",
            "Hosts currently ejected by outlier detection.",
        ),
    }
    /// One worker's handles for one upstream host.
    host -> HostStats(cluster, host) {
        cx_active: gauge = host_cx_active(
            "host_cx_active",
            "Upstream connections open, per host.",
        ),
        rq_active: gauge = host_rq_active(
            "host_rq_active",
            "Upstream requests in flight, per host.",
        ),
    }
    /// One worker's per-endpoint counts for one upstream host, kept for clusters with
    /// `per_endpoint_stats` (Envoy's `track_cluster_stats`).
    endpoint -> EndpointStats(cluster, host) {
        cx_total: counter = host_cx_total(
            "host_cx_total",
            "Upstream connections opened, per host (per_endpoint_stats).",
        ),
        cx_connect_fail: counter = host_cx_connect_fail(
            "host_cx_connect_fail",
            "Upstream connects refused, failed or timed out, per host (per_endpoint_stats).",
        ),
        rq_total: counter = host_rq_total(
            "host_rq_total",
            "Requests sent upstream, per host (per_endpoint_stats).",
        ),
        rq_success: counter = host_rq_success(
            "host_rq_success",
            "Upstream responses other than 5xx, per host (per_endpoint_stats).",
        ),
        rq_error: counter = host_rq_error(
            "host_rq_error",
            "Upstream 5xx responses and tries that got no response, per host (per_endpoint_stats).",
        ),
        rq_timeout: counter = host_rq_timeout(
            "host_rq_timeout",
            "Requests that hit the route timeout, per host (per_endpoint_stats).",
        ),
    }
    /// One worker's totals over all its listeners: the balance between workers (lesson L3).
    worker -> WorkerStats() {
        cx_active: per_shard_gauge = worker_downstream_cx_active(
            "worker_downstream_cx_active",
            "Downstream connections open on each worker (Envoy's worker_N.downstream_cx_active).",
        ),
        rq_total: per_shard_counter = worker_downstream_rq_total(
            "worker_downstream_rq_total",
            "Downstream requests received by each worker.",
        ),
        /// The config generation the worker applied last.
        config_generation: per_shard_gauge = worker_config_generation(
            "worker_config_generation",
            "The config generation each worker serves with: one behind config_generation for long is a stuck worker.",
        ),
        overload_applied: counter["action": OVERLOAD_ACTIONS] = overload_action_applied(
            "overload_action_applied_total",
            "What the overload manager did, by action: disable_keepalive (a response that closed its connection, or an HTTP/2 GOAWAY), refuse_connections (a connection closed as accepted), shed_requests (a 503 with x-legate-overloaded).",
        ),
    }
    @process {
        downstream_rq_idle_timeout: counter("downstream_rq_idle_timeout", ["listener"], "HTTP/2 streams reset after stream_idle_timeout with nothing moving (a zero-window stall, a body never finished)."),
        tracing_spans: counter("tracing_spans_total", ["outcome"], "Spans of sampled requests, by outcome: sampled (recorded), dropped (the export queue was full), exported (taken by the collector), failed (the export failed; the spans are lost)."),
        overload_action_active: gauge("overload_action_active", ["action"], "1 while the overload manager's action is in force."),
        overload_resource_pressure: gauge("overload_resource_pressure_percent", ["resource"], "Use of a resource the overload manager watches, in percent of its limit (-1: not watched)."),
        ssl_certificate_reload: counter("ssl_certificate_reload", ["listener", "result"], "Certificate reloads (SIGHUP or POST /reload_certs) by outcome; on failure the previous certificates stay."),
        server_concurrency: gauge("server_concurrency", [], "Worker threads."),
        server_uptime: gauge("server_uptime", [], "Seconds since the proxy started."),
        server_memory_resident: gauge("server_memory_resident_bytes", [], "Resident memory of the process."),
        server_live: gauge("server_live", [], "1 while serving, 0 while draining."),
        server_descriptors_in_use: gauge("server_descriptors_in_use", [], "File descriptors the process has open (clients, upstream connections, listeners, files), as the overload manager last counted them (-1: not counted)."),
        server_descriptor_limit: gauge("server_descriptor_limit", [], "The overload manager's descriptor limit (default: the open-file limit; -1: not watched)."),
        server_days_until_first_cert_expiring: gauge("server_days_until_first_cert_expiring", [], "Whole days until the first certificate a TLS listener serves expires (negative once it has; 4294967295 without TLS listeners), as GET /certs lists them."),
        config_reload: counter("config_reload_total", ["result"], "Config reloads (SIGHUP, POST /reload, a watched file), by result: success, or failure (the config in force stays)."),
        config_propagation: histogram("config_propagation", [], "From a new config accepted to every worker serving with it."),
        control_plane_connected: gauge("control_plane_connected_state", [], "1 while the xDS stream to the management server is up, 0 otherwise (Envoy's control_plane.connected_state)."),
        xds_update_attempt: counter("xds_update_attempt_total", ["type"], "xDS responses received, by resource type (lds, rds, cds, eds, sds)."),
        xds_update_success: counter("xds_update_success_total", ["type"], "xDS responses put in force and ACKed, by resource type."),
        xds_response_too_large: counter("xds_response_too_large_total", [], "xDS responses longer than ads.max_message_size: refused unread (the stream ends and the config in force stays)."),
        xds_update_rejected: counter("xds_update_rejected_total", ["type"], "xDS responses refused and NACKed (the config in force stays), by resource type."),
        sds_update_attempt: counter("sds_update_attempt_total", ["secret"], "Secrets received over SDS, by name (Envoy's sds.<name>.update_attempt)."),
        sds_update_success: counter("sds_update_success_total", ["secret"], "Secrets received over SDS and put in force (or held, unchanged), by name."),
        sds_update_rejected: counter("sds_update_rejected_total", ["secret"], "Secrets in SDS responses that were refused (the response is NACKed whole; the secret held before stays), by name."),
        config_generation: gauge("config_generation", [], "The config generation in force (1 at start, +1 per successful reload)."),
    }
}

const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const TLS_VERSIONS: [&str; 3] = ["TLSv1_2", "TLSv1_3", "other"];
const ALPN_LABELS: [&str; 4] = ["h2", "http/1.1", "none", "other"];
/// In `config::Encoding`'s order.
const ENCODINGS: [&str; 3] = ["zstd", "br", "gzip"];
/// Why an HTTP/3 connection ended, as `downstream_cx_http3_close` labels it.
pub(crate) const QUIC_CLOSE_REASONS: [&str; 9] = [
    "idle_timeout",
    "closed_here",
    "peer_application_close",
    "peer_transport_close",
    "transport_error",
    "stateless_reset",
    "version_mismatch",
    "cids_exhausted",
    "http3_error",
];
/// The overload manager's actions, as `overload_action_applied` labels them; indexed by the
/// constants below.
const OVERLOAD_ACTIONS: [&str; 3] = ["disable_keepalive", "refuse_connections", "shed_requests"];
const DISABLE_KEEPALIVE: usize = 0;
const REFUSE_CONNECTIONS: usize = 1;
const SHED_REQUESTS: usize = 2;

/// Index into [`CLASSES`] for a status.
fn class_index(status: StatusCode) -> usize {
    (status.as_u16() / 100).clamp(1, 5) as usize - 1
}

impl Catalog {
    /// The listener's count of HTTP/2 streams ended by `stream_idle_timeout` (kept by the
    /// codec's executor, not by a connection).
    pub(crate) fn stream_idle_timeouts(&self, shard: &Shard, listener: &str) -> stats::Counter {
        shard.counter(self.downstream_rq_idle_timeout, &[listener])
    }

    /// `(success, failure)` counters of a TLS listener's certificate reloads.
    pub(crate) fn certificate_reloads(
        &self,
        shard: &Shard,
        listener: &str,
    ) -> (stats::Counter, stats::Counter) {
        (
            shard.counter(self.ssl_certificate_reload, &[listener, "success"]),
            shard.counter(self.ssl_certificate_reload, &[listener, "failure"]),
        )
    }
}

impl ListenerStats {
    pub(crate) fn response(&self, status: StatusCode) {
        self.rq_class[class_index(status)].inc();
    }
}

impl ClusterStats {
    pub(crate) fn response(&self, status: StatusCode) {
        self.rq_class[class_index(status)].inc();
    }
}

impl WorkerStats {
    /// Responses that closed their connection, or HTTP/2 GOAWAYs, for the overload manager.
    pub(crate) fn overload_keepalive_disabled(&self) -> &stats::Counter {
        &self.overload_applied[DISABLE_KEEPALIVE]
    }

    /// Connections closed as accepted by the overload manager.
    pub(crate) fn overload_cx_refused(&self) -> &stats::Counter {
        &self.overload_applied[REFUSE_CONNECTIONS]
    }

    /// Requests answered 503 by the overload manager.
    pub(crate) fn overload_rq_shed(&self) -> &stats::Counter {
        &self.overload_applied[SHED_REQUESTS]
    }
}

impl TlsStats {
    pub(crate) fn version(&self, version: Option<rustls::ProtocolVersion>) {
        let i = match version {
            Some(rustls::ProtocolVersion::TLSv1_2) => 0,
            Some(rustls::ProtocolVersion::TLSv1_3) => 1,
            _ => 2,
        };
        self.versions[i].inc();
    }

    pub(crate) fn alpn(&self, protocol: Option<&[u8]>) {
        let i = match protocol {
            Some(b"h2") => 0,
            Some(b"http/1.1") => 1,
            None => 2,
            Some(_) => 3,
        };
        self.alpn[i].inc();
    }
}

/// The registry and its catalogue, shared by the workers and the admin server.
pub(crate) struct ProxyStats {
    pub(crate) registry: Registry,
    pub(crate) catalog: Catalog,
    /// The shard of process-wide stats (not a worker's): made once, since every shard stays
    /// in the registry for good and reloads make handles again and again.
    pub(crate) process: Shard,
}

impl ProxyStats {
    pub(crate) fn new() -> Arc<ProxyStats> {
        let registry = Registry::new();
        let catalog = Catalog::declare(&registry);
        let process = registry.shard(&[]);
        Arc::new(ProxyStats {
            registry,
            catalog,
            process,
        })
    }

    /// Makes this registry the process's `metrics` recorder: what any library records with
    /// `metrics::counter!` and the like is exported beside Legate's own stats. The first
    /// server of a process takes it (a recorder is set once per process); `false` for the
    /// others.
    pub(crate) fn record_the_metrics_facade(&self) -> bool {
        metrics::set_global_recorder(stats::MetricsRecorder::new(self.registry.clone())).is_ok()
    }
}

#[cfg(test)]
mod facade_tests {
    use super::*;

    #[test]
    fn a_librarys_metrics_appear_beside_the_proxys_own() {
        let stats = ProxyStats::new();
        let recorder = stats::MetricsRecorder::new(stats.registry.clone());
        metrics::with_local_recorder(&recorder, || {
            // As a library would, not knowing who records.
            metrics::counter!("library_jobs_total", "queue" => "mail").increment(2);
            metrics::gauge!("library_workers").set(3.0);
            metrics::histogram!("library_job_seconds").record(0.25);
            // A name the proxy's stats already use is refused, not mixed in.
            metrics::counter!("downstream_rq_total").increment(1);
        });
        let text = stats.registry.snapshot().render_prometheus();
        assert!(
            text.contains("library_jobs_total{queue=\"mail\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("library_workers 3\n"), "{text}");
        assert!(text.contains("library_job_seconds_count 1\n"), "{text}");
        assert!(
            text.contains("library_job_seconds_bucket{le=\"0.25\"} 1\n"),
            "{text}"
        );
        let refused = recorder.refused();
        assert!(
            refused.len() == 1 && refused[0].contains("downstream_rq_total"),
            "{refused:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_fall_in_their_class() {
        assert_eq!(class_index(StatusCode::CONTINUE), 0);
        assert_eq!(class_index(StatusCode::OK), 1);
        assert_eq!(class_index(StatusCode::NOT_FOUND), 3);
        assert_eq!(class_index(StatusCode::from_u16(599).unwrap()), 4);
        assert_eq!(class_index(StatusCode::from_u16(999).unwrap()), 4);
    }

    /// docs/stats.md lists every family the catalogue declares, with its type, and nothing
    /// that it does not declare.
    #[test]
    fn the_stats_doc_lists_exactly_the_catalogue() {
        let registry = Registry::new();
        Catalog::declare(&registry);
        let declared: std::collections::BTreeSet<(String, &str)> = registry
            .snapshot()
            .families()
            .iter()
            .map(|family| {
                let kind = match family.kind() {
                    stats::MetricKind::Counter => "counter",
                    stats::MetricKind::Gauge => "gauge",
                    stats::MetricKind::Histogram => "histogram",
                };
                (family.name().to_owned(), kind)
            })
            .collect();
        let doc = include_str!("../../../docs/stats.md");
        let documented: std::collections::BTreeSet<(String, &str)> = doc
            .lines()
            .filter_map(|line| {
                // `| `name`, `name` | type | meaning |`
                let mut cells = line.strip_prefix('|')?.split('|');
                let names = cells.next()?.trim();
                let kind = cells.next()?.trim();
                let kind = ["counter", "gauge", "histogram"]
                    .into_iter()
                    .find(|k| *k == kind)?;
                Some(
                    names
                        .split(", ")
                        .filter_map(|name| name.strip_prefix('`')?.strip_suffix('`'))
                        .map(move |name| (name.to_owned(), kind))
                        .collect::<Vec<_>>(),
                )
            })
            .flatten()
            .collect();
        let undocumented: Vec<_> = declared.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&declared).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "declared but not in docs/stats.md: {undocumented:?}\nin docs/stats.md but not declared: {unknown:?}"
        );
    }
}
