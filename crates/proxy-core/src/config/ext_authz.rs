//! External authorization settings of listeners and routes, validated.

use std::time::Duration;

use http::{HeaderName, StatusCode};
use serde::{Serialize, Serializer};

use super::serialize as ser;

use super::ServiceEndpoint;

/// How long an authorization check may take, unless configured (Envoy's default).
pub const DEFAULT_AUTHZ_TIMEOUT: Duration = Duration::from_millis(200);

/// A listener's external authorization: every request is checked before it is routed on,
/// unless its route turns the check off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExtAuthzConfig {
    #[serde(flatten)]
    pub service: AuthzService,
    /// A check with no answer within this is an error.
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// On an error or timeout, let the request through (marked with
    /// `x-legate-auth-failure-mode-allowed: true`) instead of answering `status_on_error`.
    pub failure_mode_allow: bool,
    #[serde(serialize_with = "ser::status")]
    pub status_on_error: StatusCode,
    /// Send the request body (or its start) with the check.
    pub with_request_body: Option<AuthzBodyConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthzService {
    /// `envoy.service.auth.v3.Authorization/Check`.
    Grpc {
        #[serde(rename = "address", serialize_with = "ser::display")]
        endpoint: ServiceEndpoint,
    },
    /// Plain HTTP: a 2xx allows.
    Http {
        #[serde(rename = "address", serialize_with = "ser::display")]
        endpoint: ServiceEndpoint,
        path_prefix: String,
        #[serde(serialize_with = "ser::header_names")]
        allowed_headers: Vec<HeaderName>,
        #[serde(serialize_with = "ser::header_names")]
        allowed_upstream_headers: Vec<HeaderName>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

impl RouteAuthz {
    pub(crate) fn is_default(&self) -> bool {
        *self == RouteAuthz::default()
    }
}

impl Serialize for RouteAuthz {
    /// As written: `disabled`, or the context extensions.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.disabled {
            return s.serialize_str("disabled");
        }
        let mut map = s.serialize_map(Some(1))?;
        let extensions: std::collections::BTreeMap<_, _> =
            self.context_extensions.iter().cloned().collect();
        map.serialize_entry("context_extensions", &extensions)?;
        map.end()
    }
}
