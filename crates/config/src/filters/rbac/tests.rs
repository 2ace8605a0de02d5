use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac as Rules, permission, principal,
};
use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::{Rbac, RbacPerRoute};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use prost::{Message, Name};

use super::*;

fn check(yaml: &str) -> Result<RbacConfig, ConfigError> {
    let raw: RawRbac =
        serde_yaml::from_str(yaml).map_err(|e| ConfigError::invalid("rbac", e.to_string()))?;
    rbac(raw, "rbac", false)
}

fn error(yaml: &str) -> String {
    check(yaml).unwrap_err().to_string()
}

#[test]
fn policies_are_rules_in_name_order_with_the_opposite_when_none_holds() {
    let config = check(
        "
         rules:
           action: deny
           policies:
             zeta: { permissions: [{ any: true }], principals: [{ remote_ip: [10.0.0.0/8] }] }
             alpha:
               permissions: [{ path: { prefix: /admin } }, { header: { name: ':method', exact: DELETE } }]
               principals: [{ any: true }]
         rules_stat_prefix: edge_",
    )
    .unwrap();
    let rules = config.rules.unwrap();
    assert_eq!(rules.on_no_match, RbacAction::Allow);
    let names: Vec<_> = rules.matchers.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["alpha", "zeta"]);
    assert!(rules.matchers.iter().all(|r| r.action == RbacAction::Deny));
    assert_eq!(
        rules.matchers[0].when,
        RbacMatch::And(vec![
            RbacMatch::Or(vec![
                RbacMatch::Path(StringMatch::Prefix("/admin".into())),
                RbacMatch::Header {
                    name: ":method".into(),
                    value: HeaderValueMatch::Pattern(StringMatch::Exact("DELETE".into())),
                },
            ]),
            RbacMatch::Any,
        ])
    );
    assert_eq!(
        rules.matchers[1].when,
        RbacMatch::And(vec![
            RbacMatch::Any,
            RbacMatch::RemoteIp(vec!["10.0.0.0/8".parse().unwrap()]),
        ])
    );
    assert_eq!(config.rules_stat_prefix, "edge_");
    assert!(config.shadow_rules.is_none());

    // ALLOW (the default action): what no policy allows is denied; no policies at all deny
    // everything, as in Envoy.
    let allow = check("rules: { policies: {} }").unwrap().rules.unwrap();
    assert_eq!(allow.on_no_match, RbacAction::Deny);
    assert!(allow.matchers.is_empty());
    let log = check("rules: { action: log, policies: {} }").unwrap().rules.unwrap();
    assert_eq!(log.on_no_match, RbacAction::Allow);
}

#[test]
fn the_ordered_form_keeps_its_order_and_denies_what_nothing_matched_by_default() {
    let config = check(
        "
         shadow_rules:
           matchers:
             - { name: b, action: allow, match: { destination_port_range: { start: 8000, end: 9000 } } }
             - name: a
               action: deny
               match: { and: [{ requested_server_name: { suffix: .internal } }, { not: { authenticated: {} } }] }
         shadow_rules_stat_prefix: dry_",
    )
    .unwrap();
    assert!(config.rules.is_none(), "shadow rules enforce nothing");
    let shadow = config.shadow_rules.unwrap();
    assert_eq!(shadow.on_no_match, RbacAction::Deny);
    assert_eq!(shadow.matchers[0].name, "b");
    assert_eq!(
        shadow.matchers[0].when,
        RbacMatch::DestinationPort {
            start: 8000,
            end: 9000
        }
    );
    assert_eq!(
        shadow.matchers[1].when,
        RbacMatch::And(vec![
            RbacMatch::RequestedServerName(StringMatch::Suffix(".internal".into())),
            RbacMatch::Not(Box::new(RbacMatch::Authenticated(None))),
        ])
    );
    let allow_rest = check("rules: { matchers: [], on_no_match: allow }").unwrap();
    assert_eq!(allow_rest.rules.unwrap().on_no_match, RbacAction::Allow);
}

