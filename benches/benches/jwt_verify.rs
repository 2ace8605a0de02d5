//! One token through the `jwt_authn` filter's checks with a cached key set: parsed, its
//! times and audience checked, its signature verified. Per algorithm, against a set of four
//! keys (the token's kid picks one), as a request with a valid token costs the filter; and
//! with `jwt_cache` (`/remembered`), a token that verified before: the signature is not
//! verified again.

use criterion::{Criterion, criterion_group, criterion_main};
use jwt::mint::{SigningKey, jwks};
use std::sync::Arc;

use jwt::{Jwks, Jwt, VerifiedTokens};

fn verify(c: &mut Criterion) {
    let keys = [
        SigningKey::es256("es"),
        SigningKey::rs256("rs"),
        SigningKey::ed25519("ed"),
        SigningKey::hs256("hs", b"a shared secret of thirty-two by"),
    ];
    let set = Arc::new(Jwks::parse(&jwks(&keys.iter().collect::<Vec<_>>())).expect("key set"));
    let claims = serde_json::json!({
        "iss": "https://issuer.example", "sub": "alice", "aud": "api",
        "exp": 4_000_000_000u64, "iat": 1_700_000_000u64, "scope": "read write",
    });
    let audiences = ["api".to_owned()];
    let mut group = c.benchmark_group("jwt_verify");
    for key in &keys {
        let token = key.sign(&claims);
        group.bench_function(key.alg(), |b| {
            b.iter(|| {
                let jwt = Jwt::parse(std::hint::black_box(&token)).expect("token");
                jwt.check_time(1_800_000_000, 60, false).expect("valid now");
                jwt.audience_allowed(&audiences).expect("audience");
                jwt.verify(&set).expect("signature");
            })
        });
        let mut verified = VerifiedTokens::new(100, 4096);
        verified.insert(&token, &set);
        group.bench_function(format!("{}/remembered", key.alg()), |b| {
            b.iter(|| {
                let token = std::hint::black_box(&token);
                let jwt = Jwt::parse(token).expect("token");
                jwt.check_time(1_800_000_000, 60, false).expect("valid now");
                jwt.audience_allowed(&audiences).expect("audience");
                if !verified.contains(token, &set) {
                    jwt.verify(&set).expect("signature");
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, verify);
criterion_main!(benches);
