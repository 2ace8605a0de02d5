//! Envoy's `RBAC` and `RBACPerRoute` (the `envoy.filters.http.rbac` filter) as the `rbac`
//! filter's settings, in both of Envoy's forms: `rules` (policies of permissions and
//! principals, Istio's) and `matcher` (a matcher list of `envoy.config.rbac.v3.Action`s,
//! Envoy Gateway's). `matcher` is taken over `rules` when both are set, as Envoy does.
//! Metadata is read where the `jwt_authn` filter writes it (JWT claims); what changes a
//! decision and is not here is refused by name: other filters' metadata, filter state, CEL
//! conditions, URI templates, audit loggers and per-rule stats.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::rbac::v3::{
    Action, Permission, Policy, Principal, Rbac as Rules, permission, principal,
};
use envoy_types::pb::envoy::config::route::v3::HeaderMatcher;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::{Rbac, RbacPerRoute};
use envoy_types::pb::envoy::extensions::matching::input_matchers::ip::v3::Ip;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    HttpRequestHeaderMatchInput, RegexMatcher, StringMatcher, string_matcher,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::xds::core::v3::TypedExtensionConfig;
use envoy_types::pb::xds::r#type::matcher::v3::Matcher;
use envoy_types::pb::xds::r#type::matcher::v3::matcher::matcher_list::Predicate;
use envoy_types::pb::xds::r#type::matcher::v3::matcher::matcher_list::predicate::{
    MatchType, SinglePredicate, single_predicate,
};
use envoy_types::pb::xds::r#type::matcher::v3::matcher::{MatcherType, OnMatch, on_match};

use envoy_types::pb::envoy::extensions::matching::common_inputs::network::v3::{
    DynamicMetadataInput, dynamic_metadata_input,
};
use envoy_types::pb::envoy::extensions::matching::input_matchers::metadata::v3::Metadata as MetadataInputMatcher;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    MetadataMatcher, ValueMatcher, list_matcher, metadata_matcher, value_matcher,
};

use crate::envoy::unsupported;
use super::{
    RawMatch, RawMetadataMatch, RawPolicy, RawRbac, RawRbacRules, RawRule, RawMetadataValue,
    RbacAction,
};
use crate::RawStringMatch;
use crate::envoy::{ResourceError, decode, matchers};
use crate::filters::RawPerRoute;

pub(crate) const TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute";
const ACTION: &str = "type.googleapis.com/envoy.config.rbac.v3.Action";
const HEADER_INPUT: &str = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput";
const INPUTS: &str = "type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.";
const METADATA_MATCHER: &str =
    "type.googleapis.com/envoy.extensions.matching.input_matchers.metadata.v3.Metadata";
const IP_MATCHER: &str =
    "type.googleapis.com/envoy.extensions.matching.input_matchers.ip.v3.Ip";

/// Deeper nesting is refused (the file's bound).
const MAX_DEPTH: usize = super::MAX_DEPTH;

/// The listener's filter.
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawRbac, ResourceError> {
    let rbac: Rbac = decode(any, TYPE_URL, "an RBAC filter")?;
    from_rbac(rbac, at)
}

/// A route's or virtual host's entry: its own settings, which replace the listener's; no
/// `rbac` is settings without rules (nothing enforced there, whatever a route below turns
/// on, as in Envoy).
pub(crate) fn per_route(any: &Any, at: &str) -> Result<RawPerRoute<RawRbac>, ResourceError> {
    let per_route: RbacPerRoute = decode(any, PER_ROUTE, "an RBACPerRoute")?;
    Ok(RawPerRoute::Settings(match per_route.rbac {
        None => RawRbac::default(),
        Some(rbac) => from_rbac(rbac, &format!("{at}.rbac"))?,
    }))
}

pub(crate) const NETWORK_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";

