//! The container image and the Kubernetes example: the config the image ships, and the one in
//! the ConfigMap, load; the ports, paths and probes they name agree with each other; and
//! `legate ready`, the image's HEALTHCHECK, says what `/ready` says.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_yaml::Value;

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// `legate validate -c` on `yaml`.
fn validate(yaml: &str) {
    let dir = ScratchDir::new();
    let path = dir.write("legate.yaml", yaml);
    let out = Command::new(BIN)
        .args(["validate", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The admin port and `open` list of a config.
fn admin_of(yaml: &str) -> (u16, Vec<String>) {
    let config: Value = serde_yaml::from_str(yaml).unwrap();
    let address = config["admin"]["address"].as_str().unwrap();
    let port = address.rsplit(':').next().unwrap().parse().unwrap();
    let open = config["admin"]["open"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    (port, open)
}

#[test]
fn the_image_runs_the_config_it_ships_and_exposes_its_ports() {
    let dockerfile = repo_file("Dockerfile");
    let shipped = repo_file("configs/container.yaml");
    validate(&shipped);
    assert!(
        dockerfile.contains("COPY configs/container.yaml /etc/legate/legate.yaml"),
        "{dockerfile}"
    );
    assert!(dockerfile.contains(r#"CMD ["-c", "/etc/legate/legate.yaml"]"#));
    assert!(
        dockerfile.contains("--no-default-features"),
        "no test servers"
    );
    let config: Value = serde_yaml::from_str(&shipped).unwrap();
    let listener = config["listeners"][0]["address"].as_str().unwrap();
    assert!(
        listener.starts_with("0.0.0.0:"),
        "reachable through -p: {listener}"
    );
    let (admin_port, open) = admin_of(&shipped);
    assert!(
        open.contains(&"/ready".to_string()) && open.contains(&"/stats/prometheus".to_string())
    );
    let listener_port = listener.rsplit(':').next().unwrap();
    let expose = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .unwrap();
    let exposed: Vec<&str> = expose.split_whitespace().collect();
    assert_eq!(exposed, [listener_port, &admin_port.to_string()]);
    assert!(dockerfile.contains(&format!("--admin\", \"127.0.0.1:{admin_port}\"")));
    assert!(dockerfile.contains("USER 10001"));
}

#[test]
fn the_kubernetes_example_probes_what_its_config_opens() {
    let manifest = repo_file("deploy/kubernetes.yaml");
    let documents: Vec<Value> = manifest
        .split("\n---\n")
        .map(|d| serde_yaml::from_str(d).unwrap())
        .collect();
    assert_eq!(documents.len(), 3);
    let kind = |k: &str| documents.iter().find(|d| d["kind"] == k).unwrap();
    let config = kind("ConfigMap")["data"]["legate.yaml"].as_str().unwrap();
    validate(config);
    let (admin_port, open) = admin_of(config);
    let pod = &kind("Deployment")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let port_named = |name: &str| {
        container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port_named("admin"), u64::from(admin_port));
    let readiness = &container["readinessProbe"]["httpGet"];
    assert_eq!(readiness["port"], "admin");
    let ready_path = readiness["path"].as_str().unwrap();
    assert!(
        open.iter().any(|p| p == ready_path),
        "{ready_path} not open"
    );
    assert_eq!(container["args"][1], "/etc/legate/legate.yaml");
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/etc/legate");
    // The grace period covers the preStop wait and the drain.
    let drain: Value = serde_yaml::from_str(config).unwrap();
    let drain_s: u64 = drain["drain_timeout"]
        .as_str()
        .unwrap()
        .trim_end_matches('s')
        .parse()
        .unwrap();
    let wait_s: u64 = container["lifecycle"]["preStop"]["exec"]["command"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > drain_s + wait_s);
    // Workers follow the CPU limit: `concurrency: auto`.
    assert_eq!(drain["concurrency"], "auto");
}

#[test]
fn legate_ready_says_what_ready_says() {
    let proxy = Proxy::start(
        "admin: { address: 127.0.0.1:0 }\nlisteners:\n  - name: a\n    address: 127.0.0.1:0\n    routes: [{ match: { prefix: / }, direct_response: { status: 200 } }]\n",
        1,
    );
    let admin = proxy.admin.unwrap().to_string();
    let ready = || {
        Command::new(BIN)
            .args(["ready", "--admin", &admin])
            .output()
            .unwrap()
    };
    let out = ready();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "LIVE");
    let (status, _) = admin_request(proxy.admin.unwrap(), "POST", "/healthcheck/fail");
    assert_eq!(status, 200);
    let out = ready();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("503 FAILED"),
        "{out:?}"
    );
    let closed = closed_port();
    let out = Command::new(BIN)
        .args(["ready", "--admin", &closed.addr.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}
