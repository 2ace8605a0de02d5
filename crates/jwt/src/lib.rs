//! JSON Web Tokens and key sets as Envoy's `jwt_authn` filter reads them.
//!
//! A token is taken apart here ([`Jwt::parse`]: three base64url parts, a JSON header with a
//! supported `alg`, a JSON payload whose registered claims have the right types), its claims
//! are checked with Envoy's rules ([`Jwt::check_time`], [`Jwt::audience_allowed`]), and its
//! signature is verified against a JWKS ([`Jwks::parse`], [`Jwt::verify`]). The signature
//! itself is checked by the `jsonwebtoken` crate on aws-lc-rs, the TLS stack's own crypto;
//! nothing here does cryptography. Failures are [`JwtError`]s whose text is Envoy's, which the
//! filter answers with. [`VerifiedTokens`] remembers tokens that verified, for one key set.
//!
//! ```
//! let jwks = jwt::Jwks::parse(r#"{"keys":[{"kty":"oct","kid":"k1","k":"c2VjcmV0"}]}"#).unwrap();
//! // {"alg":"HS256","kid":"k1"} . {"iss":"me","exp":2000000000} . HMAC-SHA256 with "secret"
//! let token = "eyJhbGciOiJIUzI1NiIsImtpZCI6ImsxIn0.eyJpc3MiOiJtZSIsImV4cCI6MjAwMDAwMDAwMH0.\
//!              DRkS7vX2NOGFsgLnSO0L-v4DpezPc_lTsFIErZ-axO8";
//! let jwt = jwt::Jwt::parse(token).unwrap();
//! assert_eq!(jwt.issuer(), Some("me"));
//! jwt.check_time(1_900_000_000, 60, false).unwrap();
//! assert_eq!(jwt.verify(&jwks), Ok(()));
//! ```

mod cache;

pub use cache::VerifiedTokens;

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{Map, Value};

/// base64url, with or without padding and with any bits after the last byte, as tokens and
/// keys are written in the wild (and as Envoy's decoder reads them).
const BASE64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Why a token is not accepted; the text is Envoy's (the body of its 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("Jwt is missing")]
    Missing,
    #[error("Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections")]
    BadFormat,
    #[error("Jwt header is an invalid Base64url encoded")]
    HeaderBadBase64,
    #[error("Jwt header is an invalid JSON")]
    HeaderBadJson,
    #[error("Jwt header [alg] field is required and must be a string")]
    HeaderBadAlg,
    #[error("Jwt header [alg] is not supported")]
    HeaderAlgNotSupported,
    #[error("Jwt header [kid] field is not a string")]
    HeaderBadKid,
    #[error("Jwt payload is an invalid Base64url encoded")]
    PayloadBadBase64,
    #[error("Jwt payload is an invalid JSON")]
    PayloadBadJson,
    #[error("Jwt payload [iss] field is not a string")]
    IssNotString,
    #[error("Jwt payload [sub] field is not a string")]
    SubNotString,
    #[error("Jwt payload [aud] field is not a string or string list")]
    AudNotString,
    #[error("Jwt payload [exp] field is not a positive 64 bit integer")]
    ExpNotInteger,
    #[error("Jwt payload [nbf] field is not a positive 64 bit integer")]
    NbfNotInteger,
    #[error("Jwt payload [iat] field is not a positive 64 bit integer")]
    IatNotInteger,
    #[error("Jwt signature is an invalid Base64url encoded")]
    SignatureBadBase64,
    #[error("Jwt is expired")]
    Expired,
    #[error("Jwt not yet valid")]
    NotYetValid,
    #[error("Jwt doesn't have an expiration time")]
    NoExpiration,
    #[error("Jwt issuer is not configured")]
    UnknownIssuer,
    #[error("Audiences in Jwt are not allowed")]
    AudienceNotAllowed,
    #[error("Jwks doesn't have key to match kid or alg from Jwt")]
    NoKeyForKidOrAlg,
    #[error("Jwt verification fails")]
    VerificationFails,
    #[error("Jwks remote fetch is failed")]
    JwksFetchFailed,
}

impl JwtError {
    /// Whether the client gets 403 rather than 401: its token is valid, but not for this
    /// audience (as Envoy answers).
    pub fn forbidden(self) -> bool {
        self == JwtError::AudienceNotAllowed
    }
}

/// A token taken apart, its signature not yet verified.
#[derive(Debug)]
pub struct Jwt<'a> {
    alg: Algorithm,
    kid: Option<String>,
    claims: Map<String, Value>,
    /// `header.payload`, what the signature signs.
    signed: &'a str,
    payload: &'a str,
    signature: &'a str,
    exp: Option<u64>,
    nbf: Option<u64>,
}

