//! What a balancer records through the `metrics` facade (feature `metrics`), for a service
//! that embeds it to export with the recorder of its choice (metrics-exporter-prometheus,
//! for one). Handles are made once per balancer, so a pick costs one counter increment, not a
//! lookup in the recorder.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `balancer_picks_total` | counter | `policy` | hosts picked |
//! | `balancer_pick_failures_total` | counter | `policy` | picks that found no host to offer |
//! | `balancer_panic_mode_entered_total` | counter | `policy` | table rebuilds that went into panic mode (too few available hosts: picks ignore health) |
//! | `balancer_panic_mode` | gauge | `policy` | 1 while the tables in use are in panic mode |
//! | `balancer_table_rebuilds_total` | counter | `policy` | tables rebuilt after the host set changed |
//! | `balancer_host_set_updates_total` | counter | | changes published to a host set (lists, health, weights) |

use metrics::{Counter, Gauge};

pub(crate) struct Meters {
    pub(crate) picks: Counter,
    pub(crate) pick_failures: Counter,
    pub(crate) panic_entered: Counter,
    pub(crate) panic_mode: Gauge,
    pub(crate) rebuilds: Counter,
}

impl Meters {
    pub(crate) fn new(policy: &'static str) -> Self {
        Self {
            picks: metrics::counter!("balancer_picks_total", "policy" => policy),
            pick_failures: metrics::counter!("balancer_pick_failures_total", "policy" => policy),
            panic_entered: metrics::counter!("balancer_panic_mode_entered_total", "policy" => policy),
            panic_mode: metrics::gauge!("balancer_panic_mode", "policy" => policy),
            rebuilds: metrics::counter!("balancer_table_rebuilds_total", "policy" => policy),
        }
    }

    /// After the tables were rebuilt: `panic` says whether they are in panic mode now,
    /// `was` whether the previous ones were.
    pub(crate) fn rebuilt(&self, was: bool, panic: bool) {
        self.rebuilds.increment(1);
        if panic && !was {
            self.panic_entered.increment(1);
        }
        self.panic_mode.set(if panic { 1.0 } else { 0.0 });
    }
}

/// A host set's update counter.
pub(crate) fn host_set_updates() -> Counter {
    metrics::counter!("balancer_host_set_updates_total")
}
