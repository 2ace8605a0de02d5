//! Where a provider's tokens are found in a request, and what a verified one leaves on it.

use base64::Engine;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use serde_json::Value;

use config::{ClaimToHeader, JwtProvider};

/// A token found in a request, and where.
pub(super) struct Found {
    pub(super) token: String,
    pub(super) place: Place,
}

/// Where a token was found: a header (removed once verified, unless `forward`), a query
/// parameter or a cookie (left, as Envoy leaves them).
#[derive(Clone, PartialEq)]
pub(super) enum Place {
    Header(HeaderName),
    Param(String),
    Cookie(String),
}

impl Place {
    pub(super) fn header(&self) -> Option<&HeaderName> {
        match self {
            Place::Header(name) => Some(name),
            Place::Param(_) | Place::Cookie(_) => None,
        }
    }
}

/// The tokens of `provider`'s locations in the request, in the order of its locations:
/// headers, then query parameters, then cookies. Without locations: `authorization: Bearer`
/// and the `access_token` parameter.
pub(super) fn find(provider: &JwtProvider, headers: &HeaderMap, uri: &Uri) -> Vec<Found> {
    let mut found = Vec::new();
    let defaults = provider.from_headers.is_empty()
        && provider.from_params.is_empty()
        && provider.from_cookies.is_empty();
    if defaults {
        from_header(headers, &AUTHORIZATION, "Bearer ", &mut found);
        from_query(uri, "access_token", &mut found);
        return found;
    }
    for location in &provider.from_headers {
        from_header(headers, &location.name, &location.value_prefix, &mut found);
    }
    for name in &provider.from_params {
        from_query(uri, name, &mut found);
    }
    for name in &provider.from_cookies {
        from_cookie(headers, name, &mut found);
    }
    found
}

fn from_header(headers: &HeaderMap, name: &HeaderName, prefix: &str, found: &mut Vec<Found>) {
    let mut push = |token: &str| {
        found.push(Found {
            token: token.to_owned(),
            place: Place::Header(name.clone()),
        })
    };
    for value in headers.get_all(name) {
        let Ok(value) = value.to_str() else { continue };
        if prefix.is_empty() {
            // The whole value, as Envoy takes it.
            push(value);
            continue;
        }
        // Envoy takes the token after the first `prefix`; here, after each one in any letter
        // case (the scheme is case-insensitive, RFC 6750), so every token an upstream might
        // read from the value is one that must verify.
        let mut from = 0;
        while let Some(at) = value.get(from..).and_then(|rest| find_ignore_case(rest, prefix)) {
            let start = from + at + prefix.len();
            push(token_after(value, start));
            from = start;
        }
    }
}

/// The first value of the parameter, percent-decoded, as Envoy reads the query (as routes
/// read it).
fn from_query(uri: &Uri, name: &str, found: &mut Vec<Found>) {
    if let Some(value) = crate::router::query_value(uri.query().unwrap_or(""), name) {
        found.push(Found {
            token: String::from_utf8_lossy(&value).into_owned(),
            place: Place::Param(name.to_owned()),
        });
    }
}

/// The first cookie of the name, without quotes (as routes and hash policies read it).
fn from_cookie(headers: &HeaderMap, name: &str, found: &mut Vec<Found>) {
    if let Some(value) = config::cookie_value(headers, name) {
        found.push(Found {
            token: String::from_utf8_lossy(value).into_owned(),
            place: Place::Cookie(name.to_owned()),
        });
    }
}

/// Envoy's `extractJWT`: from the first token character at or after `start` (base64url and
/// the dots between the parts), the run of them; the whole value when there is none, so a
/// value that holds no token is still a token that fails, not a missing one.
fn token_after(value: &str, start: usize) -> &str {
    let is_token = |b: u8| b.is_ascii_alphanumeric() || b"-_.".contains(&b);
    let bytes = value.as_bytes();
    let Some(begin) = (start..bytes.len()).find(|&i| is_token(bytes[i])) else {
        return value;
    };
    let end = (begin..bytes.len())
        .find(|&i| !is_token(bytes[i]))
        .unwrap_or(bytes.len());
    &value[begin..end]
}

