//! External authorization settings of listeners and routes, validated.

use std::time::Duration;

use http::{HeaderName, StatusCode};

pub use authz_client::Endpoint as AuthzEndpoint;

/// How long an authorization check may take, unless configured (Envoy's default).
pub const DEFAULT_AUTHZ_TIMEOUT: Duration = Duration::from_millis(200);

/// A listener's external authorization: every request is checked before it is routed on,
/// unless its route turns the check off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtAuthzConfig {
    pub service: AuthzService,
    /// A check with no answer within this is an error.
    pub timeout: Duration,
    /// On an error or timeout, let the request through (marked with
    /// `x-legate-auth-failure-mode-allowed: true`) instead of answering `status_on_error`.
    pub failure_mode_allow: bool,
    pub status_on_error: StatusCode,
    /// Send the request body (or its start) with the check.
    pub with_request_body: Option<AuthzBodyConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthzService {
    /// `envoy.service.auth.v3.Authorization/Check`.
    Grpc { endpoint: AuthzEndpoint },
    /// Plain HTTP: a 2xx allows.
    Http {
        endpoint: AuthzEndpoint,
        path_prefix: String,
        allowed_headers: Vec<HeaderName>,
        allowed_upstream_headers: Vec<HeaderName>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthzBodyConfig {
    /// Bytes of body sent at most; at most the listener's buffer limit.
    pub max_request_bytes: u32,
    /// A longer body: send its first `max_request_bytes` (true) or answer 413 (false).
    pub allow_partial_message: bool,
}

/// A route's view of its listener's check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteAuthz {
    /// No check for this route.
    pub disabled: bool,
    /// Sent with every check of this route (gRPC mode).
    pub context_extensions: Vec<(String, String)>,
}
