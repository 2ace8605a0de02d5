
use super::*;

const JWKS: &str = r#"{"keys":[{"kty":"oct","kid":"k","k":"c2VjcmV0"}]}"#;

fn check(yaml: &str) -> Result<JwtAuthnConfig, ConfigError> {
    let raw: RawJwtAuthn =
        serde_yaml::from_str(yaml).map_err(|e| ConfigError::invalid("jwt_authn", e.to_string()))?;
    let clusters: crate::cluster::ClusterIndex<'_> = [("jwks", 3)].into_iter().collect();
    let ctx = ChainCtx {
        buffer_limit: 32 * 1024,
        cluster_index: &clusters,
    };
    jwt_authn(raw, "jwt_authn", &ctx)
}

fn error(yaml: &str) -> String {
    check(yaml).unwrap_err().to_string()
}

#[test]
fn providers_take_envoys_defaults_and_remote_keys_find_their_cluster() {
    let config = check(&format!(
        "
        providers:
          local: {{ issuer: https://a.example, local_jwks: '{JWKS}' }}
          remote:
            remote_jwks: {{ cluster: jwks, uri: 'https://keys.example/jwks.json' }}
            claim_to_headers: [{{ header_name: X-Sub, claim_name: org.sub }}]
        rules:
          - match: {{ prefix: /health }}
          - match: {{ prefix: / }}
            requires: {{ any: [local, {{ all: [remote, {{ provider: local, audiences: [x] }}] }}, allow_missing] }}
        requirement_map:
          open: allow_missing_or_failed
        "
    ))
    .unwrap();
    let local = &config.providers["local"];
    assert_eq!(local.clock_skew_seconds, 60);
    assert!(!local.forward);
    assert_eq!(local.issuer.as_deref(), Some("https://a.example"));
    let JwksSource::RemoteJwks(remote) = &config.providers["remote"].keys else {
        panic!("remote keys");
    };
    assert_eq!(remote.cluster_index, 3);
    assert_eq!(remote.cache_duration, DEFAULT_JWKS_CACHE_DURATION);
    assert_eq!(remote.failed_refetch_duration, Duration::from_secs(1));
    assert_eq!(remote.retries, 1);
    assert_eq!(config.providers["remote"].claim_to_headers[0].header_name, "x-sub");
    assert_eq!(config.rules[0].requires, None);
    assert_eq!(
        config.rules[1].requires,
        Some(JwtRequirement::Any(vec![
            JwtRequirement::Provider { name: "local".into(), audiences: None },
            JwtRequirement::All(vec![
                JwtRequirement::Provider { name: "remote".into(), audiences: None },
                JwtRequirement::Provider { name: "local".into(), audiences: Some(vec!["x".into()]) },
            ]),
            JwtRequirement::AllowMissing,
        ]))
    );
    assert_eq!(config.requirement_map["open"], JwtRequirement::AllowMissingOrFailed);
    // /config_dump writes requirements as they are written.
    let dumped = serde_json::to_value(&config.rules[1]).unwrap();
    assert_eq!(
        dumped["requires"],
        serde_json::json!({"any": ["local", {"all": ["remote", {"provider": "local", "audiences": ["x"]}]}, "allow_missing"]})
    );
}

#[test]
fn mistakes_are_named_at_load() {
    let cases = [
        (
            format!("providers: {{ a: {{ local_jwks: '{JWKS}' }} }}\nrules: [{{ match: {{ prefix: / }}, requires: b }}]"),
            "jwt_authn.rules[0].requires: no provider named `b`; known: a",
        ),
        (
            "providers: { a: {} }".into(),
            "jwt_authn.providers.a: expected one of `local_jwks`, `local_jwks_file` or `remote_jwks`",
        ),
        (
            "providers: { a: { local_jwks: '{\"keys\": []}' } }".into(),
            "jwt_authn.providers.a.local_jwks: no key in `keys`",
        ),
        (
            "providers: { a: { remote_jwks: { cluster: nope, uri: 'http://k/' } } }".into(),
            "jwt_authn.providers.a.remote_jwks.cluster: no cluster named `nope`",
        ),
        (
            "providers: { a: { remote_jwks: { cluster: jwks, uri: '/keys' } } }".into(),
            "jwt_authn.providers.a.remote_jwks.uri: expected an http:// or https:// URL",
        ),
        (
            format!("providers: {{ a: {{ local_jwks: '{JWKS}', claim_to_headers: [{{ header_name: host, claim_name: sub }}] }} }}"),
            "claim_to_headers[0].header_name: `host` frames or routes the request",
        ),
        (
            format!("providers: {{ a: {{ local_jwks: '{JWKS}', claim_to_headers: [{{ header_name: x, claim_name: a..b }}] }} }}"),
            "claim_name: expected a claim name",
        ),
        (
            format!("providers: {{ a: {{ local_jwks: '{JWKS}' }} }}\nrequirement_map: {{ r: {{ any: [a] }} }}"),
            "jwt_authn.requirement_map.r.any: expected at least two requirements",
        ),
        (
            format!("providers: {{ allow_missing: {{ local_jwks: '{JWKS}' }} }}"),
            "a provider may not be named as a requirement word",
        ),
        (
            format!("providers: {{ a: {{ local_jwks: '{JWKS}' }} }}\nrules: [{{ match: {{ prefix: api }} }}]"),
            "jwt_authn.rules[0].match: expected one of",
        ),
    ];
    for (yaml, want) in cases {
        let got = error(&yaml);
        assert!(got.contains(want), "{yaml}\n{got}");
    }
}

#[test]
fn rule_paths_match_as_route_paths_do() {
    let separated = PathMatch::SeparatedPrefix("/api".into());
    assert!(separated.matches_path("/api"));
    assert!(separated.matches_path("/api/v1"));
    assert!(!separated.matches_path("/apis"));
    assert!(PathMatch::Prefix("/api".into()).matches_path("/apis"));
    assert!(PathMatch::Exact("/a".into()).matches_path("/a"));
    assert!(!PathMatch::Exact("/a".into()).matches_path("/a/"));
}
