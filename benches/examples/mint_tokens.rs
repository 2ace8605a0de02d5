//! Writes a key set and tokens signed with it, for benchmarks that send real tokens through
//! the `jwt_authn` filter (benches/auth_filters/run.sh): `DIR/jwks.json` (an ES256 and an
//! RS256 key) and `DIR/es256.token`, `DIR/rs256.token`, valid for a day for issuer
//! `https://issuer.bench` and audience `bench`.
//!
//!     cargo run --release -p legate-benches --example mint_tokens -- DIR

use std::time::{SystemTime, UNIX_EPOCH};

use jwt::mint::{SigningKey, jwks};
use serde_json::json;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: mint_tokens DIR");
        std::process::exit(2);
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = json!({
        "iss": "https://issuer.bench", "sub": "bench", "aud": "bench",
        "iat": now, "exp": now + 86_400,
    });
    let es256 = SigningKey::es256("bench-es256");
    let rs256 = SigningKey::rs256("bench-rs256");
    std::fs::write(format!("{dir}/jwks.json"), jwks(&[&es256, &rs256]))?;
    std::fs::write(format!("{dir}/es256.token"), es256.sign(&claims))?;
    std::fs::write(format!("{dir}/rs256.token"), rs256.sign(&claims))?;
    Ok(())
}
