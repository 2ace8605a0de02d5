//! The `compression` filter: responses compressed with gzip, brotli or zstd when the client
//! accepts one, the content type is compressible and the body is long enough. Never for
//! responses already encoded, partial (206) responses, `cache-control: no-transform`,
//! bodiless ones, or (where configured) ones with an `etag`; `vary: accept-encoding` goes on every response whose type is compressible,
//! so caches keep the variants apart.

use std::io::Write;
use std::rc::Rc;

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE,
    ETAG, HeaderValue, VARY,
};
use http::{Request, StatusCode};

use super::body::BodyFilter;
use super::{
    BuildCtx, Exchange, HeadersFlow, HttpFilter, PerRouteSettings, ResponseCtx, ResponseHead,
    ResponseInfo,
};
use crate::error::ProxyError;
use crate::catalog::CompressionStats;
use crate::context::RequestBody;
use crate::header_list;
use config::{CompressionConfig, Encoding, EtagPolicy, RouteConfiguration};

/// The filter on one worker.
pub(crate) struct Compression {
    settings: PerRouteSettings<CompressionConfig>,
    stats: Rc<CompressionStats>,
}

/// The encodings a request accepts, as a set (bit per [`Encoding`]) with their weights.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub(crate) struct Accepted {
    /// q-values times 1000, per encoding: 0 = not accepted.
    zstd: u16,
    br: u16,
    gzip: u16,
}

impl Accepted {
    /// Parses `Accept-Encoding` (RFC 9110 section 12.5.3): tokens with optional `;q=`, `*`
    /// for any other, `identity` ignored.
    pub(crate) fn parse(values: http::header::GetAll<'_, HeaderValue>) -> Self {
        let mut accepted = Accepted::default();
        let mut star: Option<u16> = None;
        let (mut zstd, mut br, mut gzip) = (None, None, None);
        for value in values {
            let Ok(text) = value.to_str() else { continue };
            for item in text.split(',') {
                let mut parts = item.split(';');
                let token = parts.next().unwrap_or("").trim();
                let mut q = 1000u16;
                for param in parts {
                    if let Some((k, v)) = param.split_once('=')
                        && k.trim().eq_ignore_ascii_case("q")
                    {
                        q = parse_qvalue(v.trim()).unwrap_or(0);
                    }
                }
                if token.eq_ignore_ascii_case("zstd") {
                    zstd = Some(q);
                } else if token.eq_ignore_ascii_case("br") {
                    br = Some(q);
                } else if token.eq_ignore_ascii_case("gzip") || token.eq_ignore_ascii_case("x-gzip")
                {
                    gzip = Some(q);
                } else if token == "*" {
                    star = Some(q);
                }
            }
        }
        let or_star = |explicit: Option<u16>| explicit.or(star).unwrap_or(0);
        accepted.zstd = or_star(zstd);
        accepted.br = or_star(br);
        accepted.gzip = or_star(gzip);
        accepted
    }

    fn weight(&self, encoding: Encoding) -> u16 {
        match encoding {
            Encoding::Zstd => self.zstd,
            Encoding::Brotli => self.br,
            Encoding::Gzip => self.gzip,
        }
    }

    /// The encoding to use: the client's highest weight, ties broken by `offered`'s order.
    fn choose(&self, offered: &[Encoding]) -> Option<Encoding> {
        let mut best: Option<(Encoding, u16)> = None;
        for &encoding in offered {
            let weight = self.weight(encoding);
            if weight > 0 && best.is_none_or(|(_, w)| weight > w) {
                best = Some((encoding, weight));
            }
        }
        best.map(|(encoding, _)| encoding)
    }
}

/// `1`, `0.5`, `0.001` -> thousandths.
fn parse_qvalue(text: &str) -> Option<u16> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let int: u16 = match int {
        "0" => 0,
        "1" => 1,
        _ => return None,
    };
    let mut thousandths = 0u16;
    for (i, digit) in frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .enumerate()
    {
        thousandths += u16::from(digit - b'0') * [100, 10, 1][i];
    }
    Some((int * 1000 + thousandths).min(1000))
}

impl HttpFilter for Compression {
    type Config = CompressionConfig;
    type Shared = ();
    /// The encodings the client accepts.
    type State = Accepted;

    fn new(config: &CompressionConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        let stats = Rc::new(ctx.catalog.compression(ctx.shard, &ctx.listener.name));
        Self::with_stats(config, ctx.table, ctx.filter, stats)
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        accept: &mut Accepted,
    ) -> Result<HeadersFlow, ProxyError> {
        if self.settings.get(exchange).is_some() {
            *accept = Accepted::parse(req.headers().get_all(ACCEPT_ENCODING));
        }
        Ok(HeadersFlow::Flow(super::Flow::Continue))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        ctx: &ResponseCtx<'_>,
        accept: &mut Accepted,
    ) -> Option<BodyFilter> {
        self.compress(head, ctx.exchange, ctx.info, accept)
    }
}

impl Compression {
    pub(crate) fn with_stats(
        config: &CompressionConfig,
        table: &RouteConfiguration,
        filter: &str,
        stats: Rc<CompressionStats>,
    ) -> Self {
        Self {
            settings: PerRouteSettings::new(config, table, filter, |f| &f.compression, Clone::clone),
            stats,
        }
    }

