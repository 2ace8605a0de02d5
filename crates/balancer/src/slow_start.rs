//! Envoy's slow start: a host that joins the set, or passes its health checks again after
//! failing them, takes a growing share of its weight over a window, so that a cold host is
//! not sent its full share at once. Round robin and least request only, as in Envoy.
//!
//! Within the window, a host's weight is scaled by
//! `max(min_weight_percent / 100, time_factor ^ (1 / aggression))`, where `time_factor` is
//! the time since it started (at least 1 ms) over the window. Hosts present when the set is
//! first built, and hosts coming back from an outlier ejection, do not ramp (as in Envoy,
//! where only joining and passing active health checks start a host's window).

use std::time::Duration;

use crate::BuildError;

/// Slow start's settings (Envoy's `slow_start_config`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowStart {
    /// How long a host ramps up.
    pub window: Duration,
    /// The ramp's shape: 1 is linear, above 1 faster at first, below 1 slower.
    pub aggression: f64,
    /// The least share of its weight a ramping host gets, in percent (Envoy's default: 10).
    pub min_weight_percent: f64,
}

impl SlowStart {
    /// Envoy's defaults (linear, at least 10%) over `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            aggression: 1.0,
            min_weight_percent: 10.0,
        }
    }

    /// The share of its weight a host gets `elapsed` after it started (1 past the window).
    pub fn factor(&self, elapsed: Duration) -> f64 {
        if elapsed >= self.window {
            return 1.0;
        }
        let time_factor =
            elapsed.max(Duration::from_millis(1)).as_secs_f64() / self.window.as_secs_f64();
        let ramp = if self.aggression == 1.0 {
            time_factor
        } else {
            time_factor.powf(1.0 / self.aggression)
        };
        ramp.max(self.min_weight_percent / 100.0).min(1.0)
    }

    /// How often a balancer with a ramping host rebuilds its tables: a twentieth of the
    /// window, but not more often than every 100 ms (a rebuild is on a request's path).
    pub(crate) fn step(&self) -> Duration {
        (self.window / 20).max(Duration::from_millis(100))
    }

    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        let invalid = |reason: &'static str| Err(BuildError::InvalidSlowStart { reason });
        if self.window.is_zero() {
            return invalid("the window is zero");
        }
        if !(self.aggression.is_finite() && self.aggression > 0.0) {
            return invalid("aggression must be a number above 0");
        }
        if !(0.0..=100.0).contains(&self.min_weight_percent) {
            return invalid("min_weight_percent must be within 0..=100");
        }
        Ok(())
    }
}

/// Weights are multiplied by this while a host ramps, so that a fraction of a weight still
/// orders hosts (a weight-1 host at 10% is 100 against its peers' 1000; 0.1% is the finest
/// step).
pub(crate) const SCALE: f64 = 1000.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_follows_envoys_formula() {
        let linear = SlowStart::new(Duration::from_secs(10));
        assert_eq!(linear.factor(Duration::ZERO), 0.1, "the minimum weight");
        assert!((linear.factor(Duration::from_secs(5)) - 0.5).abs() < 1e-9);
        assert_eq!(linear.factor(Duration::from_secs(10)), 1.0);
        assert_eq!(linear.factor(Duration::from_secs(60)), 1.0);
        let aggressive = SlowStart {
            aggression: 2.0,
            ..linear
        };
        // sqrt(2.5 / 10) = 0.5: twice as fast early on.
        assert!((aggressive.factor(Duration::from_millis(2500)) - 0.5).abs() < 1e-9);
        let no_floor = SlowStart {
            min_weight_percent: 0.0,
            ..linear
        };
        assert!(
            (no_floor.factor(Duration::ZERO) - 0.0001).abs() < 1e-12,
            "1 ms of 10 s"
        );
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        let ok = SlowStart::new(Duration::from_secs(1));
        assert!(ok.validate().is_ok());
        assert!(SlowStart::new(Duration::ZERO).validate().is_err());
        let bad = |s: SlowStart| s.validate().is_err();
        assert!(bad(SlowStart {
            aggression: 0.0,
            ..ok
        }));
        assert!(bad(SlowStart {
            aggression: f64::NAN,
            ..ok
        }));
        assert!(bad(SlowStart {
            min_weight_percent: 101.0,
            ..ok
        }));
    }
}
