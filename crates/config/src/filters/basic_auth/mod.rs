//! Settings of the `basic_auth` filter (Envoy's): requests carry `authorization: Basic` with a
//! user and password of an htpasswd list (SHA-1 entries, `user:{SHA}base64`, as Envoy takes
//! them), else they are refused 401. A route may turn the filter off or give its own users.

pub(crate) mod xds;

use std::collections::BTreeMap;

use base64::Engine;
use http::HeaderName;
use serde::{Deserialize, Serialize, Serializer};

use crate::serialize as ser;
use crate::*;

/// The filter's settings on a listener or a route.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BasicAuthConfig {
    /// Each user's SHA-1 of its password; shown by name only.
    #[serde(serialize_with = "user_names")]
    pub users: BTreeMap<String, [u8; 20]>,
    /// The user's name is sent upstream in this header.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser::opt_header_name"
    )]
    pub forward_username_header: Option<HeaderName>,
    /// Where the credentials are (`authorization` unless set: `proxy-authorization`, say).
    #[serde(serialize_with = "ser::header_name")]
    pub authentication_header: HeaderName,
    /// A request without credentials goes on (bad ones are still refused).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_missing: bool,
}

fn user_names<S: Serializer>(users: &BTreeMap<String, [u8; 20]>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(users.keys())
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBasicAuth {
    /// htpasswd lines.
    pub users: Option<String>,
    /// A file of them, read at load.
    pub users_file: Option<String>,
    pub forward_username_header: Option<String>,
    pub authentication_header: Option<String>,
    pub allow_missing: Option<bool>,
}

fn basic_auth(raw: RawBasicAuth, path: &str, on_route: bool) -> Result<BasicAuthConfig, ConfigError> {
    let (text, at) = match (raw.users, raw.users_file) {
        (Some(text), None) => (text, format!("{path}.users")),
        (None, Some(file)) => {
            let at = format!("{path}.users_file");
            let text = std::fs::read_to_string(&file)
                .map_err(|e| ConfigError::invalid(&at, format!("cannot read `{file}`: {e}")))?;
            (text, at)
        }
        _ => {
            return Err(ConfigError::invalid(
                path,
                "expected one of `users` (htpasswd lines) or `users_file`",
            ));
        }
    };
    if on_route
        && (raw.forward_username_header.is_some()
            || raw.authentication_header.is_some()
            || raw.allow_missing.is_some())
    {
        return Err(ConfigError::invalid(
            path,
            "a route gives users only; the other settings are the listener's",
        ));
    }
    let header = |name: &str, at: String| {
        HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
            .map_err(|_| ConfigError::invalid(at, format!("`{name}` is not a header name")))
    };
    let forward_username_header = match raw.forward_username_header {
        None => None,
        Some(name) => {
            let at = format!("{path}.forward_username_header");
            let name = header(&name, at.clone())?;
            if crate::values::framing_or_host(&name) {
                return Err(ConfigError::invalid(at, "frames or routes the request"));
            }
            Some(name)
        }
    };
    Ok(BasicAuthConfig {
        users: htpasswd(&text, &at)?,
        forward_username_header,
        authentication_header: match raw.authentication_header {
            None => http::header::AUTHORIZATION,
            Some(name) => header(&name, format!("{path}.authentication_header"))?,
        },
        allow_missing: raw.allow_missing.unwrap_or(false),
    })
}

per_route_settings!(BasicAuthConfig, RawBasicAuth, basic_auth);

/// htpasswd lines, each `user:{SHA}base64(sha1(password))`; blank lines skipped.
fn htpasswd(text: &str, path: &str) -> Result<BTreeMap<String, [u8; 20]>, ConfigError> {
    let mut users = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{path} line {}", i + 1);
        let Some((user, hash)) = line.split_once(':') else {
            return Err(ConfigError::invalid(at, "expected `user:{SHA}hash`"));
        };
        let Some(hash) = hash.strip_prefix("{SHA}") else {
            return Err(ConfigError::invalid(
                at,
                format!("user `{user}`: only SHA-1 entries (`{{SHA}}`, htpasswd -s) are supported, as in Envoy"),
            ));
        };
        let digest = base64::engine::general_purpose::STANDARD
            .decode(hash)
            .ok()
            .and_then(|d| <[u8; 20]>::try_from(d).ok())
            .ok_or_else(|| {
                ConfigError::invalid(&at, format!("user `{user}`: not a base64 SHA-1 digest"))
            })?;
        if user.is_empty() || users.insert(user.to_owned(), digest).is_some() {
            return Err(ConfigError::invalid(
                at,
                format!("user `{user}`: empty or given twice"),
            ));
        }
    }
    if users.is_empty() {
        return Err(ConfigError::invalid(path, "expected at least one user"));
    }
    Ok(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str, on_route: bool) -> Result<BasicAuthConfig, String> {
        let raw: RawBasicAuth = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        basic_auth(raw, "basic_auth", on_route).map_err(|e| e.to_string())
    }

    #[test]
    fn htpasswd_sha_entries_are_read_and_others_refused() {
        // `htpasswd -nbs alice secret`.
        let config = check(
            "users: |\n  alice:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\n\n  bob:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\nforward_username_header: X-User",
            false,
        )
        .unwrap();
        assert_eq!(config.users.keys().collect::<Vec<_>>(), ["alice", "bob"]);
        assert_eq!(config.authentication_header, "authorization");
        assert_eq!(config.forward_username_header.unwrap(), "x-user");
        let dumped = serde_json::to_value(check("users: 'a:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ='", false).unwrap()).unwrap();
        assert_eq!(dumped["users"], serde_json::json!(["a"]));
        for (yaml, want) in [
            ("users: 'alice:$apr1$x$y'", "only SHA-1 entries"),
            ("users: 'alice:{SHA}c2hvcnQ='", "not a base64 SHA-1 digest"),
            ("users: 'alice'", "expected `user:{SHA}hash`"),
            ("users: ''", "expected at least one user"),
            ("{}", "expected one of `users`"),
            ("users: \"a:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\\na:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\"", "given twice"),
            ("{ users: 'a:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=', forward_username_header: host }", "frames or routes"),
        ] {
            let got = check(yaml, false).unwrap_err();
            assert!(got.contains(want), "{yaml}: {got}");
        }
        let got = check("{ users: 'a:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=', allow_missing: true }", true).unwrap_err();
        assert!(got.contains("a route gives users only"), "{got}");
    }
}