#[test]
fn what_is_written_wrong_is_refused_by_its_path() {
    let both = error("rules: { policies: {}, matchers: [] }");
    assert!(both.contains("not both"), "{both}");
    let empty = error("rules: { policies: { p: { permissions: [{ any: true }] } } }");
    assert!(empty.contains("rbac.rules.policies.p.principals"), "{empty}");
    let cidr = error(
        "rules: { policies: { p: { permissions: [{ any: true }], principals: [{ remote_ip: [10.0.0.300/8] }] } } }",
    );
    assert!(cidr.contains("10.0.0.300/8"), "{cidr}");
    let unknown = error("rules: { matchers: [{ name: x, action: deny, match: { method: GET } }] }");
    assert!(unknown.contains("unknown match `method`"), "{unknown}");
    let two_keys = error(
        "rules: { matchers: [{ name: x, action: deny, match: { any: true, path: { exact: / } } }] }",
    );
    assert!(two_keys.contains("one key"), "{two_keys}");
    let header = error(
        "rules: { matchers: [{ name: x, action: deny, match: { header: { name: 'bad name', exact: a } } }] }",
    );
    assert!(header.contains("bad name"), "{header}");
    let port = error(
        "rules: { matchers: [{ name: x, action: deny, match: { destination_port_range: { start: 9, end: 9 } } }] }",
    );
    assert!(port.contains("destination_port_range"), "{port}");
    let action = error("rules: { action: deny, matchers: [] }");
    assert!(action.contains("rbac.rules.action"), "{action}");
    let mut deep = String::from("{ any: true }");
    for _ in 0..40 {
        deep = format!("{{ not: {deep} }}");
    }
    let deep = error(&format!(
        "rules: {{ matchers: [{{ name: x, action: deny, match: {deep} }}] }}"
    ));
    assert!(deep.contains("nested more than"), "{deep}");
}

#[test]
fn the_dump_reads_back_as_the_same_settings() {
    let config = check(
        "
         rules:
           action: deny
           policies:
             p:
               permissions:
                 - { header: { name: x-tenant, present: true } }
                 - { destination_ip: [192.0.2.1] }
                 - { destination_port: 443 }
               principals:
                 - { authenticated: { principal_name: { regex: 'spiffe://.+/ns/prod/.*' } } }
                 - { direct_remote_ip: ['2001:db8::/32'] }
                 - { any: false }",
    )
    .unwrap();
    let dumped = serde_yaml::to_string(&config).unwrap();
    assert_eq!(check(&dumped).unwrap(), config, "{dumped}");
}

fn pack<M: Message + Name>(message: &M) -> Any {
    testbed::xds::any(message)
}

fn string(pattern: MatchPattern, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(pattern),
        ignore_case,
    }
}

fn cidr(prefix: &str, len: u32) -> CidrRange {
    CidrRange {
        address_prefix: prefix.into(),
        prefix_len: Some(UInt32Value { value: len }),
    }
}

fn from_xds(rbac: &Rbac) -> Result<RbacConfig, String> {
    let raw = xds::settings(&pack(rbac), "rbac").map_err(|e| e.to_string())?;
    super::rbac(raw, "rbac", false).map_err(|e| e.to_string())
}

fn policy(permissions: Vec<permission::Rule>, principals: Vec<principal::Identifier>) -> Policy {
    Policy {
        permissions: (permissions.into_iter())
            .map(|rule| Permission { rule: Some(rule) })
            .collect(),
        principals: (principals.into_iter())
            .map(|id| Principal {
                identifier: Some(id),
            })
            .collect(),
        ..Default::default()
    }
}

