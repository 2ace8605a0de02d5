//! The fuzz target's entry point (fuzz/fuzz_targets/jwt.rs), also replayed over the corpus by
//! tests/fuzz_corpus.rs: any bytes as a token, checked and verified against a fixed key set of
//! every kind, and as a key set.

use crate::{Jwks, Jwt};

/// One RSA, one EC P-256, one Ed25519 and one HMAC key (public halves; none signs anything
/// the fuzzer could know).
const KEYS: &str = r#"{"keys":[
 {"kty":"RSA","kid":"rs","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"},
 {"kty":"EC","kid":"ec","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
 {"kty":"OKP","kid":"ed","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
 {"kty":"oct","kid":"hs","k":"c2VjcmV0"}]}"#;

pub fn token(data: &[u8]) {
    static SET: std::sync::LazyLock<Jwks> =
        std::sync::LazyLock::new(|| Jwks::parse(KEYS).unwrap_or_default());
    let text = String::from_utf8_lossy(data);
    if let Ok(jwt) = Jwt::parse(&text) {
        let _ = jwt.check_time(1_800_000_000, 60, true);
        let _ = jwt.audience_allowed(&["api".to_owned()]);
        let _ = jwt.audiences().count();
        // Nothing the fuzzer writes is signed by these keys.
        assert!(
            jwt.verify(&SET).is_err(),
            "a made-up token verified: {text}"
        );
    }
    let _ = Jwks::parse(&text);
}
