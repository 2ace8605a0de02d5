//! A `hash_policy` as Envoy's routes and clusters send it (`RouteAction.HashPolicy`), in the
//! file's form.

use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};

use super::{RawCookieAttribute, RawCookieHash, RawHashRule};
use crate::envoy::ResourceError;
use crate::envoy::unsupported;

/// A route's or cluster's `hash_policy`. A `connection_properties` rule without `source_ip` hashes
/// nothing and is left out, as Envoy does.
pub(crate) fn hash_policy(
    policies: Vec<HashPolicy>,
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<RawHashRule>, ResourceError> {
    let mut rules = Vec::with_capacity(policies.len());
    for (i, policy) in policies.into_iter().enumerate() {
        let at = format!("{at}.hash_policy[{i}]");
        let mut rule = RawHashRule {
            terminal: policy.terminal,
            ..RawHashRule::default()
        };
        match policy.policy_specifier {
            Some(hash_policy::PolicySpecifier::Header(h)) => {
                if h.regex_rewrite.is_some() {
                    return Err(unsupported(&format!("{at}.header"), "regex_rewrite"));
                }
                rule.header = Some(h.header_name.to_ascii_lowercase());
            }
            Some(hash_policy::PolicySpecifier::Cookie(c)) => {
                let ttl = crate::envoy::duration(c.ttl, &format!("{at}.cookie.ttl"))?;
                rule.cookie = Some(RawCookieHash {
                    name: c.name,
                    ttl,
                    path: Some(c.path).filter(|p| !p.is_empty() && ttl.is_some()),
                    // Only a made cookie carries them; without a `ttl` none is made.
                    attributes: match ttl {
                        None => Vec::new(),
                        Some(_) => c
                            .attributes
                            .into_iter()
                            .map(|a| RawCookieAttribute {
                                name: a.name,
                                value: a.value,
                            })
                            .collect(),
                    },
                });
            }
            Some(hash_policy::PolicySpecifier::ConnectionProperties(p)) => {
                if !p.source_ip {
                    continue;
                }
                rule.source_ip = Some(true);
            }
            Some(hash_policy::PolicySpecifier::QueryParameter(q)) => {
                rule.query_parameter = Some(q.name);
            }
            Some(hash_policy::PolicySpecifier::FilterState(_)) => {
                return Err(unsupported(
                    &at,
                    "filter_state (header, cookie, connection_properties and query_parameter only)",
                ));
            }
            None => return Err(ResourceError::invalid(at, "expected a policy_specifier")),
        }
        rules.push(rule);
    }
    Ok(rules)
}
