//! The stats catalogue: every family the proxy records, with Envoy's names where Envoy has
//! one, and the per-worker handles the request path records through. Handles are made once
//! per worker when it starts; recording is then a worker-local store (see the `stats` crate).

use std::sync::Arc;

use http::StatusCode;
use stats::{CounterFamily, GaugeFamily, HistogramFamily, Registry, Shard};

/// The families, declared once on the registry.
#[derive(Clone, Copy)]
pub(crate) struct Catalog {
    downstream_cx_total: CounterFamily,
    downstream_cx_active: GaugeFamily,
    downstream_cx_destroy: CounterFamily,
    downstream_cx_overflow: CounterFamily,
    downstream_cx_idle_timeout: CounterFamily,
    downstream_cx_max_requests: CounterFamily,
    downstream_cx_max_duration: CounterFamily,
    downstream_cx_h2_flood: CounterFamily,
    downstream_cx_h2_continuation_flood: CounterFamily,
    downstream_rq_idle_timeout: CounterFamily,
    downstream_cx_h2_control_flood: CounterFamily,
    downstream_cx_headers_timeout: CounterFamily,
    downstream_cx_proxy_proto_error: CounterFamily,
    downstream_cx_parked: GaugeFamily,
    downstream_rq_total: CounterFamily,
    downstream_rq_active: GaugeFamily,
    downstream_rq_class: CounterFamily,
    downstream_rq_time: HistogramFamily,
    upstream_cx_total: CounterFamily,
    upstream_cx_active: GaugeFamily,
    upstream_cx_connect_fail: CounterFamily,
    upstream_cx_max_requests: CounterFamily,
    upstream_cx_connect_timeout: CounterFamily,
    upstream_cx_connect_time: HistogramFamily,
    upstream_rq_total: CounterFamily,
    upstream_rq_active: GaugeFamily,
    upstream_rq_pending_active: GaugeFamily,
    upstream_rq_timeout: CounterFamily,
    upstream_rq_class: CounterFamily,
    upstream_rq_time: HistogramFamily,
    upstream_cx_overflow: CounterFamily,
    upstream_rq_pending_overflow: CounterFamily,
    upstream_rq_pending_total: CounterFamily,
    upstream_rq_pending_timeout: CounterFamily,
    upstream_rq_retry: CounterFamily,
    upstream_rq_retry_success: CounterFamily,
    upstream_rq_retry_overflow: CounterFamily,
    upstream_rq_retry_limit_exceeded: CounterFamily,
    upstream_rq_shadow: CounterFamily,
    upstream_rq_shadow_failed: CounterFamily,
    outlier_detection_ejections_enforced_total: CounterFamily,
    outlier_detection_ejections_overflow: CounterFamily,
    health_check_attempt: CounterFamily,
    health_check_success: CounterFamily,
    health_check_failure: CounterFamily,
    update_attempt: CounterFamily,
    update_success: CounterFamily,
    update_failure: CounterFamily,
    pub(crate) circuit_breakers_cx_open: GaugeFamily,
    pub(crate) circuit_breakers_rq_pending_open: GaugeFamily,
    pub(crate) circuit_breakers_rq_open: GaugeFamily,
    pub(crate) circuit_breakers_rq_retry_open: GaugeFamily,
    pub(crate) circuit_breakers_remaining_cx: GaugeFamily,
    pub(crate) circuit_breakers_remaining_pending: GaugeFamily,
    pub(crate) circuit_breakers_remaining_rq: GaugeFamily,
    pub(crate) circuit_breakers_remaining_retries: GaugeFamily,
    pub(crate) circuit_breakers_rq_headroom: GaugeFamily,
    pub(crate) circuit_breakers_pending_headroom: GaugeFamily,
    pub(crate) membership_healthy: GaugeFamily,
    pub(crate) outlier_detection_ejections_active: GaugeFamily,
    upstream_rq_pending_time: HistogramFamily,
    ssl_handshake: CounterFamily,
    ssl_connection_error: CounterFamily,
    ssl_handshake_timeout: CounterFamily,
    ssl_no_certificate: CounterFamily,
    ssl_session_reused: CounterFamily,
    ssl_versions: CounterFamily,
    ssl_alpn: CounterFamily,
    ssl_handshake_time: HistogramFamily,
    ssl_certificate_reload: CounterFamily,
    ext_authz_ok: CounterFamily,
    ext_authz_denied: CounterFamily,
    ext_authz_error: CounterFamily,
    ext_authz_timeout: CounterFamily,
    ext_authz_failure_mode_allowed: CounterFamily,
    ext_authz_time: HistogramFamily,
    upgrades: CounterFamily,
    upgrades_active: GaugeFamily,
    upgrades_failed: CounterFamily,
    http_local_rate_limit_ok: CounterFamily,
    http_local_rate_limit_rate_limited: CounterFamily,
    compression_compressed: CounterFamily,
    compression_not_compressed: CounterFamily,
    compression_uncompressed_bytes: CounterFamily,
    compression_compressed_bytes: CounterFamily,
    upstream_ssl_handshake: CounterFamily,
    upstream_ssl_connection_error: CounterFamily,
    host_cx_active: GaugeFamily,
    host_rq_active: GaugeFamily,
    worker_downstream_cx_active: GaugeFamily,
    worker_downstream_rq_total: CounterFamily,
    overload_action_applied: CounterFamily,
    /// Spans by outcome: sampled and dropped on the workers, exported and failed on the
    /// exporter's thread.
    pub(crate) tracing_spans: CounterFamily,
    pub(crate) overload_action_active: GaugeFamily,
    pub(crate) overload_resource_pressure: GaugeFamily,
    pub(crate) server_concurrency: GaugeFamily,
    pub(crate) server_uptime: GaugeFamily,
    pub(crate) server_memory_resident: GaugeFamily,
    pub(crate) server_live: GaugeFamily,
    pub(crate) config_reload: CounterFamily,
    pub(crate) config_propagation: HistogramFamily,
    pub(crate) config_generation: GaugeFamily,
    worker_config_generation: GaugeFamily,
    pub(crate) control_plane_connected: GaugeFamily,
    pub(crate) xds_update_attempt: CounterFamily,
    pub(crate) xds_update_success: CounterFamily,
    pub(crate) xds_update_rejected: CounterFamily,
}

