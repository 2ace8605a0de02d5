//! Which exchanges a logger writes (Envoy's access log `filter`): the status, the duration,
//! response flags, a request header, a CEL expression, and `and`/`or` of those. Without a
//! filter every exchange is written.
//!
//! ```yaml
//! access_log:
//!   - path: stdout
//!     filter: { or: [ { status_code: { ge: 500 } }, { response_flags: [UF, UT] } ] }
//! ```

use serde::{Deserialize, Serialize};

use crate::cel::{Attributes, Expr};
use crate::matchers::value_match;
use crate::route::raw::RawHeaderMatch;
use crate::{ConfigError, HeaderValueMatch};

/// The response flags Envoy names (those this proxy never sets match nothing).
pub const RESPONSE_FLAGS: [&str; 30] = [
    "LH", "UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DI", "FI", "RL", "UAEX", "RLSE", "DC",
    "URX", "SI", "IH", "DPE", "UMSDR", "RFCF", "NFCF", "DT", "UPE", "NC", "OM", "DF", "DO", "DR",
    "UDO",
];

/// A logger's filter, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFilter {
    /// The response's status (0 where there was none).
    StatusCode(Comparison),
    /// Milliseconds from the request's head to the end of the response.
    Duration(Comparison),
    /// One of these flags is set; empty: any flag is.
    ResponseFlags(Vec<String>),
    /// A request header (or `:authority`, `:method`, `:path`, `:scheme`) matches.
    Header(LogHeaderMatch),
    Expression(Expr),
    And(Vec<LogFilter>),
    Or(Vec<LogFilter>),
}

/// A request header's match: its lowercase name, and what its value must be.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogHeaderMatch {
    pub name: String,
    #[serde(flatten)]
    pub value: HeaderValueMatch,
}

/// The pseudo-headers a filter may name, which the log captures as the request's.
const PSEUDO_HEADERS: [&str; 4] = [":authority", ":method", ":path", ":scheme"];

/// `{ OP: VALUE }` with OP `eq`, `ne`, `ge` or `le`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comparison {
    pub op: CompareOp,
    pub value: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    Ne,
    Ge,
    Le,
}

impl Serialize for Comparison {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        let op = match self.op {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Ge => "ge",
            CompareOp::Le => "le",
        };
        map.serialize_entry(op, &self.value)?;
        map.end()
    }
}

impl Comparison {
    fn holds(&self, found: u64) -> bool {
        match self.op {
            CompareOp::Eq => found == self.value,
            CompareOp::Ne => found != self.value,
            CompareOp::Ge => found >= self.value,
            CompareOp::Le => found <= self.value,
        }
    }
}

/// What a filter reads of an exchange, besides what an expression reads.
pub trait LogFacts: Attributes {
    fn duration_ms(&self) -> u64;
    /// The response flag set, if any (Envoy's short name).
    fn flag(&self) -> Option<&str>;
}

impl LogFilter {
    /// Whether the exchange is written.
    pub fn passes(&self, facts: &dyn LogFacts) -> bool {
        match self {
            LogFilter::StatusCode(c) => c.holds(facts.response_code().unwrap_or(0).into()),
            LogFilter::Duration(c) => c.holds(facts.duration_ms()),
            LogFilter::ResponseFlags(flags) => match facts.flag() {
                None => false,
                Some(flag) => flags.is_empty() || flags.iter().any(|f| f == flag),
            },
            LogFilter::Header(m) => m.value.matches_value(facts.request_header(&m.name)),
            LogFilter::Expression(e) => e.holds(facts),
            LogFilter::And(all) => all.iter().all(|f| f.passes(facts)),
            LogFilter::Or(any) => any.iter().any(|f| f.passes(facts)),
        }
    }

