//! Settings of the `csrf` filter (Envoy's): a state-changing request (POST, PUT, DELETE,
//! PATCH) whose origin (`origin`, else `referer`) is not the host it asks for, nor one of
//! `additional_origins`, is refused 403.

pub(crate) mod xds;

use serde::{Deserialize, Serialize};

use crate::matchers::{share, string_patterns};
use crate::serialize as ser;
use crate::*;

/// Cross-site request forgery checks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CsrfConfig {
    /// The share of requests checked and refused on a mismatch.
    pub enabled: Share,
    /// The share of the others checked and counted only.
    pub shadow: Share,
    /// Origins taken besides the request's own host (`host[:port]`).
    #[serde(serialize_with = "ser::string_matches")]
    pub additional_origins: Vec<StringMatch>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCsrf {
    pub enabled: Option<serde_yaml::Value>,
    pub shadow: Option<serde_yaml::Value>,
    #[serde(default)]
    pub additional_origins: Vec<RawStringMatch>,
}

fn csrf(raw: RawCsrf, path: &str, _: bool) -> Result<CsrfConfig, ConfigError> {
    Ok(CsrfConfig {
        enabled: share(raw.enabled.as_ref(), Share::ALL, &format!("{path}.enabled"))?,
        shadow: share(raw.shadow.as_ref(), Share::NONE, &format!("{path}.shadow"))?,
        additional_origins: string_patterns(
            raw.additional_origins,
            &format!("{path}.additional_origins"),
        )?,
    })
}

per_route_settings!(CsrfConfig, RawCsrf, csrf);
