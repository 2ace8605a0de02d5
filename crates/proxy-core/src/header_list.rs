//! Header values that are comma-separated lists (RFC 9110 section 5.6.1), such as
//! `Connection: keep-alive, Upgrade` or `Cache-Control: no-transform`, read over every line
//! of the header.

use http::HeaderMap;
use http::header::AsHeaderName;

/// The items of the list under `name`, trimmed, over all its lines. Lines that are not text
/// are skipped.
pub(crate) fn items<K: AsHeaderName>(headers: &HeaderMap, name: K) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Whether the list under `name` holds `token`, compared without case.
pub(crate) fn contains<K: AsHeaderName>(headers: &HeaderMap, name: K, token: &str) -> bool {
    items(headers, name).any(|item| item.eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use http::header::CONNECTION;

    #[test]
    fn items_span_lines_and_ignore_case_and_spaces() {
        let mut headers = HeaderMap::new();
        headers.append(CONNECTION, HeaderValue::from_static("keep-alive , x-a"));
        headers.append(CONNECTION, HeaderValue::from_static("Upgrade"));
        let listed: Vec<&str> = items(&headers, CONNECTION).collect();
        assert_eq!(listed, ["keep-alive", "x-a", "Upgrade"]);
        assert!(contains(&headers, CONNECTION, "upgrade"));
        assert!(!contains(&headers, CONNECTION, "close"));
        assert!(!contains(&headers, "te", "trailers"));
    }
}
