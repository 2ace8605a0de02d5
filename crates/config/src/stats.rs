//! `stats:` how the admin server exports latency histograms to Prometheus, and how long the
//! series of a removed cluster, host or listener stay before they are retired.

use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use super::ConfigError;

/// Most bucket bounds a histogram exports: each is a series per histogram series.
const MAX_BUCKETS: usize = 64;

/// How long a series nothing records into stays exported: Prometheus's default scrape
/// interval, so that a scrape sees the last counts of a removed host.
const DEFAULT_RETIRE_AFTER: Duration = Duration::from_secs(60);

/// The bounds of `retire_after`: shorter would retire series between a config swap's old and
/// new handles on a slow machine; longer keeps a churning fleet's memory for no reader.
const RETIRE_AFTER_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3600));

/// Validated `stats` settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatsConfig {
    /// The upper bounds of each histogram's `_bucket` series, ascending.
    #[serde(serialize_with = "ser_durations")]
    pub histogram_buckets: Vec<Duration>,
    /// Whether each histogram also exports this process's quantiles (`x_seconds_quantile`).
    pub quantiles: bool,
    /// How long the series of something removed (a cluster, a host, a listener) stay after
    /// the last handle on them is dropped, before they are retired and their memory freed.
    #[serde(serialize_with = "crate::ser::duration")]
    pub retire_after: Duration,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            histogram_buckets: stats::DEFAULT_BUCKETS_US
                .iter()
                .map(|&us| Duration::from_micros(us))
                .collect(),
            quantiles: true,
            retire_after: DEFAULT_RETIRE_AFTER,
        }
    }
}

impl StatsConfig {
    /// The Prometheus renderer's options.
    pub fn prometheus(&self) -> stats::PrometheusOptions {
        stats::PrometheusOptions {
            buckets: self
                .histogram_buckets
                .iter()
                .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
                .collect(),
            quantiles: self.quantiles,
        }
    }
}

fn ser_durations<S: Serializer>(bounds: &[Duration], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(bounds.iter().map(|d| crate::units::format_duration(*d)))
}

/// `stats: { histogram_buckets: [100us, 1ms, ...], quantiles: true }`.
pub(crate) fn stats(raw: Option<RawStats>) -> Result<StatsConfig, ConfigError> {
    let Some(raw) = raw else {
        return Ok(StatsConfig::default());
    };
    let mut config = StatsConfig::default();
    if let Some(bounds) = raw.histogram_buckets {
        if bounds.is_empty() || bounds.len() > MAX_BUCKETS {
            return Err(ConfigError::invalid(
                "stats.histogram_buckets",
                format!("expected 1 to {MAX_BUCKETS} bounds"),
            ));
        }
        let mut parsed: Vec<Duration> = Vec::with_capacity(bounds.len());
        for (i, text) in bounds.iter().enumerate() {
            let at = format!("stats.histogram_buckets[{i}]");
            let bound =
                crate::units::parse_duration(text).map_err(|e| ConfigError::invalid(&at, e))?;
            if bound < Duration::from_micros(1) {
                return Err(ConfigError::invalid(at, "expected at least 1us"));
            }
            if parsed.last().is_some_and(|last| *last >= bound) {
                return Err(ConfigError::invalid(
                    at,
                    "expected bounds in increasing order",
                ));
            }
            parsed.push(bound);
        }
        config.histogram_buckets = parsed;
    }
    if let Some(quantiles) = raw.quantiles {
        config.quantiles = quantiles;
    }
    if let Some(after) = raw.retire_after {
        let (min, max) = RETIRE_AFTER_RANGE;
        if after < min || after > max {
            return Err(ConfigError::invalid(
                "stats.retire_after",
                format!(
                    "expected 1s to 1h, found {}",
                    crate::units::format_duration(after)
                ),
            ));
        }
        config.retire_after = after;
    }
    Ok(config)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStats {
    /// Durations (`100us`, `2.5ms`), ascending.
    pub histogram_buckets: Option<Vec<String>>,
    pub quantiles: Option<bool>,
    #[serde(default, deserialize_with = "crate::units::de_opt_duration")]
    pub retire_after: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(buckets: &[&str]) -> Option<RawStats> {
        Some(RawStats {
            histogram_buckets: Some(buckets.iter().map(|s| (*s).to_owned()).collect()),
            quantiles: Some(false),
            retire_after: None,
        })
    }

    #[test]
    fn bounds_are_durations_in_increasing_order() {
        let config = stats(raw(&["250us", "1ms", "1.5s"])).unwrap();
        assert_eq!(config.prometheus().buckets, [250, 1_000, 1_500_000]);
        assert!(!config.quantiles);
        for (bad, says) in [
            (&["1ms", "1ms"][..], "increasing"),
            (&["2ms", "1ms"], "increasing"),
            (&["0s"], "at least"),
            (&["fast"], "histogram_buckets[0]"),
            (&[], "1 to 64"),
        ] {
            let err = stats(raw(bad)).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        assert_eq!(
            stats(None).unwrap().prometheus(),
            stats::PrometheusOptions::default()
        );
    }

    #[test]
    fn retire_after_is_a_duration_from_a_second_to_an_hour() {
        let with = |after: Option<Duration>| {
            stats(Some(RawStats {
                histogram_buckets: None,
                quantiles: None,
                retire_after: after,
            }))
        };
        assert_eq!(with(None).unwrap().retire_after, Duration::from_secs(60));
        assert_eq!(
            with(Some(Duration::from_secs(5))).unwrap().retire_after,
            Duration::from_secs(5)
        );
        for bad in [Duration::from_millis(500), Duration::from_secs(3601)] {
            let err = with(Some(bad)).unwrap_err().to_string();
            assert!(
                err.contains("stats.retire_after") && err.contains("1s to 1h"),
                "{err}"
            );
        }
    }
}
