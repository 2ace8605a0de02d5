//! The `jwt_authn` filter on the real binary: tokens minted here with keys made here, key sets
//! served by a real HTTP server through a cluster (or written in the config), and requests
//! over HTTP/1.1 and HTTP/2.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::jwks::JwksServer;
use common::*;
use http::Method;
use jwt::mint::{SigningKey, jwks};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.example";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims valid for an hour, for `aud`.
fn claims(aud: &str) -> Value {
    json!({"iss": ISSUER, "sub": "alice", "aud": aud, "exp": now() + 3600, "iat": now(), "org": {"team": "edge"}})
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Sends a GET with `authorization: Bearer <token>` (none for `""`), and the extra headers.
async fn call(
    addr: SocketAddr,
    path: &str,
    token: &str,
    extra: &[(&str, &str)],
) -> (u16, String, String) {
    let auth = bearer(token);
    let mut headers = extra.to_vec();
    if !token.is_empty() {
        headers.push(("authorization", &auth));
    }
    headers.push(("x-noop-echo", "headers"));
    let response = send_h1(addr, get(path, &headers)).await;
    let status = response.status().as_u16();
    let challenge = (response.headers().get("www-authenticate"))
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, text(response.into_body()).await, challenge)
}

fn remote_config(upstream: SocketAddr, jwks: SocketAddr) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - jwt_authn:
          providers:
            example:
              issuer: {ISSUER}
              audiences: [api]
              remote_jwks:
                cluster: jwks
                uri: http://keys.example/.well-known/jwks.json
                timeout: 2s
                cache_duration: 1s
                failed_refetch_duration: 100ms
                retries: 0
              forward_payload_header: x-jwt-payload
              claim_to_headers:
                - {{ header_name: x-jwt-sub, claim_name: sub }}
                - {{ header_name: x-jwt-team, claim_name: org.team }}
              # Tokens that verified are remembered: a rotated-out key's must still fail.
              jwt_cache: {{ size: 10 }}
          rules:
            - match: {{ prefix: /public }}
            - match: {{ prefix: / }}
              requires: example
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
  - name: jwks
    endpoints: [{jwks}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_verified_against_a_key_set_fetched_through_a_cluster() {
    let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (es, rs) = (SigningKey::es256("k1"), SigningKey::rs256("k2"));
    let server = JwksServer::start(jwks(&[&es, &rs]), true).await;
    let proxy = Proxy::start(&remote_config(upstream.local_addr(), server.addr), 2);
    let addr = proxy.addr();

    // No token: 401 with a challenge and no error.
    let (status, body, challenge) = call(addr, "/items?x=1", "", &[]).await;
    assert_eq!((status, body.as_str()), (401, "Jwt is missing"));
    assert_eq!(challenge, r#"Bearer realm="http://legate.test/items""#);

    // A good token: on upstream with its claims, its payload, and without itself; a header
    // of the client's own with a claim header's name does not get through.
    let token = es.sign(&claims("api"));
    let (status, echoed, _) = call(addr, "/items", &token, &[("x-jwt-sub", "mallory")]).await;
    assert_eq!(status, 200, "{echoed}");
    let echoed = echoed.to_ascii_lowercase();
    assert!(echoed.contains("x-jwt-sub: alice"), "{echoed}");
    assert!(!echoed.contains("mallory"), "{echoed}");
    assert!(echoed.contains("x-jwt-team: edge"), "{echoed}");
    let payload = token.split('.').nth(1).unwrap().to_ascii_lowercase();
    assert!(
        echoed.contains(&format!("x-jwt-payload: {payload}")),
        "{echoed}"
    );
    assert!(!echoed.contains("authorization"), "{echoed}");
    // RSA too, over HTTP/2, and from the `access_token` parameter.
    let rsa = rs.sign(&claims("https://api/"));
    let over_h2 = send_h2(addr, get_h2("/items", &[("authorization", &bearer(&rsa))])).await;
    assert_eq!(over_h2.status(), 200);
    assert_eq!(
        call(addr, &format!("/items?access_token={token}"), "", &[])
            .await
            .0,
        200
    );

    // Each way a token fails, with Envoy's reason.
    let mut expired = claims("api");
    expired["exp"] = json!(now() - 120);
    let mut early = claims("api");
    early["nbf"] = json!(now() + 120);
    let mut stranger = claims("api");
    stranger["iss"] = json!("https://other.example");
    let impostor = SigningKey::es256("k1").sign(&claims("api"));
    let none = format!(
        "{}.{}.",
        base64_url(r#"{"alg":"none"}"#),
        base64_url(&claims("api").to_string())
    );
    let failures = [
        (es.sign(&expired), 401, "Jwt is expired"),
        (es.sign(&early), 401, "Jwt not yet valid"),
        (es.sign(&stranger), 401, "Jwt issuer is not configured"),
        (
            es.sign(&claims("other")),
            403,
            "Audiences in Jwt are not allowed",
        ),
        (impostor, 401, "Jwt verification fails"),
        (none, 401, "Jwt header [alg] is not supported"),
        (
            "not-a-token".to_owned(),
            401,
            "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections",
        ),
        (
            SigningKey::es256("k9").sign(&claims("api")),
            401,
            "Jwks doesn't have key to match kid or alg from Jwt",
        ),
    ];
    for (token, want_status, reason) in &failures {
        let (status, body, challenge) = call(addr, "/items", token, &[]).await;
        assert_eq!((status, body.as_str()), (*want_status, *reason));
        assert!(
            challenge.ends_with(r#", error="invalid_token""#),
            "{challenge}"
        );
    }
    // A path whose rule requires nothing.
    assert_eq!(call(addr, "/public/x", "", &[]).await.0, 200);

    // A key rotated in: refused until the set is fetched again (cache_duration: 1s), then
    // taken, with no restart.
    let rotated = SigningKey::es256("k3");
    server.serve(jwks(&[&rotated, &rs]));
    let fresh = rotated.sign(&claims("api"));
    eventually("the rotated key is taken", async || {
        call(addr, "/items", &fresh, &[]).await.0 == 200
    })
    .await;
    // The key rotated out is gone with the old set, though its token verified before and
    // was remembered (`jwt_cache`).
    assert_eq!(call(addr, "/items", &token, &[]).await.0, 401);

    let admin = proxy.admin.unwrap();
    assert!(stat(admin, "http_jwt_authn_jwks_fetch_success") >= 2);
    assert_eq!(stat(admin, "http_jwt_authn_jwks_fetch_failed"), 0);
    assert!(stat(admin, "http_jwt_authn_allowed") >= 4);
    assert!(stat(admin, "http_jwt_authn_denied") >= 10);
}

fn base64_url(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_server_down_at_start_gets_401s_until_it_comes() {
    let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let key = SigningKey::es256("k1");
    let server = JwksServer::start(jwks(&[&key]), false).await;
    let proxy = Proxy::start(&remote_config(upstream.local_addr(), server.addr), 2);
    let addr = proxy.addr();
    let admin = proxy.admin.unwrap();
    let token = key.sign(&claims("api"));
    // Refused at once, not held: a bounded wait shows no request hangs on the dead server.
    for _ in 0..3 {
        let answered = tokio::time::timeout(Duration::from_secs(10), call(addr, "/", &token, &[]))
            .await
            .expect("answered while the key server is down");
        assert_eq!(
            (answered.0, answered.1.as_str()),
            (401, "Jwks remote fetch is failed")
        );
    }
    eventually("the failed fetches are counted", async || {
        stat(admin, "http_jwt_authn_jwks_fetch_failed") >= 2
    })
    .await;
    // The proxy keeps trying on its own; the first request after the server comes is let on.
    server.up.store(true, Ordering::SeqCst);
    eventually("the keys are fetched once the server is up", async || {
        stat(admin, "http_jwt_authn_jwks_fetch_success") >= 1
    })
    .await;
    assert!(server.fetches.load(Ordering::SeqCst) >= 1);
    assert_eq!(call(addr, "/", &token, &[]).await.0, 200);
}

/// Two providers with keys in the config, requirements by name on routes.
fn requirements_config(
    upstream: SocketAddr,
    a: &SigningKey,
    b: &SigningKey,
    audience: &str,
) -> String {
    let quote = |key: &SigningKey| serde_json::to_string(&jwks(&[key])).unwrap();
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - jwt_authn:
          providers:
            a:
              issuer: https://a.example
              audiences: [{audience}]
              local_jwks: {a_keys}
            b:
              issuer: https://b.example
              local_jwks: {b_keys}
              from_headers: [{{ name: x-b-token }}]
              forward: true
          requirement_map:
            either: {{ any: [a, b] }}
            optional: {{ any: [a, allow_missing] }}
            both: {{ all: [a, b] }}
            lenient: allow_missing
          bypass_cors_preflight: true
    routes:
      - match: {{ prefix: /either }}
        cluster: backend
        filters: {{ jwt_authn: {{ requirement_name: either }} }}
      - match: {{ prefix: /optional }}
        cluster: backend
        filters: {{ jwt_authn: {{ requirement_name: optional }} }}
      - match: {{ prefix: /both }}
        cluster: backend
        filters: {{ jwt_authn: {{ requirement_name: both }} }}
      - match: {{ prefix: /lenient }}
        cluster: backend
        filters: {{ jwt_authn: {{ requirement_name: lenient }} }}
      - match: {{ prefix: /wrong }}
        cluster: backend
        filters: {{ jwt_authn: {{ requirement_name: nope }} }}
      - match: {{ prefix: / }}
        cluster: backend
        filters: {{ jwt_authn: {{ requirement_name: both }} }}
clusters:
  - name: backend
    endpoints: [{upstream}]
"#,
        a_keys = quote(a),
        b_keys = quote(b),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requirements_combine_providers_by_route_and_follow_reloads() {
    let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (a, b) = (
        SigningKey::ed25519("a"),
        SigningKey::hs256("b", b"a secret of b's"),
    );
    let proxy = Proxy::start(
        &requirements_config(upstream.local_addr(), &a, &b, "api"),
        1,
    );
    let addr = proxy.addr();
    let claims_of = |iss: &str| json!({"iss": iss, "aud": "api", "exp": now() + 600});
    let token_a = a.sign(&claims_of("https://a.example"));
    let token_b = b.sign(&claims_of("https://b.example"));
    let bad_a = SigningKey::ed25519("a").sign(&claims_of("https://a.example"));
    let b_header = [("x-b-token", token_b.as_str())];

    // Either provider's token; neither is missing.
    assert_eq!(call(addr, "/either", &token_a, &[]).await.0, 200);
    assert_eq!(call(addr, "/either", "", &b_header).await.0, 200);
    assert_eq!(call(addr, "/either", "", &[]).await.1, "Jwt is missing");
    assert_eq!(
        call(addr, "/either", &bad_a, &[]).await.1,
        "Jwt verification fails"
    );
    // Optional: none is fine, a bad one is not.
    assert_eq!(call(addr, "/optional", "", &[]).await.0, 200);
    assert_eq!(call(addr, "/optional", &bad_a, &[]).await.0, 401);
    // A token no provider takes is not a missing one; nor is one that is not a token.
    let stranger = a.sign(&claims_of("https://evil.example"));
    let (status, body, _) = call(addr, "/optional", &stranger, &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (401, "Jwt issuer is not configured")
    );
    let quoted = [("authorization", "Bearer \"\"")];
    assert_eq!(call(addr, "/optional", "", &quoted).await.0, 401);
    // `allow_missing` alone: no token is fine; each token there is must verify with the
    // provider of its issuer among those that look where it is.
    assert_eq!(call(addr, "/lenient", "", &[]).await.0, 200);
    assert_eq!(call(addr, "/lenient", &token_a, &[]).await.0, 200);
    assert_eq!(call(addr, "/lenient", "", &b_header).await.0, 200);
    let a_in_b = [("x-b-token", token_a.as_str())];
    let (status, body, _) = call(addr, "/lenient", "", &a_in_b).await;
    assert_eq!(
        (status, body.as_str()),
        (401, "Jwt issuer is not configured")
    );
    assert_eq!(call(addr, "/lenient", &bad_a, &[]).await.0, 401);
    // Both: each provider's token in its own place; B's is forwarded, A's is not.
    let (status, echoed, _) = call(addr, "/both", &token_a, &b_header).await;
    assert_eq!(status, 200);
    assert!(
        echoed.to_ascii_lowercase().contains("x-b-token:"),
        "{echoed}"
    );
    assert!(
        !echoed.to_ascii_lowercase().contains("authorization"),
        "{echoed}"
    );
    assert_eq!(call(addr, "/both", &token_a, &[]).await.0, 401);
    // A requirement name the filter does not have.
    let (status, body, _) = call(addr, "/wrong", &token_a, &[]).await;
    assert_eq!(status, 403);
    assert!(body.contains("Wrong requirement_name: nope"), "{body}");
    // CORS preflights go on unchecked.
    let mut preflight = get(
        "/both",
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "POST"),
        ],
    );
    *preflight.method_mut() = Method::OPTIONS;
    assert_eq!(send_h1(addr, preflight).await.status(), 200);

    // A reload that changes A's audience: the same token is now of another audience.
    let admin = proxy.admin.unwrap();
    proxy.rewrite_config(&requirements_config(
        upstream.local_addr(),
        &a,
        &b,
        "billing",
    ));
    let (status, body) = admin_request(admin, "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = call(addr, "/either", &token_a, &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (403, "Audiences in Jwt are not allowed")
    );
    assert_eq!(stat(admin, "http_jwt_authn_cors_preflight_bypassed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_claims_reach_rbac_rules() {
    let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let key = SigningKey::es256("corp");
    let keys = serde_json::to_string(&jwks(&[&key])).unwrap();
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - jwt_authn:
          providers:
            corp:
              issuer: {ISSUER}
              local_jwks: {keys}
              payload_in_metadata: corp
              normalize_payload_in_metadata: {{ space_delimited_claims: [scope] }}
          rules:
            - match: {{ prefix: / }}
              requires: corp
      - rbac:
          rules:
            matchers:
              - name: writers
                action: allow
                match:
                  and:
                    - {{ path: {{ prefix: /admin }} }}
                    - {{ metadata: {{ filter: jwt_authn, path: [corp, scope], value: {{ list_contains: {{ exact: write }} }} }} }}
                    - {{ metadata: {{ filter: jwt_authn, path: [corp, org, team], value: {{ exact: edge }} }} }}
              - name: the-rest
                action: allow
                match: {{ not: {{ path: {{ prefix: /admin }} }} }}
            on_no_match: deny
    routes:
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#,
        upstream = upstream.local_addr()
    );
    let proxy = Proxy::start(&yaml, 1);
    let addr = proxy.addr();
    let token = |scope: &str, team: &str| {
        key.sign(&json!({"iss": ISSUER, "exp": now() + 600, "scope": scope, "org": {"team": team}}))
    };
    assert_eq!(
        call(addr, "/admin/users", &token("read write", "edge"), &[])
            .await
            .0,
        200
    );
    let (status, body, _) = call(addr, "/admin/users", &token("read", "edge"), &[]).await;
    assert_eq!((status, body.as_str()), (403, "RBAC: access denied"));
    assert_eq!(
        call(addr, "/admin/users", &token("write", "billing"), &[])
            .await
            .0,
        403
    );
    assert_eq!(
        call(addr, "/catalog", &token("read", "billing"), &[])
            .await
            .0,
        200
    );
    // A client cannot bring claims of its own: without a token, jwt_authn answers first.
    assert_eq!(call(addr, "/admin/users", "", &[]).await.0, 401);
}
