//! Signing keys that make tokens and the JWKS that verifies them: for tests and the demo,
//! never for the proxy's own use. Signed with aws-lc-rs directly, not by the code that
//! verifies, so a test of one checks the other.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use base64::Engine;
use serde_json::{Value, json};

use crate::BASE64URL;

/// A key that signs tokens, with its `kid`.
pub struct SigningKey {
    kid: String,
    key: Secret,
}

enum Secret {
    Es256(EcdsaKeyPair),
    Es384(EcdsaKeyPair),
    Rs256(RsaKeyPair),
    EdDsa(Ed25519KeyPair),
    Hs256(Vec<u8>),
}

impl SigningKey {
    /// A new P-256 key (ES256).
    pub fn es256(kid: &str) -> Self {
        Self::new(
            kid,
            Secret::Es256(ec(&signature::ECDSA_P256_SHA256_FIXED_SIGNING)),
        )
    }

    /// A new P-384 key (ES384).
    pub fn es384(kid: &str) -> Self {
        Self::new(
            kid,
            Secret::Es384(ec(&signature::ECDSA_P384_SHA384_FIXED_SIGNING)),
        )
    }

    /// A new 2048-bit RSA key (RS256).
    pub fn rs256(kid: &str) -> Self {
        let key = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048)
            .expect("RSA key generation");
        Self::new(kid, Secret::Rs256(key))
    }

    /// A new Ed25519 key (EdDSA).
    pub fn ed25519(kid: &str) -> Self {
        Self::new(
            kid,
            Secret::EdDsa(Ed25519KeyPair::generate().expect("Ed25519 key generation")),
        )
    }

    /// A shared secret (HS256).
    pub fn hs256(kid: &str, secret: &[u8]) -> Self {
        Self::new(kid, Secret::Hs256(secret.to_vec()))
    }

    fn new(kid: &str, key: Secret) -> Self {
        Self {
            kid: kid.to_owned(),
            key,
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.key {
            Secret::Es256(_) => "ES256",
            Secret::Es384(_) => "ES384",
            Secret::Rs256(_) => "RS256",
            Secret::EdDsa(_) => "EdDSA",
            Secret::Hs256(_) => "HS256",
        }
    }

    /// The public half as a JWK, with `kid` and `alg`.
    pub fn jwk(&self) -> Value {
        let b64 = |bytes: &[u8]| BASE64URL.encode(bytes);
        let mut jwk = match &self.key {
            Secret::Es256(key) | Secret::Es384(key) => {
                let point = &key.public_key().as_ref()[1..];
                let (x, y) = point.split_at(point.len() / 2);
                let crv = if x.len() == 32 { "P-256" } else { "P-384" };
                json!({"kty": "EC", "crv": crv, "x": b64(x), "y": b64(y)})
            }
            Secret::Rs256(key) => {
                let parts = signature::RsaPublicKeyComponents::<Vec<u8>>::from(key.public_key());
                json!({"kty": "RSA", "n": b64(&parts.n), "e": b64(&parts.e)})
            }
            Secret::EdDsa(key) => {
                json!({"kty": "OKP", "crv": "Ed25519", "x": b64(key.public_key().as_ref())})
            }
            Secret::Hs256(secret) => json!({"kty": "oct", "k": b64(secret)}),
        };
        jwk["kid"] = json!(self.kid);
        jwk["alg"] = json!(self.alg());
        jwk
    }

    /// A token of `claims`, with this key's `alg` and `kid` in its header.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(
            &json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }

    /// A token with this header (any `alg` it says) and `claims`, signed with this key.
    pub fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
        let signed = format!(
            "{}.{}",
            BASE64URL.encode(header.to_string()),
            BASE64URL.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let signature = match &self.key {
            Secret::Es256(key) | Secret::Es384(key) => key
                .sign(&rng, signed.as_bytes())
                .expect("ECDSA signing")
                .as_ref()
                .to_vec(),
            Secret::Rs256(key) => {
                let mut out = vec![0; key.public_modulus_len()];
                key.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signed.as_bytes(),
                    &mut out,
                )
                .expect("RSA signing");
                out
            }
            Secret::EdDsa(key) => key.sign(signed.as_bytes()).as_ref().to_vec(),
            Secret::Hs256(secret) => {
                let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
                aws_lc_rs::hmac::sign(&key, signed.as_bytes())
                    .as_ref()
                    .to_vec()
            }
        };
        format!("{signed}.{}", BASE64URL.encode(signature))
    }
}

/// A JWKS document of these keys' public halves.
pub fn jwks(keys: &[&SigningKey]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()}).to_string()
}

fn ec(alg: &'static signature::EcdsaSigningAlgorithm) -> EcdsaKeyPair {
    EcdsaKeyPair::generate(alg).expect("EC key generation")
}