/// Envoy's network `rbac` filter before a TCP proxy: its rules, read as the HTTP filter's.
/// Both enforcement types decide alike here (the rules read only the connection, which the
/// bytes after the first do not change); `delay_deny` is refused.
pub(crate) fn network(any: &Any, at: &str) -> Result<RawRbac, ResourceError> {
    use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
    let rbac: NetworkRbac = decode(any, NETWORK_TYPE_URL, "a network RBAC filter")?;
    if rbac.delay_deny.is_some() {
        return Err(unsupported(at, "delay_deny"));
    }
    // `stat_prefix` names the counters, which are the listener's here.
    from_rbac(
        Rbac {
            rules: rbac.rules,
            matcher: rbac.matcher,
            shadow_rules: rbac.shadow_rules,
            shadow_matcher: rbac.shadow_matcher,
            shadow_rules_stat_prefix: rbac.shadow_rules_stat_prefix,
            ..Default::default()
        },
        at,
    )
}

fn from_rbac(rbac: Rbac, at: &str) -> Result<RawRbac, ResourceError> {
    if rbac.track_per_rule_stats {
        return Err(unsupported(at, "track_per_rule_stats (per-policy counters)"));
    }
    let engine = |matcher: Option<Matcher>, rules: Option<Rules>, key: &str, rules_key: &str| {
        match (matcher, rules) {
            (Some(m), _) => matcher_rules(m, &format!("{at}.{key}")).map(Some),
            (None, Some(r)) => policy_rules(r, &format!("{at}.{rules_key}")).map(Some),
            (None, None) => Ok(None),
        }
    };
    Ok(RawRbac {
        rules: engine(rbac.matcher, rbac.rules, "matcher", "rules")?,
        shadow_rules: engine(
            rbac.shadow_matcher,
            rbac.shadow_rules,
            "shadow_matcher",
            "shadow_rules",
        )?,
        rules_stat_prefix: rbac.rules_stat_prefix,
        shadow_rules_stat_prefix: rbac.shadow_rules_stat_prefix,
    })
}

fn action_of(value: i32, at: &str) -> Result<RbacAction, ResourceError> {
    match value {
        0 => Ok(RbacAction::Allow),
        1 => Ok(RbacAction::Deny),
        2 => Ok(RbacAction::Log),
        other => Err(ResourceError::invalid(at, format!("unknown action {other}"))),
    }
}

/// The policy form (`envoy.config.rbac.v3.RBAC`).
fn policy_rules(rules: Rules, at: &str) -> Result<RawRbacRules, ResourceError> {
    if rules.audit_logging_options.is_some() {
        return Err(unsupported(at, "audit_logging_options"));
    }
    let mut policies = BTreeMap::new();
    for (name, policy) in rules.policies {
        let at = format!("{at}.policies.{name}");
        policies.insert(name, policy_of(policy, &at)?);
    }
    Ok(RawRbacRules {
        action: Some(action_of(rules.action, &format!("{at}.action"))?),
        policies: Some(policies),
        ..Default::default()
    })
}

fn policy_of(policy: Policy, at: &str) -> Result<RawPolicy, ResourceError> {
    if policy.condition.is_some() || policy.checked_condition.is_some() {
        return Err(unsupported(at, "condition (CEL)"));
    }
    if policy.cel_config.is_some() {
        return Err(unsupported(at, "cel_config"));
    }
    let permissions = (policy.permissions.into_iter().enumerate())
        .map(|(i, p)| permission_of(p, &format!("{at}.permissions[{i}]"), 0))
        .collect::<Result<_, _>>()?;
    let principals = (policy.principals.into_iter().enumerate())
        .map(|(i, p)| principal_of(p, &format!("{at}.principals[{i}]"), 0))
        .collect::<Result<_, _>>()?;
    Ok(RawPolicy {
        permissions,
        principals,
    })
}

fn deeper(at: &str, depth: usize) -> Result<usize, ResourceError> {
    if depth >= MAX_DEPTH {
        return Err(ResourceError::invalid(
            at,
            format!("nested more than {MAX_DEPTH} deep"),
        ));
    }
    Ok(depth + 1)
}