const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Index into [`CLASSES`] for a status.
fn class_index(status: StatusCode) -> usize {
    (status.as_u16() / 100).clamp(1, 5) as usize - 1
}

impl Catalog {
    pub(crate) fn declare(r: &Registry) -> Catalog {
        let l = &["listener"];
        let lc = &["listener", "code_class"];
        let c = &["cluster"];
        let cc = &["cluster", "code_class"];
        Catalog {
            downstream_cx_total: r.counter(
                "downstream_cx_total",
                "Downstream connections accepted.",
                l,
            ),
            downstream_cx_active: r.gauge(
                "downstream_cx_active",
                "Downstream connections open.",
                l,
            ),
            downstream_cx_destroy: r.counter(
                "downstream_cx_destroy",
                "Downstream connections closed.",
                l,
            ),
            downstream_cx_max_requests: r.counter(
                "downstream_cx_max_requests_reached",
                "Client connections retired after max_requests_per_connection (connection: close or GOAWAY).",
                l,
            ),
            downstream_cx_max_duration: r.counter(
                "downstream_cx_max_duration_reached",
                "Client connections retired after max_connection_duration (connection: close, a close when idle, or GOAWAY).",
                l,
            ),
            downstream_cx_h2_flood: r.counter(
                "downstream_cx_h2_flood",
                "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM: a flood of resets (rapid reset) or of stream errors.",
                l,
            ),
            downstream_rq_idle_timeout: r.counter(
                "downstream_rq_idle_timeout",
                "HTTP/2 streams reset after stream_idle_timeout with nothing moving (a zero-window stall, a body never finished).",
                l,
            ),
            downstream_cx_h2_continuation_flood: r.counter(
                "downstream_cx_h2_continuation_flood",
                "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM for a header block of too many CONTINUATION frames.",
                l,
            ),
            downstream_cx_h2_control_flood: r.counter(
                "downstream_cx_h2_control_flood",
                "HTTP/2 connections closed for more than 1000 PING or SETTINGS frames in a 10-second window with no response data or headers sent between them.",
                l,
            ),
            downstream_cx_idle_timeout: r.counter(
                "downstream_cx_idle_timeout",
                "Connections closed after idle_timeout without a request.",
                l,
            ),
            downstream_cx_proxy_proto_error: r.counter(
                "downstream_cx_proxy_proto_error",
                "Connections closed because their PROXY protocol header was missing, malformed, too long, of a version not accepted, or late (request_headers_timeout).",
                l,
            ),
            downstream_cx_parked: r.gauge(
                "downstream_cx_parked",
                "Idle HTTP/1.1 connections held as their sockets alone, without a task (idle for a second or more).",
                l,
            ),
            downstream_cx_headers_timeout: r.counter(
                "downstream_cx_headers_timeout",
                "Connections closed because a request head did not arrive within request_headers_timeout.",
                l,
            ),
            downstream_cx_overflow: r.counter(
                "downstream_cx_overflow",
                "Connections closed at accept: the listener's connection_limit or the process's max_connections was reached.",
                l,
            ),
            downstream_rq_total: r.counter(
                "downstream_rq_total",
                "Downstream requests received.",
                l,
            ),
            downstream_rq_active: r.gauge(
                "downstream_rq_active",
                "Downstream requests not yet fully answered.",
                l,
            ),
            downstream_rq_class: r.counter(
                "downstream_rq_xx",
                "Downstream responses by status class.",
                lc,
            ),
            downstream_rq_time: r.histogram(
                "downstream_rq_time",
                "Time from request head to the last response byte handed to the codec.",
                l,
            ),
            upstream_cx_total: r.counter("upstream_cx_total", "Upstream connections opened.", c),
            upstream_cx_active: r.gauge("upstream_cx_active", "Upstream connections open.", c),
            upstream_cx_max_requests: r.counter(
                "upstream_cx_max_requests",
                "Upstream connections retired after max_requests_per_connection.",
                c,
            ),
            upstream_cx_connect_fail: r.counter(
                "upstream_cx_connect_fail",
                "Upstream connects refused or failed.",
                c,
            ),
            upstream_cx_connect_timeout: r.counter(
                "upstream_cx_connect_timeout",
                "Upstream connects that timed out.",
                c,
            ),
            upstream_cx_connect_time: r.histogram(
                "upstream_cx_connect_time",
                "Time to establish an upstream connection (Envoy's upstream_cx_connect_ms).",
                c,
            ),
            upstream_rq_total: r.counter("upstream_rq_total", "Requests sent upstream.", c),
            upstream_rq_active: r.gauge(
                "upstream_rq_active",
                "Upstream requests not yet complete.",
                c,
            ),
            upstream_rq_pending_active: r.gauge(
                "upstream_rq_pending_active",
                "Requests waiting for an upstream connection.",
                c,
            ),
            upstream_rq_timeout: r.counter(
                "upstream_rq_timeout",
                "Requests that hit the route timeout.",
                c,
            ),
            upstream_rq_class: r.counter(
                "upstream_rq_xx",
                "Upstream responses by status class.",
                cc,
            ),
            upstream_rq_time: r.histogram(
                "upstream_rq_time",
                "Time from sending a request upstream to the end of its response.",
                c,
            ),
            upstream_cx_overflow: r.counter("upstream_cx_overflow", "Times a request found max_connections reached (it then waits in the pending queue, if there is room).", c),
            upstream_rq_pending_overflow: r.counter("upstream_rq_pending_overflow", "Requests refused with 503 because max_requests or max_pending_requests was reached (as Envoy counts them).", c),
            upstream_rq_pending_total: r.counter("upstream_rq_pending_total", "Requests that waited for an upstream connection.", c),
            upstream_rq_pending_timeout: r.counter("upstream_rq_pending_timeout", "Requests refused with 503 after waiting pending_timeout for a connection.", c),
            upstream_rq_retry: r.counter("upstream_rq_retry", "Retries sent.", c),
            upstream_rq_retry_success: r.counter("upstream_rq_retry_success", "Retries that got a response not itself retried.", c),
            upstream_rq_retry_overflow: r.counter("upstream_rq_retry_overflow", "Retries not sent because max_retries was reached.", c),
            upstream_rq_retry_limit_exceeded: r.counter("upstream_rq_retry_limit_exceeded", "Requests still failing after num_retries retries.", c),
            upstream_rq_shadow: r.counter("upstream_rq_shadow", "Copies of requests sent to this cluster by routes' request_mirror_policies.", c),
            upstream_rq_shadow_failed: r.counter("upstream_rq_shadow_failed", "Copies that got no response: refused (no host, a full breaker), failed, timed out, or given up when the original's body outgrew the buffer limit.", c),
            outlier_detection_ejections_enforced_total: r.counter("outlier_detection_ejections_enforced_total", "Hosts ejected by outlier detection.", c),
            outlier_detection_ejections_overflow: r.counter("outlier_detection_ejections_overflow", "Ejections skipped because max_ejection_percent was reached.", c),
            health_check_attempt: r.counter("health_check_attempt", "Active health checks made.", c),
            health_check_success: r.counter("health_check_success", "Active health checks passed.", c),
            health_check_failure: r.counter("health_check_failure", "Active health checks failed (status, timeout or connection).", c),
            update_attempt: r.counter("update_attempt", "DNS lookups of the cluster's endpoint names.", c),
            update_success: r.counter("update_success", "DNS lookups answered (an answer with no address included).", c),
            update_failure: r.counter("update_failure", "DNS lookups that failed (timeout, server failure); the last answer stays in use.", c),
            circuit_breakers_cx_open: r.gauge("circuit_breakers_cx_open", "1 while max_connections is reached.", c),
            circuit_breakers_rq_pending_open: r.gauge("circuit_breakers_rq_pending_open", "1 while max_pending_requests is reached.", c),
            circuit_breakers_rq_open: r.gauge("circuit_breakers_rq_open", "1 while max_requests is reached.", c),
            circuit_breakers_rq_retry_open: r.gauge("circuit_breakers_rq_retry_open", "1 while max_retries is reached.", c),
            circuit_breakers_remaining_cx: r.gauge("circuit_breakers_remaining_cx", "Upstream connections left before max_connections.", c),
            circuit_breakers_remaining_pending: r.gauge("circuit_breakers_remaining_pending", "Pending requests left before max_pending_requests.", c),
            circuit_breakers_remaining_rq: r.gauge("circuit_breakers_remaining_rq", "Requests left before max_requests.", c),
            circuit_breakers_remaining_retries: r.gauge("circuit_breakers_remaining_retries", "Retries left before max_retries.", c),
            circuit_breakers_rq_headroom: r.gauge("circuit_breakers_rq_headroom", "max_requests over the requests in flight on average in the last 10 s (rate x mean latency), in percent: 200 = the breaker trips at twice the current load. 100000 when idle.", c),
            circuit_breakers_pending_headroom: r.gauge("circuit_breakers_pending_headroom", "max_pending_requests over the requests pending on average in the last 10 s, in percent. 100000 when none waited.", c),
            membership_healthy: r.gauge("membership_healthy", "Hosts of the cluster that may take traffic (not failing health checks, not ejected).", c),
            outlier_detection_ejections_active: r.gauge("outlier_detection_ejections_active", "Hosts currently ejected by outlier detection.", c),
            upstream_rq_pending_time: r.histogram("upstream_rq_pending_time", "Time requests waited for an upstream connection.", c),
            worker_downstream_cx_active: r.per_shard_gauge("worker_downstream_cx_active", "Downstream connections open on each worker (Envoy's worker_N.downstream_cx_active).", &[]),
            worker_downstream_rq_total: r.per_shard_counter("worker_downstream_rq_total", "Downstream requests received by each worker.", &[]),
            tracing_spans: r.counter(
                "tracing_spans_total",
                "Spans of sampled requests, by outcome: sampled (recorded), dropped (the export queue was full), exported (taken by the collector), failed (the export failed; the spans are lost).",
                &["outcome"],
            ),
            overload_action_applied: r.counter(
                "overload_action_applied_total",
                "What the overload manager did, by action: disable_keepalive (a response that closed its connection, or an HTTP/2 GOAWAY), refuse_connections (a connection closed as accepted), shed_requests (a 503 with x-legate-overloaded).",
                &["action"],
            ),
            overload_action_active: r.gauge(
                "overload_action_active",
                "1 while the overload manager's action is in force.",
                &["action"],
            ),
            overload_resource_pressure: r.gauge(
                "overload_resource_pressure_percent",
                "Use of a resource the overload manager watches, in percent of its limit (-1: not watched).",
                &["resource"],
            ),
            host_cx_active: r.gauge(
                "host_cx_active",
                "Upstream connections open, per host.",
                &["cluster", "host"],
            ),
            host_rq_active: r.gauge(
                "host_rq_active",
                "Upstream requests in flight, per host.",
                &["cluster", "host"],
            ),
            ssl_handshake: r.counter("ssl_handshake", "TLS handshakes completed.", l),
            ssl_connection_error: r.counter(
                "ssl_connection_error",
                "TLS handshakes that failed (bad or no TLS, no certificate for the name, client certificate refused, timeout).",
                l,
            ),
            ssl_handshake_timeout: r.counter(
                "ssl_handshake_timeout",
                "TLS handshakes not finished within handshake_timeout (also counted in ssl_connection_error).",
                l,
            ),
            ssl_no_certificate: r.counter(
                "ssl_no_certificate",
                "TLS connections established without a client certificate.",
                l,
            ),
            ssl_session_reused: r.counter(
                "ssl_session_reused",
                "TLS handshakes that resumed a session (ticket or session id).",
                l,
            ),
            ssl_versions: r.counter(
                "ssl_versions",
                "TLS connections by protocol version.",
                &["listener", "version"],
            ),
            ssl_alpn: r.counter(
                "ssl_alpn",
                "TLS connections by the protocol ALPN chose (`none` without ALPN).",
                &["listener", "protocol"],
            ),
            ssl_handshake_time: r.histogram(
                "ssl_handshake_time",
                "Time from accept to the end of the TLS handshake.",
                l,
            ),
            ssl_certificate_reload: r.counter(
                "ssl_certificate_reload",
                "Certificate reloads (SIGHUP or POST /reload_certs) by outcome; on failure the previous certificates stay.",
                &["listener", "result"],
            ),
            ext_authz_ok: r.counter("ext_authz_ok", "Requests the authorization service allowed.", l),
            ext_authz_denied: r.counter(
                "ext_authz_denied",
                "Requests the authorization service denied (answered with its status, headers and body).",
                l,
            ),
            ext_authz_error: r.counter(
                "ext_authz_error",
                "Checks that got no decision: service unreachable, timeout, gRPC error, error response.",
                l,
            ),
            ext_authz_timeout: r.counter(
                "ext_authz_timeout",
                "Checks not answered within the timeout (also counted in ext_authz_error).",
                l,
            ),
            ext_authz_failure_mode_allowed: r.counter(
                "ext_authz_failure_mode_allowed",
                "Requests let through after a failed check (failure_mode_allow).",
                l,
            ),
            ext_authz_time: r.histogram(
                "ext_authz_time",
                "Time an authorization check took, answered or not.",
                l,
            ),
            upgrades: r.counter(
                "downstream_cx_upgrades_total",
                "Connections upgraded (WebSocket over HTTP/1.1 or HTTP/2 extended CONNECT) and relayed as bytes.",
                l,
            ),
            upgrades_active: r.gauge(
                "downstream_cx_upgrades_active",
                "Upgraded connections being relayed.",
                l,
            ),
            upgrades_failed: r.counter(
                "downstream_rq_upgrade_failed",
                "Upgrade requests the upstream did not accept or that could not be relayed (the client got the upstream's answer or an error).",
                l,
            ),
            http_local_rate_limit_ok: r.counter(
                "http_local_rate_limit_ok",
                "Requests a local rate limit let through (a token was taken).",
                l,
            ),
            http_local_rate_limit_rate_limited: r.counter(
                "http_local_rate_limit_rate_limited",
                "Requests a local rate limit refused (429 unless configured; flag RL).",
                l,
            ),
            compression_compressed: r.counter(
                "compression_compressed",
                "Responses compressed, by encoding.",
                &["listener", "encoding"],
            ),
            compression_not_compressed: r.counter(
                "compression_not_compressed",
                "Responses of a compressible type sent uncompressed (not accepted, too short, already encoded, partial, no-transform, or bodiless).",
                l,
            ),
            compression_uncompressed_bytes: r.counter(
                "compression_uncompressed_bytes",
                "Body bytes that went into the compressor.",
                l,
            ),
            compression_compressed_bytes: r.counter(
                "compression_compressed_bytes",
                "Body bytes that came out of the compressor.",
                l,
            ),
            upstream_ssl_handshake: r.counter(
                "upstream_ssl_handshake",
                "TLS handshakes completed with upstream hosts.",
                c,
            ),
            upstream_ssl_connection_error: r.counter(
                "upstream_ssl_connection_error",
                "TLS handshakes with upstream hosts that failed (certificate not trusted, expired or for another name; protocol error). Also counted in upstream_cx_connect_fail.",
                c,
            ),
            server_concurrency: r.gauge("server_concurrency", "Worker threads.", &[]),
            server_uptime: r.gauge("server_uptime", "Seconds since the proxy started.", &[]),
            server_memory_resident: r.gauge(
                "server_memory_resident_bytes",
                "Resident memory of the process.",
                &[],
            ),
            server_live: r.gauge("server_live", "1 while serving, 0 while draining.", &[]),
            config_reload: r.counter(
                "config_reload_total",
                "Config reloads (SIGHUP, POST /reload, a watched file), by result: success, or failure (the config in force stays).",
                &["result"],
            ),
            config_propagation: r.histogram(
                "config_propagation",
                "From a new config accepted to every worker serving with it.",
                &[],
            ),
            control_plane_connected: r.gauge(
                "control_plane_connected_state",
                "1 while the xDS stream to the management server is up, 0 otherwise (Envoy's control_plane.connected_state).",
                &[],
            ),
            xds_update_attempt: r.counter(
                "xds_update_attempt_total",
                "xDS responses received, by resource type (lds, rds, cds, eds).",
                &["type"],
            ),
            xds_update_success: r.counter(
                "xds_update_success_total",
                "xDS responses put in force and ACKed, by resource type.",
                &["type"],
            ),
            xds_update_rejected: r.counter(
                "xds_update_rejected_total",
                "xDS responses refused and NACKed (the config in force stays), by resource type.",
                &["type"],
            ),
            config_generation: r.gauge(
                "config_generation",
                "The config generation in force (1 at start, +1 per successful reload).",
                &[],
            ),
            worker_config_generation: r.per_shard_gauge(
                "worker_config_generation",
                "The config generation each worker serves with: one behind config_generation for long is a stuck worker.",
                &[],
            ),
        }
    }

