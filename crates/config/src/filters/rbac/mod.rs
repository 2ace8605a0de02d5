//! Settings of the `rbac` filter (Envoy's role-based access control): requests allowed or
//! denied by who sends them (client address, mTLS identity, headers) and what they ask for
//! (path, method, host, port).
//!
//! Rules are an ordered list; the first that holds decides (`allow`, `deny`, or `log`, which
//! allows), and `on_no_match` decides when none does. Envoy's policy form (`action` and named
//! `policies`, any of which holding means the action) is read into that list: the policies in
//! name order, each with `action`, and the opposite when none holds. `rules` are enforced (403
//! `RBAC: access denied`); `shadow_rules` are evaluated and counted only. Without `rules`
//! nothing is enforced, so a listener can carry the filter and routes give it rules of their
//! own (Envoy Gateway's way).

mod metadata;
pub(crate) mod xds;

pub use metadata::{MetadataMatch, MetadataValueMatch, RawMetadataMatch, RawMetadataValue};

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::matchers::{string_match, string_pattern as pattern};
use crate::*;

/// The filter's settings on a listener or a route.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RbacConfig {
    /// Enforced; `None`: nothing is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<RbacRules>,
    /// Evaluated and counted only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow_rules: Option<RbacRules>,
    /// The `prefix` label of the enforced rules' counters.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rules_stat_prefix: String,
    /// The `prefix` label of the shadow rules' counters.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub shadow_rules_stat_prefix: String,
}

/// Rules in order: the first that holds decides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RbacRules {
    pub matchers: Vec<RbacRule>,
    /// What a request no rule holds for gets.
    pub on_no_match: RbacAction,
}

/// One rule: its name (the policy's), what it decides, and when it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RbacRule {
    pub name: String,
    pub action: RbacAction,
    #[serde(rename = "match")]
    pub when: RbacMatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RbacAction {
    Allow,
    Deny,
    /// Allowed. (Envoy marks such a request for its access logs' filters; nothing here
    /// reads that mark.)
    Log,
}

impl RbacAction {
    /// What a request gets in the policy form when none of the policies holds.
    fn otherwise(self) -> RbacAction {
        match self {
            RbacAction::Allow => RbacAction::Deny,
            RbacAction::Deny | RbacAction::Log => RbacAction::Allow,
        }
    }
}

/// What a rule asks of a request and its connection.
#[derive(Debug, Clone, PartialEq)]
pub enum RbacMatch {
    Any,
    And(Vec<RbacMatch>),
    Or(Vec<RbacMatch>),
    Not(Box<RbacMatch>),
    /// A request header (`:method`, `:path` with its query, `:authority` and `:scheme`
    /// included), its values joined by commas.
    Header {
        name: String,
        value: HeaderValueMatch,
    },
    /// The path without its query.
    Path(StringMatch),
    /// The port the client connected to, in `[start, end)`.
    DestinationPort { start: u32, end: u32 },
    /// The address the client connected to.
    DestinationIp(Vec<IpNet>),
    /// The client's address as the listener reads it (behind trusted proxies, from
    /// `x-forwarded-for`).
    RemoteIp(Vec<IpNet>),
    /// The client's address after a PROXY protocol header, never from `x-forwarded-for`.
    SourceIp(Vec<IpNet>),
    /// The address of the connection's own peer, whatever a PROXY protocol header says.
    DirectRemoteIp(Vec<IpNet>),
    /// The name the client asked for in its TLS handshake (empty without one).
    RequestedServerName(StringMatch),
    /// A client certificate (mutual TLS), and where given one of its names matching: its URI
    /// names, else its DNS names, else its subject.
    Authenticated(Option<StringMatch>),
    /// A value the `jwt_authn` filter left (a verified token's claim).
    Metadata(Box<MetadataMatch>),
}

/// A string match as its one key (`prefix: /v1`).
struct Pattern<'a>(&'a StringMatch);

impl Serialize for Pattern<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        self.0.write(&mut map)?;
        map.end()
    }
}

