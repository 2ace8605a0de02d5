//! Path normalisation, before routing, authorization and forwarding: the route, the
//! authorization service and the upstream all see one spelling of a path, so `//private`,
//! `/%70rivate` or `/x/../private` cannot reach `/private` past a guard written for it.
//!
//! RFC 3986 section 6.2.2: percent-encoded unreserved characters are decoded and the
//! remaining escapes upper-cased; runs of slashes merged (Envoy's `merge_slashes`); then dot
//! segments removed (section 5.2.4). Escaped slashes (`%2F`, `%5C`) are kept, refused, or unescaped
//! as the listener says (Envoy's `path_with_escaped_slashes_action`). A raw backslash is a
//! slash here, as it is to browsers and many origins. The query is untouched. A leaf: the
//! config uses it to check route paths, the request path to rewrite requests.

use std::borrow::Cow;

use serde::Serialize;

/// How a request's path is normalised before routing, authorization and forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PathNormalization {
    /// RFC 3986 section 6: decode escaped unreserved characters, upper-case the other
    /// escapes, remove dot segments. Envoy's `normalize_path`.
    pub normalize: bool,
    /// `//` becomes `/`. Envoy's `merge_slashes`.
    pub merge_slashes: bool,
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathNormalization {
    /// On: the route, the authorization service and the upstream see one spelling.
    fn default() -> Self {
        Self {
            normalize: true,
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Keep,
        }
    }
}

/// What to do with `%2F` and `%5C` in a path (Envoy's `path_with_escaped_slashes_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// Forwarded as they are (upper-cased when normalising).
    Keep,
    /// 400.
    Reject,
    /// A redirect (307) to the path with them unescaped.
    UnescapeAndRedirect,
    /// Unescaped to `/`, then routed and forwarded.
    UnescapeAndForward,
}

/// Why a path cannot be normalised (the request gets 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    BadEscape,
    EscapedSlash,
}

impl PathError {
    /// The reason, as the 400's log line gives it.
    pub fn message(self) -> &'static str {
        match self {
            PathError::BadEscape => "a `%` in the path not followed by two hex digits",
            PathError::EscapedSlash => "an escaped slash (`%2F` or `%5C`) in the path",
        }
    }
}

/// What to do with a request's path.
#[derive(Debug, PartialEq, Eq)]
pub enum Normalized<'a> {
    /// Route, check and forward with this path (borrowed: unchanged).
    Path(Cow<'a, str>),
    /// Redirect the client to this path (`unescape_and_redirect` found an escaped slash).
    Redirect(String),
}

/// Normalises `path` (without its query) as `settings` say. A path that is not
/// origin-form (`*`) is left alone.
pub fn normalize<'a>(
    path: &'a str,
    settings: &PathNormalization,
) -> Result<Normalized<'a>, PathError> {
    if !path.starts_with('/') || !needs_work(path, settings) {
        return Ok(Normalized::Path(Cow::Borrowed(path)));
    }
    let decode = settings.normalize || settings.escaped_slashes != EscapedSlashes::Keep;
    let (mut out, unescaped_slash) = if decode {
        decode_escapes(path, settings)?
    } else {
        (path.to_owned(), false)
    };
    // Slashes first: `/a//../b` is `/b`, as to an origin that merges them itself.
    if settings.merge_slashes {
        out = merge_slashes(&out);
    }
    if settings.normalize {
        out = remove_dot_segments(&out);
    }
    if unescaped_slash && settings.escaped_slashes == EscapedSlashes::UnescapeAndRedirect {
        return Ok(Normalized::Redirect(out));
    }
    Ok(Normalized::Path(if out == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(out)
    }))
}

