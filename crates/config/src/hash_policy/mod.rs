//! A route's or cluster's `hash_policy` (Envoy's): what a request is hashed on, so that
//! requests alike reach the same host of a consistent-hashing cluster (`ring_hash`,
//! `maglev`) and, with `use_hash_policy`, the same side of the route's `weighted_clusters`.
//! A cluster's replaces its routes'. The xDS form is `xds.rs`; the data plane's evaluation is
//! proxy-core's `http/hash_policy.rs`.

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::ConfigError;

pub(crate) mod xds;
use crate::units::de_opt_duration;

/// The rules, in order. Each rule that finds its value adds it to the hash (the hash so far
/// rotated left by one bit, then xor-ed with the value's, as Envoy combines them); a
/// `terminal` rule that leaves a hash ends the walk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct HashPolicy(pub Vec<HashRule>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashRule {
    pub source: HashSource,
    pub terminal: bool,
}

/// What one rule hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashSource {
    /// A request header's value (all its values, sorted, when it has several).
    Header(HeaderName),
    Cookie(CookieHash),
    /// The client's address (the trusted one `x-forwarded-for` gives, as Envoy's).
    SourceIp,
    /// A query parameter's first value, as sent (not decoded, as Envoy hashes it).
    QueryParameter(String),
}

/// A cookie's value. With a `ttl`, a request without the cookie gets one made for it (from
/// its connection's addresses, so that one connection's requests agree) and sent back in a
/// `set-cookie` on the upstream's response, as Envoy does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieHash {
    pub name: String,
    pub ttl: Option<Duration>,
    pub path: Option<String>,
    /// `name=value` (or `name` alone) pairs added to a made cookie.
    pub attributes: Vec<(String, String)>,
}

impl CookieHash {
    /// The `set-cookie` for a made cookie of this `value`, as Envoy writes it:
    /// `name="value"; Max-Age=N; Path=P; attributes; HttpOnly` (no `Max-Age` for a zero
    /// `ttl`: a session cookie).
    pub fn set_cookie(&self, value: &str) -> Option<HeaderValue> {
        let mut text = format!("{}=\"{value}\"", self.name);
        if let Some(ttl) = self.ttl.filter(|t| t.as_secs() > 0) {
            text.push_str(&format!("; Max-Age={}", ttl.as_secs()));
        }
        if let Some(path) = &self.path {
            text.push_str(&format!("; Path={path}"));
        }
        for (name, value) in &self.attributes {
            match value.as_str() {
                "" => text.push_str(&format!("; {name}")),
                value => text.push_str(&format!("; {name}={value}")),
            }
        }
        text.push_str("; HttpOnly");
        HeaderValue::from_str(&text).ok()
    }
}

impl Serialize for HashRule {
    /// As written: `{ header: NAME }`, `{ cookie: { name, ttl, path } }`, `{ source_ip: true }`
    /// or `{ query_parameter: NAME }`, with `terminal: true` when set.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match &self.source {
            HashSource::Header(name) => map.serialize_entry("header", name.as_str())?,
            HashSource::Cookie(cookie) => {
                let mut fields = serde_json::Map::new();
                fields.insert("name".into(), cookie.name.clone().into());
                if let Some(ttl) = cookie.ttl {
                    fields.insert("ttl".into(), format!("{}s", ttl.as_secs()).into());
                }
                if let Some(path) = &cookie.path {
                    fields.insert("path".into(), path.clone().into());
                }
                if !cookie.attributes.is_empty() {
                    let list: Vec<serde_json::Value> = cookie
                        .attributes
                        .iter()
                        .map(|(name, value)| serde_json::json!({ "name": name, "value": value }))
                        .collect();
                    fields.insert("attributes".into(), list.into());
                }
                map.serialize_entry("cookie", &fields)?;
            }
            HashSource::SourceIp => map.serialize_entry("source_ip", &true)?,
            HashSource::QueryParameter(name) => map.serialize_entry("query_parameter", name)?,
        }
        if self.terminal {
            map.serialize_entry("terminal", &true)?;
        }
        map.end()
    }
}