/// Istio's AuthorizationPolicy as its RBAC filter: a SPIFFE identity by regex, a host folded
/// in case, a path, a negated principal, a header matcher inverted.
#[test]
fn istios_rules_translate() {
    let authority = HeaderMatcher {
        name: ":authority".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(string(
            MatchPattern::Exact("Example.COM".into()),
            true,
        ))),
        ..Default::default()
    };
    let no_debug = HeaderMatcher {
        name: "x-debug".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)),
        invert_match: true,
        ..Default::default()
    };
    let rbac = Rbac {
        rules: Some(Rules {
            action: 0,
            policies: HashMap::from([(
                "ns[foo]-policy[httpbin]-rule[0]".to_string(),
                policy(
                    vec![
                        permission::Rule::Header(authority),
                        permission::Rule::UrlPath(
                            envoy_types::pb::envoy::r#type::matcher::v3::PathMatcher {
                                rule: Some(
                                    envoy_types::pb::envoy::r#type::matcher::v3::path_matcher::Rule::Path(
                                        string(MatchPattern::Prefix("/api/".into()), false),
                                    ),
                                ),
                            },
                        ),
                        permission::Rule::Header(no_debug),
                    ],
                    vec![
                        principal::Identifier::Authenticated(principal::Authenticated {
                            principal_name: Some(string(
                                MatchPattern::SafeRegex(
                                    envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher {
                                        regex: "spiffe://.+/ns/foo/sa/sleep".into(),
                                        ..Default::default()
                                    },
                                ),
                                false,
                            )),
                        }),
                        principal::Identifier::NotId(Box::new(Principal {
                            identifier: Some(principal::Identifier::RemoteIp(cidr(
                                "10.1.2.3", 32,
                            ))),
                        })),
                    ],
                ),
            )]),
            ..Default::default()
        }),
        shadow_rules_stat_prefix: "istio_dry_run_allow_".into(),
        ..Default::default()
    };
    let config = from_xds(&rbac).unwrap();
    assert_eq!(config.shadow_rules_stat_prefix, "istio_dry_run_allow_");
    let rules = config.rules.unwrap();
    assert_eq!(rules.on_no_match, RbacAction::Deny);
    let [rule] = &rules.matchers[..] else {
        panic!("one rule: {rules:?}");
    };
    assert_eq!(rule.action, RbacAction::Allow);
    let RbacMatch::And(parts) = &rule.when else {
        panic!("{rule:?}");
    };
    let RbacMatch::Or(permissions) = &parts[0] else {
        panic!("{parts:?}");
    };
    let RbacMatch::Header { name, value } = &permissions[0] else {
        panic!("{permissions:?}");
    };
    assert_eq!(name, ":authority");
    assert!(value.matches_value(Some(b"example.com")));
    assert!(value.matches_value(Some(b"EXAMPLE.com")));
    assert!(!value.matches_value(Some(b"example.com.evil")));
    assert_eq!(
        permissions[1],
        RbacMatch::Path(StringMatch::Prefix("/api/".into()))
    );
    let RbacMatch::Not(inverted) = &permissions[2] else {
        panic!("{permissions:?}");
    };
    assert!(matches!(&**inverted, RbacMatch::Header { value: HeaderValueMatch::Present, .. }));
    let RbacMatch::Or(principals) = &parts[1] else {
        panic!("{parts:?}");
    };
    assert!(matches!(&principals[0], RbacMatch::Authenticated(Some(StringMatch::Regex(_)))));
    assert_eq!(
        principals[1],
        RbacMatch::Not(Box::new(RbacMatch::RemoteIp(vec!["10.1.2.3/32".parse().unwrap()])))
    );
}

