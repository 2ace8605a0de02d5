//! Settings of the `compression` filter, validated.

pub(crate) mod xds;

use serde::{Deserialize, Serialize};

use crate::units::de_opt_size;
use crate::units::ser_size;
use crate::*;

/// Responses shorter than this are sent as they are, unless configured.
pub const DEFAULT_MIN_CONTENT_LENGTH: u64 = 1024;

/// Compressible media types unless configured: text and the structured formats sent as text.
pub const DEFAULT_CONTENT_TYPES: &[&str] = &[
    "text/html",
    "text/plain",
    "text/css",
    "text/javascript",
    "text/xml",
    "application/javascript",
    "application/json",
    "application/xml",
    "application/xhtml+xml",
    "application/wasm",
    "image/svg+xml",
];

/// Response compression by `Accept-Encoding`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompressionConfig {
    /// The encodings offered, most preferred first (among those the client accepts with the
    /// same weight).
    pub encodings: Vec<Encoding>,
    /// Responses whose `content-length` is below this are not compressed (streamed ones
    /// without a length are).
    #[serde(serialize_with = "ser_size")]
    pub min_content_length: u64,
    /// Media types compressed (`type/subtype`, lowercase, parameters ignored).
    pub content_types: Vec<String>,
    /// gzip level, 1 (fast) to 9 (small).
    pub gzip_level: u32,
    /// brotli quality, 0 to 11.
    pub brotli_quality: u32,
    /// zstd level, 1 to 19.
    pub zstd_level: i32,
    /// What a compressed response's `etag` becomes.
    pub etag: EtagPolicy,
    /// Encodings with rules of their own, over the ones above (Envoy's compressors each have
    /// theirs): applied once the client's `Accept-Encoding` has chosen the encoding.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "ser_by_encoding"
    )]
    pub by_encoding: Vec<(Encoding, EncodingRules)>,
}

/// What one encoding compresses, where it differs from the filter's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EncodingRules {
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "ser_opt_size")]
    pub min_content_length: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_types: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etag: Option<EtagPolicy>,
}

fn ser_opt_size<S: serde::Serializer>(bytes: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match bytes {
        Some(bytes) => ser_size(bytes, s),
        None => s.serialize_none(),
    }
}

fn ser_by_encoding<S: serde::Serializer>(
    rules: &[(Encoding, EncodingRules)],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(rules.iter().map(|(e, r)| (e.token(), r)))
}

impl CompressionConfig {
    fn own(&self, encoding: Encoding) -> Option<&EncodingRules> {
        (self.by_encoding.iter())
            .find(|(e, _)| *e == encoding)
            .map(|(_, rules)| rules)
    }

    /// The shortest `content-length` compressed with `encoding`.
    pub fn min_content_length_for(&self, encoding: Encoding) -> u64 {
        self.own(encoding)
            .and_then(|r| r.min_content_length)
            .unwrap_or(self.min_content_length)
    }

    /// The media types compressed with `encoding`.
    pub fn content_types_for(&self, encoding: Encoding) -> &[String] {
        self.own(encoding)
            .and_then(|r| r.content_types.as_deref())
            .unwrap_or(&self.content_types)
    }

    pub fn etag_for(&self, encoding: Encoding) -> EtagPolicy {
        self.own(encoding)
            .and_then(|r| r.etag)
            .unwrap_or(self.etag)
    }
}

/// A compressed body is not the bytes a strong `etag` names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EtagPolicy {
    /// A strong `etag` is made weak (`W/` before it); a weak one stays.
    #[default]
    Weaken,
    /// A strong `etag` is removed; a weak one stays (Envoy's default).
    Remove,
    /// A response with any `etag` is sent uncompressed (Envoy's `disable_on_etag_header`).
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Encoding {
    #[serde(rename = "zstd")]
    Zstd,
    #[serde(rename = "br")]
    Brotli,
    #[serde(rename = "gzip")]
    Gzip,
}