/// One `hash_policy` entry as the file writes it: exactly one source.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHashRule {
    pub header: Option<String>,
    pub cookie: Option<RawCookieHash>,
    pub source_ip: Option<bool>,
    pub query_parameter: Option<String>,
    #[serde(default)]
    pub terminal: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCookieHash {
    pub name: String,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub ttl: Option<Duration>,
    pub path: Option<String>,
    #[serde(default)]
    pub attributes: Vec<RawCookieAttribute>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCookieAttribute {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// Checks a route's `hash_policy`; `None` for an empty list.
pub(crate) fn hash_policy(
    raw: Vec<RawHashRule>,
    path: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<HashPolicy>, ConfigError> {
    if raw.is_empty() {
        return Ok(None);
    }
    let rules = raw
        .into_iter()
        .enumerate()
        .map(|(i, rule)| hash_rule(rule, &format!("{path}[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(HashPolicy(rules)))
}

fn hash_rule(raw: RawHashRule, path: &str) -> Result<HashRule, ConfigError> {
    let source = match raw {
        RawHashRule {
            header: Some(h),
            cookie: None,
            source_ip: None,
            query_parameter: None,
            ..
        } => HashSource::Header(HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
            ConfigError::invalid(
                format!("{path}.header"),
                format!("expected a header name, found `{h}`"),
            )
        })?),
        RawHashRule {
            header: None,
            cookie: Some(c),
            source_ip: None,
            query_parameter: None,
            ..
        } => HashSource::Cookie(cookie(c, &format!("{path}.cookie"))?),
        RawHashRule {
            header: None,
            cookie: None,
            source_ip: Some(true),
            query_parameter: None,
            ..
        } => HashSource::SourceIp,
        RawHashRule {
            header: None,
            cookie: None,
            source_ip: None,
            query_parameter: Some(q),
            ..
        } if !q.is_empty() => HashSource::QueryParameter(q),
        _ => {
            return Err(ConfigError::invalid(
                path,
                "expected exactly one of `header: NAME`, `cookie: { name: NAME }`, \
                 `source_ip: true` or `query_parameter: NAME`",
            ));
        }
    };
    Ok(HashRule {
        source,
        terminal: raw.terminal,
    })
}

fn cookie(raw: RawCookieHash, path: &str) -> Result<CookieHash, ConfigError> {
    // Written into a `set-cookie` when made: RFC 6265's token for names, and no `;` or
    // control characters in the rest.
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
    };
    let text = |s: &str| s.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b';');
    if !token(&raw.name) {
        return Err(ConfigError::invalid(
            format!("{path}.name"),
            format!("expected a cookie name, found `{}`", raw.name),
        ));
    }
    if let Some(p) = raw.path.as_deref().filter(|p| !text(p)) {
        return Err(ConfigError::invalid(
            format!("{path}.path"),
            format!("expected a cookie path, found `{p}`"),
        ));
    }
    let mut attributes = Vec::with_capacity(raw.attributes.len());
    for (i, a) in raw.attributes.into_iter().enumerate() {
        if !token(&a.name) || !text(&a.value) {
            return Err(ConfigError::invalid(
                format!("{path}.attributes[{i}]"),
                format!(
                    "expected a cookie attribute, found `{}={}`",
                    a.name, a.value
                ),
            ));
        }
        attributes.push((a.name, a.value));
    }
    if raw.ttl.is_none() && (raw.path.is_some() || !attributes.is_empty()) {
        // Envoy accepts these and never uses them; here they would read as if they did.
        return Err(ConfigError::invalid(
            path,
            "`path` and `attributes` describe a cookie made for a request without one: they need a `ttl`",
        ));
    }
    Ok(CookieHash {
        name: raw.name,
        ttl: raw.ttl,
        path: raw.path.filter(|p| !p.is_empty()),
        attributes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Option<HashPolicy>, ConfigError> {
        let raw: Vec<RawHashRule> = serde_yaml::from_str(yaml).unwrap();
        hash_policy(raw, "routes[0].hash_policy")
    }

    #[test]
    fn rules_parse_and_write_back() {
        let policy = parse(
            "- header: x-user\n  terminal: true\n- cookie: { name: s, ttl: 1h, path: /, attributes: [{ name: SameSite, value: Lax }, { name: Secure }] }\n- source_ip: true\n- query_parameter: id\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(policy.0.len(), 4);
        assert!(policy.0[0].terminal);
        assert_eq!(
            serde_json::to_value(&policy).unwrap(),
            serde_json::json!([
                { "header": "x-user", "terminal": true },
                { "cookie": { "name": "s", "ttl": "3600s", "path": "/", "attributes": [
                    { "name": "SameSite", "value": "Lax" }, { "name": "Secure", "value": "" } ] } },
                { "source_ip": true },
                { "query_parameter": "id" },
            ])
        );
        let HashSource::Cookie(cookie) = &policy.0[1].source else {
            panic!("a cookie rule");
        };
        assert_eq!(
            cookie.set_cookie("00ab").unwrap(),
            "s=\"00ab\"; Max-Age=3600; Path=/; SameSite=Lax; Secure; HttpOnly"
        );
        assert_eq!(parse("[]").unwrap(), None);
    }

    #[test]
    fn a_zero_ttl_makes_a_session_cookie() {
        let policy = parse("- cookie: { name: s, ttl: 0s }\n").unwrap().unwrap();
        let HashSource::Cookie(cookie) = &policy.0[0].source else {
            panic!("a cookie rule");
        };
        assert_eq!(cookie.set_cookie("ff").unwrap(), "s=\"ff\"; HttpOnly");
    }

    #[test]
    fn bad_rules_are_refused_by_path() {
        for (yaml, at) in [
            ("- {}\n", "routes[0].hash_policy[0]"),
            (
                "- header: x\n  source_ip: true\n",
                "routes[0].hash_policy[0]",
            ),
            ("- header: 'a b'\n", "routes[0].hash_policy[0].header"),
            (
                "- cookie: { name: 'a;b', ttl: 1s }\n",
                "routes[0].hash_policy[0].cookie.name",
            ),
            (
                "- cookie: { name: a, path: / }\n",
                "routes[0].hash_policy[0].cookie",
            ),
            ("- source_ip: false\n", "routes[0].hash_policy[0]"),
            ("- query_parameter: ''\n", "routes[0].hash_policy[0]"),
        ] {
            let error = parse(yaml).unwrap_err().to_string();
            assert!(error.starts_with(at), "{yaml}: {error}");
        }
    }
}
