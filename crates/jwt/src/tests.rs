use serde_json::json;

use super::*;
use crate::mint::{SigningKey, jwks};

fn claims() -> Value {
    json!({"iss": "https://issuer.example", "sub": "alice", "aud": ["api", "https://other.example/"], "exp": 2_000_000_000u64, "nbf": 1_000_000_000u64})
}

#[test]
fn every_algorithm_verifies_against_its_key_and_no_other() {
    let keys = [
        SigningKey::es256("a"),
        SigningKey::es384("b"),
        SigningKey::rs256("c"),
        SigningKey::ed25519("d"),
        SigningKey::hs256("e", b"a shared secret of some length"),
    ];
    let all = Jwks::parse(&jwks(&keys.iter().collect::<Vec<_>>())).unwrap();
    assert_eq!(all.len(), 5);
    for key in &keys {
        let token = key.sign(&claims());
        let jwt = Jwt::parse(&token).unwrap();
        assert_eq!(jwt.verify(&all), Ok(()), "{}", key.alg());
        // The same kid and alg, another key: the signature does not hold.
        let other = match key.alg() {
            "ES256" => SigningKey::es256("a"),
            "ES384" => SigningKey::es384("b"),
            "RS256" => SigningKey::rs256("c"),
            "EdDSA" => SigningKey::ed25519("d"),
            _ => SigningKey::hs256("e", b"another secret"),
        };
        let impostor = Jwks::parse(&jwks(&[&other])).unwrap();
        assert_eq!(
            jwt.verify(&impostor),
            Err(JwtError::VerificationFails),
            "{}",
            key.alg()
        );
    }
}

#[test]
fn a_kid_or_alg_no_key_has_is_told_apart_from_a_bad_signature() {
    let key = SigningKey::es256("k1");
    let set = Jwks::parse(&jwks(&[&key])).unwrap();
    let other_kid = SigningKey::es256("k2").sign(&claims());
    assert_eq!(
        Jwt::parse(&other_kid).unwrap().verify(&set),
        Err(JwtError::NoKeyForKidOrAlg)
    );
    // No kid in the token: every key of its type is tried.
    let no_kid = key.sign_with_header(&json!({"alg": "ES256"}), &claims());
    assert_eq!(Jwt::parse(&no_kid).unwrap().verify(&set), Ok(()));
    // An RSA token against EC keys only.
    let rsa = SigningKey::rs256("k1").sign(&claims());
    assert_eq!(
        Jwt::parse(&rsa).unwrap().verify(&set),
        Err(JwtError::NoKeyForKidOrAlg)
    );
}

#[test]
fn a_token_cannot_choose_an_algorithm_its_key_is_not_for() {
    // The EC key's public point as an HMAC secret (the classic confusion): the key is EC, so
    // an HS256 token never meets it.
    let key = SigningKey::es256("k1");
    let set = Jwks::parse(&jwks(&[&key])).unwrap();
    let jwk = key.jwk();
    let x = BASE64URL.decode(jwk["x"].as_str().unwrap()).unwrap();
    let forged = SigningKey::hs256("k1", &x).sign(&claims());
    assert_eq!(
        Jwt::parse(&forged).unwrap().verify(&set),
        Err(JwtError::NoKeyForKidOrAlg)
    );
    // A key whose `alg` is given serves that one only.
    let hs = SigningKey::hs256("h", b"secret");
    let mut jwk = hs.jwk();
    jwk["alg"] = json!("HS384");
    let set = Jwks::parse(&json!({"keys": [jwk]}).to_string()).unwrap();
    let token = hs.sign(&claims());
    assert_eq!(
        Jwt::parse(&token).unwrap().verify(&set),
        Err(JwtError::NoKeyForKidOrAlg)
    );
}