    /// The request headers it reads (lowercase), each once.
    pub fn headers(&self) -> Vec<String> {
        fn walk(filter: &LogFilter, out: &mut Vec<String>) {
            match filter {
                LogFilter::Header(m) => out.push(m.name.clone()),
                LogFilter::Expression(e) => out.extend(e.headers().into_iter().map(String::from)),
                LogFilter::And(list) | LogFilter::Or(list) => {
                    list.iter().for_each(|f| walk(f, out))
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out.sort();
        out.dedup();
        out
    }
}

/// A filter as the file writes it: one key.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLogFilter {
    pub status_code: Option<RawComparison>,
    pub duration: Option<RawComparison>,
    pub response_flags: Option<Vec<String>>,
    pub header: Option<RawHeaderMatch>,
    pub expression: Option<String>,
    pub and: Option<Vec<RawLogFilter>>,
    pub or: Option<Vec<RawLogFilter>>,
}

/// `{ eq | ne | ge | le: VALUE }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawComparison {
    pub eq: Option<u64>,
    pub ne: Option<u64>,
    pub ge: Option<u64>,
    pub le: Option<u64>,
}

/// Checks a logger's `filter` (`path`: its key path).
pub(crate) fn log_filter(raw: RawLogFilter, path: &str) -> Result<LogFilter, ConfigError> {
    let list = |raw: Vec<RawLogFilter>, key: &str| -> Result<Vec<LogFilter>, ConfigError> {
        if raw.len() < 2 {
            return Err(ConfigError::invalid(
                format!("{path}.{key}"),
                "expected at least two filters",
            ));
        }
        (raw.into_iter().enumerate())
            .map(|(i, f)| log_filter(f, &format!("{path}.{key}[{i}]")))
            .collect()
    };
    let RawLogFilter {
        status_code,
        duration,
        response_flags,
        header,
        expression,
        and,
        or,
    } = raw;
    let given = [
        status_code.is_some(),
        duration.is_some(),
        response_flags.is_some(),
        header.is_some(),
        expression.is_some(),
        and.is_some(),
        or.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ConfigError::invalid(
            path,
            "expected exactly one of status_code, duration, response_flags, header, expression, and, or",
        ));
    }
    if let Some(c) = status_code {
        return Ok(LogFilter::StatusCode(comparison(
            c,
            &format!("{path}.status_code"),
        )?));
    }
    if let Some(c) = duration {
        return Ok(LogFilter::Duration(comparison(
            c,
            &format!("{path}.duration"),
        )?));
    }
    if let Some(flags) = response_flags {
        if let Some(unknown) = flags.iter().find(|f| !RESPONSE_FLAGS.contains(&f.as_str())) {
            return Err(ConfigError::invalid(
                format!("{path}.response_flags"),
                format!(
                    "`{unknown}` is not a response flag; known: {}",
                    RESPONSE_FLAGS.join(", ")
                ),
            ));
        }
        return Ok(LogFilter::ResponseFlags(flags));
    }
    if let Some(h) = header {
        let at = format!("{path}.header");
        let name = h.name.to_ascii_lowercase();
        if !PSEUDO_HEADERS.contains(&name.as_str())
            && http::HeaderName::from_bytes(name.as_bytes()).is_err()
        {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!("expected a header name, found `{}`", h.name),
            ));
        }
        let value = value_match(&h, &at)?;
        return Ok(LogFilter::Header(LogHeaderMatch { name, value }));
    }
    if let Some(text) = expression {
        return Expr::parse(&text)
            .map(LogFilter::Expression)
            .map_err(|e| ConfigError::invalid(format!("{path}.expression"), e));
    }
    if let Some(all) = and {
        return Ok(LogFilter::And(list(all, "and")?));
    }
    Ok(LogFilter::Or(list(or.unwrap_or_default(), "or")?))
}

