//! Envoy's `Compressor` filters (`envoy.filters.http.compressor`, one per library: gzip,
//! brotli, zstd) as the `compression` filter's settings, and their per-route
//! `CompressorPerRoute`. A chain's compressors become one `compression` filter offering their
//! encodings in the chain's order, each with its own rules (length, types, etag) where they
//! differ.

use envoy_types::pb::envoy::extensions::compression::brotli::compressor::v3::Brotli;
use envoy_types::pb::envoy::extensions::compression::gzip::compressor::v3::Gzip;
use envoy_types::pb::envoy::extensions::compression::zstd::compressor::v3::Zstd;
use envoy_types::pb::envoy::extensions::filters::http::compressor::v3::{
    Compressor, CompressorPerRoute, compressor_per_route,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::google::protobuf::Any;

use crate::envoy::unsupported;
use super::{RawCompression, RawEncodingRules};
use crate::envoy::{ResourceError, decode};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.CompressorPerRoute";
const GZIP: &str = "type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip";
const BROTLI: &str =
    "type.googleapis.com/envoy.extensions.compression.brotli.compressor.v3.Brotli";
const ZSTD: &str = "type.googleapis.com/envoy.extensions.compression.zstd.compressor.v3.Zstd";

/// Envoy's `min_content_length` unless set.
const ENVOY_MIN_CONTENT_LENGTH: u64 = 30;

/// Envoy's compressible types unless set: its eight and their synonyms.
const ENVOY_CONTENT_TYPES: &[&str] = &[
    "text/html",
    "text/plain",
    "text/css",
    "application/javascript",
    "application/x-javascript",
    "text/javascript",
    "text/x-javascript",
    "text/ecmascript",
    "text/js",
    "text/jscript",
    "text/x-js",
    "application/ecmascript",
    "application/x-json",
    "application/xml",
    "application/json",
    "image/svg+xml",
    "text/xml",
    "application/xhtml+xml",
];

/// One compressor filter: the `compression` settings offering its one encoding; `first` when
/// it asks to win ties (`choose_first`).
pub(crate) fn settings(any: &Any, at: &str) -> Result<(RawCompression, bool), ResourceError> {
    let mut c: Compressor = decode(any, TYPE_URL, "a Compressor")?;
    #[allow(deprecated)]
    let legacy = c.content_length.is_some()
        || !c.content_type.is_empty()
        || c.disable_on_etag_header
        || c.remove_accept_encoding_header
        || c.runtime_enabled.is_some();
    if legacy {
        return Err(unsupported(
            at,
            "content_length, content_type, disable_on_etag_header, remove_accept_encoding_header, runtime_enabled (deprecated: response_direction_config's)",
        ));
    }
    if c.request_direction_config.is_some() {
        return Err(unsupported(
            at,
            "request_direction_config (responses are compressed, requests are not)",
        ));
    }
    let mut raw = RawCompression {
        min_content_length: Some(ENVOY_MIN_CONTENT_LENGTH),
        content_types: Some(ENVOY_CONTENT_TYPES.iter().map(|t| t.to_string()).collect()),
        // Envoy drops a strong etag from what it compresses.
        etag: Some("remove".into()),
        ..RawCompression::default()
    };
    if let Some(response) = c.response_direction_config.take() {
        let at = format!("{at}.response_direction_config");
        if let Some(common) = response.common_config {
            let at = format!("{at}.common_config");
            let on = common
                .enabled
                .as_ref()
                .is_none_or(|flag| flag.default_value.as_ref().is_none_or(|v| v.value));
            if !on {
                return Err(unsupported(&at, "enabled: false (a pass-through)"));
            }
            if let Some(min) = common.min_content_length {
                raw.min_content_length = Some(u64::from(min.value));
            }
            #[allow(deprecated)]
            let mut types = common.content_type;
            for (i, m) in common.content_type_matcher.into_iter().enumerate() {
                match m.match_pattern {
                    Some(MatchPattern::Exact(t)) => types.push(t),
                    _ => {
                        return Err(unsupported(
                            &format!("{at}.content_type_matcher[{i}]"),
                            "a matcher other than exact",
                        ));
                    }
                }
            }
            if !types.is_empty() {
                raw.content_types = Some(types);
            }
        }
        // Envoy checks disable_on_etag_header first: with both set, a response
        // with an ETag is not compressed at all.
        if response.disable_on_etag_header {
            raw.etag = Some("skip".into());
        } else if response.weaken_etag_on_compress {
            raw.etag = Some("weaken".into());
        }
        if response.remove_accept_encoding_header
            || !response.uncompressible_response_codes.is_empty()
            || response.status_header_enabled
        {
            return Err(unsupported(
                &at,
                "remove_accept_encoding_header, uncompressible_response_codes, status_header_enabled",
            ));
        }
    }
    let library = c
        .compressor_library
        .take()
        .and_then(|l| l.typed_config)
        .ok_or_else(|| ResourceError::invalid(at, "expected a compressor_library"))?;
    let at = format!("{at}.compressor_library");
    let encoding = match library.type_url.as_str() {
        GZIP => {
            let gzip: Gzip = decode(&library, GZIP, "a Gzip compressor")?;
            // zlib's default level is 6.
            raw.gzip_level = Some(match gzip.compression_level {
                0 => 6,
                level => u32::try_from(level).unwrap_or(u32::MAX),
            });
            let tuned = gzip.memory_level.is_some_and(|v| v.value != 5)
                || gzip.window_bits.is_some_and(|v| v.value != 12)
                || gzip.compression_strategy != 0
                || gzip.chunk_size.is_some();
            if tuned {
                return Err(unsupported(
                    &at,
                    "memory_level, window_bits, compression_strategy, chunk_size (the encoder's own)",
                ));
            }
            "gzip"
        }
        BROTLI => {
            let brotli: Brotli = decode(&library, BROTLI, "a Brotli compressor")?;
            raw.brotli_quality = Some(brotli.quality.map_or(3, |q| q.value));
            let tuned = brotli.encoder_mode != 0
                || brotli.window_bits.is_some()
                || brotli.input_block_bits.is_some()
                || brotli.chunk_size.is_some()
                || brotli.disable_literal_context_modeling;
            if tuned {
                return Err(unsupported(
                    &at,
                    "encoder_mode, window_bits, input_block_bits, chunk_size, disable_literal_context_modeling (the encoder's own)",
                ));
            }
            "br"
        }
        ZSTD => {
            let zstd: Zstd = decode(&library, ZSTD, "a Zstd compressor")?;
            raw.zstd_level = Some(zstd.compression_level.map_or(3, |l| {
                i32::try_from(l.value).unwrap_or(i32::MAX)
            }));
            let tuned = zstd.enable_checksum
                || zstd.strategy != 0
                || zstd.dictionary.is_some()
                || zstd.chunk_size.is_some();
            if tuned {
                return Err(unsupported(
                    &at,
                    "enable_checksum, strategy, dictionary, chunk_size (the encoder's own)",
                ));
            }
            "zstd"
        }
        other => {
            return Err(unsupported(
                &at,
                format!("library `{other}` (gzip, brotli and zstd only)"),
            ));
        }
    };
    raw.encodings = Some(vec![encoding.to_owned()]);
    Ok((raw, c.choose_first))
}

/// Adds the compressor `next` to the chain's `compression` settings: its encoding is offered
/// after those before it (before them with `first`); where its rules differ from the
/// chain's (its first compressor's), they are that encoding's own, as each Envoy compressor
/// has its own.
pub(crate) fn merge(
    chain: &mut RawCompression,
    next: RawCompression,
    first: bool,
    at: &str,
) -> Result<(), ResourceError> {
    let rules = |c: &RawCompression| (c.min_content_length, c.content_types.clone(), c.etag.clone());
    let differs = rules(chain) != rules(&next);
    let encodings = chain.encodings.get_or_insert_with(Vec::new);
    for encoding in next.encodings.clone().unwrap_or_default() {
        if encodings.contains(&encoding) {
            return Err(unsupported(at, format!("a second `{encoding}` compressor")));
        }
        if first {
            encodings.insert(0, encoding.clone());
        } else {
            encodings.push(encoding.clone());
        }
        if differs {
            chain.by_encoding.get_or_insert_with(Default::default).insert(
                encoding,
                RawEncodingRules {
                    min_content_length: next.min_content_length,
                    content_types: next.content_types.clone(),
                    etag: next.etag.clone(),
                },
            );
        }
    }
    chain.gzip_level = chain.gzip_level.or(next.gzip_level);
    chain.brotli_quality = chain.brotli_quality.or(next.brotli_quality);
    chain.zstd_level = chain.zstd_level.or(next.zstd_level);
    Ok(())
}

/// A route's `CompressorPerRoute`: `Some(true)` turns compression on (its listener may have
/// it off), `Some(false)` off, `None` changes nothing.
pub(crate) fn per_route(any: &Any, at: &str) -> Result<Option<bool>, ResourceError> {
    let per_route: CompressorPerRoute = decode(any, PER_ROUTE, "a CompressorPerRoute")?;
    match per_route.r#override {
        None | Some(compressor_per_route::Override::Disabled(false)) => Ok(None),
        Some(compressor_per_route::Override::Disabled(true)) => Ok(Some(false)),
        Some(compressor_per_route::Override::Overrides(overrides)) => {
            if overrides.compressor_library.is_some() {
                return Err(unsupported(at, "overrides.compressor_library"));
            }
            match overrides.response_direction_config {
                None => Ok(None),
                Some(response) if response.remove_accept_encoding_header.is_some_and(|r| r.value) => {
                    Err(unsupported(
                        at,
                        "overrides.response_direction_config.remove_accept_encoding_header",
                    ))
                }
                // Present: response compression on for the route.
                Some(_) => Ok(Some(true)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::extensions::filters::http::compressor::v3::compressor;
    use prost::Message;

    fn any_of<M: Message>(type_url: &str, m: &M) -> Any {
        Any {
            type_url: type_url.to_owned(),
            value: m.encode_to_vec(),
        }
    }

    fn gzip_with_etag(disable: bool, weaken: bool) -> Any {
        let compressor = Compressor {
            compressor_library: Some(TypedExtensionConfig {
                name: "gzip".into(),
                typed_config: Some(any_of(GZIP, &Gzip::default())),
            }),
            response_direction_config: Some(compressor::ResponseDirectionConfig {
                disable_on_etag_header: disable,
                weaken_etag_on_compress: weaken,
                ..Default::default()
            }),
            ..Default::default()
        };
        any_of(TYPE_URL, &compressor)
    }

    #[test]
    fn disable_on_etag_header_wins_over_weakening_as_in_envoy() {
        let etag = |disable, weaken| {
            settings(&gzip_with_etag(disable, weaken), "f")
                .map(|(raw, _)| raw.etag)
                .map_err(|e| e.to_string())
        };
        assert_eq!(etag(true, true), Ok(Some("skip".to_owned())));
        assert_eq!(etag(false, true), Ok(Some("weaken".to_owned())));
        assert_eq!(etag(true, false), Ok(Some("skip".to_owned())));
        assert_eq!(etag(false, false), Ok(Some("remove".to_owned())));
    }
}
