//! Settings of the `cors` filter, validated.

use std::time::Duration;

use http::{HeaderName, Method};
use serde::{Serialize, Serializer};

use super::serialize as ser;

/// Cross-origin resource sharing (the Fetch standard's CORS protocol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorsConfig {
    /// Origins allowed to read responses.
    pub allow_origins: Vec<OriginMatch>,
    /// Methods a preflight allows; empty: the one asked for.
    #[serde(serialize_with = "methods")]
    pub allow_methods: Vec<Method>,
    /// Request headers a preflight allows; empty: those asked for.
    #[serde(serialize_with = "ser::header_names")]
    pub allow_headers: Vec<HeaderName>,
    /// Response headers scripts may read.
    #[serde(serialize_with = "ser::header_names")]
    pub expose_headers: Vec<HeaderName>,
    /// How long browsers may cache a preflight answer.
    #[serde(serialize_with = "ser::opt_duration")]
    pub max_age: Option<Duration>,
    /// Requests with credentials (cookies) may be read.
    pub allow_credentials: bool,
}

/// An origin as written: `https://app.example.com`, `https://*.example.com` or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginMatch {
    Any,
    /// Lowercase `scheme://host[:port]`.
    Exact(String),
    /// `https://*.example.com` as (`https://`, `.example.com`): any subdomain.
    Subdomains {
        scheme: String,
        suffix: String,
    },
}

impl Serialize for OriginMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OriginMatch::Any => s.serialize_str("*"),
            OriginMatch::Exact(origin) => s.serialize_str(origin),
            OriginMatch::Subdomains { scheme, suffix } => {
                s.collect_str(&format_args!("{scheme}*{suffix}"))
            }
        }
    }
}

fn methods<S: Serializer>(methods: &[Method], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(methods.iter().map(Method::as_str))
}