    /// Decides whether this response is compressed; if so, rewrites its head and returns the
    /// body filter that compresses it.
    fn compress(
        &self,
        head: &mut ResponseHead<'_>,
        exchange: &Exchange<'_>,
        info: &ResponseInfo<'_>,
        accept: &Accepted,
    ) -> Option<BodyFilter> {
        if head.replaced {
            return None;
        }
        let config = self.settings.get(exchange)?;
        let headers = &head.headers;
        let content_type = headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes);
        let compressible = |encoding: Encoding| {
            content_type.is_some_and(|t| listed_type(config.content_types_for(encoding), t))
        };
        // An encoding with rules of its own may take a type the others do not.
        let compressible_type = if config.by_encoding.is_empty() {
            content_type.is_some_and(|t| listed_type(&config.content_types, t))
        } else {
            config.encodings.iter().any(|e| compressible(*e))
        };
        if !compressible_type {
            return None;
        }
        // The client's choice; then that encoding's rules decide, as Envoy's compressor for it
        // decides alone.
        let chosen = accept.choose(&config.encodings);
        let listed = config.by_encoding.is_empty() || chosen.is_some_and(compressible);
        // The representation depends on Accept-Encoding from here on, whatever we decide.
        add_vary(head.headers);
        let headers = &head.headers;
        let status = head.status;
        let bodiless = info.head_request
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let partial = status == StatusCode::PARTIAL_CONTENT || headers.contains_key(CONTENT_RANGE);
        let encoded = headers.contains_key(CONTENT_ENCODING);
        let no_transform = header_list::contains(headers, CACHE_CONTROL, "no-transform");
        let Some(encoding) = chosen else {
            self.stats.not_compressed.inc();
            return None;
        };
        let too_short = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|len| len < config.min_content_length_for(encoding));
        let etag_policy = config.etag_for(encoding);
        let etag_kept = etag_policy == EtagPolicy::Skip && headers.contains_key(ETAG);
        let (true, false, false, false, false, false, false) = (
            listed,
            bodiless,
            partial,
            encoded,
            no_transform,
            too_short,
            etag_kept,
        ) else {
            self.stats.not_compressed.inc();
            return None;
        };
        let compressor = match Compressor::new(encoding, config) {
            Ok(compressor) => compressor,
            Err(error) => {
                tracing::warn!(%error, encoding = encoding.token(), "cannot start a compressor");
                self.stats.not_compressed.inc();
                return None;
            }
        };
        let headers = &mut *head.headers;
        headers.remove(CONTENT_LENGTH);
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(encoding.token()));
        // The bytes differ from the uncompressed ones: a strong validator would lie.
        if let Some(etag) = headers.get(ETAG)
            && !etag.as_bytes().starts_with(b"W/")
        {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(etag.as_bytes());
            match HeaderValue::from_bytes(&weak) {
                Ok(weak) if etag_policy == EtagPolicy::Weaken => {
                    headers.insert(ETAG, weak);
                }
                _ => {
                    headers.remove(ETAG);
                }
            }
        }
        self.stats.compressed[encoding as usize].inc();
        Some(BodyFilter::compress(compressor, Rc::clone(&self.stats)))
    }
}

/// Adds `accept-encoding` to `vary` unless it is there (or `vary: *`).
fn add_vary(headers: &mut http::HeaderMap) {
    let present = header_list::items(headers, VARY)
        .any(|t| t == "*" || t.eq_ignore_ascii_case("accept-encoding"));
    if !present {
        headers.append(VARY, HeaderValue::from_static("accept-encoding"));
    }
}

/// A streaming encoder writing into a buffer the body filter empties.
pub(crate) enum Compressor {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

/// brotli's window: 2^19 bytes, a quarter of its default, to bound memory per response.
const BROTLI_WINDOW_BITS: u32 = 19;
/// brotli's internal buffer between our writes and its encoder.
const BROTLI_BUFFER: usize = 4096;

impl Compressor {
    fn new(encoding: Encoding, config: &CompressionConfig) -> std::io::Result<Self> {
        Ok(match encoding {
            Encoding::Gzip => Compressor::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(config.gzip_level),
            )),
            Encoding::Brotli => Compressor::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                BROTLI_BUFFER,
                config.brotli_quality,
                BROTLI_WINDOW_BITS,
            ))),
            Encoding::Zstd => Compressor::Zstd(zstd::stream::write::Encoder::new(
                Vec::new(),
                config.zstd_level,
            )?),
        })
    }

    /// Compresses `data`; returns what the encoder has produced so far.
    pub(crate) fn write(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        match self {
            Compressor::Gzip(e) => e.write_all(data)?,
            Compressor::Brotli(e) => e.write_all(data)?,
            Compressor::Zstd(e) => e.write_all(data)?,
        }
        Ok(self.take())
    }

    /// Everything written so far, decodable by the client now (a sync flush).
    pub(crate) fn flush(&mut self) -> std::io::Result<Bytes> {
        match self {
            Compressor::Gzip(e) => e.flush()?,
            Compressor::Brotli(e) => e.flush()?,
            Compressor::Zstd(e) => e.flush()?,
        }
        Ok(self.take())
    }

    /// The end of the stream.
    pub(crate) fn finish(self) -> std::io::Result<Bytes> {
        let out = match self {
            Compressor::Gzip(e) => e.finish()?,
            Compressor::Brotli(e) => e.into_inner(),
            Compressor::Zstd(e) => e.finish()?,
        };
        Ok(Bytes::from(out))
    }

    fn take(&mut self) -> Bytes {
        let out = match self {
            Compressor::Gzip(e) => e.get_mut(),
            Compressor::Brotli(e) => e.get_mut(),
            Compressor::Zstd(e) => e.get_mut(),
        };
        Bytes::from(std::mem::take(out))
    }
}