impl Serialize for RbacMatch {
    /// As written: one key.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Header<'a> {
            name: &'a str,
            #[serde(flatten)]
            value: &'a HeaderValueMatch,
        }
        #[derive(Serialize)]
        struct Range {
            start: u32,
            end: u32,
        }
        let nets = |nets: &[IpNet]| nets.iter().map(ToString::to_string).collect::<Vec<_>>();
        let mut map = s.serialize_map(Some(1))?;
        match self {
            RbacMatch::Any => map.serialize_entry("any", &true)?,
            RbacMatch::And(all) => map.serialize_entry("and", all)?,
            RbacMatch::Or(any) => map.serialize_entry("or", any)?,
            RbacMatch::Not(inner) => map.serialize_entry("not", inner)?,
            RbacMatch::Header { name, value } => {
                map.serialize_entry("header", &Header { name, value })?
            }
            RbacMatch::Path(m) => map.serialize_entry("path", &Pattern(m))?,
            RbacMatch::DestinationPort { start, end } if *end == start + 1 => {
                map.serialize_entry("destination_port", start)?
            }
            RbacMatch::DestinationPort { start, end } => map.serialize_entry(
                "destination_port_range",
                &Range {
                    start: *start,
                    end: *end,
                },
            )?,
            RbacMatch::DestinationIp(n) => map.serialize_entry("destination_ip", &nets(n))?,
            RbacMatch::RemoteIp(n) => map.serialize_entry("remote_ip", &nets(n))?,
            RbacMatch::SourceIp(n) => map.serialize_entry("source_ip", &nets(n))?,
            RbacMatch::DirectRemoteIp(n) => map.serialize_entry("direct_remote_ip", &nets(n))?,
            RbacMatch::RequestedServerName(m) => {
                map.serialize_entry("requested_server_name", &Pattern(m))?
            }
            RbacMatch::Authenticated(name) => {
                let mut inner = BTreeMap::new();
                if let Some(m) = name {
                    inner.insert("principal_name", Pattern(m));
                }
                map.serialize_entry("authenticated", &inner)?
            }
            RbacMatch::Metadata(m) => map.serialize_entry("metadata", m)?,
        }
        map.end()
    }
}

/// The filter's entry as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRbac {
    pub rules: Option<RawRbacRules>,
    pub shadow_rules: Option<RawRbacRules>,
    #[serde(default)]
    pub rules_stat_prefix: String,
    #[serde(default)]
    pub shadow_rules_stat_prefix: String,
}

/// Rules as written: Envoy's policy form (`action`, `policies`) or the ordered form
/// (`matchers`, `on_no_match`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRbacRules {
    pub action: Option<RbacAction>,
    pub policies: Option<BTreeMap<String, RawPolicy>>,
    pub matchers: Option<Vec<RawRule>>,
    pub on_no_match: Option<RbacAction>,
}

/// A named policy: it holds when one of its permissions and one of its principals hold.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(default)]
    pub permissions: Vec<RawMatch>,
    #[serde(default)]
    pub principals: Vec<RawMatch>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: String,
    pub action: RbacAction,
    #[serde(rename = "match")]
    pub when: RawMatch,
}