impl<'a> Jwt<'a> {
    /// Takes `token` apart (compact serialization) and checks its registered claims' types.
    pub fn parse(token: &'a str) -> Result<Self, JwtError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::BadFormat);
        };
        let header = BASE64URL
            .decode(header)
            .map_err(|_| JwtError::HeaderBadBase64)?;
        let header: Map<String, Value> =
            serde_json::from_slice(&header).map_err(|_| JwtError::HeaderBadJson)?;
        let alg = match header.get("alg") {
            Some(Value::String(alg)) => algorithm(alg).ok_or(JwtError::HeaderAlgNotSupported)?,
            _ => return Err(JwtError::HeaderBadAlg),
        };
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(kid)) => Some(kid.clone()),
            Some(_) => return Err(JwtError::HeaderBadKid),
        };
        let decoded = BASE64URL
            .decode(payload)
            .map_err(|_| JwtError::PayloadBadBase64)?;
        let claims: Map<String, Value> =
            serde_json::from_slice(&decoded).map_err(|_| JwtError::PayloadBadJson)?;
        for (claim, error) in [
            ("iss", JwtError::IssNotString),
            ("sub", JwtError::SubNotString),
        ] {
            if claims.get(claim).is_some_and(|v| !v.is_string()) {
                return Err(error);
            }
        }
        match claims.get("aud") {
            None | Some(Value::String(_)) => {}
            Some(Value::Array(list)) if list.iter().all(Value::is_string) => {}
            Some(_) => return Err(JwtError::AudNotString),
        }
        let exp = time_claim(&claims, "exp", JwtError::ExpNotInteger)?;
        let nbf = time_claim(&claims, "nbf", JwtError::NbfNotInteger)?;
        time_claim(&claims, "iat", JwtError::IatNotInteger)?;
        if BASE64URL.decode(signature).is_err() {
            return Err(JwtError::SignatureBadBase64);
        }
        let signed = &token[..token.len() - signature.len() - 1];
        Ok(Jwt {
            alg,
            kid,
            claims,
            signed,
            payload: &signed[signed.len() - payload.len()..],
            signature,
            exp,
            nbf,
        })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The payload's claims.
    pub fn claims(&self) -> &Map<String, Value> {
        &self.claims
    }

    /// The payload as the token carries it (base64url), as `forward_payload_header` passes
    /// it on.
    pub fn payload_base64url(&self) -> &'a str {
        self.payload
    }

    pub fn issuer(&self) -> Option<&str> {
        self.claims.get("iss").and_then(Value::as_str)
    }

    /// The token's audiences: `aud` as a string or a list of them.
    pub fn audiences(&self) -> impl Iterator<Item = &str> {
        let (one, list) = match self.claims.get("aud") {
            Some(Value::String(aud)) => (Some(aud.as_str()), &[][..]),
            Some(Value::Array(list)) => (None, list.as_slice()),
            _ => (None, &[][..]),
        };
        one.into_iter().chain(list.iter().filter_map(Value::as_str))
    }

    /// Whether the token is valid at `now` (seconds since the Unix epoch), `skew` seconds
    /// either way allowed for clocks apart: `nbf` not after `now + skew`, `exp` not before
    /// `now - skew`. Without `exp` a token does not expire, unless `require_exp`.
    pub fn check_time(&self, now: u64, skew: u64, require_exp: bool) -> Result<(), JwtError> {
        if self.nbf.is_some_and(|nbf| nbf > now.saturating_add(skew)) {
            return Err(JwtError::NotYetValid);
        }
        match self.exp {
            Some(exp) if exp < now.saturating_sub(skew) => Err(JwtError::Expired),
            None if require_exp => Err(JwtError::NoExpiration),
            _ => Ok(()),
        }
    }

    /// Whether one of the token's audiences is one of `allowed` (any, when none is given).
    /// As Envoy compares them, a scheme (`http://`, `https://`) and a trailing `/` do not
    /// count.
    pub fn audience_allowed(&self, allowed: &[String]) -> Result<(), JwtError> {
        if allowed.is_empty()
            || (self.audiences()).any(|aud| {
                let aud = bare_audience(aud);
                allowed.iter().any(|a| bare_audience(a) == aud)
            })
        {
            return Ok(());
        }
        Err(JwtError::AudienceNotAllowed)
    }

    /// Verifies the signature with a key of `jwks` that fits: of the token's algorithm's
    /// type (and curve), with the token's `kid` and `alg` where both name one.
    pub fn verify(&self, jwks: &Jwks) -> Result<(), JwtError> {
        let mut candidate = false;
        for key in &jwks.keys {
            if let (Some(want), Some(kid)) = (&self.kid, &key.kid)
                && want != kid
            {
                continue;
            }
            if key.alg.is_some_and(|alg| alg != self.alg) || !key.kind.serves(self.alg) {
                continue;
            }
            candidate = true;
            if jsonwebtoken::crypto::verify(
                self.signature,
                self.signed.as_bytes(),
                &key.key,
                self.alg,
            )
            .unwrap_or(false)
            {
                return Ok(());
            }
        }
        Err(if candidate {
            JwtError::VerificationFails
        } else {
            JwtError::NoKeyForKidOrAlg
        })
    }
}

