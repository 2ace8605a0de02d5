//! The string, header and percentage matchers every part of the configuration writes the
//! same way (routes, the CORS and health-check filters, fault and mirror shares), checked
//! once here so that no topic imports another for them.

use http::{HeaderName, HeaderValue};

use crate::*;

/// `{ exact | prefix | suffix | contains | regex: VALUE }`, or `present: true` (`None`).
/// `present: false` is the caller's to allow.
pub(crate) fn string_match(
    raw: &RawHeaderMatch,
    path: &str,
) -> Result<Option<StringMatch>, ConfigError> {
    let given = [
        ("exact", &raw.exact),
        ("prefix", &raw.prefix),
        ("suffix", &raw.suffix),
        ("contains", &raw.contains),
        ("regex", &raw.regex),
    ];
    let mut set = given.iter().filter(|(_, v)| v.is_some());
    let first = set.next();
    if set.next().is_some() || (first.is_some() && raw.present.is_some()) {
        return Err(ConfigError::invalid(
            path,
            "expected one of `exact`, `prefix`, `suffix`, `contains`, `regex` or `present`",
        ));
    }
    let Some((key, Some(value))) = first else {
        return Ok(None);
    };
    let value = value.clone();
    Ok(Some(match *key {
        "exact" => StringMatch::Exact(value),
        "prefix" => StringMatch::Prefix(value),
        "suffix" => StringMatch::Suffix(value),
        "contains" => StringMatch::Contains(value),
        _ => StringMatch::Regex(pattern(&value, false, &format!("{path}.regex"))?),
    }))
}

/// A string pattern alone (no name): one of its keys.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStringMatch {
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub contains: Option<String>,
    pub regex: Option<String>,
}

/// One string pattern, with exactly one key.
pub(crate) fn string_pattern(raw: RawStringMatch, path: &str) -> Result<StringMatch, ConfigError> {
    let mut one = string_patterns(vec![raw], path)?;
    Ok(one.remove(0))
}

/// A list of string patterns, each with exactly one key.
pub(crate) fn string_patterns(
    raw: Vec<RawStringMatch>,
    path: &str,
) -> Result<Vec<StringMatch>, ConfigError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("{path}[{i}]");
            let m = RawHeaderMatch {
                exact: m.exact,
                prefix: m.prefix,
                suffix: m.suffix,
                contains: m.contains,
                regex: m.regex,
                ..Default::default()
            };
            string_match(&m, &at)?.ok_or_else(|| {
                ConfigError::invalid(
                    at,
                    "expected one of `exact`, `prefix`, `suffix`, `contains` or `regex`",
                )
            })
        })
        .collect()
}

/// A regex that must match a whole value.
pub(crate) fn pattern(value: &str, ignore_case: bool, path: &str) -> Result<Pattern, ConfigError> {
    Pattern::new(value, ignore_case)
        .map_err(|e| ConfigError::invalid(path, format!("invalid regex `{value}`: {e}")))
}

pub(crate) fn header_match(raw: RawHeaderMatch, path: &str) -> Result<HeaderMatch, ConfigError> {
    let name = HeaderName::from_bytes(raw.name.as_bytes()).map_err(|_| {
        ConfigError::invalid(
            format!("{path}.name"),
            format!("expected a header name, found `{}`", raw.name),
        )
    })?;
    Ok(HeaderMatch {
        name,
        value: value_match(&raw, path)?,
    })
}

/// What a header match asks of the header's value (its name is the caller's).
pub(crate) fn value_match(
    raw: &RawHeaderMatch,
    path: &str,
) -> Result<HeaderValueMatch, ConfigError> {
    Ok(match string_match(raw, path)? {
        Some(StringMatch::Exact(v)) => {
            HeaderValueMatch::Exact(HeaderValue::from_str(&v).map_err(|_| {
                ConfigError::invalid(
                    format!("{path}.exact"),
                    format!("expected a header value of visible ASCII, found `{v}`"),
                )
            })?)
        }
        Some(pattern) => HeaderValueMatch::Pattern(pattern),
        None if raw.present == Some(false) => HeaderValueMatch::Absent,
        None => HeaderValueMatch::Present,
    })
}

/// `10%`, `0.5%` or a number of percent, in millionths.
pub(crate) fn fraction(value: &serde_yaml::Value) -> Option<u32> {
    let percent = match value {
        serde_yaml::Value::Number(n) => n.as_f64()?,
        serde_yaml::Value::String(s) => s.trim().strip_suffix('%')?.trim().parse().ok()?,
        _ => return None,
    };
    (0.0..=100.0)
        .contains(&percent)
        .then(|| (percent * 10_000.0).round() as u32)
}

/// A query parameter's match: its name, and a value match or presence.
pub(crate) fn query_match(raw: RawHeaderMatch, path: &str) -> Result<QueryMatch, ConfigError> {
    if raw.name.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.name"),
            "expected a parameter name",
        ));
    }
    if raw.present == Some(false) {
        return Err(ConfigError::invalid(
            format!("{path}.present"),
            "`present: false` is not supported for query parameters",
        ));
    }
    let value = string_match(&raw, path)?;
    Ok(QueryMatch {
        name: raw.name,
        value,
    })
}

/// A share of requests, in millionths (`100%` is 1 000 000), written as a percentage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share(pub u32);

impl Share {
    pub const ALL: Share = Share(1_000_000);
    pub const NONE: Share = Share(0);

    /// Whether a request whose draw is `draw` (uniform in 0..1 000 000) falls in the share.
    pub fn holds(self, draw: u64) -> bool {
        draw < u64::from(self.0)
    }
}

impl serde::Serialize for Share {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}%", f64::from(self.0) / 10_000.0))
    }
}

/// `10%`, `0.5%` or a number of percent; `default` when not written.
pub(crate) fn share(
    value: Option<&serde_yaml::Value>,
    default: Share,
    path: &str,
) -> Result<Share, ConfigError> {
    match value {
        None => Ok(default),
        Some(value) => fraction(value).map(Share).ok_or_else(|| {
            ConfigError::invalid(
                path,
                "expected a percentage from 0% to 100% (`10%`, `0.5%`)",
            )
        }),
    }
}