/// Whether `content_type` (`type/subtype`, maybe with parameters) is one of `types`
/// (lowercase). Compared in place: no split, no allocation per response.
fn listed_type(types: &[String], content_type: &[u8]) -> bool {
    types.iter().any(|t| {
        content_type.len() >= t.len()
            && content_type[..t.len()].eq_ignore_ascii_case(t.as_bytes())
            && matches!(content_type.get(t.len()), None | Some(b';' | b' ' | b'\t'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn accepted(value: &str) -> Accepted {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_str(value).unwrap());
        Accepted::parse(headers.get_all(ACCEPT_ENCODING))
    }

    #[test]
    fn content_types_match_without_case_or_parameters() {
        let types = vec!["text/html".to_string(), "application/json".to_string()];
        for listed in [
            "text/html",
            "TEXT/HTML",
            "text/html; charset=utf-8",
            "text/html;q=1",
        ] {
            assert!(listed_type(&types, listed.as_bytes()), "{listed}");
        }
        for other in [
            "text/htmlx",
            "text/htm",
            "text/plain",
            "",
            "application/json+x",
        ] {
            assert!(!listed_type(&types, other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn accept_encoding_weights_choose_the_encoding() {
        let all = [Encoding::Zstd, Encoding::Brotli, Encoding::Gzip];
        assert_eq!(
            accepted("gzip, deflate, br").choose(&all),
            Some(Encoding::Brotli)
        );
        assert_eq!(
            accepted("gzip;q=1, br;q=0.5").choose(&all),
            Some(Encoding::Gzip)
        );
        assert_eq!(accepted("br;q=0, gzip").choose(&all), Some(Encoding::Gzip));
        assert_eq!(accepted("*").choose(&all), Some(Encoding::Zstd));
        assert_eq!(
            accepted("*;q=0.1, gzip;q=0.2").choose(&all),
            Some(Encoding::Gzip)
        );
        assert_eq!(accepted("identity").choose(&all), None);
        assert_eq!(
            accepted("GZIP").choose(&[Encoding::Gzip]),
            Some(Encoding::Gzip)
        );
        assert_eq!(
            accepted("zstd;q=0.9, br;q=0.9").choose(&[Encoding::Brotli, Encoding::Zstd]),
            Some(Encoding::Brotli)
        );
        assert_eq!(Accepted::default().choose(&all), None);
    }

    #[test]
    fn qvalues_parse_to_thousandths() {
        assert_eq!(parse_qvalue("1"), Some(1000));
        assert_eq!(parse_qvalue("0.5"), Some(500));
        assert_eq!(parse_qvalue("0.001"), Some(1));
        assert_eq!(parse_qvalue("1.000"), Some(1000));
        assert_eq!(parse_qvalue("2"), None);
        assert_eq!(parse_qvalue("0.1234"), None);
    }

    #[test]
    fn each_encoder_round_trips_across_flushes() {
        let config = CompressionConfig {
            encodings: vec![],
            min_content_length: 0,
            content_types: vec![],
            gzip_level: 6,
            brotli_quality: 4,
            zstd_level: 3,
            etag: Default::default(),
            by_encoding: Vec::new(),
        };
        let input: Vec<u8> = (0..200_000u32)
            .map(|i| (i % 251) as u8 ^ (i / 1000) as u8)
            .collect();
        for encoding in [Encoding::Gzip, Encoding::Brotli, Encoding::Zstd] {
            let mut c = Compressor::new(encoding, &config).unwrap();
            let mut out = Vec::new();
            for chunk in input.chunks(7000) {
                out.extend_from_slice(&c.write(chunk).unwrap());
                out.extend_from_slice(&c.flush().unwrap());
            }
            out.extend_from_slice(&c.finish().unwrap());
            let mut decoded = Vec::new();
            match encoding {
                Encoding::Gzip => {
                    std::io::Read::read_to_end(
                        &mut flate2::read::GzDecoder::new(&out[..]),
                        &mut decoded,
                    )
                    .unwrap();
                }
                Encoding::Brotli => {
                    brotli::BrotliDecompress(&mut &out[..], &mut decoded).unwrap();
                }
                Encoding::Zstd => decoded = zstd::stream::decode_all(&out[..]).unwrap(),
            }
            assert_eq!(decoded, input, "{encoding:?}");
        }
    }
}
