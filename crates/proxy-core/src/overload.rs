//! The overload manager: sheds load before the process runs out of memory or descriptors.
//!
//! A thread measures the process's resident memory, the file descriptors it has open and (when
//! a limit is set) its open downstream connections, each against its limit (`overload` in the
//! config), and publishes one level. As the pressure (the highest of the shares) rises, the actions start in order: responses stop
//! keeping connections alive (clients reconnect, and the balancer in front spreads them
//! elsewhere), new connections are closed as soon as they are accepted, then new requests get
//! 503 with `x-legate-overloaded: true`. An action ends once the pressure falls more than
//! [`RECOVERY_MARGIN`] points below where it started, so a pressure hovering at a threshold
//! does not flap. Workers read the level with one relaxed atomic load per connection or
//! request. While memory is near or past the first threshold, freed memory is also handed back to
//! the system once a second (Envoy's `shrink_heap`), so that the resident size, and with it
//! the pressure, falls as soon as the load that caused it is gone.
//!
//! ```
//! # use proxy_core::overload::{Level, level_for};
//! # let config = proxy_core::config::OverloadConfig {
//! #     enabled: true, memory_limit: Some(100), connection_limit: None, descriptor_limit: None,
//! #     disable_keepalive_at: 80, refuse_connections_at: 90, shed_requests_at: 95,
//! #     interval: std::time::Duration::from_millis(250),
//! # };
//! assert_eq!(level_for(&config, 91, Level::Normal), Level::RefuseConnections);
//! // Falling back to 87 keeps refusing (within the margin); 84 does not.
//! assert_eq!(level_for(&config, 87, Level::RefuseConnections), Level::RefuseConnections);
//! assert_eq!(level_for(&config, 84, Level::RefuseConnections), Level::DisableKeepalive);
//! ```

use std::fmt::Write as _;
use std::sync::Weak;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use config::OverloadConfig;

/// Points of pressure below its threshold at which an action ends.
pub const RECOVERY_MARGIN: u32 = 5;

/// How often freed memory is handed back while memory is under pressure.
const SHRINK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How far the overload manager has gone, each level including the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Normal = 0,
    DisableKeepalive = 1,
    RefuseConnections = 2,
    ShedRequests = 3,
}

impl Level {
    /// The actions, in the order they start.
    pub const ACTIONS: [Level; 3] = [
        Level::DisableKeepalive,
        Level::RefuseConnections,
        Level::ShedRequests,
    ];

    fn from_u8(value: u8) -> Level {
        match value {
            0 => Level::Normal,
            1 => Level::DisableKeepalive,
            2 => Level::RefuseConnections,
            _ => Level::ShedRequests,
        }
    }

    /// The action's name in stats and `/ready`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Normal => "none",
            Level::DisableKeepalive => "disable_keepalive",
            Level::RefuseConnections => "refuse_connections",
            Level::ShedRequests => "shed_requests",
        }
    }

    fn threshold(self, config: &OverloadConfig) -> u32 {
        match self {
            Level::Normal => 0,
            Level::DisableKeepalive => config.disable_keepalive_at,
            Level::RefuseConnections => config.refuse_connections_at,
            Level::ShedRequests => config.shed_requests_at,
        }
    }
}

/// The level for `pressure` (percent of a limit), coming from `current`: an action starts at
/// its threshold and ends more than [`RECOVERY_MARGIN`] points below it.
pub fn level_for(config: &OverloadConfig, pressure: u32, current: Level) -> Level {
    let mut level = Level::Normal;
    for action in Level::ACTIONS {
        let threshold = action.threshold(config);
        let holds = if action <= current {
            pressure > 0 && pressure.saturating_add(RECOVERY_MARGIN) >= threshold
        } else {
            pressure >= threshold
        };
        if holds {
            level = action;
        }
    }
    level
}

/// The state workers read, and the overload thread writes.
#[derive(Debug, Default)]
pub struct Overload {
    /// Read on every request; written only by the overload thread.
    level: AtomicU8,
    /// The last measurements, for `/ready` and stats: percent of each limit (`u32::MAX`:
    /// not watched).
    memory_percent: AtomicU32,
    connection_percent: AtomicU32,
    descriptor_percent: AtomicU32,
}

impl Overload {
    pub fn level(&self) -> Level {
        Level::from_u8(self.level.load(Ordering::Relaxed))
    }

    pub(crate) fn keepalive_disabled(&self) -> bool {
        self.level() >= Level::DisableKeepalive
    }

    pub(crate) fn refusing_connections(&self) -> bool {
        self.level() >= Level::RefuseConnections
    }

    pub(crate) fn shedding_requests(&self) -> bool {
        self.level() >= Level::ShedRequests
    }