#[allow(deprecated)] // `metadata`: read, whatever Envoy calls it
fn permission_of(p: Permission, at: &str, depth: usize) -> Result<RawMatch, ResourceError> {
    use permission::Rule;
    let depth = deeper(at, depth)?;
    let set = |rules: Vec<Permission>, key: &str| {
        (rules.into_iter().enumerate())
            .map(|(i, p)| permission_of(p, &format!("{at}.{key}.rules[{i}]"), depth))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match p.rule {
        Some(Rule::AndRules(s)) => RawMatch::And(set(s.rules, "and_rules")?),
        Some(Rule::OrRules(s)) => RawMatch::Or(set(s.rules, "or_rules")?),
        Some(Rule::Any(any)) => RawMatch::Any(any),
        Some(Rule::Header(h)) => header(h, &format!("{at}.header"))?,
        Some(Rule::UrlPath(p)) => url_path(p, &format!("{at}.url_path"))?,
        Some(Rule::DestinationIp(c)) => RawMatch::DestinationIp(vec![cidr(&c)]),
        Some(Rule::DestinationPort(port)) => RawMatch::DestinationPort(port),
        Some(Rule::DestinationPortRange(r)) => {
            let port = |v: i32| {
                u32::try_from(v).map_err(|_| {
                    ResourceError::invalid(format!("{at}.destination_port_range"), "expected ports")
                })
            };
            RawMatch::DestinationPortRange {
                start: port(r.start)?,
                end: port(r.end)?,
            }
        }
        Some(Rule::NotRule(inner)) => {
            RawMatch::Not(Box::new(permission_of(*inner, &format!("{at}.not_rule"), depth)?))
        }
        Some(Rule::RequestedServerName(s)) => {
            RawMatch::RequestedServerName(string(s, &format!("{at}.requested_server_name"))?)
        }
        Some(Rule::Metadata(m)) => metadata_of(m, &format!("{at}.metadata"))?,
        Some(Rule::SourcedMetadata(_)) => return Err(unsupported(at, "sourced_metadata")),
        Some(Rule::Matcher(m)) => return Err(unsupported(at, format!("matcher `{}`", m.name))),
        Some(Rule::UriTemplate(_)) => return Err(unsupported(at, "uri_template")),
        None => return Err(ResourceError::invalid(at, "expected a rule")),
    })
}

#[allow(deprecated)] // `source_ip` and `metadata`: read, as Envoy still sends them
fn principal_of(p: Principal, at: &str, depth: usize) -> Result<RawMatch, ResourceError> {
    use principal::Identifier;
    let depth = deeper(at, depth)?;
    let set = |ids: Vec<Principal>, key: &str| {
        (ids.into_iter().enumerate())
            .map(|(i, p)| principal_of(p, &format!("{at}.{key}.ids[{i}]"), depth))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match p.identifier {
        Some(Identifier::AndIds(s)) => RawMatch::And(set(s.ids, "and_ids")?),
        Some(Identifier::OrIds(s)) => RawMatch::Or(set(s.ids, "or_ids")?),
        Some(Identifier::Any(any)) => RawMatch::Any(any),
        Some(Identifier::Authenticated(a)) => RawMatch::Authenticated(
            a.principal_name
                .map(|s| string(s, &format!("{at}.authenticated.principal_name")))
                .transpose()?,
        ),
        Some(Identifier::SourceIp(c)) => RawMatch::SourceIp(vec![cidr(&c)]),
        Some(Identifier::DirectRemoteIp(c)) => RawMatch::DirectRemoteIp(vec![cidr(&c)]),
        Some(Identifier::RemoteIp(c)) => RawMatch::RemoteIp(vec![cidr(&c)]),
        Some(Identifier::Header(h)) => header(h, &format!("{at}.header"))?,
        Some(Identifier::UrlPath(p)) => url_path(p, &format!("{at}.url_path"))?,
        Some(Identifier::NotId(inner)) => {
            RawMatch::Not(Box::new(principal_of(*inner, &format!("{at}.not_id"), depth)?))
        }
        Some(Identifier::Metadata(m)) => metadata_of(m, &format!("{at}.metadata"))?,
        Some(Identifier::FilterState(_)) => return Err(unsupported(at, "filter_state")),
        Some(Identifier::SourcedMetadata(_)) => return Err(unsupported(at, "sourced_metadata")),
        Some(Identifier::Custom(c)) => return Err(unsupported(at, format!("custom `{}`", c.name))),
        None => return Err(ResourceError::invalid(at, "expected an identifier")),
    })
}

