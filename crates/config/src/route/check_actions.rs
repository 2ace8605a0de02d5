//! A route's redirect, path rewrites, traffic split and mirrors (the string matchers of its
//! headers and query parameters are in matchers.rs, shared with the filters).

use http::StatusCode;

use crate::matchers::fraction;
use crate::*;

/// `redirect: { ... }`, or `https_redirect: true` (`raw` empty, `https` set).
pub(crate) fn redirect(
    raw: RawRedirect,
    https: bool,
    matcher: &RouteMatch,
    path: &str,
) -> Result<RedirectAction, ConfigError> {
    let scheme = match (raw.scheme, https) {
        (Some(_), true) => {
            return Err(ConfigError::invalid(
                path,
                "expected `https_redirect: true` or `redirect: { scheme }`, not both",
            ));
        }
        (None, true) => Some("https".to_owned()),
        (Some(s), false) => {
            let lower = s.to_ascii_lowercase();
            if lower != "http" && lower != "https" {
                return Err(ConfigError::invalid(
                    format!("{path}.scheme"),
                    format!("expected `http` or `https`, found `{s}`"),
                ));
            }
            Some(lower)
        }
        (None, false) => None,
    };
    let host = raw
        .host
        .map(|h| {
            let valid = !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
            if valid {
                Ok(h.to_ascii_lowercase())
            } else {
                Err(ConfigError::invalid(
                    format!("{path}.host"),
                    format!("expected a host name without a port (see `port`), found `{h}`"),
                ))
            }
        })
        .transpose()?;
    if raw.port == Some(0) {
        return Err(ConfigError::invalid(
            format!("{path}.port"),
            "expected a port from 1 to 65535",
        ));
    }
    let redirect_path = match (raw.path, raw.prefix_rewrite, raw.regex_rewrite) {
        (Some(p), None, None) => Some(RedirectPath::Path(location_path(
            p,
            &format!("{path}.path"),
        )?)),
        (None, Some(p), None) => {
            prefix_route(matcher, &format!("{path}.prefix_rewrite"))?;
            Some(RedirectPath::PrefixRewrite(rewritten_prefix(
                p,
                &format!("{path}.prefix_rewrite"),
            )?))
        }
        (None, None, Some(r)) => Some(RedirectPath::RegexRewrite(regex_rewrite(
            r,
            &format!("{path}.regex_rewrite"),
        )?)),
        (None, None, None) => None,
        _ => {
            return Err(ConfigError::invalid(
                path,
                "expected one of `path`, `prefix_rewrite` and `regex_rewrite`",
            ));
        }
    };
    let status = match raw.status {
        None => StatusCode::MOVED_PERMANENTLY,
        Some(code @ (301 | 302 | 303 | 307 | 308)) => {
            StatusCode::from_u16(code).unwrap_or(StatusCode::MOVED_PERMANENTLY)
        }
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.status"),
                format!("expected 301, 302, 303, 307 or 308, found {other}"),
            ));
        }
    };
    Ok(RedirectAction {
        scheme,
        host,
        port: raw.port,
        path: redirect_path,
        status,
        strip_query: raw.strip_query,
    })
}

/// A redirect's or rewrite's prefix replaces what the route's prefix or path matched: a regex
/// route has no such part.
fn prefix_route(matcher: &RouteMatch, path: &str) -> Result<(), ConfigError> {
    if matches!(matcher.path, PathMatch::Regex(_) | PathMatch::Connect) {
        return Err(ConfigError::invalid(
            path,
            "a prefix rewrite needs a route matching by `prefix` or `path` (use `regex_rewrite` with `regex`; CONNECT has no path)",
        ));
    }
    Ok(())
}

/// Characters a path may carry as it is (RFC 3986 `pchar`, `/`, and `%` escapes).
fn is_path_text(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b))
}

fn location_path(value: String, path: &str) -> Result<String, ConfigError> {
    if value.starts_with('/') && is_path_text(&value) {
        Ok(value)
    } else {
        Err(ConfigError::invalid(
            path,
            format!("expected a path starting with `/`, found `{value}`"),
        ))
    }
}

/// What a matched prefix becomes: empty, or path text (a missing leading `/` is the
/// request's business: `/api` rewritten to `v2` gives `v2/x`, which Envoy sends as it is).
fn rewritten_prefix(value: String, path: &str) -> Result<String, ConfigError> {
    if is_path_text(&value) {
        Ok(value)
    } else {
        Err(ConfigError::invalid(
            path,
            format!("expected path characters, found `{value}`"),
        ))
    }
}