    /// Publishes the level for one round of measurements: (the level before, the level now).
    fn update(&self, config: &OverloadConfig, used: Usage) -> (Level, Level) {
        let before = self.level();
        let memory = share(used.resident, config.memory_limit);
        let connections = share(Some(used.connections), config.connection_limit);
        let descriptors = share(used.descriptors, config.descriptor_limit);
        let mut pressure = 0;
        for (percent, slot) in [
            (memory, &self.memory_percent),
            (connections, &self.connection_percent),
            (descriptors, &self.descriptor_percent),
        ] {
            slot.store(percent.unwrap_or(u32::MAX), Ordering::Relaxed);
            pressure = pressure.max(percent.unwrap_or(0));
        }
        let now = if config.enabled {
            level_for(config, pressure, before)
        } else {
            Level::Normal
        };
        self.level.store(now as u8, Ordering::Relaxed);
        (before, now)
    }

    /// `/ready`'s line about overload: the actions in force and the pressure behind them;
    /// `None` when nothing is in force.
    pub fn describe(&self) -> Option<String> {
        let level = self.level();
        if level == Level::Normal {
            return None;
        }
        let mut text = String::from("overload:");
        for action in Level::ACTIONS.into_iter().filter(|a| *a <= level) {
            let _ = write!(text, " {}", action.name());
            if action < level {
                text.push(',');
            }
        }
        let mut sep = " (";
        for (what, percent) in [
            ("memory", &self.memory_percent),
            ("connections", &self.connection_percent),
            ("descriptors", &self.descriptor_percent),
        ] {
            let percent = percent.load(Ordering::Relaxed);
            if percent != u32::MAX {
                let _ = write!(text, "{sep}{what} at {percent}% of its limit");
                sep = ", ";
            }
        }
        if sep == ", " {
            text.push(')');
        }
        Some(text)
    }
}

/// One round of measurements.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    /// Resident memory in bytes.
    resident: Option<u64>,
    /// Open downstream connections.
    connections: u64,
    /// File descriptors open.
    descriptors: Option<u64>,
}

/// `used` as a percentage of `limit`, when both are known.
fn share(used: Option<u64>, limit: Option<u64>) -> Option<u32> {
    let (used, limit) = (used?, limit?);
    // Capped well below `u32::MAX`, which stands for "not watched".
    Some((used.saturating_mul(100) / limit.max(1)).min(1_000_000) as u32)
}

/// What the overload thread publishes besides the level.
pub(crate) struct OverloadGauges {
    /// Per action, in [`Level::ACTIONS`] order: 1 while in force.
    active: [stats::SharedGauge; 3],
    memory_percent: stats::SharedGauge,
    connection_percent: stats::SharedGauge,
    descriptor_percent: stats::SharedGauge,
    descriptors_in_use: stats::SharedGauge,
    descriptor_limit: stats::SharedGauge,
}

impl OverloadGauges {
    /// The gauges, on the process shard.
    pub(crate) fn new(catalog: &crate::catalog::Catalog, process: &stats::Shard) -> Self {
        let active =
            |action: Level| process.shared_gauge(catalog.overload_action_active, &[action.name()]);
        let [keepalive, refuse, shed] = Level::ACTIONS;
        Self {
            active: [active(keepalive), active(refuse), active(shed)],
            memory_percent: process.shared_gauge(catalog.overload_resource_pressure, &["memory"]),
            connection_percent: process
                .shared_gauge(catalog.overload_resource_pressure, &["connections"]),
            descriptor_percent: process
                .shared_gauge(catalog.overload_resource_pressure, &["descriptors"]),
            descriptors_in_use: process.shared_gauge(catalog.server_descriptors_in_use, &[]),
            descriptor_limit: process.shared_gauge(catalog.server_descriptor_limit, &[]),
        }
    }
}

