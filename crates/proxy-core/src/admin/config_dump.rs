//! `/config_dump`: the effective configuration as JSON, defaults filled in and per-core limits
//! resolved to the numbers in force. The typed config serializes itself (see
//! `config/serialize.rs`), so every key it has is in the dump; this adds what only the running
//! process knows.

use serde_json::{Value, json};

use crate::live::LiveConfig;
use config::{Config, LimitSpec};

/// The dump of the config in force, with its version, when it was loaded, and how the last
/// reload went (its error, if it failed: the config in force is then the last good one).
pub(crate) fn live_config_dump(live: &LiveConfig, workers: usize) -> Result<Value, String> {
    let generation = live.current();
    let mut dump = config_dump(&generation.config, workers)?;
    let status = live.status();
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    for (i, shared) in generation.listeners.iter().enumerate() {
        dump["listeners"][i]["bound_address"] = json!(shared.sockets.address.to_string());
    }
    dump["version_info"] = json!(generation.version().to_string());
    dump["generation"] = json!(generation.number);
    dump["last_updated_unix"] = json!(unix(generation.loaded_at));
    dump["reload"] = json!({
        "source": live.source().map(|p| p.display().to_string()),
        "last_attempt_unix": status.last_attempt.map(unix),
        "last_error": status.last_error,
        "successes": status.successes,
        "failures": status.failures,
    });
    if let Some(xds) = live.xds_status() {
        dump["xds"] =
            serde_json::to_value(xds).map_err(|e| format!("cannot render xDS state: {e}"))?;
    }
    Ok(dump)
}

pub(crate) fn config_dump(config: &Config, workers: usize) -> Result<Value, String> {
    let mut dump =
        serde_json::to_value(config).map_err(|e| format!("cannot render the config: {e}"))?;
    dump["workers"] = json!(workers);
    for (i, listener) in config.listeners.iter().enumerate() {
        if let Some(tls) = &listener.tls {
            let dumped = dump["listeners"][i]["tls"]
                .as_object_mut()
                .ok_or_else(|| format!("listeners[{i}].tls missing from the dump"))?;
            dumped.insert(
                "default_certificate".into(),
                json!(tls.default_certificate()),
            );
        }
    }
    // Circuit-breaker limits: what was written, and what it comes to with this many workers.
    for (i, cluster) in config.clusters.iter().enumerate() {
        let dumped = dump["clusters"][i]["circuit_breakers"]
            .as_object_mut()
            .ok_or_else(|| format!("clusters[{i}].circuit_breakers missing from the dump"))?;
        let b = &cluster.circuit_breakers;
        for (key, spec) in [
            ("max_connections", b.max_connections),
            ("max_pending_requests", b.max_pending_requests),
            ("max_requests", b.max_requests),
            ("max_retries", b.max_retries),
        ] {
            dumped.insert(key.into(), limit(spec, workers));
        }
    }
    Ok(dump)
}

