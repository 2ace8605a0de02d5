//! The admin server: operators' endpoints on their own listener and thread, never on a
//! worker, so a busy data plane cannot starve them and they cannot slow it down.

mod access;
mod certs;
mod config_dump;
mod stats_json;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use stats::{SharedGauge, Snapshot};

use crate::catalog::ProxyStats;
use crate::live::{Generation, LiveConfig};

/// The endpoints, listed in every 404 so an operator can find the right one.
const ENDPOINTS: &str = "\
GET  /                    a dashboard: workers, latency, clusters, config (HTML)
GET  /ready               200 while serving, 503 when draining or failed by /healthcheck/fail
GET  /stats               every stat as text; ?filter=REGEX keeps the lines whose name matches;
                          ?format=json: as JSON, histograms with their buckets (filter= too)
GET  /stats/prometheus    every stat in the Prometheus text format
GET  /workers             per-worker open connections and requests, as JSON
GET  /clusters            per-host connections and requests in flight, as JSON
GET  /config_dump         the effective config as JSON, defaults filled in
GET  /certs               each TLS listener's certificates and days until they expire
POST /healthcheck/fail    make /ready answer 503 (drain this proxy from its load balancer)
POST /healthcheck/ok      undo /healthcheck/fail
POST /reload              read the config file again and put it in force (as SIGHUP)
POST /reload_certs        read TLS certificates, keys and CAs again
POST /reopen_logs         open the access log files again by their paths (as SIGUSR1)
";

/// The dashboard at `/`: one page, no build step, polling the JSON endpoints.
const DASHBOARD: &str = include_str!("dashboard.html");

/// What the admin endpoints read.
pub(crate) struct AdminState {
    /// The config in force, and reloads.
    live: Arc<LiveConfig>,
    /// What the overload manager has in force, for `/ready`.
    overload: Arc<crate::overload::Overload>,
    pub(crate) workers: usize,
    stats: Arc<ProxyStats>,
    server: ServerGauges,
    started: Instant,
    /// Failed by `POST /healthcheck/fail`, or draining; shared with the workers.
    pub(crate) health: Arc<crate::context::ServerHealth>,
}

impl AdminState {
    pub(crate) fn new(
        live: Arc<LiveConfig>,
        overload: Arc<crate::overload::Overload>,
        workers: usize,
        stats: Arc<ProxyStats>,
    ) -> Self {
        let shard = &stats.process;
        let catalog = &stats.catalog;
        let server = ServerGauges {
            concurrency: shard.shared_gauge(catalog.server_concurrency, &[]),
            uptime: shard.shared_gauge(catalog.server_uptime, &[]),
            memory_resident: shard.shared_gauge(catalog.server_memory_resident, &[]),
            live: shard.shared_gauge(catalog.server_live, &[]),
            days_until_first_cert_expiring: shard
                .shared_gauge(catalog.server_days_until_first_cert_expiring, &[]),
        };
        server.concurrency.set(workers as i64);
        server.live.set(1);
        Self {
            live,
            overload,
            workers,
            stats,
            server,
            started: Instant::now(),
            health: Arc::default(),
        }
    }
}

/// `server_days_until_first_cert_expiring` with no certificate to expire: never (an alert on
/// few days left stays quiet; -1 would read as just expired).
const NO_CERTIFICATE_DAYS: i64 = u32::MAX as i64;

/// Server-wide gauges, refreshed when someone reads the stats.
struct ServerGauges {
    concurrency: SharedGauge,
    uptime: SharedGauge,
    memory_resident: SharedGauge,
    live: SharedGauge,
    /// [`NO_CERTIFICATE_DAYS`] without TLS listeners.
    days_until_first_cert_expiring: SharedGauge,
}

