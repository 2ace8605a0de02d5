//! The overload manager's settings: the limits pressure is measured against, and the share
//! of a limit at which each action starts.
//!
//! Defaults come from where the process runs: the memory limit is the cgroup's (what the
//! kernel's OOM killer enforces), the descriptor limit the open-file limit (raised to its hard
//! limit at start), against which the descriptors really in use are counted: clients,
//! upstream connections, listeners and files. An idle keep-alive client holds one descriptor
//! and a few KiB, so counting client connections against a guess (half the limit, as if each
//! had its upstream) shed idle clients while descriptors and memory had room to spare. A
//! connection limit is watched only when one is set; `max_connections` is not a default for
//! it: that is a hard limit of its own, which the actions must not cut short.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::ser;
use crate::units::{de_opt_duration, de_opt_size};

/// Below this a memory limit is a typo (`16` meant as GiB), not a limit.
const MIN_MEMORY_LIMIT: u64 = 1 << 20;

/// How often pressure is measured unless configured.
const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverload {
    pub enabled: Option<bool>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub memory_limit: Option<u64>,
    pub connection_limit: Option<u64>,
    pub descriptor_limit: Option<u64>,
    pub disable_keepalive_at: Option<u32>,
    pub refuse_connections_at: Option<u32>,
    pub shed_requests_at: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub interval: Option<Duration>,
}

/// Validated overload settings. A limit that is `None` is not watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OverloadConfig {
    pub enabled: bool,
    /// Resident memory, in bytes.
    pub memory_limit: Option<u64>,
    /// Open downstream connections of the whole process.
    pub connection_limit: Option<u64>,
    /// File descriptors in use by the process (sockets of every kind, files).
    pub descriptor_limit: Option<u64>,
    /// Percent of a limit at which responses stop keeping connections alive...
    pub disable_keepalive_at: u32,
    /// ...new connections are closed as soon as they are accepted...
    pub refuse_connections_at: u32,
    /// ...and new requests get 503 with `x-legate-overloaded: true`.
    pub shed_requests_at: u32,
    #[serde(serialize_with = "ser::duration")]
    pub interval: Duration,
}

/// What the process may use, read once at load: (cgroup memory limit, open-file limit).
#[derive(Debug, Clone, Copy, Default)]
pub struct Environment {
    pub memory_limit: Option<u64>,
    pub open_files: Option<u64>,
}

impl Environment {
    /// This process's limits, from cgroupfs and `/proc` (Linux); none elsewhere.
    pub fn current() -> Self {
        Self {
            memory_limit: cgroup_memory_limit(),
            open_files: crate::machine::open_file_limit(),
        }
    }
}

pub(crate) fn overload(
    raw: Option<RawOverload>,
    env: Environment,
) -> Result<OverloadConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let keepalive = percent(
        raw.disable_keepalive_at,
        80,
        "overload.disable_keepalive_at",
    )?;
    let refuse = percent(
        raw.refuse_connections_at,
        90,
        "overload.refuse_connections_at",
    )?;
    let shed = percent(raw.shed_requests_at, 95, "overload.shed_requests_at")?;
    if !(keepalive <= refuse && refuse <= shed) {
        return Err(ConfigError::invalid(
            "overload",
            format!(
                "actions start in order as pressure rises: expected disable_keepalive_at <= refuse_connections_at <= shed_requests_at, found {keepalive}, {refuse}, {shed}"
            ),
        ));
    }
    let interval = raw.interval.unwrap_or(DEFAULT_INTERVAL);
    if interval < Duration::from_millis(10) || interval > Duration::from_secs(60) {
        return Err(ConfigError::invalid(
            "overload.interval",
            "expected 10ms to 60s",
        ));
    }
    let memory_limit = match raw.memory_limit {
        Some(bytes) if bytes < MIN_MEMORY_LIMIT => {
            return Err(ConfigError::invalid(
                "overload.memory_limit",
                format!("expected at least 1MiB, found {bytes} bytes"),
            ));
        }
        Some(bytes) => Some(bytes),
        None => env.memory_limit,
    };
    let connection_limit = match raw.connection_limit {
        Some(0) => {
            return Err(ConfigError::invalid(
                "overload.connection_limit",
                "expected at least 1",
            ));
        }
        other => other,
    };
    let descriptor_limit = match raw.descriptor_limit {
        Some(0) => {
            return Err(ConfigError::invalid(
                "overload.descriptor_limit",
                "expected at least 1",
            ));
        }
        Some(n) => Some(n),
        // RLIM_INFINITY and other absurd values are no limit to measure against.
        None => env.open_files.filter(|&n| n < 1 << 40),
    };
    Ok(OverloadConfig {
        enabled: raw.enabled.unwrap_or(true),
        memory_limit,
        connection_limit,
        descriptor_limit,
        disable_keepalive_at: keepalive,
        refuse_connections_at: refuse,
        shed_requests_at: shed,
        interval,
    })
}