/// A breaker limit as resolved for this process, with what was written when it was per core.
fn limit(spec: LimitSpec, workers: usize) -> Value {
    match spec {
        LimitSpec::Fixed(_) => json!({ "resolved": spec.resolve(workers) }),
        LimitSpec::PerCore(n) => json!({ "per_core": n, "resolved": spec.resolve(workers) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(yaml: &str, workers: usize) -> Value {
        config_dump(&Config::from_yaml(yaml).unwrap(), workers).unwrap()
    }

    #[test]
    fn defaults_appear_filled_in() {
        let dump = dump(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - match: { prefix: / }\n        cluster: c\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:2]\n",
            3,
        );
        assert_eq!(dump["workers"], 3);
        assert_eq!(dump["concurrency"], "auto");
        assert_eq!(dump["drain_timeout"], "5s");
        assert_eq!(dump["admin"]["address"], "127.0.0.1:9901");
        assert_eq!(dump["admin"]["allow"], serde_json::json!([]));
        let route = &dump["listeners"][0]["routes"][0];
        assert_eq!(route["match"], json!({ "prefix": "/" }));
        assert_eq!(route["cluster"], "c");
        assert_eq!(route["timeout"], "15s");
        let cluster = &dump["clusters"][0];
        assert_eq!(cluster["connect_timeout"], "1s");
        assert_eq!(cluster["protocol"], "http1");
        assert_eq!(cluster["lb_policy"], "round_robin");
        assert_eq!(
            cluster["circuit_breakers"]["max_requests"],
            json!({ "per_core": 4096, "resolved": 4096 * 3 })
        );
        assert_eq!(
            dump["listeners"][0]["per_connection_buffer_limit_bytes"],
            32768
        );
    }

    /// Every kind of key reads back as the config file writes it.
    #[test]
    fn keys_read_as_written() {
        let dump = dump(
            r#"
concurrency: 2
listeners:
  - name: l
    address: 127.0.0.1:1
    access_log: { path: stdout, format: "%METHOD% %%\n" }
    routes:
      - match: { path: /x, host: "*.example.com", headers: [{ name: x-a, exact: "1" }, { name: x-b, present: false }] }
        direct_response: { status: 204, body: "" }
        filters: { ext_authz: disabled }
      - match: { prefix: / }
        cluster: c
        host_rewrite: up.internal
        retry_policy: { retry_on: [reset, 5xx], per_try_timeout: 250ms }
    http_filters:
      - ext_authz: { grpc: { address: 127.0.0.1:9191 } }
      - local_rate_limit: { token_bucket: { max_tokens: 5, fill_interval: 250ms } }
clusters:
  - name: c
    endpoints: [127.0.0.1:2, { address: 127.0.0.1:3, weight: 3 }]
    lb_policy: ring_hash
    hash_key: { cookie: session }
    circuit_breakers: { max_connections: 7 }
"#,
            2,
        );
        let listener = &dump["listeners"][0];
        assert_eq!(dump["concurrency"], 2);
        assert_eq!(listener["access_log"][0]["path"], "stdout");
        assert_eq!(listener["access_log"][0]["format"], "%METHOD% %%\n");
        let authz = &listener["http_filters"][0]["ext_authz"];
        assert_eq!(authz["grpc"]["address"], "127.0.0.1:9191");
        assert_eq!(authz["timeout"], "200ms");
        assert_eq!(
            listener["http_filters"][1]["local_rate_limit"]["token_bucket"],
            json!({ "max_tokens": 5, "tokens_per_fill": 5, "fill_interval": "250ms" })
        );
        let direct = &listener["routes"][0];
        assert_eq!(
            direct["match"],
            json!({ "path": "/x", "host": "*.example.com", "headers": [
                { "name": "x-a", "exact": "1" }, { "name": "x-b", "present": false }
            ] })
        );
        assert_eq!(
            direct["direct_response"],
            json!({ "status": 204, "body": "" })
        );
        assert_eq!(direct["filters"], json!({ "ext_authz": "disabled" }));
        let forward = &listener["routes"][1];
        assert_eq!(forward["host_rewrite"], "up.internal");
        assert_eq!(forward["retry_policy"]["retry_on"], json!(["reset", "5xx"]));
        assert_eq!(forward["retry_policy"]["per_try_timeout"], "250ms");
        let cluster = &dump["clusters"][0];
        assert_eq!(
            cluster["endpoints"][1],
            json!({ "address": "127.0.0.1:3", "weight": 3 })
        );
        assert_eq!(cluster["lb_policy"], "ring_hash");
        assert_eq!(cluster["ring_hash"]["minimum_ring_size"], 1024);
        assert_eq!(cluster["hash_key"], json!({ "cookie": "session" }));
        assert_eq!(
            cluster["circuit_breakers"]["max_connections"],
            json!({ "resolved": 7 })
        );
    }

    #[test]
    fn a_cluster_without_a_ca_shows_the_system_roots() {
        let dump = dump(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - match: { prefix: / }\n        cluster: c\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:2]\n    tls: { server_name: origin.test }\n",
            1,
        );
        assert_eq!(dump["clusters"][0]["tls"]["ca"], "system");
        assert_eq!(dump["clusters"][0]["tls"]["server_name"], "origin.test");
    }
}
