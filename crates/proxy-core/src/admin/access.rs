//! Who may use which admin endpoint (config/admin.rs has the rules): decided before a
//! request is looked at any further.

use std::net::IpAddr;

use http::header::AUTHORIZATION;
use http::{HeaderMap, Method, StatusCode};

use config::AdminConfig;

/// Why a request is refused: the status and the body that says so.
pub(super) type Refusal = (StatusCode, &'static str);

/// `Ok` if `peer` may make this request.
pub(super) fn check(
    admin: &AdminConfig,
    peer: IpAddr,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    if admin.trusts(peer) {
        return Ok(());
    }
    // Open endpoints first: a scraper sending a stale token still reads them.
    if method == Method::GET && admin.open.iter().any(|open| open == path) {
        return Ok(());
    }
    if let Some(token) = &admin.token
        && let Some(presented) = headers.get(AUTHORIZATION)
    {
        // The scheme is case-insensitive (RFC 9110 section 11.1).
        let bytes = presented.as_bytes();
        let credentials = bytes
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"Bearer "))
            .map(|_| &bytes[7..]);
        return match credentials {
            Some(presented) if token.matches(presented) => Ok(()),
            _ => Err((StatusCode::UNAUTHORIZED, "wrong admin token\n")),
        };
    }
    Err((
        StatusCode::FORBIDDEN,
        "this endpoint is for loopback, `admin.allow` peers or the admin token\n",
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http::HeaderValue;

    use super::*;
    use config::Config;

    /// A config with `admin: { settings }` and one listener.
    fn yaml(settings: &str) -> String {
        format!(
            "admin: {{ {settings} }}\nlisteners:\n  - {{ name: l, address: \"127.0.0.1:0\", routes: [{{ match: {{ prefix: / }}, direct_response: {{ status: 200 }} }}] }}\n"
        )
    }

    fn admin(settings: &str) -> AdminConfig {
        Config::from_yaml(&yaml(settings)).unwrap().admin.unwrap()
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        headers
    }

    #[test]
    fn loopback_and_allowed_peers_may_use_everything_others_nothing_unless_open() {
        let admin =
            admin("address: \"0.0.0.0:9901\", allow: [10.1.0.0/16, 192.0.2.7], open: [/ready]");
        let none = HeaderMap::new();
        let may = |peer: &str, method: &Method, path: &str| {
            check(&admin, peer.parse().unwrap(), method, path, &none).is_ok()
        };
        for peer in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "::ffff:127.0.0.1",
            "10.1.2.3",
            "::ffff:10.1.2.3",
            "192.0.2.7",
        ] {
            assert!(may(peer, &Method::POST, "/healthcheck/fail"), "{peer}");
        }
        for peer in ["10.2.0.1", "192.0.2.8", "2001:db8::1", "::ffff:10.2.0.1"] {
            assert!(!may(peer, &Method::POST, "/healthcheck/fail"), "{peer}");
            assert!(!may(peer, &Method::GET, "/config_dump"), "{peer}");
            assert!(may(peer, &Method::GET, "/ready"), "{peer}: open");
            assert!(
                check(
                    &admin,
                    peer.parse().unwrap(),
                    &Method::GET,
                    "/ready",
                    &bearer("stale")
                )
                .is_ok(),
                "{peer}: open, whatever token comes along"
            );
            assert!(
                !may(peer, &Method::POST, "/ready"),
                "{peer}: open is GET only"
            );
        }
    }

    #[test]
    fn the_token_opens_everything_and_a_wrong_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("legate-admin-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret-admin-token-0123\n").unwrap();
        let admin = admin(&format!(
            "address: \"[::]:9901\", token_file: \"{}\"",
            file.display()
        ));
        let peer: IpAddr = "203.0.113.5".parse().unwrap();
        let post = |headers: &HeaderMap| check(&admin, peer, &Method::POST, "/reload", headers);
        assert_eq!(post(&bearer("s3cret-admin-token-0123")), Ok(()));
        // The scheme in any case.
        let mut lower = HeaderMap::new();
        lower.insert(
            AUTHORIZATION,
            HeaderValue::from_static("bearer s3cret-admin-token-0123"),
        );
        assert_eq!(post(&lower), Ok(()));
        assert_eq!(
            post(&bearer("s3cret-admin-token-0124")).unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            post(&HeaderMap::new()).unwrap_err().0,
            StatusCode::FORBIDDEN
        );
        // The dump shows the file, never the token.
        let dumped = serde_json::to_string(&admin).unwrap();
        assert!(
            !dumped.contains("s3cret") && dumped.contains("token"),
            "{dumped}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_admin_beyond_loopback_must_say_who_may_use_it() {
        let error = |settings: &str| Config::from_yaml(&yaml(settings)).unwrap_err().to_string();
        assert!(
            error("address: \"0.0.0.0:9901\"")
                .starts_with("admin.address: 0.0.0.0:9901 is reachable beyond this host"),
        );
        assert!(
            error("address: \"127.0.0.1:9901\", open: [/reload]")
                .starts_with("admin.open[0]: expected a read-only endpoint")
        );
        assert!(
            error("allow: [10.0.0.0/33]")
                .starts_with("admin.allow[0]: expected an address or CIDR")
        );
        assert!(
            error("token_file: /nonexistent/token").starts_with("admin.token_file: cannot read")
        );
        assert!(
            Config::from_yaml(&yaml(
                "address: \"0.0.0.0:9901\", open: [/stats/prometheus]"
            ))
            .is_ok()
        );
    }
}
