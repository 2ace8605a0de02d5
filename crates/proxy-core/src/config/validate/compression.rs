//! The `compression` filter's settings.

use crate::config::raw::RawCompression;
use crate::config::*;

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
    Ok(CompressionConfig {
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