fn percent(value: Option<u32>, default: u32, path: &str) -> Result<u32, ConfigError> {
    match value.unwrap_or(default) {
        p @ 1..=100 => Ok(p),
        other => Err(ConfigError::invalid(
            path,
            format!("expected a percentage from 1 to 100, found {other}"),
        )),
    }
}

/// `memory.max` (cgroup v2) or `memory.limit_in_bytes` (v1) of the process's cgroup; `None`
/// when there is none or it is unlimited.
fn cgroup_memory_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        // `0::/path` (v2) or `N:memory:/path` (v1).
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            continue;
        };
        let text = std::fs::read_to_string(&file).or_else(|_| {
            // Inside a container the cgroup is often mounted as the root.
            let root = if controllers.is_empty() {
                "/sys/fs/cgroup/memory.max"
            } else {
                "/sys/fs/cgroup/memory/memory.limit_in_bytes"
            };
            std::fs::read_to_string(root)
        });
        let Ok(text) = text else {
            // A hybrid host lists v2 first; its v1 memory controller may come next.
            continue;
        };
        // "max", or v1's "no limit" (a page-rounded i64::MAX).
        return text.trim().parse::<u64>().ok().filter(|&b| b < (1 << 62));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Environment {
        Environment {
            memory_limit: Some(1 << 30),
            open_files: Some(1024),
        }
    }

    #[test]
    fn defaults_come_from_the_environment() {
        let config = overload(None, env()).unwrap();
        assert_eq!(config.memory_limit, Some(1 << 30));
        assert_eq!(config.connection_limit, None);
        assert_eq!(config.descriptor_limit, Some(1024));
        assert_eq!(
            (
                config.disable_keepalive_at,
                config.refuse_connections_at,
                config.shed_requests_at
            ),
            (80, 90, 95)
        );
        let config = overload(None, Environment::default()).unwrap();
        assert_eq!(
            (
                config.memory_limit,
                config.connection_limit,
                config.descriptor_limit
            ),
            (None, None, None)
        );
        let raw = RawOverload {
            connection_limit: Some(100),
            descriptor_limit: Some(5000),
            ..Default::default()
        };
        let config = overload(Some(raw), env()).unwrap();
        assert_eq!(
            (config.connection_limit, config.descriptor_limit),
            (Some(100), Some(5000))
        );
        let raw = RawOverload {
            descriptor_limit: Some(0),
            ..Default::default()
        };
        let err = overload(Some(raw), env()).unwrap_err().to_string();
        assert!(err.contains("overload.descriptor_limit"), "{err}");
    }

    #[test]
    fn actions_out_of_order_or_out_of_range_are_refused() {
        let raw = RawOverload {
            refuse_connections_at: Some(70),
            ..Default::default()
        };
        let err = overload(Some(raw), env()).unwrap_err().to_string();
        assert!(err.contains("in order"), "{err}");
        let raw = RawOverload {
            shed_requests_at: Some(101),
            ..Default::default()
        };
        let err = overload(Some(raw), env()).unwrap_err().to_string();
        assert!(err.contains("overload.shed_requests_at"), "{err}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_machine_s_open_file_limit_is_read() {
        // getrlimit always answers for RLIMIT_NOFILE.
        let env = Environment::current();
        assert!(env.open_files.is_some_and(|n| n > 0), "{env:?}");
        assert_ne!(env.memory_limit, Some(0));
    }
}
