//! Units written in config files, read and written back: durations (`250ms`, `10s`) and
//! sizes (`32KiB`).

use std::fmt;
use std::time::Duration;

use serde::Serializer;
use serde::de::{self, Deserializer, Visitor};

/// Parses `500us`, `250ms`, `10s`, `5m`, `1h`. A bare `0` is allowed and means zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("`{text}` has no unit; write e.g. `250ms`, `10s`, `5m`"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a number"))?;
    let scale = match unit {
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "`{text}` has unknown unit `{unit}`; use us, ms, s, m or h"
            ));
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > 1e9 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a byte size: `4096`, `32KiB`, `1MiB`, `1GiB`, and the decimal `KB`, `MB`, `GB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a whole number"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{text}` has unknown unit `{other}`; use B, KiB, MiB, GiB, KB, MB or GB"
            ));
        }
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// serde adapter: text, kept as its bytes.
pub fn de_text_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<bytes::Bytes, D::Error> {
    <String as serde::Deserialize>::deserialize(d).map(bytes::Bytes::from)
}

/// serde adapter: optional text, kept as its bytes.
pub fn de_opt_text_bytes<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<bytes::Bytes>, D::Error> {
    <Option<String> as serde::Deserialize>::deserialize(d).map(|s| s.map(bytes::Bytes::from))
}

/// serde adapter: a duration written as a string with a unit.
pub fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as `250ms` or `10s`")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            parse_duration(v).map_err(E::custom)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            if v == 0 {
                Ok(Duration::ZERO)
            } else {
                Err(E::custom(format!(
                    "`{v}` has no unit; write e.g. `{v}ms` or `{v}s`"
                )))
            }
        }
    }
    d.deserialize_any(V)
}

/// serde adapter for `Option<Duration>` fields.
pub fn de_opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    de_duration(d).map(Some)
}

/// serde adapter: a size written as a number of bytes or a string with a unit.
pub fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a size such as `32KiB` or a number of bytes")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse_size(v).map_err(E::custom)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
    }
    d.deserialize_any(V)
}

/// serde adapter for `Option<u64>` size fields.
pub fn de_opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_size(d).map(Some)
}

/// `250ms`, `15s`, `1500us`: the largest unit that writes it exactly.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.subsec_micros().is_multiple_of(1000) {
        format!("{}us", d.as_micros())
    } else if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else {
        format!("{}s", d.as_secs())
    }
}

pub(crate) fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

pub(crate) fn ser_opt_duration<S: Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_duration(d, s),
        None => s.serialize_none(),
    }
}

/// `32KiB`, `1MiB`, or the number of bytes when no binary unit writes it exactly.
pub fn format_size(bytes: u64) -> String {
    for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    bytes.to_string()
}

pub(crate) fn ser_size<S: Serializer>(bytes: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_size(*bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_written_as_read() {
        for text in ["32KiB", "1MiB", "3GiB", "1000", "0"] {
            assert_eq!(format_size(parse_size(text).unwrap()), text);
        }
    }

    #[test]
    fn durations_are_written_as_read() {
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(15)), "15s");
        assert_eq!(format_duration(Duration::from_micros(1500)), "1500us");
        for text in ["250ms", "15s", "1500us", "0s"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }

    #[test]
    fn durations_take_every_unit() {
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_without_a_known_unit_are_refused() {
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("10 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_duration("ms").unwrap_err().contains("number"));
        assert!(parse_duration("1e300h").is_err());
    }

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("32KiB"), Ok(32 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert!(
            parse_size("12 bananas")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(
            parse_size("99999999999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
    }
}