impl AdminState {
    /// Refreshes the server gauges and merges every worker's shard.
    fn snapshot(&self) -> Snapshot {
        self.server
            .uptime
            .set(self.started.elapsed().as_secs() as i64);
        if let Some(rss) = crate::overload::resident_bytes() {
            self.server.memory_resident.set(rss as i64);
        }
        let live = !self.health.draining();
        self.server.live.set(i64::from(live));
        let generation = self.live.current();
        for cluster in generation.clusters.iter() {
            cluster.refresh_gauges();
        }
        let days = certs::days_until_first_expiring(&generation.tls, certs::now_unix());
        self.server
            .days_until_first_cert_expiring
            .set(days.unwrap_or(NO_CERTIFICATE_DAYS));
        self.stats.registry.snapshot()
    }
}

/// `/ready` while serving: `LIVE`, and what the overload manager has in force. A proxy that
/// refuses connections or sheds requests answers 503 (`OVERLOADED`), so the balancer in
/// front sends its traffic elsewhere until it recovers.
fn ready_under_overload(overload: &crate::overload::Overload) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let (status, word) = if overload.level() >= crate::overload::Level::RefuseConnections {
        (StatusCode::SERVICE_UNAVAILABLE, "OVERLOADED")
    } else {
        (StatusCode::OK, "LIVE")
    };
    match overload.describe() {
        Some(detail) => reply(status, TEXT, format!("{word}\n{detail}\n")),
        None => reply(status, TEXT, format!("{word}\n")),
    }
}

/// Per-worker totals: which worker holds how many connections, and has served how much.
fn workers_json(snapshot: &Snapshot) -> serde_json::Value {
    let mut workers: std::collections::BTreeMap<usize, (i64, u64)> = Default::default();
    let worker_of = |shard| {
        snapshot
            .shard_labels(shard)
            .find(|(name, _)| *name == "worker")
            .and_then(|(_, value)| value.parse::<usize>().ok())
    };
    if let Some(family) = snapshot.family("downstream_cx_active") {
        for series in family.series() {
            for (shard, value) in series.per_shard() {
                if let (Some(w), Some(v)) = (worker_of(*shard), value.as_gauge()) {
                    workers.entry(w).or_default().0 += v;
                }
            }
        }
    }
    if let Some(family) = snapshot.family("downstream_rq_total") {
        for series in family.series() {
            for (shard, value) in series.per_shard() {
                if let (Some(w), Some(v)) = (worker_of(*shard), value.as_counter()) {
                    workers.entry(w).or_default().1 += v;
                }
            }
        }
    }
    let list: Vec<serde_json::Value> = workers
        .into_iter()
        .map(|(worker, (cx, rq))| {
            serde_json::json!({ "worker": worker, "downstream_cx_active": cx, "downstream_rq_total": rq })
        })
        .collect();
    serde_json::json!({ "workers": list })
}

/// Each cluster's hosts: weight, health, priority, locality and requests in flight from the
/// shared host set, open connections summed over the workers.
fn clusters_json(generation: &Generation, snapshot: &Snapshot) -> serde_json::Value {
    let clusters: Vec<serde_json::Value> = generation
        .config
        .clusters
        .iter()
        .zip(generation.clusters.iter())
        .map(|(c, shared)| {
            let set = shared.host_set.snapshot();
            let hosts: Vec<serde_json::Value> = set
                .hosts()
                .zip(set.specs())
                .map(|(host, spec)| {
                    let (ejected, ejections, passing) = shared
                        .health
                        .describe(host.addr())
                        .unwrap_or((false, 0, true));
                    let addr = host.addr().to_string();
                    let labels = [c.name.as_str(), addr.as_str()];
                    serde_json::json!({
                        "address": addr,
                        "weight": host.weight(),
                        "priority": spec.priority,
                        "locality": crate::cluster::locality::name(spec.locality),
                        "health": format!("{:?}", host.health()).to_lowercase(),
                        "passing_health_checks": passing,
                        "ejected": ejected,
                        "ejections": ejections,
                        "rq_active": host.active_requests(),
                        "cx_active": snapshot.gauge("host_cx_active", &labels).unwrap_or(0),
                    })
                })
                .collect();
            let b = &shared.breakers;
            serde_json::json!({
                "name": c.name,
                "lb_policy": c.lb_policy.name(),
                "locality_weighted": c.lb_settings.locality_weighted,
                "circuit_breakers": {
                    "remaining_cx": b.connections.remaining(),
                    "remaining_pending": b.pending.remaining(),
                    "remaining_rq": b.requests.remaining(),
                    "remaining_retries": b.retry_limit().saturating_sub(b.retries.active()),
                },
                "hosts": hosts,
            })
        })
        .collect();
    serde_json::json!({ "clusters": clusters })
}