/// One match as written: a map of one key (`- path: { prefix: /admin }`).
#[derive(Debug, Clone)]
pub enum RawMatch {
    Any(bool),
    And(Vec<RawMatch>),
    Or(Vec<RawMatch>),
    Not(Box<RawMatch>),
    Header(RawHeaderMatch),
    Path(RawStringMatch),
    DestinationPort(u32),
    DestinationPortRange { start: u32, end: u32 },
    DestinationIp(Vec<String>),
    RemoteIp(Vec<String>),
    SourceIp(Vec<String>),
    DirectRemoteIp(Vec<String>),
    RequestedServerName(RawStringMatch),
    /// `principal_name`, where one is asked for.
    Authenticated(Option<RawStringMatch>),
    Metadata(RawMetadataMatch),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuthenticated {
    principal_name: Option<RawStringMatch>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPortRange {
    start: u32,
    end: u32,
}

/// The match keys, for errors.
const MATCH_KEYS: &str = "any, and, or, not, header, path, destination_port, destination_port_range, destination_ip, remote_ip, source_ip, direct_remote_ip, requested_server_name, authenticated, metadata";

impl<'de> Deserialize<'de> for RawMatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        fn read<T: serde::de::DeserializeOwned, E: Error>(
            key: &str,
            v: serde_yaml::Value,
        ) -> Result<T, E> {
            serde_yaml::from_value(v).map_err(|e| E::custom(format!("`{key}`: {e}")))
        }
        let map = BTreeMap::<String, serde_yaml::Value>::deserialize(d)?;
        let mut entries = map.into_iter();
        let (Some((key, v)), None) = (entries.next(), entries.next()) else {
            return Err(D::Error::custom(format!(
                "expected a map of one key, one of {MATCH_KEYS}"
            )));
        };
        Ok(match key.as_str() {
            "any" => RawMatch::Any(read(&key, v)?),
            "and" => RawMatch::And(read(&key, v)?),
            "or" => RawMatch::Or(read(&key, v)?),
            "not" => RawMatch::Not(Box::new(read(&key, v)?)),
            "header" => RawMatch::Header(read(&key, v)?),
            "path" => RawMatch::Path(read(&key, v)?),
            "destination_port" => RawMatch::DestinationPort(read(&key, v)?),
            "destination_port_range" => {
                let RawPortRange { start, end } = read(&key, v)?;
                RawMatch::DestinationPortRange { start, end }
            }
            "destination_ip" => RawMatch::DestinationIp(read(&key, v)?),
            "remote_ip" => RawMatch::RemoteIp(read(&key, v)?),
            "source_ip" => RawMatch::SourceIp(read(&key, v)?),
            "direct_remote_ip" => RawMatch::DirectRemoteIp(read(&key, v)?),
            "requested_server_name" => RawMatch::RequestedServerName(read(&key, v)?),
            "authenticated" => {
                let raw: Option<RawAuthenticated> = read(&key, v)?;
                RawMatch::Authenticated(raw.and_then(|r| r.principal_name))
            }
            "metadata" => RawMatch::Metadata(read(&key, v)?),
            other => {
                return Err(D::Error::custom(format!(
                    "unknown match `{other}`; known: {MATCH_KEYS}"
                )));
            }
        })
    }
}

fn rbac(raw: RawRbac, path: &str, _on_route: bool) -> Result<RbacConfig, ConfigError> {
    let rules = |raw: Option<RawRbacRules>, key: &str| {
        raw.map(|r| check_rules(r, &format!("{path}.{key}")))
            .transpose()
    };
    Ok(RbacConfig {
        rules: rules(raw.rules, "rules")?,
        shadow_rules: rules(raw.shadow_rules, "shadow_rules")?,
        rules_stat_prefix: raw.rules_stat_prefix,
        shadow_rules_stat_prefix: raw.shadow_rules_stat_prefix,
    })
}

per_route_settings!(RbacConfig, RawRbac, rbac);

/// Rules for a TCP listener's connections (Envoy's network `rbac` filter): they read what a
/// connection shows (addresses, ports, SNI, the client certificate), never a request's
/// headers, path or metadata, which a relayed connection does not have.
pub(crate) fn network_rbac(raw: RawRbac, path: &str) -> Result<RbacConfig, ConfigError> {
    let config = rbac(raw, path, false)?;
    for (rules, key) in [(&config.rules, "rules"), (&config.shadow_rules, "shadow_rules")] {
        for rule in rules.iter().flat_map(|r| &r.matchers) {
            if let Some(what) = rule.when.of_a_request() {
                return Err(ConfigError::invalid(
                    format!("{path}.{key}"),
                    format!("rule `{}` reads {what}: a relayed connection has none", rule.name),
                ));
            }
        }
    }
    Ok(config)
}