fn cidr(c: &CidrRange) -> String {
    let len = c.prefix_len.as_ref().map_or(0, |l| l.value);
    format!("{}/{len}", c.address_prefix)
}

/// A `StringMatcher`, `ignore_case` folded into a regex.
fn string(s: StringMatcher, at: &str) -> Result<RawStringMatch, ResourceError> {
    matchers::pattern_of(fold_case(s), at)
}

/// `ignore_case` as a regex over the same strings, ASCII letters folded as Envoy folds them
/// (and nothing else). With `safe_regex`, where Envoy refuses it, it is left for the
/// caller's refusal by name.
fn fold_case(mut s: StringMatcher) -> StringMatcher {
    use string_matcher::MatchPattern;
    if !s.ignore_case {
        return s;
    }
    // Any bytes, valid UTF-8 or not: a header value may carry any.
    let any = "(?s-u:.)*";
    let regex = match &s.match_pattern {
        Some(MatchPattern::Exact(v)) => folded(v),
        Some(MatchPattern::Prefix(v)) => format!("{}{any}", folded(v)),
        Some(MatchPattern::Suffix(v)) => format!("{any}{}", folded(v)),
        Some(MatchPattern::Contains(v)) => format!("{any}{}{any}", folded(v)),
        _ => return s,
    };
    s.ignore_case = false;
    s.match_pattern = Some(MatchPattern::SafeRegex(RegexMatcher {
        regex,
        ..Default::default()
    }));
    s
}

/// `text` as a regex matching it with ASCII letters in either case.
fn folded(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 4);
    for c in text.chars() {
        if c.is_ascii_alphabetic() {
            out.push('[');
            out.push(c.to_ascii_lowercase());
            out.push(c.to_ascii_uppercase());
            out.push(']');
        } else {
            out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4])));
        }
    }
    out
}

/// A `HeaderMatcher`. `invert_match` inverts a value match over the header's values, and
/// a request without the header still does not match (Envoy's way); it inverts presence.
fn header(mut h: HeaderMatcher, at: &str) -> Result<RawMatch, ResourceError> {
    use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
    let invert = std::mem::take(&mut h.invert_match);
    let on_presence = matches!(
        h.header_match_specifier,
        Some(HeaderMatchSpecifier::PresentMatch(_))
    );
    if let Some(HeaderMatchSpecifier::StringMatch(s)) = &mut h.header_match_specifier {
        *s = fold_case(std::mem::take(s));
    }
    let name = h.name.clone();
    let header = RawMatch::Header(matchers::header(h, at)?);
    Ok(match (invert, on_presence) {
        (false, _) => header,
        (true, true) => RawMatch::Not(Box::new(header)),
        (true, false) => RawMatch::And(vec![
            RawMatch::Header(crate::RawHeaderMatch {
                name,
                present: Some(true),
                ..Default::default()
            }),
            RawMatch::Not(Box::new(header)),
        ]),
    })
}

fn url_path(
    p: envoy_types::pb::envoy::r#type::matcher::v3::PathMatcher,
    at: &str,
) -> Result<RawMatch, ResourceError> {
    use envoy_types::pb::envoy::r#type::matcher::v3::path_matcher::Rule;
    match p.rule {
        Some(Rule::Path(s)) => Ok(RawMatch::Path(string(s, &format!("{at}.path"))?)),
        None => Err(ResourceError::invalid(at, "expected a path")),
    }
}

