//! Settings of the `compression` filter, validated.

use serde::Serialize;

use crate::units::ser_size;

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