impl RbacMatch {
    /// What of a request it reads, if anything (a header, the path, metadata).
    fn of_a_request(&self) -> Option<&'static str> {
        match self {
            RbacMatch::Header { .. } => Some("a header"),
            RbacMatch::Path(_) => Some("the path"),
            RbacMatch::Metadata(_) => Some("metadata"),
            RbacMatch::And(list) | RbacMatch::Or(list) => list.iter().find_map(RbacMatch::of_a_request),
            RbacMatch::Not(inner) => inner.of_a_request(),
            _ => None,
        }
    }
}

fn check_rules(raw: RawRbacRules, path: &str) -> Result<RbacRules, ConfigError> {
    match (raw.policies, raw.matchers) {
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            path,
            "expected `policies` (with `action`) or `matchers` (with `on_no_match`), not both",
        )),
        (Some(policies), None) => {
            if raw.on_no_match.is_some() {
                return Err(ConfigError::invalid(
                    format!("{path}.on_no_match"),
                    "goes with `matchers`; with `policies`, a request none holds for gets the opposite of `action`",
                ));
            }
            let action = raw.action.unwrap_or(RbacAction::Allow);
            let matchers = (policies.into_iter())
                .map(|(name, policy)| {
                    let at = format!("{path}.policies.{name}");
                    Ok(RbacRule {
                        when: check_policy(policy, &at)?,
                        name,
                        action,
                    })
                })
                .collect::<Result<_, ConfigError>>()?;
            Ok(RbacRules {
                matchers,
                on_no_match: action.otherwise(),
            })
        }
        (None, matchers) => {
            if raw.action.is_some() {
                return Err(ConfigError::invalid(
                    format!("{path}.action"),
                    "goes with `policies`; each of `matchers` names its own",
                ));
            }
            let matchers = (matchers.unwrap_or_default().into_iter().enumerate())
                .map(|(i, rule)| {
                    let at = format!("{path}.matchers[{i}]");
                    if rule.name.is_empty() {
                        return Err(ConfigError::invalid(format!("{at}.name"), "expected a name"));
                    }
                    Ok(RbacRule {
                        when: check_match(rule.when, &format!("{at}.match"))?,
                        name: rule.name,
                        action: rule.action,
                    })
                })
                .collect::<Result<_, ConfigError>>()?;
            Ok(RbacRules {
                matchers,
                // As Envoy's matcher form: what nothing matched is denied unless told
                // otherwise.
                on_no_match: raw.on_no_match.unwrap_or(RbacAction::Deny),
            })
        }
    }
}