#[test]
fn what_would_change_a_decision_and_is_not_here_is_refused_by_name() {
    let with = |principal: principal::Identifier| Rbac {
        rules: Some(Rules {
            policies: HashMap::from([(
                "p".to_string(),
                policy(vec![permission::Rule::Any(true)], vec![principal]),
            )]),
            ..Default::default()
        }),
        ..Default::default()
    };
    #[allow(deprecated)]
    let claims = with(principal::Identifier::Metadata(Default::default()));
    let refused = from_xds(&claims).unwrap_err();
    assert!(refused.contains("metadata"), "{refused}");
    let per_rule = Rbac {
        track_per_rule_stats: true,
        ..Default::default()
    };
    assert!(from_xds(&per_rule).unwrap_err().contains("track_per_rule_stats"));
    let cel = Rbac {
        rules: Some(Rules {
            policies: HashMap::from([(
                "p".to_string(),
                Policy {
                    condition: Some(Default::default()),
                    ..policy(vec![permission::Rule::Any(true)], vec![principal::Identifier::Any(true)])
                },
            )]),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(from_xds(&cel).unwrap_err().contains("condition"));
    // No rules: nothing enforced, as Envoy (Contour's and Envoy Gateway's listener filter).
    let empty = from_xds(&Rbac::default()).unwrap();
    assert!(empty.rules.is_none() && empty.shadow_rules.is_none());
}

/// Envoy Gateway's SecurityPolicy authorization, as its translator's golden output writes
/// it: a matcher list on the route (client CIDRs and a method), the default last.
#[test]
fn envoy_gateways_matcher_form_translates() {
    use envoy_types::pb::envoy::config::rbac::v3::Action;
    use envoy_types::pb::envoy::extensions::matching::common_inputs::network::v3::{
        DynamicMetadataInput, SourceIpInput,
    };
    use envoy_types::pb::envoy::extensions::matching::input_matchers::ip::v3::Ip;
    use envoy_types::pb::envoy::r#type::matcher::v3::HttpRequestHeaderMatchInput;
    use envoy_types::pb::xds::core::v3::TypedExtensionConfig;
    use envoy_types::pb::xds::r#type::matcher::v3 as xm;
    use xm::matcher::matcher_list::predicate::{MatchType, PredicateList, SinglePredicate, single_predicate};
    use xm::matcher::matcher_list::{FieldMatcher, Predicate};
    use xm::matcher::{MatcherList, MatcherType, OnMatch, on_match};

    let extension = |name: &str, any: Any| TypedExtensionConfig {
        name: name.into(),
        typed_config: Some(any),
    };
    let action = |name: &str, action: i32| OnMatch {
        on_match: Some(on_match::OnMatch::Action(extension(
            name,
            pack(&Action {
                name: name.into(),
                action,
            }),
        ))),
        keep_matching: false,
    };
    let single = |input: Any, matcher: single_predicate::Matcher| Predicate {
        match_type: Some(MatchType::SinglePredicate(SinglePredicate {
            input: Some(extension("input", input)),
            matcher: Some(matcher),
        })),
    };
    let client_in = |input: Any| {
        single(
            input,
            single_predicate::Matcher::CustomMatch(extension(
                "ip_matcher",
                pack(&Ip {
                    cidr_ranges: vec![cidr("192.168.1.0", 24)],
                    stat_prefix: "client_ip".into(),
                }),
            )),
        )
    };
    let method_post = single(
        pack(&HttpRequestHeaderMatchInput {
            header_name: ":method".into(),
        }),
        single_predicate::Matcher::ValueMatch(xm::StringMatcher {
            match_pattern: Some(xm::string_matcher::MatchPattern::Exact("post".into())),
            ignore_case: true,
        }),
    );
    let per_route = |client: Predicate| RbacPerRoute {
        rbac: Some(Rbac {
            matcher: Some(xm::Matcher {
                matcher_type: Some(MatcherType::MatcherList(MatcherList {
                    matchers: vec![FieldMatcher {
                        predicate: Some(Predicate {
                            match_type: Some(MatchType::AndMatcher(PredicateList {
                                predicate: vec![client, method_post.clone()],
                            })),
                        }),
                        on_match: Some(action("deny-location-1", 1)),
                    }],
                })),
                on_no_match: Some(Box::new(action("ALLOW", 0))),
            }),
            ..Default::default()
        }),
    };
    let from_source = per_route(client_in(pack(&SourceIpInput {})));
    let RawPerRoute::Settings(raw) = xds::per_route(&pack(&from_source), "route").unwrap() else {
        panic!("settings");
    };
    let config = rbac(raw, "route", true).unwrap();
    let rules = config.rules.unwrap();
    assert_eq!(rules.on_no_match, RbacAction::Allow);
    assert_eq!(rules.matchers[0].name, "deny-location-1");
    assert_eq!(rules.matchers[0].action, RbacAction::Deny);
    let RbacMatch::And(parts) = &rules.matchers[0].when else {
        panic!("{rules:?}");
    };
    assert_eq!(
        parts[0],
        RbacMatch::RemoteIp(vec!["192.168.1.0/24".parse().unwrap()])
    );
    let RbacMatch::Header { name, value } = &parts[1] else {
        panic!("{parts:?}");
    };
    assert_eq!(name, ":method");
    assert!(value.matches_value(Some(b"POST")));
    assert!(!value.matches_value(Some(b"GET")));

    // No `rbac`: settings without rules, which enforce nothing on that route.
    let RawPerRoute::Settings(none) =
        xds::per_route(&pack(&RbacPerRoute { rbac: None }), "route").unwrap()
    else {
        panic!("settings");
    };
    let none = rbac(none, "route", true).unwrap();
    assert!(none.rules.is_none() && none.shadow_rules.is_none());

    // A JWT claim, as Envoy Gateway's claim authorization writes it: the jwt_authn filter's
    // metadata at [provider, claim] holding a list with one value.
    use envoy_types::pb::envoy::extensions::matching::common_inputs::network::v3::dynamic_metadata_input;
    use envoy_types::pb::envoy::extensions::matching::input_matchers::metadata::v3::Metadata;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        ListMatcher, StringMatcher as EnvoyString, ValueMatcher, list_matcher, value_matcher,
    };
    let key = |k: &str| dynamic_metadata_input::PathSegment {
        segment: Some(dynamic_metadata_input::path_segment::Segment::Key(k.into())),
    };
    let claim_input = pack(&DynamicMetadataInput {
        filter: "envoy.filters.http.jwt_authn".into(),
        path: vec![key("corp"), key("groups")],
    });
    let admins = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
            match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(ValueMatcher {
                match_pattern: Some(value_matcher::MatchPattern::StringMatch(EnvoyString {
                    match_pattern: Some(
                        envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(
                            "admins".into(),
                        ),
                    ),
                    ignore_case: false,
                })),
            }))),
        }))),
    };
    let claim = single(
        claim_input.clone(),
        single_predicate::Matcher::CustomMatch(extension(
            "claim",
            pack(&Metadata {
                value: Some(admins),
                invert: false,
            }),
        )),
    );
    let RawPerRoute::Settings(raw) = xds::per_route(&pack(&per_route(claim)), "route").unwrap()
    else {
        panic!("settings");
    };
    let rules = rbac(raw, "route", true).unwrap().rules.unwrap();
    let RbacMatch::And(parts) = &rules.matchers[0].when else {
        panic!("{rules:?}");
    };
    let RbacMatch::Metadata(m) = &parts[0] else {
        panic!("{parts:?}");
    };
    let payload = |groups: serde_json::Value| {
        serde_json::json!({"corp": {"groups": groups}}).as_object().unwrap().clone()
    };
    assert!(m.matches(Some(&payload(serde_json::json!(["users", "admins"])))));
    assert!(!m.matches(Some(&payload(serde_json::json!(["users"])))));
    assert!(!m.matches(Some(&payload(serde_json::json!("admins")))));
    assert!(!m.matches(None));
    // Another matcher on metadata is refused by name.
    let refused = xds::per_route(&pack(&per_route(client_in(claim_input))), "route")
        .err()
        .unwrap()
        .to_string();
    assert!(refused.contains("the Metadata matcher only"), "{refused}");
}