/// `%XX` escapes and `+` in a query value.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = config::path::escaped_byte(bytes, i);
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json(value: &serde_json::Value) -> Response<Full<Bytes>> {
    match serde_json::to_vec_pretty(value) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(err) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("cannot render JSON: {err}\n"),
        ),
    }
}

/// The admin server's thread.
pub(crate) struct AdminServer {
    pub(crate) address: SocketAddr,
    stop: watch::Sender<bool>,
    thread: JoinHandle<()>,
}

impl AdminServer {
    /// Binds `address` and serves on a new thread.
    pub(crate) fn start(address: SocketAddr, state: Arc<AdminState>) -> io::Result<AdminServer> {
        let listener = std::net::TcpListener::bind(address)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let runtime = crate::runtime::current_thread_runtime()?;
        let thread = std::thread::Builder::new()
            .name("legate-admin".into())
            .spawn(move || {
                runtime.block_on(serve(listener, state, stopped));
            })?;
        Ok(AdminServer {
            address,
            stop,
            thread,
        })
    }

    pub(crate) fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AdminState>,
    mut stopped: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(err) => {
            tracing::error!(error = %err, "cannot register the admin socket");
            return;
        }
    };
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    tracing::warn!(error = %err, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stopped.wait_for(|s| *s) => return,
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let state = Arc::clone(&state);
                async move {
                    let allowed = match &state.live.current().config.admin {
                        Some(admin) => access::check(
                            admin,
                            peer.ip(),
                            req.method(),
                            req.uri().path(),
                            req.headers(),
                        ),
                        None => Ok(()),
                    };
                    let response = match (allowed, req.method(), req.uri().path()) {
                        (Err((status, why)), _, path) => {
                            tracing::warn!(%peer, path, status = status.as_u16(), "admin request refused");
                            reply(status, "text/plain; charset=utf-8", why)
                        }
                        (Ok(()), &Method::POST, "/reload") => reload(&state.live).await,
                        (Ok(()), _, _) => handle(req, &state),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn handle(req: Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/ready") => {
            if state.health.draining() {
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "DRAINING\n")
            } else if state.health.failed() {
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "FAILED\n")
            } else {
                ready_under_overload(&state.overload)
            }
        }
        (&Method::GET, "/config_dump") => {
            match config_dump::live_config_dump(&state.live, state.workers) {
                Ok(dump) => json(&dump),
                Err(error) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, error + "\n"),
            }
        }
        (&Method::GET, "/") => reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            Bytes::from_static(DASHBOARD.as_bytes()),
        ),
        (&Method::GET, "/stats") => {
            let query = req.uri().query().unwrap_or("");
            let as_json = query.split('&').any(|pair| pair == "format=json");
            let filter = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("filter="))
                .map(|pattern| regex::Regex::new(&percent_decode(pattern)))
                .transpose();
            match filter {
                Err(err) => reply(
                    StatusCode::BAD_REQUEST,
                    TEXT,
                    format!("invalid filter regex: {err}\n"),
                ),
                Ok(filter) if as_json => {
                    json(&stats_json::stats_json(&state.snapshot(), filter.as_ref()))
                }
                Ok(None) => reply(StatusCode::OK, TEXT, state.snapshot().render_text(None)),
                // A line is `key: value`; the filter looks at the key, as Envoy's does.
                Ok(Some(re)) => {
                    let text = state.snapshot().render_text(None);
                    let mut kept = String::new();
                    for line in text.lines() {
                        if re.is_match(line.split(": ").next().unwrap_or(line)) {
                            kept.push_str(line);
                            kept.push('\n');
                        }
                    }
                    reply(StatusCode::OK, TEXT, kept)
                }
            }
        }
        (&Method::GET, "/stats/prometheus") => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state
                .snapshot()
                .render_prometheus_with(&state.live.current().config.stats.prometheus()),
        ),
        (&Method::GET, "/certs") => json(&certs::certs_json(
            &state.live.current().tls,
            certs::now_unix(),
        )),
        (&Method::GET, "/workers") => json(&workers_json(&state.snapshot())),
        (&Method::GET, "/clusters") => {
            json(&clusters_json(&state.live.current(), &state.snapshot()))
        }
        (&Method::POST, "/healthcheck/fail") => {
            state.health.set_failed(true);
            reply(StatusCode::OK, TEXT, "OK\n")
        }
        (&Method::POST, "/healthcheck/ok") => {
            state.health.set_failed(false);
            reply(StatusCode::OK, TEXT, "OK\n")
        }
        (&Method::POST, "/reload_certs") => reload_certs(&state.live.current().tls),
        (&Method::POST, "/reopen_logs") => reopen_logs(),
        (
            _,
            "/healthcheck/fail" | "/healthcheck/ok" | "/reload_certs" | "/reload" | "/reopen_logs",
        ) => reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "use POST\n"),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            format!("unknown admin endpoint; these exist:\n{ENDPOINTS}"),
        ),
    }
}