/// Resident set size from `/proc/self/status` (Linux), in bytes: `VmRSS` is in kB whatever
/// the page size.
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line["VmRSS:".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// File descriptors this process has open, from `/proc/self/fd` (Linux): every socket,
/// listener, pipe and file, whoever opened it. Reading it costs a directory walk, once per
/// interval. The walk needs a descriptor itself: when none is left (the process or the system
/// is out of them), that is all of `limit` in use, not a count unknown.
pub(crate) fn descriptors_in_use(limit: Option<u64>) -> Option<u64> {
    match std::fs::read_dir("/proc/self/fd") {
        // The walk's own descriptor is listed too.
        Ok(entries) => Some((entries.count() as u64).saturating_sub(1)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => limit,
        Err(_) => None,
    }
}

/// Starts the thread that measures every `interval` of the settings `settings` gives, until
/// it gives `None` (the server is gone). `connections` counts the open client connections
/// (the workers already keep that count, for connection balancing).
pub(crate) fn start(
    overload: Weak<Overload>,
    settings: impl Fn() -> Option<OverloadConfig> + Send + 'static,
    connections: impl Fn() -> u64 + Send + 'static,
    gauges: OverloadGauges,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("legate-overload".into())
        .spawn(move || {
            let mut last_shrink = std::time::Instant::now();
            while let Some(config) = settings() {
                std::thread::sleep(config.interval);
                let Some(overload) = overload.upgrade() else {
                    return;
                };
                let descriptors = descriptors_in_use(config.descriptor_limit);
                let used = Usage {
                    resident: resident_bytes(),
                    connections: connections(),
                    descriptors,
                };
                let (before, now) = overload.update(&config, used);
                let memory = overload.memory_percent.load(Ordering::Relaxed);
                // From where the first action could still be in force, so that the pressure
                // can fall far enough to end it.
                if config.enabled
                    && memory != u32::MAX
                    && memory.saturating_add(RECOVERY_MARGIN) >= config.disable_keepalive_at
                    && last_shrink.elapsed() >= SHRINK_EVERY
                {
                    crate::memory::trim_now();
                    last_shrink = std::time::Instant::now();
                }
                for (gauge, action) in gauges.active.iter().zip(Level::ACTIONS) {
                    gauge.set(i64::from(now >= action));
                }
                let percent = |p: &AtomicU32| match p.load(Ordering::Relaxed) {
                    u32::MAX => -1,
                    p => i64::from(p),
                };
                gauges.memory_percent.set(percent(&overload.memory_percent));
                gauges
                    .connection_percent
                    .set(percent(&overload.connection_percent));
                gauges
                    .descriptor_percent
                    .set(percent(&overload.descriptor_percent));
                let count = |n: Option<u64>| n.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
                gauges.descriptors_in_use.set(count(descriptors));
                gauges.descriptor_limit.set(count(config.descriptor_limit));
                if now > before {
                    tracing::warn!(
                        action = now.name(),
                        detail = overload.describe().unwrap_or_default(),
                        "overloaded: shedding load"
                    );
                } else if now < before {
                    tracing::info!(action = now.name(), "overload eased");
                }
            }
        })
        .map(drop)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config() -> OverloadConfig {
        OverloadConfig {
            enabled: true,
            memory_limit: Some(1000),
            connection_limit: Some(10),
            descriptor_limit: Some(100),
            disable_keepalive_at: 80,
            refuse_connections_at: 90,
            shed_requests_at: 95,
            interval: Duration::from_millis(10),
        }
    }

    #[test]
    fn actions_start_in_order_and_end_below_their_margin() {
        let c = config();
        let mut level = Level::Normal;
        let mut seen = Vec::new();
        for pressure in (0..=100).chain((0..=100).rev()) {
            let next = level_for(&c, pressure, level);
            if next != level {
                seen.push((pressure, next));
                level = next;
            }
        }
        assert_eq!(
            seen,
            [
                (80, Level::DisableKeepalive),
                (90, Level::RefuseConnections),
                (95, Level::ShedRequests),
                (89, Level::RefuseConnections),
                (84, Level::DisableKeepalive),
                (74, Level::Normal),
            ]
        );
    }

    fn used(resident: u64, connections: u64, descriptors: u64) -> Usage {
        Usage {
            resident: Some(resident),
            connections,
            descriptors: Some(descriptors),
        }
    }

    #[test]
    fn the_highest_pressure_of_memory_connections_and_descriptors_decides() {
        let overload = Overload::default();
        let c = config();
        assert_eq!(overload.update(&c, used(100, 0, 10)).1, Level::Normal);
        assert_eq!(
            overload.update(&c, used(100, 9, 10)).1,
            Level::RefuseConnections
        );
        assert!(overload.refusing_connections() && !overload.shedding_requests());
        assert_eq!(overload.update(&c, used(960, 9, 10)).1, Level::ShedRequests);
        let text = overload.describe().unwrap();
        assert!(
            text.contains("disable_keepalive, refuse_connections, shed_requests")
                && text.contains("memory at 96%")
                && text.contains("connections at 90%")
                && text.contains("descriptors at 10%"),
            "{text}"
        );
        assert_eq!(overload.update(&c, used(100, 0, 10)).1, Level::Normal);
        assert_eq!(overload.describe(), None);
        // Descriptors alone: 81 of 100 in use.
        assert_eq!(
            overload.update(&c, used(100, 0, 81)).1,
            Level::DisableKeepalive
        );
        assert!(overload.describe().unwrap().contains("descriptors at 81%"));
    }

    #[test]
    fn unwatched_or_disabled_means_normal() {
        let overload = Overload::default();
        let mut c = config();
        c.memory_limit = None;
        c.connection_limit = None;
        c.descriptor_limit = None;
        assert_eq!(
            overload.update(&c, used(u64::MAX, u64::MAX, u64::MAX)).1,
            Level::Normal
        );
        let mut c = config();
        c.enabled = false;
        assert_eq!(overload.update(&c, used(999, 0, 0)).1, Level::Normal);
    }
}