fn find_ignore_case(haystack: &str, needle: &str) -> Option<usize> {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    (0..=h.len().checked_sub(n.len())?).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// What a verified token of `provider` leaves on the request: its payload in
/// `forward_payload_header`, its claims in their headers. Returns whether a claim header
/// was set (the route may then be matched again).
pub(super) fn leave(provider: &JwtProvider, jwt: &jwt::Jwt<'_>, headers: &mut HeaderMap) -> bool {
    if let Some(name) = &provider.forward_payload_header {
        let payload = jwt.payload_base64url();
        let value = if provider.pad_forward_payload_header {
            let padding = (4 - payload.len() % 4) % 4;
            HeaderValue::from_str(&format!("{payload}{}", &"=="[..padding.min(2)]))
        } else {
            HeaderValue::from_str(payload)
        };
        if let Ok(value) = value {
            headers.insert(name.clone(), value);
        }
    }
    let mut set = false;
    for ClaimToHeader {
        header_name,
        claim_name,
    } in &provider.claim_to_headers
    {
        let Some(claim) = claim(jwt.claims(), claim_name) else { continue };
        // Added, as Envoy adds it: two providers setting one header give it two values.
        if let Some(value) = claim_text(claim).and_then(|t| HeaderValue::from_str(&t).ok()) {
            headers.append(header_name.clone(), value);
            set = true;
        }
    }
    set
}

/// The payload as the filters after this one read it: the claims named in
/// `space_delimited` (`scope: "a b"`) split into lists, as Envoy's
/// `normalize_payload_in_metadata` writes them.
pub(super) fn normalized(claims: &serde_json::Map<String, Value>, space_delimited: &[String]) -> Value {
    let mut payload = claims.clone();
    for name in space_delimited {
        if let Some(Value::String(text)) = payload.get(name) {
            let list = (text.split(' ').filter(|part| !part.is_empty()))
                .map(|part| Value::String(part.to_owned()))
                .collect();
            payload.insert(name.clone(), Value::Array(list));
        }
    }
    Value::Object(payload)
}

/// The claim at a dotted path (`a.b`: claim `b` of the object in `a`).
fn claim<'a>(claims: &'a serde_json::Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut value = claims.get(parts.next()?)?;
    for part in parts {
        value = value.as_object()?.get(part)?;
    }
    Some(value)
}

/// A claim as a header value, as Envoy writes it: strings as they are, numbers and booleans
/// as text, lists and objects as their JSON in base64.
fn claim_text(claim: &Value) -> Option<String> {
    match claim {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Array(_) | Value::Object(_) => {
            Some(base64::engine::general_purpose::STANDARD.encode(claim.to_string()))
        }
        Value::Null => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_taken_as_envoy_extracts_them() {
        assert_eq!(token_after("a.b.c, other", 0), "a.b.c");
        assert_eq!(token_after("Bearer  \"a.b-c_d\"", 7), "a.b-c_d");
        // No token character after the prefix: the whole value, which then fails.
        assert_eq!(token_after("Bearer \"\"", 7), "Bearer \"\"");
        assert_eq!(token_after("Bearer ", 7), "Bearer ");
        assert_eq!(find_ignore_case("x bearer abc", "Bearer "), Some(2));
        assert_eq!(find_ignore_case("Bear", "Bearer "), None);
        let uri: Uri = "/p?access%5Ftoken=a.b.c&x=1&access_token=".parse().unwrap();
        let mut found = Vec::new();
        from_query(&uri, "access_token", &mut found);
        let tokens: Vec<&str> = found.iter().map(|f| f.token.as_str()).collect();
        assert_eq!(tokens, ["a.b.c"]);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_static("bearer a.b.c Bearer d.e.f"));
        let mut found = Vec::new();
        from_header(&headers, &AUTHORIZATION, "Bearer ", &mut found);
        let tokens: Vec<&str> = found.iter().map(|f| f.token.as_str()).collect();
        assert_eq!(tokens, ["a.b.c", "d.e.f"]);
    }

    #[test]
    fn claims_are_found_by_dotted_paths_and_written_as_envoy_writes_them() {
        let claims = serde_json::json!({"sub": "alice", "n": 7, "ok": true, "org": {"team": "edge"}, "roles": ["a"]});
        let claims = claims.as_object().unwrap();
        let text = |path| claim(claims, path).and_then(claim_text);
        assert_eq!(text("sub").as_deref(), Some("alice"));
        assert_eq!(text("n").as_deref(), Some("7"));
        assert_eq!(text("ok").as_deref(), Some("true"));
        assert_eq!(text("org.team").as_deref(), Some("edge"));
        assert_eq!(text("org.none"), None);
        assert_eq!(text("roles").as_deref(), Some("WyJhIl0="));
    }
}