    /// The listener's count of HTTP/2 streams ended by `stream_idle_timeout` (kept by the
    /// codec's executor, not by a connection).
    pub(crate) fn stream_idle_timeouts(&self, shard: &Shard, listener: &str) -> stats::Counter {
        shard.counter(self.downstream_rq_idle_timeout, &[listener])
    }

    pub(crate) fn listener(&self, shard: &Shard, listener: &str) -> ListenerStats {
        ListenerStats {
            cx_total: shard.counter(self.downstream_cx_total, &[listener]),
            cx_active: shard.gauge(self.downstream_cx_active, &[listener]),
            cx_destroy: shard.counter(self.downstream_cx_destroy, &[listener]),
            cx_overflow: shard.counter(self.downstream_cx_overflow, &[listener]),
            cx_idle_timeout: shard.counter(self.downstream_cx_idle_timeout, &[listener]),
            cx_max_requests: shard.counter(self.downstream_cx_max_requests, &[listener]),
            cx_max_duration: shard.counter(self.downstream_cx_max_duration, &[listener]),
            cx_h2_flood: shard.counter(self.downstream_cx_h2_flood, &[listener]),
            cx_h2_continuation_flood: shard
                .counter(self.downstream_cx_h2_continuation_flood, &[listener]),
            cx_h2_control_flood: shard.counter(self.downstream_cx_h2_control_flood, &[listener]),
            cx_headers_timeout: shard.counter(self.downstream_cx_headers_timeout, &[listener]),
            cx_proxy_proto_error: shard.counter(self.downstream_cx_proxy_proto_error, &[listener]),
            cx_parked: shard.gauge(self.downstream_cx_parked, &[listener]),
            rq_total: shard.counter(self.downstream_rq_total, &[listener]),
            rq_active: shard.gauge(self.downstream_rq_active, &[listener]),
            rq_class: CLASSES
                .map(|class| shard.counter(self.downstream_rq_class, &[listener, class])),
            rq_time: shard.histogram(self.downstream_rq_time, &[listener]),
            upgrades: shard.counter(self.upgrades, &[listener]),
            upgrades_active: shard.gauge(self.upgrades_active, &[listener]),
            upgrades_failed: shard.counter(self.upgrades_failed, &[listener]),
        }
    }

