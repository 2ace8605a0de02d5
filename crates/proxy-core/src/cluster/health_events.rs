//! Envoy's health-check event log: a JSON line per event (its `HealthCheckEvent`, field
//! names as Envoy writes them) appended to the cluster's `event_log_path`. A host that fails
//! its checks (`eject_unhealthy_event`) and passes them again (`add_healthy_event`) is
//! always logged; each failed check when asked (`always_log_health_check_failures`) or when
//! it is the host's first, and each passed check without a change when asked
//! (`always_log_health_check_success`).

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::SystemTime;

use config::HealthCheckConfig;
use serde_json::{Value, json};

/// Why a check failed, as Envoy's `HealthCheckFailureType` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailureType {
    /// The host answered, and the answer fails the check.
    Active,
    /// No connection, or it broke.
    Network,
    /// No answer within the timeout.
    NetworkTimeout,
}

impl FailureType {
    fn name(self) -> &'static str {
        match self {
            FailureType::Active => "ACTIVE",
            FailureType::Network => "NETWORK",
            FailureType::NetworkTimeout => "NETWORK_TIMEOUT",
        }
    }
}

pub(super) struct EventLog {
    file: RefCell<File>,
    cluster: String,
    /// `HTTP`, `TCP` or `GRPC`.
    checker: &'static str,
    always_failures: bool,
    always_success: bool,
}

impl EventLog {
    /// The cluster's event log, if its checks have one; a file that cannot be opened is
    /// reported and not logged to.
    pub(super) fn open(cluster: &str, check: &HealthCheckConfig) -> Option<Rc<Self>> {
        let path = check.event_log_path.as_ref()?;
        let file = match File::options().create(true).append(true).open(path) {
            Ok(file) => file,
            Err(error) => {
                tracing::error!(cluster, path, %error, "cannot open the health-check event log");
                return None;
            }
        };
        let checker = if check.tcp {
            "TCP"
        } else if check.grpc.is_some() {
            "GRPC"
        } else {
            "HTTP"
        };
        Some(Rc::new(Self {
            file: RefCell::new(file),
            cluster: cluster.to_owned(),
            checker,
            always_failures: check.always_log_health_check_failures,
            always_success: check.always_log_health_check_success,
        }))
    }

    /// The host started failing its checks.
    pub(super) fn ejected(&self, host: SocketAddr, why: FailureType) {
        self.write(
            host,
            "eject_unhealthy_event",
            json!({ "failure_type": why.name() }),
        );
    }

    /// The host passes its checks again.
    pub(super) fn added(&self, host: SocketAddr) {
        self.write(host, "add_healthy_event", json!({ "first_check": false }));
    }

    /// A check failed: logged when asked, and for a host's first check (as Envoy).
    pub(super) fn failed(&self, host: SocketAddr, why: FailureType, first_check: bool) {
        if self.always_failures || first_check {
            self.write(
                host,
                "health_check_failure_event",
                json!({ "failure_type": why.name(), "first_check": first_check }),
            );
        }
    }

    /// A check passed without changing the host's state.
    pub(super) fn passed(&self, host: SocketAddr) {
        if self.always_success {
            self.write(host, "successful_health_check_event", json!({}));
        }
    }

    fn write(&self, host: SocketAddr, event: &str, detail: Value) {
        let mut timestamp = String::new();
        crate::access_log::write_rfc3339(&mut timestamp, SystemTime::now());
        let line = json!({
            "health_checker_type": self.checker,
            "host": { "socket_address": {
                "protocol": "TCP",
                "address": host.ip().to_string(),
                "port_value": host.port(),
                "resolver_name": "",
                "ipv4_compat": false,
            } },
            "cluster_name": self.cluster,
            event: detail,
            "timestamp": timestamp,
        });
        let mut text = line.to_string();
        text.push('\n');
        if let Err(error) = self.file.borrow_mut().write_all(text.as_bytes()) {
            tracing::warn!(cluster = %self.cluster, %error, "cannot write the health-check event log");
        }
    }
}
