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
                let encoding = match name.as_str() {
                    "zstd" => Encoding::Zstd,
                    "br" | "brotli" => Encoding::Brotli,
                    "gzip" => Encoding::Gzip,
                    other => {
                        return Err(ConfigError::invalid(
                            format!("{path}.encodings[{i}]"),
                            format!("expected zstd, br or gzip, found `{other}`"),
                        ));
                    }
                };
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
        Some(list) => list
            .into_iter()
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
                        format!("{path}.content_types[{i}]"),
                        format!("expected a media type `type/subtype`, found `{t}`"),
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()?,
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
    let etag = match raw.etag.as_deref() {
        None | Some("weaken") => EtagPolicy::Weaken,
        Some("remove") => EtagPolicy::Remove,
        Some("skip") => EtagPolicy::Skip,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.etag"),
                format!("expected weaken, remove or skip, found `{other}`"),
            ));
        }
    };
    Ok(CompressionConfig {
        etag,
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

per_route_settings!(CompressionConfig, RawCompression, |raw, path, _| compression(raw, path));
