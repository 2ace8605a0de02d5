//! Settings of the `api_key_auth` filter (Envoy's): a request carries an API key (in a header,
//! a query parameter or a cookie) that one of the listed clients has, else it is refused 401.
//! A route (or virtual host) may give its own keys, key sources and forwarding, and name the
//! clients it allows (others: 403).

pub(crate) mod xds;

use std::collections::BTreeMap;

use http::HeaderName;
use serde::{Deserialize, Serialize, Serializer};

use crate::serialize as ser;
use crate::*;

/// The filter's settings on a listener, or what a route or virtual host gives instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ApiKeyAuthConfig {
    /// Each key's client, by key; shown by client only. `None`: not given here.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "clients")]
    pub credentials: Option<BTreeMap<String, String>>,
    /// Where the key is looked for, in order; the first found is the request's. Empty: not
    /// given here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub key_sources: Vec<KeySource>,
    /// What goes upstream of the check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<KeyForwarding>,
    /// A route's: the clients it lets on (empty: every client with a key).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_clients: Vec<String>,
}

fn clients<S: Serializer>(keys: &Option<BTreeMap<String, String>>, s: S) -> Result<S::Ok, S::Error> {
    let names: std::collections::BTreeSet<&String> = keys.iter().flat_map(|k| k.values()).collect();
    s.collect_seq(names)
}

/// Where a key is looked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// A header's value (after `Bearer `, if it starts so).
    Header(#[serde(serialize_with = "ser::header_name")] HeaderName),
    /// A query parameter, percent-decoded.
    Query(String),
    Cookie(String),
}

/// What goes upstream after a key is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyForwarding {
    /// The client's name is set in this header.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "ser::opt_header_name")]
    pub header: Option<HeaderName>,
    /// The key is removed from every source (header, parameter, cookie).
    pub hide_credentials: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKeyAuth {
    #[serde(default)]
    pub credentials: Vec<RawCredential>,
    #[serde(default)]
    pub key_sources: Vec<RawKeySource>,
    pub forwarding: Option<RawKeyForwarding>,
    #[serde(default)]
    pub allowed_clients: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredential {
    pub key: String,
    pub client: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeySource {
    pub header: Option<String>,
    pub query: Option<String>,
    pub cookie: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeyForwarding {
    pub header: Option<String>,
    pub hide_credentials: Option<bool>,
}

fn api_key_auth(raw: RawApiKeyAuth, path: &str, on_route: bool) -> Result<ApiKeyAuthConfig, ConfigError> {
    if !on_route && !raw.allowed_clients.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.allowed_clients"),
            "a route's or virtual host's setting",
        ));
    }
    let mut credentials = None;
    if !raw.credentials.is_empty() {
        let mut keys = BTreeMap::new();
        for (i, credential) in raw.credentials.into_iter().enumerate() {
            let at = format!("{path}.credentials[{i}]");
            if credential.key.is_empty() || credential.client.is_empty() {
                return Err(ConfigError::invalid(at, "expected a key and a client"));
            }
            if keys.insert(credential.key, credential.client).is_some() {
                return Err(ConfigError::invalid(at, "a key given twice"));
            }
        }
        credentials = Some(keys);
    }
    let key_sources = (raw.key_sources.into_iter().enumerate())
        .map(|(i, source)| {
            let at = format!("{path}.key_sources[{i}]");
            match (source.header, source.query, source.cookie) {
                (Some(name), None, None) => HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                    .map(KeySource::Header)
                    .map_err(|_| ConfigError::invalid(at, format!("`{name}` is not a header name"))),
                (None, Some(name), None) if !name.is_empty() => Ok(KeySource::Query(name)),
                (None, None, Some(name)) if !name.is_empty() => Ok(KeySource::Cookie(name)),
                _ => Err(ConfigError::invalid(at, "expected one of `header`, `query` or `cookie`")),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let forwarding = match raw.forwarding {
        None => None,
        Some(forwarding) => {
            let header = match forwarding.header.filter(|h| !h.is_empty()) {
                None => None,
                Some(name) => {
                    let at = format!("{path}.forwarding.header");
                    let name = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                        .map_err(|_| ConfigError::invalid(&at, format!("`{name}` is not a header name")))?;
                    if crate::values::framing_or_host(&name) {
                        return Err(ConfigError::invalid(at, "frames or routes the request"));
                    }
                    Some(name)
                }
            };
            Some(KeyForwarding {
                header,
                hide_credentials: forwarding.hide_credentials.unwrap_or(false),
            })
        }
    };
    Ok(ApiKeyAuthConfig {
        credentials,
        key_sources,
        forwarding,
        allowed_clients: raw.allowed_clients,
    })
}

per_route_settings!(ApiKeyAuthConfig, RawApiKeyAuth, api_key_auth);

impl ApiKeyAuthConfig {
    /// A route's or virtual host's settings over the listener's: its credentials, sources
    /// and forwarding where it gives them, and its allowed clients.
    pub fn over(&self, listener: &ApiKeyAuthConfig) -> ApiKeyAuthConfig {
        ApiKeyAuthConfig {
            credentials: self.credentials.clone().or_else(|| listener.credentials.clone()),
            key_sources: if self.key_sources.is_empty() {
                listener.key_sources.clone()
            } else {
                self.key_sources.clone()
            },
            forwarding: self.forwarding.clone().or_else(|| listener.forwarding.clone()),
            allowed_clients: self.allowed_clients.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use super::*;

    fn check(yaml: &str, on_route: bool) -> Result<ApiKeyAuthConfig, String> {
        let raw: RawApiKeyAuth = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        api_key_auth(raw, "f", on_route).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_sources_and_forwarding_are_checked_at_load() {
        let config = check(
            "credentials: [{ key: k1, client: one }, { key: k2, client: two }]\nkey_sources: [{ header: X-API-KEY }, { query: api_key }, { cookie: key }]\nforwarding: { header: X-Client, hide_credentials: true }",
            false,
        )
        .unwrap();
        assert_eq!(config.credentials.as_ref().unwrap()["k2"], "two");
        assert_eq!(config.key_sources[0], KeySource::Header(HeaderName::from_static("x-api-key")));
        assert_eq!(config.key_sources[2], KeySource::Cookie("key".into()));
        let dumped = serde_json::to_value(&config).unwrap();
        assert_eq!(dumped["credentials"], serde_json::json!(["one", "two"]), "keys are not shown");
        let route = check("allowed_clients: [two]", true).unwrap();
        let merged = route.over(&config);
        assert_eq!((merged.credentials, merged.allowed_clients), (config.credentials.clone(), vec!["two".to_owned()]));
        for (yaml, complaint) in [
            ("credentials: [{ key: k, client: a }, { key: k, client: b }]", "f.credentials[1]"),
            ("key_sources: [{ header: a, query: b }]", "f.key_sources[0]"),
            ("key_sources: [{}]", "f.key_sources[0]"),
            ("forwarding: { header: host }", "f.forwarding.header"),
            ("allowed_clients: [a]", "f.allowed_clients"),
        ] {
            let err = check(yaml, false).unwrap_err();
            assert!(err.contains(complaint), "{yaml}: {err}");
        }
    }
}