/// `POST /reload`: 200 once every worker serves with the file's config; 400 with the reason
/// (the key path for an invalid config) when nothing changed.
async fn reload(live: &Arc<LiveConfig>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match live.reload().await {
        Ok(report) => reply(StatusCode::OK, TEXT, format!("reloaded: {report}\n")),
        Err(error) => reply(
            StatusCode::BAD_REQUEST,
            TEXT,
            format!("reload failed, the config in force stays: {error}\n"),
        ),
    }
}

/// `POST /reopen_logs`: 200 when every access log file was opened again by its path, 500
/// naming those that could not be (they keep being written where they were).
fn reopen_logs() -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let outcomes = crate::access_log::reopen_and_report();
    let mut body = String::new();
    let mut failed = false;
    for (path, outcome) in &outcomes {
        match outcome {
            Ok(()) => body.push_str(&format!("{}: reopened\n", path.display())),
            Err(error) => {
                failed = true;
                body.push_str(&format!(
                    "{}: kept the file it had: {error}\n",
                    path.display()
                ));
            }
        }
    }
    if outcomes.is_empty() {
        body.push_str("no access log files\n");
    }
    let status = if failed {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    reply(status, TEXT, body)
}

/// `POST /reload_certs`: 200 when every TLS listener took its new files, 500 naming those that
/// kept their previous certificates and why.
fn reload_certs(tls: &crate::tls::TlsListeners) -> Response<Full<Bytes>> {
    let outcomes = tls.reload_all();
    let mut body = String::new();
    let mut failed = false;
    for (listener, outcome) in &outcomes {
        match outcome {
            Ok(()) => body.push_str(&format!("{listener}: reloaded\n")),
            Err(error) => {
                failed = true;
                body.push_str(&format!(
                    "{listener}: kept the previous certificates: {error}\n"
                ));
            }
        }
    }
    if outcomes.is_empty() {
        body.push_str("no TLS listeners\n");
    }
    let status = if failed {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    reply(status, "text/plain; charset=utf-8", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(percent_decode("upstream_rq_.%2A"), "upstream_rq_.*");
        assert_eq!(percent_decode("a+b%"), "a b%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