/// The matcher form: a list of predicates, each with an `Action`; `on_no_match` (absent:
/// deny, as Envoy).
fn matcher_rules(m: Matcher, at: &str) -> Result<RawRbacRules, ResourceError> {
    let on_no_match = m
        .on_no_match
        .map(|on| rule_action(*on, &format!("{at}.on_no_match")))
        .transpose()?
        .map(|(_, action)| action);
    let list = match m.matcher_type {
        None => Vec::new(),
        Some(MatcherType::MatcherList(list)) => list.matchers,
        Some(MatcherType::MatcherTree(_)) => return Err(unsupported(at, "matcher_tree")),
    };
    let mut matchers = Vec::with_capacity(list.len());
    for (i, field) in list.into_iter().enumerate() {
        let at = format!("{at}.matcher_list.matchers[{i}]");
        let predicate = field
            .predicate
            .ok_or_else(|| ResourceError::invalid(&at, "expected a predicate"))?;
        let when = predicate_of(predicate, &format!("{at}.predicate"), 0)?;
        let on_match = field
            .on_match
            .ok_or_else(|| ResourceError::invalid(&at, "expected an on_match"))?;
        let (name, action) = rule_action(on_match, &format!("{at}.on_match"))?;
        matchers.push(RawRule {
            name: if name.is_empty() { format!("rule[{i}]") } else { name },
            action,
            when,
        });
    }
    Ok(RawRbacRules {
        matchers: Some(matchers),
        on_no_match,
        ..Default::default()
    })
}

/// An `on_match` or `on_no_match`: its `Action`'s name (the policy's) and decision.
fn rule_action(on: OnMatch, at: &str) -> Result<(String, RbacAction), ResourceError> {
    if on.keep_matching {
        return Err(unsupported(at, "keep_matching"));
    }
    let extension: TypedExtensionConfig = match on.on_match {
        Some(on_match::OnMatch::Action(action)) => action,
        Some(on_match::OnMatch::Matcher(_)) => return Err(unsupported(at, "a nested matcher")),
        None => return Err(ResourceError::invalid(at, "expected an action")),
    };
    let at = format!("{at}.action");
    let Some(any) = extension.typed_config.filter(|a| a.type_url == ACTION) else {
        return Err(unsupported(
            &at,
            format!("action `{}` (envoy.config.rbac.v3.Action only)", extension.name),
        ));
    };
    let action: Action = decode(&any, ACTION, "an RBAC Action")?;
    let decision = action_of(action.action, &format!("{at}.action"))?;
    let name = match action.name.is_empty() {
        true => extension.name,
        false => action.name,
    };
    Ok((name, decision))
}

/// A predicate over the request and its connection.
fn predicate_of(p: Predicate, at: &str, depth: usize) -> Result<RawMatch, ResourceError> {
    let depth = deeper(at, depth)?;
    let list = |list: Vec<Predicate>, key: &str| {
        // Envoy's validation: a list of fewer than two is invalid.
        if list.len() < 2 {
            return Err(ResourceError::invalid(
                format!("{at}.{key}.predicate"),
                "expected at least two predicates",
            ));
        }
        (list.into_iter().enumerate())
            .map(|(i, p)| predicate_of(p, &format!("{at}.{key}.predicate[{i}]"), depth))
            .collect::<Result<Vec<_>, _>>()
    };
    match p.match_type {
        Some(MatchType::SinglePredicate(single)) => {
            single_of(single, &format!("{at}.single_predicate"))
        }
        Some(MatchType::OrMatcher(or)) => Ok(RawMatch::Or(list(or.predicate, "or_matcher")?)),
        Some(MatchType::AndMatcher(and)) => Ok(RawMatch::And(list(and.predicate, "and_matcher")?)),
        Some(MatchType::NotMatcher(not)) => Ok(RawMatch::Not(Box::new(predicate_of(
            *not,
            &format!("{at}.not_matcher"),
            depth,
        )?))),
        None => Err(ResourceError::invalid(at, "expected a predicate")),
    }
}