/// A time claim: a whole number of seconds, written as an integer or a whole double (JSON
/// numbers are doubles to Envoy); 0 is the same as none.
fn time_claim(
    claims: &Map<String, Value>,
    name: &str,
    error: JwtError,
) -> Result<Option<u64>, JwtError> {
    let Some(value) = claims.get(name) else {
        return Ok(None);
    };
    let seconds = match value.as_u64() {
        Some(seconds) => seconds,
        None => match value.as_f64() {
            Some(f) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => f as u64,
            _ => return Err(error),
        },
    };
    Ok(Some(seconds).filter(|&s| s != 0))
}

fn bare_audience(aud: &str) -> &str {
    let aud = (aud.strip_prefix("http://"))
        .or_else(|| aud.strip_prefix("https://"))
        .unwrap_or(aud);
    aud.strip_suffix('/').unwrap_or(aud)
}

/// The algorithms Envoy accepts that can be verified here (ES512 cannot).
fn algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// A JSON Web Key Set: the keys of its `keys` that can verify something here. Keys of other
/// types, curves or uses, or that do not decode, are left out, as Envoy leaves them. The
/// default has no key and verifies nothing.
#[derive(Default)]
pub struct Jwks {
    keys: Vec<Key>,
}

struct Key {
    kid: Option<String>,
    alg: Option<Algorithm>,
    kind: KeyKind,
    key: DecodingKey,
}

#[derive(Clone, Copy, PartialEq)]
enum KeyKind {
    Rsa,
    EcP256,
    EcP384,
    Ed25519,
    Secret,
}

impl KeyKind {
    fn serves(self, alg: Algorithm) -> bool {
        use Algorithm::*;
        match self {
            KeyKind::Rsa => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            KeyKind::EcP256 => alg == ES256,
            KeyKind::EcP384 => alg == ES384,
            KeyKind::Ed25519 => alg == EdDSA,
            KeyKind::Secret => matches!(alg, HS256 | HS384 | HS512),
        }
    }
}

/// Why a key set cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    #[error("not a JSON object with a `keys` list: {0}")]
    NotJson(String),
    #[error("no key in `keys` can verify tokens here (RSA, EC P-256/P-384, Ed25519 or oct)")]
    NoUsableKey,
}

impl Jwks {
    /// Reads a JWKS document (`{"keys": [...]}`); it must hold at least one usable key.
    pub fn parse(text: &str) -> Result<Self, JwksError> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| JwksError::NotJson(e.to_string()))?;
        let Some(Value::Array(list)) = doc.get("keys") else {
            return Err(JwksError::NotJson("no `keys` list".into()));
        };
        let keys: Vec<Key> = list.iter().filter_map(key).collect();
        if keys.is_empty() {
            return Err(JwksError::NoUsableKey);
        }
        Ok(Jwks { keys })
    }

    /// How many usable keys it has.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// One JWK, if it can be used for verifying signatures.
fn key(jwk: &Value) -> Option<Key> {
    let text = |name: &str| jwk.get(name).and_then(Value::as_str);
    if text("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let alg = match text("alg") {
        None => None,
        Some(name) => Some(algorithm(name)?),
    };
    let (kind, key) = match (text("kty")?, text("crv")) {
        ("RSA", _) => {
            let (n, e) = (
                BASE64URL.decode(text("n")?).ok()?,
                BASE64URL.decode(text("e")?).ok()?,
            );
            (KeyKind::Rsa, DecodingKey::from_rsa_raw_components(&n, &e))
        }
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (x, y) = (
                BASE64URL.decode(text("x")?).ok()?,
                BASE64URL.decode(text("y")?).ok()?,
            );
            let size = if crv == "P-256" { 32 } else { 48 };
            if x.len() != size || y.len() != size {
                return None;
            }
            // An uncompressed point, as aws-lc-rs reads a public key.
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            let kind = if crv == "P-256" {
                KeyKind::EcP256
            } else {
                KeyKind::EcP384
            };
            (kind, DecodingKey::from_ec_der(&point))
        }
        ("OKP", Some("Ed25519")) => {
            let x = BASE64URL.decode(text("x")?).ok()?;
            if x.len() != 32 {
                return None;
            }
            (KeyKind::Ed25519, DecodingKey::from_ed_der(&x))
        }
        ("oct", _) => {
            let secret = BASE64URL.decode(text("k")?).ok()?;
            if secret.is_empty() {
                return None;
            }
            (KeyKind::Secret, DecodingKey::from_secret(&secret))
        }
        _ => return None,
    };
    if alg.is_some_and(|alg| !kind.serves(alg)) {
        return None;
    }
    Some(Key {
        kid: text("kid").map(str::to_owned),
        alg,
        kind,
        key,
    })
}

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(feature = "mint")]
pub mod mint;
#[cfg(test)]
mod tests;