impl Encoding {
    /// The token in `Accept-Encoding` and `Content-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Encoding::Zstd => "zstd",
            Encoding::Brotli => "br",
            Encoding::Gzip => "gzip",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompression {
    pub encodings: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub min_content_length: Option<u64>,
    pub content_types: Option<Vec<String>>,
    pub gzip_level: Option<u32>,
    pub brotli_quality: Option<u32>,
    pub zstd_level: Option<i32>,
    pub etag: Option<String>,
    /// `{ ENCODING: { min_content_length, content_types, etag } }`: an encoding's own rules.
    pub by_encoding: Option<std::collections::BTreeMap<String, RawEncodingRules>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEncodingRules {
    #[serde(default, deserialize_with = "de_opt_size")]
    pub min_content_length: Option<u64>,
    pub content_types: Option<Vec<String>>,
    pub etag: Option<String>,
}

pub(super) fn compression(
    raw: RawCompression,
    path: &str,
) -> Result<CompressionConfig, ConfigError> {
    let encodings = match raw.encodings {
        None => vec![Encoding::Zstd, Encoding::Brotli, Encoding::Gzip],
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for (i, name) in list.iter().enumerate() {
                let encoding = encoding(name, &format!("{path}.encodings[{i}]"))?;
                if out.contains(&encoding) {
                    return Err(ConfigError::invalid(
                        format!("{path}.encodings[{i}]"),
                        format!("`{name}` is listed twice"),
                    ));
                }
                out.push(encoding);
            }
            if out.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{path}.encodings"),
                    "expected at least one of zstd, br, gzip",
                ));
            }
            out
        }
    };
    let content_types = match raw.content_types {
        None => DEFAULT_CONTENT_TYPES
            .iter()
            .map(|t| t.to_string())
            .collect(),
        Some(list) => media_types(list, &format!("{path}.content_types"))?,
    };
    let level =
        |value: Option<i64>, default: i64, range: std::ops::RangeInclusive<i64>, key: &str| {
            let value = value.unwrap_or(default);
            if range.contains(&value) {
                Ok(value)
            } else {
                Err(ConfigError::invalid(
                    format!("{path}.{key}"),
                    format!(
                        "expected {} to {}, found {value}",
                        range.start(),
                        range.end()
                    ),
                ))
            }
        };
    let etag = match raw.etag {
        None => EtagPolicy::Weaken,
        Some(text) => etag_policy(&text, &format!("{path}.etag"))?,
    };
    let mut by_encoding = Vec::new();
    for (name, rules) in raw.by_encoding.unwrap_or_default() {
        let at = format!("{path}.by_encoding.{name}");
        let encoding = encoding(&name, &at)?;
        if !encodings.contains(&encoding) {
            return Err(ConfigError::invalid(at, "not one of the filter's encodings"));
        }
        if by_encoding.iter().any(|(e, _)| *e == encoding) {
            return Err(ConfigError::invalid(at, "the encoding has rules already"));
        }
        by_encoding.push((
            encoding,
            EncodingRules {
                min_content_length: rules.min_content_length,
                content_types: rules
                    .content_types
                    .map(|list| media_types(list, &format!("{at}.content_types")))
                    .transpose()?,
                etag: rules
                    .etag
                    .map(|text| etag_policy(&text, &format!("{at}.etag")))
                    .transpose()?,
            },
        ));
    }
    Ok(CompressionConfig {
        etag,
        by_encoding,
        encodings,
        min_content_length: raw.min_content_length.unwrap_or(DEFAULT_MIN_CONTENT_LENGTH),
        content_types,
        gzip_level: level(raw.gzip_level.map(i64::from), 6, 1..=9, "gzip_level")? as u32,
        brotli_quality: level(
            raw.brotli_quality.map(i64::from),
            4,
            0..=11,
            "brotli_quality",
        )? as u32,
        zstd_level: level(raw.zstd_level.map(i64::from), 3, 1..=19, "zstd_level")? as i32,
    })
}

/// `zstd`, `br` (or `brotli`) or `gzip`.
fn encoding(name: &str, at: &str) -> Result<Encoding, ConfigError> {
    match name {
        "zstd" => Ok(Encoding::Zstd),
        "br" | "brotli" => Ok(Encoding::Brotli),
        "gzip" => Ok(Encoding::Gzip),
        other => Err(ConfigError::invalid(
            at,
            format!("expected zstd, br or gzip, found `{other}`"),
        )),
    }
}

/// Media types, `type/subtype`, lowercase.
fn media_types(list: Vec<String>, at: &str) -> Result<Vec<String>, ConfigError> {
    list.into_iter()
        .enumerate()
        .map(|(i, t)| {
            let lower = t.trim().to_ascii_lowercase();
            let valid = lower.split_once('/').is_some_and(|(a, b)| {
                !a.is_empty() && !b.is_empty() && !lower.contains([';', ' ', ','])
            });
            if valid {
                Ok(lower)
            } else {
                Err(ConfigError::invalid(
                    format!("{at}[{i}]"),
                    format!("expected a media type `type/subtype`, found `{t}`"),
                ))
            }
        })
        .collect()
}

fn etag_policy(text: &str, at: &str) -> Result<EtagPolicy, ConfigError> {
    match text {
        "weaken" => Ok(EtagPolicy::Weaken),
        "remove" => Ok(EtagPolicy::Remove),
        "skip" => Ok(EtagPolicy::Skip),
        other => Err(ConfigError::invalid(
            at,
            format!("expected weaken, remove or skip, found `{other}`"),
        )),
    }
}

per_route_settings!(CompressionConfig, RawCompression, |raw, path, _| compression(raw, path));

#[cfg(test)]
mod tests {
    use super::*;

    fn load(filter: &str) -> Result<CompressionConfig, String> {
        let yaml = format!(
            "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    http_filters:\n      - compression: {filter}\n    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200 }}\n"
        );
        let config = crate::Config::from_yaml(&yaml).map_err(|e| e.to_string())?;
        match &config.listeners[0].http_filters[0].config {
            crate::filters::HttpFilterConfig::Compression(c) => Ok(c.clone()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_encoding_keeps_its_own_rules_and_the_others_the_filters() {
        let c = load(
            "{ encodings: [br, gzip], min_content_length: 100, by_encoding: { gzip: { min_content_length: 200, etag: skip, content_types: [Text/HTML] } } }",
        )
        .unwrap();
        assert_eq!(c.min_content_length_for(Encoding::Brotli), 100);
        assert_eq!(c.min_content_length_for(Encoding::Gzip), 200);
        assert_eq!(c.etag_for(Encoding::Brotli), EtagPolicy::Weaken);
        assert_eq!(c.etag_for(Encoding::Gzip), EtagPolicy::Skip);
        assert_eq!(c.content_types_for(Encoding::Gzip), ["text/html"]);
        assert!(c.content_types_for(Encoding::Brotli).len() > 1);
        let dumped = serde_json::to_value(&c).unwrap();
        assert_eq!(dumped["by_encoding"]["gzip"]["etag"], "skip", "{dumped}");
        let err = load("{ encodings: [br], by_encoding: { gzip: {} } }").unwrap_err();
        assert!(err.contains("by_encoding.gzip") && err.contains("not one of"), "{err}");
        let err = load("{ encodings: [br], by_encoding: { br: {}, brotli: {} } }").unwrap_err();
        assert!(err.contains("has rules already"), "{err}");
        let err = load("{ by_encoding: { deflate: {} } }").unwrap_err();
        assert!(err.contains("expected zstd, br or gzip"), "{err}");
    }
}