    /// Handshake stats of a TLS listener.
    pub(crate) fn tls(&self, shard: &Shard, listener: &str) -> TlsStats {
        TlsStats {
            handshake: shard.counter(self.ssl_handshake, &[listener]),
            connection_error: shard.counter(self.ssl_connection_error, &[listener]),
            handshake_timeout: shard.counter(self.ssl_handshake_timeout, &[listener]),
            no_certificate: shard.counter(self.ssl_no_certificate, &[listener]),
            session_reused: shard.counter(self.ssl_session_reused, &[listener]),
            versions: TLS_VERSIONS.map(|v| shard.counter(self.ssl_versions, &[listener, v])),
            alpn: ALPN_LABELS.map(|p| shard.counter(self.ssl_alpn, &[listener, p])),
            handshake_time: shard.histogram(self.ssl_handshake_time, &[listener]),
        }
    }

    /// External authorization stats of a listener.
    pub(crate) fn authz(&self, shard: &Shard, listener: &str) -> AuthzStats {
        AuthzStats {
            ok: shard.counter(self.ext_authz_ok, &[listener]),
            denied: shard.counter(self.ext_authz_denied, &[listener]),
            error: shard.counter(self.ext_authz_error, &[listener]),
            timeout: shard.counter(self.ext_authz_timeout, &[listener]),
            failure_mode_allowed: shard.counter(self.ext_authz_failure_mode_allowed, &[listener]),
            time: shard.histogram(self.ext_authz_time, &[listener]),
        }
    }