#[test]
fn malformed_tokens_get_envoys_reasons() {
    let good = SigningKey::hs256("k", b"s").sign(&claims());
    let parts: Vec<&str> = good.split('.').collect();
    let b64 = |v: &str| BASE64URL.encode(v);
    let cases = [
        ("", JwtError::BadFormat),
        ("a.b", JwtError::BadFormat),
        ("a.b.c.d", JwtError::BadFormat),
        ("!!.b.c", JwtError::HeaderBadBase64),
        (
            &format!("{}.{}.{}", b64("{"), parts[1], parts[2]),
            JwtError::HeaderBadJson,
        ),
        (
            &format!("{}.{}.{}", b64("{}"), parts[1], parts[2]),
            JwtError::HeaderBadAlg,
        ),
        (
            &format!("{}.{}.{}", b64(r#"{"alg":1}"#), parts[1], parts[2]),
            JwtError::HeaderBadAlg,
        ),
        (
            &format!("{}.{}.{}", b64(r#"{"alg":"none"}"#), parts[1], ""),
            JwtError::HeaderAlgNotSupported,
        ),
        (
            &format!("{}.{}.{}", b64(r#"{"alg":"ES512"}"#), parts[1], parts[2]),
            JwtError::HeaderAlgNotSupported,
        ),
        (
            &format!(
                "{}.{}.{}",
                b64(r#"{"alg":"HS256","kid":7}"#),
                parts[1],
                parts[2]
            ),
            JwtError::HeaderBadKid,
        ),
        (
            &format!("{}.%%.{}", parts[0], parts[2]),
            JwtError::PayloadBadBase64,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64("[1]"), parts[2]),
            JwtError::PayloadBadJson,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64(r#"{"iss":1}"#), parts[2]),
            JwtError::IssNotString,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64(r#"{"sub":{}}"#), parts[2]),
            JwtError::SubNotString,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64(r#"{"aud":["a",2]}"#), parts[2]),
            JwtError::AudNotString,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64(r#"{"exp":-1}"#), parts[2]),
            JwtError::ExpNotInteger,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64(r#"{"exp":1.5}"#), parts[2]),
            JwtError::ExpNotInteger,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64(r#"{"nbf":"1"}"#), parts[2]),
            JwtError::NbfNotInteger,
        ),
        (
            &format!("{}.{}.{}", parts[0], b64(r#"{"iat":true}"#), parts[2]),
            JwtError::IatNotInteger,
        ),
        (
            &format!("{}.{}.**", parts[0], parts[1]),
            JwtError::SignatureBadBase64,
        ),
    ];
    for (token, want) in cases {
        assert_eq!(Jwt::parse(token).err(), Some(want), "{token}");
    }
    assert!(Jwt::parse(&good).is_ok());
}

#[test]
fn a_token_that_does_not_decode_never_panics() {
    // Every prefix, and every single-byte change, of a real token: parsed and, where it
    // parses, verified, without a panic.
    let key = SigningKey::es256("k");
    let set = Jwks::parse(&jwks(&[&key])).unwrap();
    let token = key.sign(&claims());
    for end in 0..token.len() {
        if let Ok(jwt) = Jwt::parse(&token[..end]) {
            assert!(jwt.verify(&set).is_err());
        }
    }
    let bytes = token.as_bytes();
    for i in 0..bytes.len() {
        for b in [b'A', b'-', b'_', b'.', b'=', 0xff] {
            let mut changed = bytes.to_vec();
            changed[i] = b;
            let Ok(text) = std::str::from_utf8(&changed) else {
                continue;
            };
            if let Ok(jwt) = Jwt::parse(text)
                && text != token
            {
                let _ = jwt.verify(&set);
            }
        }
    }
}

#[test]
fn times_are_checked_with_the_skew_either_way() {
    let token = SigningKey::hs256("k", b"s").sign(&json!({"exp": 1000, "nbf": 500}));
    let jwt = Jwt::parse(&token).unwrap();
    assert_eq!(jwt.check_time(700, 0, false), Ok(()));
    assert_eq!(jwt.check_time(1000, 0, false), Ok(()));
    assert_eq!(jwt.check_time(1001, 0, false), Err(JwtError::Expired));
    assert_eq!(jwt.check_time(1060, 60, false), Ok(()));
    assert_eq!(jwt.check_time(1061, 60, false), Err(JwtError::Expired));
    assert_eq!(jwt.check_time(499, 0, false), Err(JwtError::NotYetValid));
    assert_eq!(jwt.check_time(440, 60, false), Ok(()));
    // A whole double is a time; 0 is none.
    let doubles = SigningKey::hs256("k", b"s").sign(&json!({"exp": 1000.0, "nbf": 0}));
    let jwt = Jwt::parse(&doubles).unwrap();
    assert_eq!(jwt.check_time(1001, 0, false), Err(JwtError::Expired));
    assert_eq!(jwt.check_time(1, 0, false), Ok(()));
    let zero = SigningKey::hs256("k", b"s").sign(&json!({"exp": 0}));
    assert_eq!(
        Jwt::parse(&zero).unwrap().check_time(u64::MAX, 0, false),
        Ok(())
    );
    let forever = SigningKey::hs256("k", b"s").sign(&json!({"sub": "x"}));
    let jwt = Jwt::parse(&forever).unwrap();
    assert_eq!(jwt.check_time(u64::MAX, 60, false), Ok(()));
    assert_eq!(jwt.check_time(1, 60, true), Err(JwtError::NoExpiration));
}

#[test]
fn audiences_match_without_scheme_or_trailing_slash() {
    let token = SigningKey::hs256("k", b"s").sign(&claims());
    let jwt = Jwt::parse(&token).unwrap();
    let allowed = |list: &[&str]| {
        jwt.audience_allowed(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    };
    assert_eq!(allowed(&[]), Ok(()));
    assert_eq!(allowed(&["api"]), Ok(()));
    assert_eq!(allowed(&["http://other.example"]), Ok(()));
    assert_eq!(allowed(&["other.example/"]), Ok(()));
    assert_eq!(
        allowed(&["apis", "other"]),
        Err(JwtError::AudienceNotAllowed)
    );
    assert!(JwtError::AudienceNotAllowed.forbidden());
    let none = SigningKey::hs256("k", b"s").sign(&json!({"sub": "x"}));
    let jwt = Jwt::parse(&none).unwrap();
    assert_eq!(
        jwt.audience_allowed(&["api".into()]),
        Err(JwtError::AudienceNotAllowed)
    );
}

#[test]
fn key_sets_keep_the_keys_they_can_use() {
    let good = SigningKey::es256("good").jwk();
    let doc = json!({"keys": [
        {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"},
        {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"},
        {"kty": "RSA", "n": "!!", "e": "AQAB"},
        {"kty": "oct", "k": ""},
        {"kty": "OKP", "crv": "X25519", "x": "AA"},
        {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
        {"kty": "EC", "crv": "P-256", "alg": "RS256", "x": good["x"], "y": good["y"]},
        "not a key",
        good,
    ]});
    assert_eq!(Jwks::parse(&doc.to_string()).unwrap().len(), 1);
    // Envoy Gateway's test secret: bits after its last byte, which Envoy's decoder ignores.
    assert_eq!(
        Jwks::parse(r#"{"keys": [{"kty": "oct", "k": "1234567890"}]}"#)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        Jwks::parse(r#"{"keys": [{"kty": "EC"}]}"#).err(),
        Some(JwksError::NoUsableKey)
    );
    assert!(matches!(Jwks::parse("nope"), Err(JwksError::NotJson(_))));
    assert!(matches!(Jwks::parse("{}"), Err(JwksError::NotJson(_))));
}

#[test]
fn the_payload_is_passed_on_as_the_token_carries_it() {
    let token = SigningKey::hs256("k", b"s").sign(&claims());
    let jwt = Jwt::parse(&token).unwrap();
    assert_eq!(jwt.payload_base64url(), token.split('.').nth(1).unwrap());
    assert_eq!(jwt.claims()["sub"], "alice");
    assert_eq!(
        jwt.audiences().collect::<Vec<_>>(),
        ["api", "https://other.example/"]
    );
}