/// A policy as one match: one of its permissions and one of its principals.
fn check_policy(policy: RawPolicy, path: &str) -> Result<RbacMatch, ConfigError> {
    let any_of = |list: Vec<RawMatch>, key: &str| {
        let at = format!("{path}.{key}");
        if list.is_empty() {
            return Err(ConfigError::invalid(
                &at,
                "expected at least one (`- any: true` for all)",
            ));
        }
        let mut list = (list.into_iter().enumerate())
            .map(|(i, m)| check_match(m, &format!("{at}[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(match list.len() {
            1 => list.remove(0),
            _ => RbacMatch::Or(list),
        })
    };
    Ok(RbacMatch::And(vec![
        any_of(policy.permissions, "permissions")?,
        any_of(policy.principals, "principals")?,
    ]))
}

fn nets(list: Vec<String>, path: &str) -> Result<Vec<IpNet>, ConfigError> {
    if list.is_empty() {
        return Err(ConfigError::invalid(path, "expected at least one address range"));
    }
    list.iter()
        .map(|text| {
            text.parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                .map(|n| n.trunc())
                .map_err(|_| {
                    ConfigError::invalid(
                        path,
                        format!("expected an address or CIDR range, found `{text}`"),
                    )
                })
        })
        .collect()
}

/// Deeper nesting is refused: evaluation recurses.
const MAX_DEPTH: usize = 32;

/// A match as written, checked.
fn check_match(raw: RawMatch, path: &str) -> Result<RbacMatch, ConfigError> {
    check_at(raw, path, 0)
}

fn check_at(raw: RawMatch, path: &str, depth: usize) -> Result<RbacMatch, ConfigError> {
    if depth > MAX_DEPTH {
        return Err(ConfigError::invalid(
            path,
            format!("nested more than {MAX_DEPTH} deep"),
        ));
    }
    let list = |raw: Vec<RawMatch>, key: &str| -> Result<Vec<RbacMatch>, ConfigError> {
        let at = format!("{path}.{key}");
        if raw.is_empty() {
            return Err(ConfigError::invalid(&at, "expected at least one match"));
        }
        (raw.into_iter().enumerate())
            .map(|(i, m)| check_at(m, &format!("{at}[{i}]"), depth + 1))
            .collect()
    };
    Ok(match raw {
        RawMatch::Any(true) => RbacMatch::Any,
        RawMatch::Any(false) => RbacMatch::Not(Box::new(RbacMatch::Any)),
        RawMatch::And(all) => RbacMatch::And(list(all, "and")?),
        RawMatch::Or(any) => RbacMatch::Or(list(any, "or")?),
        RawMatch::Not(inner) => {
            RbacMatch::Not(Box::new(check_at(*inner, &format!("{path}.not"), depth + 1)?))
        }
        RawMatch::Header(header) => {
            let at = format!("{path}.header");
            let name = header.name.to_ascii_lowercase();
            let pseudo = [":method", ":path", ":authority", ":scheme"];
            if !pseudo.contains(&name.as_str())
                && http::HeaderName::from_bytes(name.as_bytes()).is_err()
            {
                return Err(ConfigError::invalid(
                    format!("{at}.name"),
                    format!(
                        "expected a header name (or :method, :path, :authority, :scheme), found `{}`",
                        header.name
                    ),
                ));
            }
            // An exact value of any text, as Envoy compares it.
            let value = match string_match(&header, &at)? {
                Some(pattern) => HeaderValueMatch::Pattern(pattern),
                None if header.present == Some(false) => HeaderValueMatch::Absent,
                None => HeaderValueMatch::Present,
            };
            RbacMatch::Header { name, value }
        }
        RawMatch::Path(m) => RbacMatch::Path(pattern(m, &format!("{path}.path"))?),
        RawMatch::DestinationPort(port) => {
            if port > u32::from(u16::MAX) {
                return Err(ConfigError::invalid(
                    format!("{path}.destination_port"),
                    "expected a port (0-65535)",
                ));
            }
            RbacMatch::DestinationPort {
                start: port,
                end: port + 1,
            }
        }
        RawMatch::DestinationPortRange { start, end } => {
            if start >= end || end > 65_536 {
                return Err(ConfigError::invalid(
                    format!("{path}.destination_port_range"),
                    "expected `start` below `end` (the range is [start, end), ports 0-65535)",
                ));
            }
            RbacMatch::DestinationPort { start, end }
        }
        RawMatch::DestinationIp(list) => {
            RbacMatch::DestinationIp(nets(list, &format!("{path}.destination_ip"))?)
        }
        RawMatch::RemoteIp(list) => RbacMatch::RemoteIp(nets(list, &format!("{path}.remote_ip"))?),
        RawMatch::SourceIp(list) => RbacMatch::SourceIp(nets(list, &format!("{path}.source_ip"))?),
        RawMatch::DirectRemoteIp(list) => {
            RbacMatch::DirectRemoteIp(nets(list, &format!("{path}.direct_remote_ip"))?)
        }
        RawMatch::RequestedServerName(m) => {
            RbacMatch::RequestedServerName(pattern(m, &format!("{path}.requested_server_name"))?)
        }
        RawMatch::Authenticated(name) => RbacMatch::Authenticated(
            name.map(|m| pattern(m, &format!("{path}.authenticated.principal_name")))
                .transpose()?,
        ),
        RawMatch::Metadata(m) => {
            RbacMatch::Metadata(Box::new(metadata::check(m, &format!("{path}.metadata"))?))
        }
    })
}

#[cfg(test)]
mod tests;
