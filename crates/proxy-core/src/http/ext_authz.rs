//! External authorization (Envoy's `ext_authz` filter): before a request is routed on, the
//! listener's authorization service decides whether it goes, with which header changes, or
//! what the client gets instead. One client per worker and listener, so one connection to
//! the service per worker.

use authz_client::{Allowed, AuthzClient, AuthzError, CheckInput, Decision, HttpOptions};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tokio::time::Instant;

use super::{ResponseBody, local_reply};
use crate::catalog::AuthzStats;
use crate::config::{AuthzService, ExtAuthzConfig, RouteAuthz};
use crate::context::{ConnCtx, RequestBody};
use crate::error::{ProxyError, ResponseFlag};
use crate::throttle::LogThrottle;

pub(crate) static X_LEGATE_AUTH_FAILURE_MODE_ALLOWED: HeaderName =
    HeaderName::from_static("x-legate-auth-failure-mode-allowed");

/// A worker's authorization client for one listener.
pub(crate) struct ExtAuthzFilter {
    client: AuthzClient,
    config: ExtAuthzConfig,
    stats: AuthzStats,
    /// Failed checks, logged at most once a second: a dead service must not flood the log
    /// with a line per request.
    errors: LogThrottle,
}

/// What the check decided.
pub(crate) enum Verdict {
    /// Go on; the response gets these headers, if any.
    Proceed(Option<Allowed>),
    /// Answer the client with this (denied, or refused on an error). Boxed: the rare case.
    Respond(Box<Response<ResponseBody>>, ResponseFlag),
}

impl ExtAuthzFilter {
    pub(crate) fn new(config: &ExtAuthzConfig, stats: AuthzStats) -> Self {
        let client = match &config.service {
            AuthzService::Grpc { endpoint } => AuthzClient::grpc(endpoint.clone(), config.timeout),
            AuthzService::Http {
                endpoint,
                path_prefix,
                allowed_headers,
                allowed_upstream_headers,
            } => AuthzClient::http(
                endpoint.clone(),
                config.timeout,
                HttpOptions {
                    path_prefix: path_prefix.clone(),
                    allowed_headers: allowed_headers.clone(),
                    allowed_upstream_headers: allowed_upstream_headers.clone(),
                },
            ),
        };
        Self {
            client,
            config: config.clone(),
            stats,
            errors: LogThrottle::default(),
        }
    }

    /// Asks the service about `req`, applying an allow's request header changes to it.
    pub(crate) async fn check(
        &self,
        req: &mut Request<RequestBody>,
        host: &str,
        request_id: &str,
        route: &RouteAuthz,
        conn: &ConnCtx,
    ) -> Result<Verdict, ProxyError> {
        let body = match self.config.with_request_body {
            None => None,
            Some(limits) => {
                let (start, whole) = req
                    .body_mut()
                    .read_ahead(limits.max_request_bytes as usize)
                    .await
                    .map_err(|source| ProxyError::ClientAborted { source })?;
                if !whole && !limits.allow_partial_message {
                    return Ok(Verdict::Respond(
                        Box::new(local_reply::text(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            Bytes::from_static(b"request body too large for authorization\n"),
                        )),
                        ResponseFlag::UnauthorizedExternalService,
                    ));
                }
                Some(start)
            }
        };
        let input = CheckInput {
            method: req.method(),
            path: req.uri().path_and_query().map_or("/", |p| p.as_str()),
            host,
            scheme: if conn.listener.tls { "https" } else { "http" },
            version: req.version(),
            headers: req.headers(),
            request_id,
            source: conn.peer,
            destination: conn.local,
            context_extensions: &route.context_extensions,
            body: body.as_ref(),
        };
        let started = Instant::now();
        let decision = self.client.check(&input).await;
        self.stats.time.record_duration(started.elapsed());
        match decision {
            Ok(Decision::Allow(allowed)) => {
                self.stats.ok.inc();
                allowed.apply_to_request(req.headers_mut());
                Ok(Verdict::Proceed(
                    (!allowed.response_headers.is_empty()).then_some(allowed),
                ))
            }
            Ok(Decision::Deny(denied)) => {
                self.stats.denied.inc();
                let mut response = local_reply::text(denied.status, denied.body);
                for header in &denied.headers {
                    header.apply(response.headers_mut());
                }
                Ok(Verdict::Respond(
                    Box::new(response),
                    ResponseFlag::UnauthorizedExternalService,
                ))
            }
            Err(error) => {
                self.stats.error.inc();
                if error.is_timeout() {
                    self.stats.timeout.inc();
                }
                self.log_error(&error, conn);
                if self.config.failure_mode_allow {
                    self.stats.failure_mode_allowed.inc();
                    req.headers_mut().insert(
                        X_LEGATE_AUTH_FAILURE_MODE_ALLOWED.clone(),
                        HeaderValue::from_static("true"),
                    );
                    return Ok(Verdict::Proceed(None));
                }
                Ok(Verdict::Respond(
                    Box::new(local_reply::text(self.config.status_on_error, Bytes::new())),
                    ResponseFlag::UnauthorizedExternalService,
                ))
            }
        }
    }

    /// One warning a second at most, with the count since the last.
    fn log_error(&self, error: &AuthzError, conn: &ConnCtx) {
        if let Some(failed) = self.errors.hit() {
            tracing::warn!(
                listener = %conn.listener.name,
                failed,
                failure_mode_allow = self.config.failure_mode_allow,
                %error,
                "authorization check failed"
            );
        }
    }
}
