//! Envoy's matchers (`StringMatcher`, `RegexMatcher`, `HeaderMatcher`) as the configuration
//! file writes them: shared by the route, CORS and health-check translations.

// Control planes still send the deprecated header match forms; they are read, not ignored.
#![allow(deprecated)]

use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, QueryParameterMatcher, header_matcher, query_parameter_matcher,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};

use super::unsupported;
use super::{ResourceError, fields, nothing_else};
use crate::RawHeaderMatch;

/// A `safe_regex`'s pattern (RE2's syntax; the `regex` crate takes the same, linear-time).
pub(crate) fn regex(r: RegexMatcher) -> String {
    // `google_re2.max_program_size` is deprecated; patterns are bounded at load instead.
    r.regex
}

/// A `StringMatcher` as a string pattern alone (no name).
pub(crate) fn pattern_of(
    s: StringMatcher,
    at: &str,
) -> Result<crate::RawStringMatch, ResourceError> {
    let m = string_match(String::new(), s, at)?;
    Ok(crate::RawStringMatch {
        exact: m.exact,
        prefix: m.prefix,
        suffix: m.suffix,
        contains: m.contains,
        regex: m.regex,
    })
}

/// A `StringMatcher` as a header or query parameter match of `name`.
pub(crate) fn string_match(
    name: String,
    s: StringMatcher,
    at: &str,
) -> Result<RawHeaderMatch, ResourceError> {
    use string_matcher::MatchPattern;
    if s.ignore_case {
        return Err(unsupported(at, "ignore_case"));
    }
    let mut raw = RawHeaderMatch {
        name,
        ..Default::default()
    };
    match s.match_pattern {
        Some(MatchPattern::Exact(v)) => raw.exact = Some(v),
        Some(MatchPattern::Prefix(v)) => raw.prefix = Some(v),
        Some(MatchPattern::Suffix(v)) => raw.suffix = Some(v),
        Some(MatchPattern::Contains(v)) => raw.contains = Some(v),
        Some(MatchPattern::SafeRegex(r)) => raw.regex = Some(regex(r)),
        _ => {
            return Err(unsupported(
                at,
                "match_pattern (exact, prefix, suffix, contains and safe_regex only)",
            ));
        }
    }
    Ok(raw)
}

pub(crate) fn header(mut h: HeaderMatcher, at: &str) -> Result<RawHeaderMatch, ResourceError> {
    use header_matcher::HeaderMatchSpecifier as Spec;
    let invert = std::mem::take(&mut h.invert_match);
    let name = std::mem::take(&mut h.name);
    let with = |set: fn(&mut RawHeaderMatch, String), value: String| {
        let mut raw = RawHeaderMatch {
            name: name.clone(),
            ..Default::default()
        };
        set(&mut raw, value);
        raw
    };
    let raw = match h.header_match_specifier.take() {
        Some(Spec::PresentMatch(present)) => RawHeaderMatch {
            name: name.clone(),
            present: Some(present != invert),
            ..Default::default()
        },
        Some(_) if invert => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec!["invert_match (with present_match only)".into()],
            });
        }
        Some(Spec::ExactMatch(value)) => with(|r, v| r.exact = Some(v), value),
        Some(Spec::PrefixMatch(value)) => with(|r, v| r.prefix = Some(v), value),
        Some(Spec::SuffixMatch(value)) => with(|r, v| r.suffix = Some(v), value),
        Some(Spec::ContainsMatch(value)) => with(|r, v| r.contains = Some(v), value),
        Some(Spec::SafeRegexMatch(r)) => with(|r, v| r.regex = Some(v), regex(r)),
        Some(Spec::StringMatch(s)) => string_match(name.clone(), s, &format!("{at}.string_match"))?,
        _ => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec!["header_match_specifier (range_match)".into()],
            });
        }
    };
    nothing_else(&h, fields::HEADER_MATCHER, at)?;
    Ok(raw)
}

/// A `QueryParameterMatcher` (a route's, a rate limit action's).
pub(crate) fn query_parameter(
    mut q: QueryParameterMatcher,
    at: &str,
) -> Result<RawHeaderMatch, ResourceError> {
    use query_parameter_matcher::QueryParameterMatchSpecifier as Spec;
    let name = std::mem::take(&mut q.name);
    let raw = match q.query_parameter_match_specifier.take() {
        Some(Spec::StringMatch(s)) => string_match(name, s, &format!("{at}.string_match"))?,
        Some(Spec::PresentMatch(true)) => RawHeaderMatch {
            name,
            present: Some(true),
            ..Default::default()
        },
        _ => {
            return Err(unsupported(
                at,
                "query_parameter_match_specifier (string_match and present_match: true only)",
            ));
        }
    };
    nothing_else(&q, fields::QUERY_PARAMETER_MATCHER, at)?;
    Ok(raw)
}
