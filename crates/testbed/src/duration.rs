//! The tiny duration syntax of `x-noop-delay`: `250us`, `20ms`, `1s`, `2m`; a bare integer
//! means milliseconds.

use std::time::Duration;

/// Parses `value`, or returns `None` if it is not a whole number with a known unit.
pub(crate) fn parse_duration(value: &str) -> Option<Duration> {
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    // `u64::from_str` would accept a leading `+`; the split above already rejects it.
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "" | "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_duration("20"), Some(Duration::from_millis(20)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "ms",
            "-5",
            "+5",
            "1.5s",
            "5 ms",
            "5h",
            "5MS",
            " 5",
            "99999999999999999999",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        assert_eq!(parse_duration(&format!("{}m", u64::MAX)), None);
    }
}