fn comparison(raw: RawComparison, path: &str) -> Result<Comparison, ConfigError> {
    match (raw.eq, raw.ne, raw.ge, raw.le) {
        (Some(value), None, None, None) => Ok(Comparison {
            op: CompareOp::Eq,
            value,
        }),
        (None, Some(value), None, None) => Ok(Comparison {
            op: CompareOp::Ne,
            value,
        }),
        (None, None, Some(value), None) => Ok(Comparison {
            op: CompareOp::Ge,
            value,
        }),
        (None, None, None, Some(value)) => Ok(Comparison {
            op: CompareOp::Le,
            value,
        }),
        _ => Err(ConfigError::invalid(
            path,
            "expected exactly one of eq, ne, ge, le",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Facts {
        code: Option<u16>,
        flag: Option<&'static str>,
        duration: u64,
        user_agent: Option<&'static str>,
    }

    impl Attributes for Facts {
        fn response_code(&self) -> Option<u16> {
            self.code
        }
        fn path(&self) -> Option<&str> {
            Some("/")
        }
        fn host(&self) -> Option<&str> {
            None
        }
        fn method(&self) -> Option<&str> {
            Some("GET")
        }
        fn scheme(&self) -> Option<&str> {
            Some("http")
        }
        fn request_header(&self, name: &str) -> Option<&[u8]> {
            match name {
                "user-agent" => self.user_agent.map(str::as_bytes),
                ":path" => Some(b"/"),
                ":method" => Some(b"GET"),
                _ => None,
            }
        }
    }

    impl LogFacts for Facts {
        fn duration_ms(&self) -> u64 {
            self.duration
        }
        fn flag(&self) -> Option<&str> {
            self.flag
        }
    }

    fn filter(yaml: &str) -> LogFilter {
        log_filter(serde_yaml::from_str(yaml).unwrap(), "filter").unwrap()
    }

    #[test]
    fn each_form_picks_what_it_says() {
        let ok = Facts {
            code: Some(200),
            flag: None,
            duration: 5,
            user_agent: Some("kube-probe/1.30"),
        };
        let failed = Facts {
            code: Some(503),
            flag: Some("UF"),
            duration: 1500,
            user_agent: None,
        };
        let cases = [
            ("status_code: { ge: 500 }", false, true),
            ("status_code: { ne: 200 }", false, true),
            ("duration: { ge: 1000 }", false, true),
            ("response_flags: []", false, true),
            ("response_flags: [UT]", false, false),
            (
                "header: { name: user-agent, prefix: kube-probe }",
                true,
                false,
            ),
            ("header: { name: \":path\", exact: / }", true, true),
            ("header: { name: \":Method\", exact: POST }", false, false),
            ("expression: response.code == 200", true, false),
            (
                "and: [ { status_code: { ge: 500 } }, { response_flags: [UF] } ]",
                false,
                true,
            ),
            (
                "or: [ { duration: { le: 10 } }, { response_flags: [UF] } ]",
                true,
                true,
            ),
        ];
        for (yaml, for_ok, for_failed) in cases {
            let f = filter(yaml);
            assert_eq!(f.passes(&ok), for_ok, "{yaml} on a 200");
            assert_eq!(f.passes(&failed), for_failed, "{yaml} on a 503");
        }
        let dumped =
            serde_json::to_value(filter("header: { name: \":Path\", exact: /x }")).unwrap();
        assert_eq!(
            dumped,
            serde_json::json!({"header": {"name": ":path", "exact": "/x"}})
        );
        assert_eq!(
            filter("or: [ { header: { name: User-Agent, present: true } }, { expression: \"request.headers['x-a'] == 'b'\" } ]").headers(),
            ["user-agent", "x-a"]
        );
    }

    #[test]
    fn bad_filters_name_their_key() {
        for (yaml, error) in [
            (
                "status_code: { ge: 500, le: 599 }",
                "filter.status_code: expected exactly one",
            ),
            (
                "response_flags: [XX]",
                "filter.response_flags: `XX` is not a response flag",
            ),
            (
                "and: [ { duration: { ge: 1 } } ]",
                "filter.and: expected at least two",
            ),
            (
                "or: [ { duration: { ge: 1 } }, { expression: 'response.flags' } ]",
                "filter.or[1].expression: the attribute",
            ),
        ] {
            let raw: RawLogFilter = serde_yaml::from_str(yaml).unwrap();
            let found = log_filter(raw, "filter").unwrap_err().to_string();
            assert!(found.contains(error), "{yaml}: {found}");
        }
    }
}