/// `prefix_rewrite` or `regex_rewrite` of a forwarding route.
pub(crate) fn path_rewrite(
    prefix: Option<String>,
    regex: Option<RawRegexRewrite>,
    matcher: &RouteMatch,
    path: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<PathRewrite>, ConfigError> {
    match (prefix, regex) {
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            path.to_string(),
            "expected `prefix_rewrite` or `regex_rewrite`, not both",
        )),
        (Some(p), None) => {
            prefix_route(matcher, &format!("{path}.prefix_rewrite"))?;
            Ok(Some(PathRewrite::PrefixRewrite(rewritten_prefix(
                p,
                &format!("{path}.prefix_rewrite"),
            )?)))
        }
        (None, Some(raw)) => Ok(Some(PathRewrite::RegexRewrite(regex_rewrite(
            raw,
            &format!("{path}.regex_rewrite"),
        )?))),
        (None, None) => Ok(None),
    }
}

/// A pattern and its substitution (`\\1` for a group), checked.
pub(crate) fn regex_rewrite(raw: RawRegexRewrite, at: &str) -> Result<RegexRewrite, ConfigError> {
    let pattern = regex::RegexBuilder::new(&raw.pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            ConfigError::invalid(
                format!("{at}.pattern"),
                format!("invalid regex `{}`: {e}", raw.pattern),
            )
        })?;
    let replacement = substitution(&raw.substitution, pattern.captures_len())
        .map_err(|e| ConfigError::invalid(format!("{at}.substitution"), e))?;
    Ok(RegexRewrite {
        pattern,
        substitution: raw.substitution,
        replacement,
    })
}

/// An RE2-style substitution (`\1` for group 1, `\\` for a backslash) in the `regex` crate's
/// form (`${1}`, `$$` for a dollar), checked for path characters and known groups.
fn substitution(value: &str, groups: usize) -> Result<String, String> {
    let mut out = String::with_capacity(value.len() + 8);
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(d) if d.is_ascii_digit() => {
                    let group = d as usize - '0' as usize;
                    if group >= groups {
                        return Err(format!(
                            "`\\{group}` names a group the pattern does not have"
                        ));
                    }
                    out.push_str(&format!("${{{group}}}"));
                }
                Some('\\') => return Err("a backslash is not a path character".into()),
                _ => return Err("expected a digit after `\\`".into()),
            },
            '$' => out.push_str("$$"),
            c if c.is_ascii() && is_path_text(c.encode_utf8(&mut [0; 4])) => out.push(c),
            c => return Err(format!("`{c}` is not a path character")),
        }
    }
    Ok(out)
}

/// `weighted_clusters` (and what draws one: `hash_key`, `random_value_header` or
/// `use_hash_policy`).
pub(crate) fn split(
    raw: Vec<RawWeightedCluster>,
    (key, random_value_header, use_hash_policy): (Option<RawHashKey>, Option<String>, bool),
    clusters: &crate::cluster::ClusterIndex<'_>,
    known: &[Arc<ClusterConfig>],
    chain: &[ChainFilter],
    path: &str,
) -> Result<TrafficSplit, ConfigError> {
    let mut list = Vec::with_capacity(raw.len());
    for (i, w) in raw.into_iter().enumerate() {
        let at = format!("{path}.weighted_clusters[{i}]");
        // A cluster may be listed twice (Envoy Gateway merges backends so): each entry is
        // drawn by its own weight, with its own header rules, as in Envoy.
        let target = target(
            &w.cluster,
            w.cluster_header.as_deref(),
            (clusters, known),
            &at,
        )?;
        if w.weight == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.weight"),
                "expected a weight of at least 1 (leave a cluster out to send it nothing)",
            ));
        }
        let headers = match w.headers {
            None => None,
            Some(_) if !chain.iter().any(|f| f.name == "headers") => {
                return Err(ConfigError::invalid(
                    format!("{at}.headers"),
                    "the listener has no `headers` filter in its http_filters",
                ));
            }
            Some(raw) => Some(crate::filters::headers::header_rules(
                raw,
                &format!("{at}.headers"),
                true,
            )?),
        };
        let host_rewrite = w
            .host_rewrite
            .map(|h| super::check::host_rewrite(&h, &format!("{at}.host_rewrite")))
            .transpose()?;
        list.push(WeightedCluster {
            target,
            name: w.cluster,
            weight: w.weight,
            headers,
            host_rewrite,
        });
    }
    let weights: Vec<u32> = list.iter().map(|c| c.weight).collect();
    let split = balancer::WeightedSplit::new(&weights).ok_or_else(|| {
        ConfigError::invalid(
            format!("{path}.weighted_clusters"),
            "expected at least one cluster",
        )
    })?;
    let hash_key = key
        .map(|k| crate::cluster::check::hash_key(&k, &format!("{path}.hash_key")))
        .transpose()?;
    let random_value_header = random_value_header
        .map(|name| {
            http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                ConfigError::invalid(
                    format!("{path}.random_value_header"),
                    format!("expected a header name, found `{name}`"),
                )
            })
        })
        .transpose()?;
    let given = [
        hash_key.is_some(),
        random_value_header.is_some(),
        use_hash_policy,
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(ConfigError::invalid(
            path,
            "expected one of `hash_key`, `random_value_header` and `use_hash_policy`",
        ));
    }
    Ok(TrafficSplit {
        clusters: list,
        hash_key,
        random_value_header,
        use_hash_policy,
        split,
    })
}

