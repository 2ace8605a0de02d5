//! A span's name as a format (Envoy's tracing `operation` and `upstream_operation`): text
//! with `%OPERATOR%`s read from the request and, for an upstream try's span, from the host
//! it went to. An operator with nothing to say writes nothing (not `-`), as Envoy's.

use serde::{Serialize, Serializer};

use crate::header_field::HeaderField;

/// A parsed name format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanName(pub Vec<SpanNamePart>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanNamePart {
    Literal(String),
    /// `%REQ(NAME?ALTERNATIVE):MAX%`: a request header (`:method`, `:path`, `:authority`,
    /// `:scheme` too).
    RequestHeader(HeaderField),
    /// `%PATH(X:Y)%`: the request's path, with its query (`WQ`, the default) or without
    /// (`NQ`); as the client sent it before the route rewrote it (`ORIG`: nothing where the
    /// route did not rewrite it), as it goes upstream (`PATH`), or the first of those two
    /// there is (`ORIG_OR_PATH`, the default).
    Path {
        query: bool,
        source: PathSource,
    },
    /// `%PROTOCOL%`: `HTTP/1.1`, `HTTP/2`, ...
    Protocol,
    /// `%UPSTREAM_HOST%`: the try's host, `IP:port` (upstream spans only).
    UpstreamHost,
    /// `%UPSTREAM_HOST_NAME%`: the try's host by name (its endpoint's hostname, the DNS name
    /// it came from), else its address (upstream spans only).
    UpstreamHostName,
    /// `%UPSTREAM_CLUSTER%`: the try's cluster (upstream spans only).
    UpstreamCluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathSource {
    Original,
    Path,
    OriginalOrPath,
}

const NAMED: [(&str, SpanNamePart); 4] = [
    ("PROTOCOL", SpanNamePart::Protocol),
    ("UPSTREAM_HOST", SpanNamePart::UpstreamHost),
    ("UPSTREAM_HOST_NAME", SpanNamePart::UpstreamHostName),
    ("UPSTREAM_CLUSTER", SpanNamePart::UpstreamCluster),
];

impl SpanNamePart {
    /// Known only for a try at a host.
    pub fn is_upstream(&self) -> bool {
        matches!(
            self,
            SpanNamePart::UpstreamHost
                | SpanNamePart::UpstreamHostName
                | SpanNamePart::UpstreamCluster
        )
    }
}

impl SpanName {
    /// Parses a format; `upstream`: for an upstream try's span, where the host's operators
    /// have a value.
    pub fn parse(text: &str, upstream: bool) -> Result<SpanName, String> {
        let parts =
            crate::template::parse_with(text, &NAMED, operator, SpanNamePart::Literal, "operator")?;
        if !upstream && let Some(part) = parts.iter().find(|p| p.is_upstream()) {
            let name = NAMED
                .iter()
                .find(|(_, p)| p == part)
                .map_or("", |(name, _)| *name);
            return Err(format!(
                "%{name}% is known only for an upstream try's span: use it in `upstream_operation`"
            ));
        }
        Ok(SpanName(parts))
    }

    /// Whether it reads the path before the route's rewrite.
    pub fn reads_original_path(&self) -> bool {
        self.0.iter().any(|p| {
            matches!(
                p,
                SpanNamePart::Path {
                    source: PathSource::Original | PathSource::OriginalOrPath,
                    ..
                }
            )
        })
    }

    /// The text it was parsed from.
    pub fn text(&self) -> String {
        crate::template::write_with(
            &self.0,
            &NAMED,
            |part| match part {
                SpanNamePart::RequestHeader(h) => Some(h.text("REQ")),
                SpanNamePart::Path { query, source } => {
                    let x = if *query { "WQ" } else { "NQ" };
                    let y = match source {
                        PathSource::Original => "ORIG",
                        PathSource::Path => "PATH",
                        PathSource::OriginalOrPath => "ORIG_OR_PATH",
                    };
                    Some(format!("PATH({x}:{y})"))
                }
                _ => None,
            },
            |part| match part {
                SpanNamePart::Literal(literal) => Some(literal),
                _ => None,
            },
        )
    }
}

impl Serialize for SpanName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

/// `REQ(...)` and `PATH(...)`.
fn operator(name: &str) -> Result<Option<SpanNamePart>, String> {
    if let Some(args) = name.strip_prefix("REQ(") {
        return HeaderField::parse("REQ", args, true).map(|f| Some(SpanNamePart::RequestHeader(f)));
    }
    let args = match name {
        "PATH" => "",
        _ => match name.strip_prefix("PATH(").and_then(|a| a.strip_suffix(')')) {
            Some(args) => args,
            None => return Ok(None),
        },
    };
    let mut query = true;
    let mut source = PathSource::OriginalOrPath;
    for arg in args.split(':').filter(|a| !a.is_empty()) {
        match arg {
            "WQ" => query = true,
            "NQ" => query = false,
            "ORIG" => source = PathSource::Original,
            "PATH" => source = PathSource::Path,
            "ORIG_OR_PATH" => source = PathSource::OriginalOrPath,
            other => {
                return Err(format!(
                    "`%{name}%`: `{other}` is not one of WQ, NQ, ORIG, PATH, ORIG_OR_PATH"
                ));
            }
        }
    }
    Ok(Some(SpanNamePart::Path { query, source }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_gateways_formats_parse_and_write_back() {
        let name = SpanName::parse("%REQ(X-ENVOY-ORIGINAL-HOST)%%PATH(NQ:ORIG)%", false).unwrap();
        assert_eq!(
            name.0[1],
            SpanNamePart::Path {
                query: false,
                source: PathSource::Original
            }
        );
        assert_eq!(name.text(), "%REQ(x-envoy-original-host)%%PATH(NQ:ORIG)%");
        assert!(name.reads_original_path());
        let up = SpanName::parse("%UPSTREAM_HOST_NAME%%PATH(NQ:PATH)%", true).unwrap();
        assert_eq!(up.0[0], SpanNamePart::UpstreamHostName);
        assert!(!up.reads_original_path());
        let literal = SpanName::parse("custom-client-span-%REQ(X-CUSTOM-HEADER)%", false).unwrap();
        assert_eq!(
            literal.0[0],
            SpanNamePart::Literal("custom-client-span-".into())
        );
        assert_eq!(
            SpanName::parse("%PATH%", false).unwrap().0[0],
            SpanNamePart::Path {
                query: true,
                source: PathSource::OriginalOrPath
            }
        );
    }

    #[test]
    fn what_it_cannot_name_is_refused() {
        let err = SpanName::parse("%UPSTREAM_HOST%", false).unwrap_err();
        assert!(err.contains("upstream_operation"), "{err}");
        let err = SpanName::parse("%PATH(NQ:ELSEWHERE)%", false).unwrap_err();
        assert!(err.contains("ELSEWHERE"), "{err}");
        let err = SpanName::parse("%START_TIME%", true).unwrap_err();
        assert!(err.contains("unknown operator"), "{err}");
    }
}
