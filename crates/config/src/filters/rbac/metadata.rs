//! RBAC's `metadata` match: a value another filter left for the request, found by a path of
//! keys and matched as Envoy's `ValueMatcher` does. The one filter here that leaves values is
//! `jwt_authn` (a verified token's payload under its provider's `payload_in_metadata`), so
//! rules on JWT claims read: `metadata: { filter: jwt_authn, path: [corp, groups], value:
//! { list_contains: { exact: admin } } }`.

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::matchers::{RawStringMatch, string_pattern};
use crate::*;

/// The filters whose values a rule may read, by Envoy's name and this one's.
const FILTERS: [&str; 2] = ["jwt_authn", "envoy.filters.http.jwt_authn"];

/// A value at a path of the `jwt_authn` filter's metadata, matched.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataMatch {
    /// Keys from the namespace's top (the `payload_in_metadata` key first).
    pub path: Vec<String>,
    pub value: MetadataValueMatch,
    /// The match is turned around (Envoy's `invert`).
    pub invert: bool,
}

/// What the value must be.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValueMatch {
    /// A string matching.
    String(StringMatch),
    /// This boolean.
    Bool(bool),
    /// There (null included), for `true`; `false` matches nothing, as in Envoy (write
    /// `invert: true` for "not there").
    Present(bool),
    /// A list of which one element matches.
    ListContains(Box<MetadataValueMatch>),
    /// One of these matching.
    Or(Vec<MetadataValueMatch>),
}

impl MetadataMatch {
    /// Whether the value at `path` of `namespace` (the filter's metadata; `None`: it left
    /// none) matches.
    pub fn matches(&self, namespace: Option<&serde_json::Map<String, Value>>) -> bool {
        let mut keys = self.path.iter();
        let found = namespace.and_then(|ns| {
            let mut value = ns.get(keys.next()?)?;
            for key in keys {
                value = value.as_object()?.get(key)?;
            }
            Some(value)
        });
        self.value.matches(found) != self.invert
    }
}

impl MetadataValueMatch {
    fn matches(&self, value: Option<&Value>) -> bool {
        match (self, value) {
            (MetadataValueMatch::Present(want), value) => *want && value.is_some(),
            (_, None) => false,
            (MetadataValueMatch::String(pattern), Some(Value::String(s))) => {
                pattern.matches(s.as_bytes())
            }
            (MetadataValueMatch::Bool(want), Some(Value::Bool(b))) => want == b,
            (MetadataValueMatch::ListContains(inner), Some(Value::Array(list))) => {
                list.iter().any(|v| inner.matches(Some(v)))
            }
            (MetadataValueMatch::Or(any), value) => any.iter().any(|m| m.matches(value)),
            _ => false,
        }
    }
}

impl Serialize for MetadataMatch {
    /// As written.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("filter", "jwt_authn")?;
        map.serialize_entry("path", &self.path)?;
        map.serialize_entry("value", &self.value)?;
        if self.invert {
            map.serialize_entry("invert", &true)?;
        }
        map.end()
    }
}

impl Serialize for MetadataValueMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        match self {
            MetadataValueMatch::String(pattern) => pattern.write(&mut map)?,
            MetadataValueMatch::Bool(b) => map.serialize_entry("bool", b)?,
            MetadataValueMatch::Present(p) => map.serialize_entry("present", p)?,
            MetadataValueMatch::ListContains(inner) => {
                map.serialize_entry("list_contains", inner)?
            }
            MetadataValueMatch::Or(any) => map.serialize_entry("or", any)?,
        }
        map.end()
    }
}

/// `metadata:` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetadataMatch {
    pub filter: String,
    pub path: Vec<String>,
    pub value: RawMetadataValue,
    #[serde(default)]
    pub invert: bool,
}

/// A value match as written: a string pattern's one key, or one of `bool`, `present`,
/// `list_contains`, `or`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetadataValue {
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub contains: Option<String>,
    pub regex: Option<String>,
    pub bool: Option<bool>,
    pub present: Option<bool>,
    pub list_contains: Option<Box<RawMetadataValue>>,
    pub or: Option<Vec<RawMetadataValue>>,
}

pub(crate) fn check(raw: RawMetadataMatch, path: &str) -> Result<MetadataMatch, ConfigError> {
    if !FILTERS.contains(&raw.filter.as_str()) {
        return Err(ConfigError::invalid(
            format!("{path}.filter"),
            format!(
                "`{}`: only `jwt_authn` leaves values for requests here",
                raw.filter
            ),
        ));
    }
    if raw.path.is_empty() || raw.path.iter().any(String::is_empty) {
        return Err(ConfigError::invalid(
            format!("{path}.path"),
            "expected keys (the provider's payload_in_metadata first)",
        ));
    }
    Ok(MetadataMatch {
        path: raw.path,
        value: value(raw.value, &format!("{path}.value"), 0)?,
        invert: raw.invert,
    })
}

fn value(raw: RawMetadataValue, path: &str, depth: usize) -> Result<MetadataValueMatch, ConfigError> {
    if depth > super::MAX_DEPTH {
        return Err(ConfigError::invalid(path, "nested too deep"));
    }
    let RawMetadataValue {
        exact,
        prefix,
        suffix,
        contains,
        regex,
        bool,
        present,
        list_contains,
        or,
    } = raw;
    let string = [&exact, &prefix, &suffix, &contains, &regex]
        .iter()
        .any(|v| v.is_some());
    let given = usize::from(string)
        + usize::from(bool.is_some())
        + usize::from(present.is_some())
        + usize::from(list_contains.is_some())
        + usize::from(or.is_some());
    if given != 1 {
        return Err(ConfigError::invalid(
            path,
            "expected one of `exact`, `prefix`, `suffix`, `contains`, `regex`, `bool`, \
             `present`, `list_contains` or `or`",
        ));
    }
    Ok(if string {
        let raw = RawStringMatch {
            exact,
            prefix,
            suffix,
            contains,
            regex,
        };
        MetadataValueMatch::String(string_pattern(raw, path)?)
    } else if let Some(b) = bool {
        MetadataValueMatch::Bool(b)
    } else if let Some(p) = present {
        MetadataValueMatch::Present(p)
    } else if let Some(inner) = list_contains {
        let inner = value(*inner, &format!("{path}.list_contains"), depth + 1)?;
        MetadataValueMatch::ListContains(Box::new(inner))
    } else {
        let any = or.unwrap_or_default();
        if any.is_empty() {
            return Err(ConfigError::invalid(
                format!("{path}.or"),
                "expected at least one match",
            ));
        }
        MetadataValueMatch::Or(
            (any.into_iter().enumerate())
                .map(|(i, m)| value(m, &format!("{path}.or[{i}]"), depth + 1))
                .collect::<Result<_, _>>()?,
        )
    })
}