/// A split's or mirror's `cluster`, or the `cluster_header` naming it per request: one of
/// the two.
fn target(
    name: &str,
    header: Option<&str>,
    (clusters, known): (&crate::cluster::ClusterIndex<'_>, &[Arc<ClusterConfig>]),
    at: &str,
) -> Result<ClusterTarget, ConfigError> {
    match header {
        None => Ok(ClusterTarget::Index(cluster(
            name,
            clusters,
            known,
            &format!("{at}.cluster"),
        )?)),
        Some(_) if !name.is_empty() => Err(ConfigError::invalid(
            at,
            "expected `cluster` or `cluster_header`, not both",
        )),
        Some(header) => cluster_header(header, &format!("{at}.cluster_header")),
    }
}

/// A `cluster_header`: a header, or `:authority` (the request's host), the one pseudo-header
/// that names a cluster.
pub(crate) fn cluster_header(name: &str, path: &str) -> Result<ClusterTarget, ConfigError> {
    if name.eq_ignore_ascii_case(":authority") {
        return Ok(ClusterTarget::Authority);
    }
    Ok(ClusterTarget::Header(header_name(name, path)?))
}

/// A header named in the config (lower case, as HTTP/2 sends it).
pub(crate) fn header_name(name: &str, path: &str) -> Result<http::HeaderName, ConfigError> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| ConfigError::invalid(path, format!("expected a header name, found `{name}`")))
}

/// A cluster's index by name.
pub(crate) fn cluster(
    name: &str,
    clusters: &crate::cluster::ClusterIndex<'_>,
    known: &[Arc<ClusterConfig>],
    path: &(impl std::fmt::Display + ?Sized),
) -> Result<usize, ConfigError> {
    clusters.get(name).copied().ok_or_else(|| {
        let known: Vec<&str> = known.iter().map(|c| c.name.as_str()).collect();
        ConfigError::invalid(
            path.to_string(),
            if known.is_empty() {
                format!("unknown cluster `{name}`: no clusters are defined")
            } else {
                format!(
                    "unknown cluster `{name}`; defined clusters: {}",
                    known.join(", ")
                )
            },
        )
    })
}

/// `request_mirror_policies`.
pub(crate) fn mirrors(
    raw: Vec<RawMirrorPolicy>,
    clusters: &crate::cluster::ClusterIndex<'_>,
    known: &[Arc<ClusterConfig>],
    path: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<MirrorPolicy>, ConfigError> {
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    raw.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("{path}.request_mirror_policies[{i}]");
            let cluster = target(
                &m.cluster,
                m.cluster_header.as_deref(),
                (clusters, known),
                &at,
            )?;
            let fraction = match m.fraction {
                None => 1_000_000,
                Some(value) => fraction(&value).ok_or_else(|| {
                    ConfigError::invalid(
                        format!("{at}.fraction"),
                        "expected a percentage from 0% to 100% (`10%`, `0.5%`)",
                    )
                })?,
            };
            Ok(MirrorPolicy {
                cluster,
                cluster_name: m.cluster,
                fraction,
                disable_shadow_host_suffix_append: m
                    .disable_shadow_host_suffix_append
                    .unwrap_or(false),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutions_become_the_regex_crates_form() {
        assert_eq!(substitution("/v2/\\1", 2).unwrap(), "/v2/${1}");
        assert_eq!(substitution("/a$b", 1).unwrap(), "/a$$b");
        assert!(substitution("/\\2", 2).unwrap_err().contains("group"));
        assert!(
            substitution("/a b", 1)
                .unwrap_err()
                .contains("path character")
        );
        assert!(substitution("/\\x", 1).is_err());
    }

    #[test]
    fn fractions_are_percentages() {
        let f = |s: &str| fraction(&serde_yaml::from_str(s).unwrap());
        assert_eq!(f("10%"), Some(100_000));
        assert_eq!(f("\"0.5%\""), Some(5_000));
        assert_eq!(f("100"), Some(1_000_000));
        assert_eq!(f("101%"), None);
        assert_eq!(f("ten"), None);
    }
}