/// Whether anything could change: most paths have no `%`, no `//` and no dot segment, and
/// are passed through after one scan.
fn needs_work(path: &str, settings: &PathNormalization) -> bool {
    let bytes = path.as_bytes();
    let decode = settings.normalize || settings.escaped_slashes != EscapedSlashes::Keep;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'%' if decode => return true,
            b'\\' if settings.normalize => return true,
            b'/' => match bytes.get(i + 1) {
                Some(b'/') if settings.merge_slashes => return true,
                Some(b'.') if settings.normalize => {
                    let rest = &bytes[i + 1..];
                    let segment =
                        &rest[..rest.iter().position(|&c| c == b'/').unwrap_or(rest.len())];
                    if segment == b"." || segment == b".." {
                        return true;
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
    false
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte a `%XX` escape at `at` stands for: `None` unless `bytes[at]` is `%` followed by
/// two hex digits.
pub fn escaped_byte(bytes: &[u8], at: usize) -> Option<u8> {
    if bytes.get(at) != Some(&b'%') {
        return None;
    }
    let hi = hex(*bytes.get(at + 1)?)?;
    let lo = hex(*bytes.get(at + 2)?)?;
    Some(hi << 4 | lo)
}

/// Decodes escapes of unreserved characters (when normalising), upper-cases the others,
/// and applies the escaped-slash action. Returns the path and whether a slash was unescaped.
fn decode_escapes(path: &str, settings: &PathNormalization) -> Result<(String, bool), PathError> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut unescaped_slash = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            // A raw backslash is a slash to browsers and many origins.
            out.push(if b == b'\\' && settings.normalize {
                b'/'
            } else {
                b
            });
            i += 1;
            continue;
        }
        let value = escaped_byte(bytes, i).ok_or(PathError::BadEscape)?;
        i += 3;
        if value == b'/' || value == b'\\' {
            match settings.escaped_slashes {
                EscapedSlashes::Keep => {}
                EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                EscapedSlashes::UnescapeAndForward | EscapedSlashes::UnescapeAndRedirect => {
                    // A backslash is a slash to most origins (and to browsers).
                    out.push(b'/');
                    unescaped_slash = true;
                    continue;
                }
            }
        } else if settings.normalize && is_unreserved(value) {
            out.push(value);
            continue;
        }
        out.push(b'%');
        if settings.normalize {
            const UPPER: &[u8; 16] = b"0123456789ABCDEF";
            out.extend_from_slice(&[
                UPPER[usize::from(value >> 4)],
                UPPER[usize::from(value & 15)],
            ]);
        } else {
            out.extend_from_slice(&bytes[i - 2..i]);
        }
    }
    // Only ASCII bytes were added or copied from a `str`: still UTF-8.
    let out = String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    Ok((out, unescaped_slash))
}

/// RFC 3986 section 5.2.4 for an absolute path: `.` segments go, `..` takes the segment
/// before it (never above the root). A path ending in a dot segment keeps its final `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    let mut ends_in_dir = false;
    // The leading "/" makes the first piece empty.
    for segment in path.split('/').skip(1) {
        ends_in_dir = false;
        match segment {
            "." => ends_in_dir = true,
            ".." => {
                segments.pop();
                ends_in_dir = true;
            }
            _ => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if ends_in_dir || out.is_empty() {
        out.push('/');
    }
    out
}

fn merge_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut previous_slash = false;
    for c in path.chars() {
        if c == '/' && previous_slash {
            continue;
        }
        previous_slash = c == '/';
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(escaped_slashes: EscapedSlashes) -> PathNormalization {
        PathNormalization {
            normalize: true,
            merge_slashes: true,
            escaped_slashes,
        }
    }

    fn path(input: &str, settings: &PathNormalization) -> Result<String, PathError> {
        match normalize(input, settings)? {
            Normalized::Path(p) => Ok(p.into_owned()),
            Normalized::Redirect(p) => Ok(format!("redirect {p}")),
        }
    }

    #[test]
    fn the_spellings_of_one_path_become_one() {
        let s = settings(EscapedSlashes::Keep);
        for (input, expected) in [
            ("/private", "/private"),
            ("//private", "/private"),
            ("/%70rivate", "/private"),
            ("/x/../private", "/private"),
            ("/./private", "/private"),
            ("/%2e%2e/private", "/private"),
            ("/a/%2E/b/", "/a/b/"),
            ("/..", "/"),
            ("/../../x", "/x"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("/a//b///c", "/a/b/c"),
            ("/a/%7euser", "/a/~user"),
            // Reserved and other escapes stay, upper-cased.
            ("/a%3fb", "/a%3Fb"),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/a%2fb", "/a%2Fb"),
            // A raw backslash is a slash.
            ("/\\private", "/private"),
            ("/x/..\\private", "/private"),
            ("/", "/"),
            ("*", "*"),
        ] {
            assert_eq!(path(input, &s).as_deref(), Ok(expected), "{input}");
        }
    }

    #[test]
    fn a_path_with_nothing_to_do_is_not_copied() {
        let s = settings(EscapedSlashes::Keep);
        let input = "/api/v1/users/42.json";
        assert!(matches!(
            normalize(input, &s),
            Ok(Normalized::Path(Cow::Borrowed(p))) if p == input
        ));
    }

    #[test]
    fn a_broken_escape_is_refused() {
        let s = settings(EscapedSlashes::Keep);
        for input in ["/a%", "/a%2", "/a%zz", "/%G0"] {
            assert_eq!(path(input, &s), Err(PathError::BadEscape), "{input}");
        }
    }

    #[test]
    fn escaped_slashes_follow_the_action() {
        let input = "/a%2Fb/../%5cc";
        assert_eq!(
            path(input, &settings(EscapedSlashes::Keep)).as_deref(),
            Ok("/%5Cc")
        );
        assert_eq!(
            path(input, &settings(EscapedSlashes::Reject)),
            Err(PathError::EscapedSlash)
        );
        assert_eq!(
            path(input, &settings(EscapedSlashes::UnescapeAndForward)).as_deref(),
            Ok("/a/c")
        );
        assert_eq!(
            path(input, &settings(EscapedSlashes::UnescapeAndRedirect)).as_deref(),
            Ok("redirect /a/c")
        );
    }

    #[test]
    fn turned_off_nothing_changes() {
        let off = PathNormalization {
            normalize: false,
            merge_slashes: false,
            escaped_slashes: EscapedSlashes::Keep,
        };
        for input in ["//private", "/%70rivate", "/x/../private", "/a%"] {
            assert_eq!(path(input, &off).as_deref(), Ok(input));
        }
        let merge_only = PathNormalization {
            merge_slashes: true,
            ..off
        };
        assert_eq!(path("//x/../%70", &merge_only).as_deref(), Ok("/x/../%70"));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Paths of a few segments, from letters, digits and the unreserved marks.
        fn plain_path() -> impl Strategy<Value = String> {
            prop::collection::vec("[a-zA-Z0-9._~-]{1,6}", 0..5)
                .prop_map(|segments| format!("/{}", segments.join("/")))
        }

        /// Another spelling of `path`: a doubled slash, a `.` segment, a detour through a
        /// `..`, or an escaped unreserved character, at a place `pick` chooses.
        fn respell(path: &str, how: u8, pick: usize) -> String {
            let slashes: Vec<usize> = path.match_indices('/').map(|(i, _)| i).collect();
            let at = slashes[pick % slashes.len()];
            let (head, tail) = path.split_at(at);
            match how % 4 {
                0 => format!("{head}/{tail}"),
                1 => format!("{head}/.{tail}"),
                2 => format!("{head}/detour/..{tail}"),
                _ => match tail.char_indices().nth(1) {
                    // An unreserved character (not `.`, which could make a dot segment).
                    Some((i, c))
                        if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '~' =>
                    {
                        format!(
                            "{head}{}%{:02x}{}",
                            &tail[..i],
                            c as u32,
                            &tail[i + c.len_utf8()..]
                        )
                    }
                    _ => path.to_owned(),
                },
            }
        }

        fn normal(path: &str) -> String {
            match normalize(path, &PathNormalization::default()) {
                Ok(Normalized::Path(p)) => p.into_owned(),
                other => panic!("{path}: {other:?}"),
            }
        }

        proptest! {
            #[test]
            fn every_spelling_of_a_path_normalises_alike(
                path in plain_path(),
                edits in prop::collection::vec((any::<u8>(), any::<usize>()), 1..4),
            ) {
                let mut spelt = path.clone();
                for (how, pick) in edits {
                    spelt = respell(&spelt, how, pick);
                }
                prop_assert_eq!(normal(&spelt), normal(&path), "{}", spelt);
            }

            #[test]
            fn normalising_twice_changes_nothing(path in "(/[a-zA-Z0-9%./~_-]{0,5}){1,5}") {
                if let Ok(Normalized::Path(once)) = normalize(&path, &PathNormalization::default()) {
                    let once = once.into_owned();
                    let twice = normal(&once);
                    prop_assert_eq!(&twice, &once);
                    prop_assert!(!once.contains("//") && !once.split('/').any(|s| s == "." || s == ".."));
                }
            }
        }
    }
}