    /// Local rate limit stats of a listener.
    pub(crate) fn rate_limit(&self, shard: &Shard, listener: &str) -> RateLimitStats {
        RateLimitStats {
            ok: shard.counter(self.http_local_rate_limit_ok, &[listener]),
            rate_limited: shard.counter(self.http_local_rate_limit_rate_limited, &[listener]),
        }
    }

    /// Compression stats of a listener.
    pub(crate) fn compression(&self, shard: &Shard, listener: &str) -> CompressionStats {
        CompressionStats {
            // In `config::Encoding`'s order.
            compressed: ["zstd", "br", "gzip"]
                .map(|e| shard.counter(self.compression_compressed, &[listener, e])),
            not_compressed: shard.counter(self.compression_not_compressed, &[listener]),
            uncompressed_bytes: shard.counter(self.compression_uncompressed_bytes, &[listener]),
            compressed_bytes: shard.counter(self.compression_compressed_bytes, &[listener]),
        }
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

    pub(crate) fn cluster(&self, shard: &Shard, cluster: &str) -> ClusterStats {
        ClusterStats {
            ssl_handshake: shard.counter(self.upstream_ssl_handshake, &[cluster]),
            ssl_connection_error: shard.counter(self.upstream_ssl_connection_error, &[cluster]),
            cx_total: shard.counter(self.upstream_cx_total, &[cluster]),
            cx_active: shard.gauge(self.upstream_cx_active, &[cluster]),
            cx_connect_fail: shard.counter(self.upstream_cx_connect_fail, &[cluster]),
            cx_max_requests: shard.counter(self.upstream_cx_max_requests, &[cluster]),
            cx_connect_timeout: shard.counter(self.upstream_cx_connect_timeout, &[cluster]),
            cx_connect_time: shard.histogram(self.upstream_cx_connect_time, &[cluster]),
            rq_total: shard.counter(self.upstream_rq_total, &[cluster]),
            rq_active: shard.gauge(self.upstream_rq_active, &[cluster]),
            rq_pending_active: shard.gauge(self.upstream_rq_pending_active, &[cluster]),
            rq_timeout: shard.counter(self.upstream_rq_timeout, &[cluster]),
            rq_class: CLASSES.map(|class| shard.counter(self.upstream_rq_class, &[cluster, class])),
            rq_time: shard.histogram(self.upstream_rq_time, &[cluster]),
            cx_overflow: shard.counter(self.upstream_cx_overflow, &[cluster]),
            rq_pending_overflow: shard.counter(self.upstream_rq_pending_overflow, &[cluster]),
            rq_pending_total: shard.counter(self.upstream_rq_pending_total, &[cluster]),
            rq_pending_timeout: shard.counter(self.upstream_rq_pending_timeout, &[cluster]),
            rq_retry: shard.counter(self.upstream_rq_retry, &[cluster]),
            rq_retry_success: shard.counter(self.upstream_rq_retry_success, &[cluster]),
            rq_retry_overflow: shard.counter(self.upstream_rq_retry_overflow, &[cluster]),
            rq_retry_limit_exceeded: shard
                .counter(self.upstream_rq_retry_limit_exceeded, &[cluster]),
            rq_shadow: shard.counter(self.upstream_rq_shadow, &[cluster]),
            rq_shadow_failed: shard.counter(self.upstream_rq_shadow_failed, &[cluster]),
            outlier_detection_ejections_enforced_total: shard
                .counter(self.outlier_detection_ejections_enforced_total, &[cluster]),
            outlier_detection_ejections_overflow: shard
                .counter(self.outlier_detection_ejections_overflow, &[cluster]),
            health_check_attempt: shard.counter(self.health_check_attempt, &[cluster]),
            health_check_success: shard.counter(self.health_check_success, &[cluster]),
            health_check_failure: shard.counter(self.health_check_failure, &[cluster]),
            update_attempt: shard.counter(self.update_attempt, &[cluster]),
            update_success: shard.counter(self.update_success, &[cluster]),
            update_failure: shard.counter(self.update_failure, &[cluster]),
            rq_pending_time: shard.histogram(self.upstream_rq_pending_time, &[cluster]),
        }
    }
}

impl Catalog {
    /// Gauges of a cluster's shared state (breakers, membership), set by whoever reads it.
    pub(crate) fn cluster_gauges(&self, shard: &Shard, cluster: &str) -> ClusterGauges {
        let g = |family| shard.shared_gauge(family, &[cluster]);
        ClusterGauges {
            cx_open: g(self.circuit_breakers_cx_open),
            rq_pending_open: g(self.circuit_breakers_rq_pending_open),
            rq_open: g(self.circuit_breakers_rq_open),
            rq_retry_open: g(self.circuit_breakers_rq_retry_open),
            remaining_cx: g(self.circuit_breakers_remaining_cx),
            remaining_pending: g(self.circuit_breakers_remaining_pending),
            remaining_rq: g(self.circuit_breakers_remaining_rq),
            remaining_retries: g(self.circuit_breakers_remaining_retries),
            rq_headroom: g(self.circuit_breakers_rq_headroom),
            pending_headroom: g(self.circuit_breakers_pending_headroom),
            membership_healthy: g(self.membership_healthy),
            ejections_active: g(self.outlier_detection_ejections_active),
        }
    }