/// A `MetadataMatcher` (rules form): the filter's value at the path, matched.
fn metadata_of(m: MetadataMatcher, at: &str) -> Result<RawMatch, ResourceError> {
    let path = (m.path.into_iter())
        .map(|segment| match segment.segment {
            Some(metadata_matcher::path_segment::Segment::Key(key)) => key,
            None => String::new(),
        })
        .collect();
    Ok(RawMatch::Metadata(RawMetadataMatch {
        filter: m.filter,
        path,
        value: value_of(m.value, &format!("{at}.value"), 0)?,
        invert: m.invert,
    }))
}

/// A `ValueMatcher`: a string, a boolean, presence, a list holding a match, or any of several.
fn value_of(m: Option<ValueMatcher>, at: &str, depth: usize) -> Result<RawMetadataValue, ResourceError> {
    use value_matcher::MatchPattern;
    if depth > MAX_DEPTH {
        return Err(ResourceError::invalid(at, "nested too deep"));
    }
    let pattern = m
        .and_then(|m| m.match_pattern)
        .ok_or_else(|| ResourceError::invalid(at, "expected a value match"))?;
    Ok(match pattern {
        MatchPattern::StringMatch(s) => {
            let p = string(s, at)?;
            RawMetadataValue {
                exact: p.exact,
                prefix: p.prefix,
                suffix: p.suffix,
                contains: p.contains,
                regex: p.regex,
                ..Default::default()
            }
        }
        MatchPattern::BoolMatch(b) => RawMetadataValue { bool: Some(b), ..Default::default() },
        MatchPattern::PresentMatch(p) => RawMetadataValue { present: Some(p), ..Default::default() },
        MatchPattern::ListMatch(list) => {
            let Some(list_matcher::MatchPattern::OneOf(inner)) = list.match_pattern else {
                return Err(ResourceError::invalid(at, "expected a list match's one_of"));
            };
            RawMetadataValue {
                list_contains: Some(Box::new(value_of(Some(*inner), &format!("{at}.one_of"), depth + 1)?)),
                ..Default::default()
            }
        }
        MatchPattern::OrMatch(or) => RawMetadataValue {
            or: Some(
                (or.value_matchers.into_iter().enumerate())
                    .map(|(i, m)| value_of(Some(m), &format!("{at}.or_match[{i}]"), depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            ..Default::default()
        },
        MatchPattern::DoubleMatch(_) => return Err(unsupported(at, "double_match")),
        MatchPattern::NullMatch(_) => return Err(unsupported(at, "null_match")),
    })
}

/// One input and what its value must be: a request header by a string match; the client's,
/// the peer's or the destination's address by an `Ip` matcher; the destination port or the
/// server name by a string match.
fn single_of(single: SinglePredicate, at: &str) -> Result<RawMatch, ResourceError> {
    let input = single
        .input
        .and_then(|i| i.typed_config)
        .ok_or_else(|| ResourceError::invalid(format!("{at}.input"), "expected an input"))?;
    let value_at = format!("{at}.value_match");
    // xDS's StringMatcher is Envoy's, field for field, so its encoding reads as one.
    let value = |m: &single_predicate::Matcher| -> Result<StringMatcher, ResourceError> {
        match m {
            single_predicate::Matcher::ValueMatch(m) => {
                prost::Message::decode(prost::Message::encode_to_vec(m).as_slice())
                    .map_err(|e| ResourceError::invalid(&value_at, e.to_string()))
            }
            single_predicate::Matcher::CustomMatch(c) => Err(unsupported(
                &format!("{at}.custom_match"),
                format!("custom_match `{}` for this input", c.name),
            )),
        }
    };
    let nets = |m: &single_predicate::Matcher| -> Result<Vec<String>, ResourceError> {
        let custom_at = format!("{at}.custom_match");
        match m {
            single_predicate::Matcher::CustomMatch(c) => {
                let any = c.typed_config.as_ref().filter(|a| a.type_url == IP_MATCHER);
                let Some(any) = any else {
                    return Err(unsupported(
                        &custom_at,
                        format!("custom_match `{}` (the Ip matcher only)", c.name),
                    ));
                };
                let ip: Ip = decode(any, IP_MATCHER, "an Ip matcher")?;
                Ok(ip.cidr_ranges.iter().map(cidr).collect())
            }
            single_predicate::Matcher::ValueMatch(_) => Err(unsupported(
                &value_at,
                "value_match on an address (an Ip custom_match only)",
            )),
        }
    };
    let matcher = single
        .matcher
        .ok_or_else(|| ResourceError::invalid(at, "expected a value_match or custom_match"))?;
    let kind = input.type_url.strip_prefix(INPUTS).unwrap_or("");
    Ok(match (input.type_url.as_str(), kind) {
        (HEADER_INPUT, _) => {
            let header: HttpRequestHeaderMatchInput =
                decode(&input, HEADER_INPUT, "an HttpRequestHeaderMatchInput")?;
            let raw = matchers::string_match(
                header.header_name.to_ascii_lowercase(),
                fold_case(value(&matcher)?),
                &value_at,
            )?;
            RawMatch::Header(raw)
        }
        (_, "DynamicMetadataInput") => {
            let input: DynamicMetadataInput = decode(&input, &format!("{INPUTS}DynamicMetadataInput"), "a DynamicMetadataInput")?;
            let custom_at = format!("{at}.custom_match");
            let single_predicate::Matcher::CustomMatch(custom) = &matcher else {
                return Err(unsupported(&value_at, "value_match on metadata (a Metadata custom_match only)"));
            };
            let any = custom.typed_config.as_ref().filter(|a| a.type_url == METADATA_MATCHER);
            let Some(any) = any else {
                return Err(unsupported(
                    &custom_at,
                    format!("custom_match `{}` on metadata (the Metadata matcher only)", custom.name),
                ));
            };
            let m: MetadataInputMatcher = decode(any, METADATA_MATCHER, "a Metadata matcher")?;
            let path = (input.path.into_iter())
                .map(|segment| match segment.segment {
                    Some(dynamic_metadata_input::path_segment::Segment::Key(key)) => key,
                    None => String::new(),
                })
                .collect();
            RawMatch::Metadata(RawMetadataMatch {
                filter: input.filter,
                path,
                value: value_of(m.value, &format!("{custom_at}.value"), 0)?,
                invert: m.invert,
            })
        }
        (_, "SourceIPInput") => RawMatch::RemoteIp(nets(&matcher)?),
        (_, "DirectSourceIPInput") => RawMatch::DirectRemoteIp(nets(&matcher)?),
        (_, "DestinationIPInput") => RawMatch::DestinationIp(nets(&matcher)?),
        // A connection without a server name gives the input no value: nothing matches it.
        (_, "ServerNameInput") => RawMatch::And(vec![
            RawMatch::Not(Box::new(RawMatch::RequestedServerName(RawStringMatch {
                exact: Some(String::new()),
                ..Default::default()
            }))),
            RawMatch::RequestedServerName(string(value(&matcher)?, &value_at)?),
        ]),
        (_, "DestinationPortInput") => {
            let exact = match value(&matcher)?.match_pattern {
                Some(string_matcher::MatchPattern::Exact(port)) => port.parse::<u32>().ok(),
                _ => None,
            };
            let Some(port) = exact else {
                return Err(unsupported(&value_at, "a port matched other than `exact: PORT`"));
            };
            RawMatch::DestinationPort(port)
        }
        (other, _) => {
            return Err(unsupported(
                &format!("{at}.input"),
                format!(
                    "input {} (request headers, source, direct source and destination addresses, destination port and server name only)",
                    other.rsplit('/').next().unwrap_or(other)
                ),
            ));
        }
    })
}