fn header_rule(h: HeaderMatcher) -> Result<RbacConfig, String> {
    from_xds(&Rbac {
        rules: Some(Rules {
            policies: HashMap::from([(
                "p".to_string(),
                policy(
                    vec![permission::Rule::Header(h)],
                    vec![principal::Identifier::Any(true)],
                ),
            )]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The one rule's permission of a policy-form config.
fn permission(config: &RbacConfig) -> &RbacMatch {
    let rules = config.rules.as_ref().unwrap();
    let RbacMatch::And(parts) = &rules.matchers[0].when else {
        panic!("{rules:?}");
    };
    &parts[0]
}

/// Whether `m` (a header match, or header matches under `and`/`not`) holds for a request
/// whose `x-env` values are `values`.
fn holds_for(m: &RbacMatch, values: &[&str]) -> bool {
    match m {
        RbacMatch::And(all) => all.iter().all(|m| holds_for(m, values)),
        RbacMatch::Not(inner) => !holds_for(inner, values),
        RbacMatch::Header { name, value } => {
            value.matches_header(name, values.iter().map(|v| v.as_bytes()))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn inverted_header_matches_leave_out_requests_without_the_header() {
    let not_prod = HeaderMatcher {
        name: "x-env".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(string(
            MatchPattern::Exact("prod".into()),
            false,
        ))),
        invert_match: true,
        ..Default::default()
    };
    let config = header_rule(not_prod).unwrap();
    let m = permission(&config);
    assert!(holds_for(m, &["staging"]));
    assert!(!holds_for(m, &["prod"]));
    assert!(!holds_for(m, &[]), "no header: no match, as Envoy");
    let absent = HeaderMatcher {
        name: "x-env".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)),
        invert_match: true,
        ..Default::default()
    };
    let config = header_rule(absent).unwrap();
    assert!(holds_for(permission(&config), &[]));
    assert!(!holds_for(permission(&config), &["x"]));
}

#[test]
fn ignore_case_folds_ascii_letters_only_and_is_refused_on_a_regex() {
    let folded = |pattern: MatchPattern| {
        let config = header_rule(HeaderMatcher {
            name: "x-env".into(),
            header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
                string(pattern, true),
            )),
            ..Default::default()
        })
        .unwrap();
        permission(&config).clone()
    };
    let exact = folded(MatchPattern::Exact("Kit.1".into()));
    assert!(holds_for(&exact, &["kIT.1"]));
    assert!(!holds_for(&exact, &["kITx1"]), "the dot is a dot");
    assert!(!holds_for(&exact, &["\u{212a}it.1"]), "the Kelvin sign is not a K");
    let prefix = folded(MatchPattern::Prefix("Bearer ".into()));
    let RbacMatch::Header { value, .. } = &prefix else {
        panic!("{prefix:?}");
    };
    // A value with bytes that are not UTF-8 still matches the wildcard.
    assert!(value.matches_value(Some(b"bearer \xff\xfe")));
    let contains = folded(MatchPattern::Contains("Admin".into()));
    assert!(holds_for(&contains, &["/x/ADMIN/y"]));
    let regex = HeaderMatcher {
        name: "x-env".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(string(
            MatchPattern::SafeRegex(envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher {
                regex: "prod.*".into(),
                ..Default::default()
            }),
            true,
        ))),
        ..Default::default()
    };
    assert!(header_rule(regex).unwrap_err().contains("ignore_case"));
}

#[test]
fn exact_header_values_may_be_any_text() {
    let config = check(
        "rules: { matchers: [{ name: x, action: deny, match: { header: { name: x-name, exact: \"Zoë\" } } }] }",
    )
    .unwrap();
    let rules = config.rules.unwrap();
    let RbacMatch::Header { value, .. } = &rules.matchers[0].when else {
        panic!("{rules:?}");
    };
    assert!(value.matches_value(Some("Zoë".as_bytes())));
}

#[test]
fn metadata_rules_read_jwt_claims_as_envoys_value_matchers_do() {
    let config = check(
        "
         rules:
           matchers:
             - name: writers
               action: allow
               match:
                 and:
                   - { metadata: { filter: jwt_authn, path: [corp, scope], value: { list_contains: { exact: write } } } }
                   - { metadata: { filter: envoy.filters.http.jwt_authn, path: [corp, org, team], value: { or: [{ prefix: edge }, { exact: sre }] } } }
                   - { metadata: { filter: jwt_authn, path: [corp, verified], value: { bool: true } } }
                   - { metadata: { filter: jwt_authn, path: [corp, banned], value: { present: true }, invert: true } }
           on_no_match: deny",
    )
    .unwrap();
    let when = &config.rules.unwrap().matchers[0].when;
    let RbacMatch::And(parts) = when else {
        panic!("{when:?}");
    };
    let ns = |v: serde_json::Value| v.as_object().unwrap().clone();
    let holds = |payload: serde_json::Value| {
        let ns = ns(serde_json::json!({ "corp": payload }));
        parts.iter().all(|p| match p {
            RbacMatch::Metadata(m) => m.matches(Some(&ns)),
            other => panic!("{other:?}"),
        })
    };
    let good = serde_json::json!({"scope": ["read", "write"], "org": {"team": "edge-eu"}, "verified": true});
    assert!(holds(good.clone()));
    let mut banned = good.clone();
    banned["banned"] = serde_json::json!(true);
    assert!(!holds(banned));
    let mut reader = good.clone();
    reader["scope"] = serde_json::json!(["read"]);
    assert!(!holds(reader));
    let mut unverified = good;
    unverified["verified"] = serde_json::json!("true");
    assert!(!holds(unverified));
    // Written back as read.
    let dumped = serde_json::to_value(&parts[0]).unwrap();
    assert_eq!(
        dumped,
        serde_json::json!({"metadata": {"filter": "jwt_authn", "path": ["corp", "scope"], "value": {"list_contains": {"exact": "write"}}}})
    );
    assert!(error("rules: { matchers: [{ name: x, action: allow, match: { metadata: { filter: istio_authn, path: [a], value: { exact: b } } } }] }").contains("only `jwt_authn`"));
    assert!(error("rules: { matchers: [{ name: x, action: allow, match: { metadata: { filter: jwt_authn, path: [a], value: { exact: b, bool: true } } } }] }").contains("expected one of"));
}