    pub(crate) fn host(&self, shard: &Shard, cluster: &str, host: &str) -> HostStats {
        HostStats {
            cx_active: shard.gauge(self.host_cx_active, &[cluster, host]),
            rq_active: shard.gauge(self.host_rq_active, &[cluster, host]),
        }
    }
}

impl Catalog {
    pub(crate) fn worker(&self, shard: &Shard) -> WorkerStats {
        WorkerStats {
            cx_active: shard.gauge(self.worker_downstream_cx_active, &[]),
            rq_total: shard.counter(self.worker_downstream_rq_total, &[]),
            config_generation: shard.gauge(self.worker_config_generation, &[]),
            overload_keepalive_disabled: shard
                .counter(self.overload_action_applied, &["disable_keepalive"]),
            overload_cx_refused: shard
                .counter(self.overload_action_applied, &["refuse_connections"]),
            overload_rq_shed: shard.counter(self.overload_action_applied, &["shed_requests"]),
        }
    }
}

/// One worker's totals over all its listeners: the balance between workers (lesson L3).
pub(crate) struct WorkerStats {
    pub(crate) cx_active: stats::Gauge,
    pub(crate) rq_total: stats::Counter,
    /// The config generation the worker applied last.
    pub(crate) config_generation: stats::Gauge,
    pub(crate) overload_keepalive_disabled: stats::Counter,
    pub(crate) overload_cx_refused: stats::Counter,
    pub(crate) overload_rq_shed: stats::Counter,
}

/// A cluster's process-wide gauges.
pub(crate) struct ClusterGauges {
    pub(crate) cx_open: stats::SharedGauge,
    pub(crate) rq_pending_open: stats::SharedGauge,
    pub(crate) rq_open: stats::SharedGauge,
    pub(crate) rq_retry_open: stats::SharedGauge,
    pub(crate) remaining_cx: stats::SharedGauge,
    pub(crate) remaining_pending: stats::SharedGauge,
    pub(crate) remaining_rq: stats::SharedGauge,
    pub(crate) remaining_retries: stats::SharedGauge,
    pub(crate) rq_headroom: stats::SharedGauge,
    pub(crate) pending_headroom: stats::SharedGauge,
    pub(crate) membership_healthy: stats::SharedGauge,
    pub(crate) ejections_active: stats::SharedGauge,
}

/// One worker's handles for one upstream host.
pub(crate) struct HostStats {
    pub(crate) cx_active: stats::Gauge,
    pub(crate) rq_active: stats::Gauge,
}

/// One worker's handles for one listener.
pub(crate) struct ListenerStats {
    pub(crate) cx_total: stats::Counter,
    pub(crate) cx_active: stats::Gauge,
    pub(crate) cx_destroy: stats::Counter,
    pub(crate) cx_overflow: stats::Counter,
    pub(crate) cx_idle_timeout: stats::Counter,
    pub(crate) cx_max_requests: stats::Counter,
    pub(crate) cx_max_duration: stats::Counter,
    pub(crate) cx_h2_flood: stats::Counter,
    pub(crate) cx_h2_continuation_flood: stats::Counter,
    pub(crate) cx_h2_control_flood: stats::Counter,
    pub(crate) cx_headers_timeout: stats::Counter,
    pub(crate) cx_proxy_proto_error: stats::Counter,
    pub(crate) cx_parked: stats::Gauge,
    pub(crate) rq_total: stats::Counter,
    pub(crate) rq_active: stats::Gauge,
    rq_class: [stats::Counter; 5],
    pub(crate) rq_time: stats::Histogram,
    pub(crate) upgrades: stats::Counter,
    pub(crate) upgrades_active: stats::Gauge,
    pub(crate) upgrades_failed: stats::Counter,
}

impl ListenerStats {
    pub(crate) fn response(&self, status: StatusCode) {
        self.rq_class[class_index(status)].inc();
    }
}

/// One worker's handles for one listener's external authorization.
pub(crate) struct AuthzStats {
    pub(crate) ok: stats::Counter,
    pub(crate) denied: stats::Counter,
    pub(crate) error: stats::Counter,
    pub(crate) timeout: stats::Counter,
    pub(crate) failure_mode_allowed: stats::Counter,
    pub(crate) time: stats::Histogram,
}

/// One worker's handles for one listener's local rate limit.
pub(crate) struct RateLimitStats {
    pub(crate) ok: stats::Counter,
    pub(crate) rate_limited: stats::Counter,
}

/// One worker's handles for one listener's compression.
pub(crate) struct CompressionStats {
    /// Indexed by `config::Encoding as usize`.
    pub(crate) compressed: [stats::Counter; 3],
    pub(crate) not_compressed: stats::Counter,
    pub(crate) uncompressed_bytes: stats::Counter,
    pub(crate) compressed_bytes: stats::Counter,
}

const TLS_VERSIONS: [&str; 3] = ["TLSv1_2", "TLSv1_3", "other"];
const ALPN_LABELS: [&str; 4] = ["h2", "http/1.1", "none", "other"];

/// One worker's handles for one TLS listener.
pub(crate) struct TlsStats {
    pub(crate) handshake: stats::Counter,
    pub(crate) connection_error: stats::Counter,
    pub(crate) handshake_timeout: stats::Counter,
    pub(crate) no_certificate: stats::Counter,
    pub(crate) session_reused: stats::Counter,
    versions: [stats::Counter; 3],
    alpn: [stats::Counter; 4],
    pub(crate) handshake_time: stats::Histogram,
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

/// One worker's handles for one cluster.
pub(crate) struct ClusterStats {
    pub(crate) ssl_handshake: stats::Counter,
    pub(crate) ssl_connection_error: stats::Counter,
    pub(crate) cx_total: stats::Counter,
    pub(crate) cx_active: stats::Gauge,
    pub(crate) cx_connect_fail: stats::Counter,
    pub(crate) cx_max_requests: stats::Counter,
    pub(crate) cx_connect_timeout: stats::Counter,
    pub(crate) cx_connect_time: stats::Histogram,
    pub(crate) rq_total: stats::Counter,
    pub(crate) rq_active: stats::Gauge,
    pub(crate) rq_pending_active: stats::Gauge,
    pub(crate) rq_timeout: stats::Counter,
    rq_class: [stats::Counter; 5],
    pub(crate) rq_time: stats::Histogram,
    pub(crate) cx_overflow: stats::Counter,
    pub(crate) rq_pending_overflow: stats::Counter,
    pub(crate) rq_pending_total: stats::Counter,
    pub(crate) rq_pending_timeout: stats::Counter,
    pub(crate) rq_retry: stats::Counter,
    pub(crate) rq_retry_success: stats::Counter,
    pub(crate) rq_retry_overflow: stats::Counter,
    pub(crate) rq_retry_limit_exceeded: stats::Counter,
    pub(crate) rq_shadow: stats::Counter,
    pub(crate) rq_shadow_failed: stats::Counter,
    pub(crate) outlier_detection_ejections_enforced_total: stats::Counter,
    pub(crate) outlier_detection_ejections_overflow: stats::Counter,
    pub(crate) health_check_attempt: stats::Counter,
    pub(crate) health_check_success: stats::Counter,
    pub(crate) health_check_failure: stats::Counter,
    pub(crate) update_attempt: stats::Counter,
    pub(crate) update_success: stats::Counter,
    pub(crate) update_failure: stats::Counter,
    pub(crate) rq_pending_time: stats::Histogram,
}

impl ClusterStats {
    pub(crate) fn response(&self, status: StatusCode) {
        self.rq_class[class_index(status)].inc();
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
