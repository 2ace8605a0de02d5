//! `GET /certs`: the certificates each TLS listener (and each of its filter chains) serves,
//! with their names, serial numbers, validity and days until they expire (Envoy's `/certs`).

use serde_json::{Value, json};

use crate::tls::TlsListeners;

/// Seconds since the Unix epoch, now.
pub(super) fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

pub(super) fn certs_json(tls: &TlsListeners, now: i64) -> Value {
    let contexts: Vec<Value> = tls
        .all()
        .iter()
        .map(|server| {
            let chain: Vec<Value> = server
                .served()
                .iter()
                .map(|cert| {
                    let mut value = serde_json::to_value(cert).unwrap_or(Value::Null);
                    if let (Some(facts), Some(map)) = (&cert.facts, value.as_object_mut()) {
                        map.insert(
                            "days_until_expiration".into(),
                            facts.days_until_expiration(now).into(),
                        );
                    }
                    value
                })
                .collect();
            let mut context = json!({ "listener": server.listener(), "cert_chain": chain });
            if let (Some(name), Some(map)) = (server.chain(), context.as_object_mut()) {
                map.insert("filter_chain".into(), name.into());
            }
            context
        })
        .collect();
    json!({ "certificates": contexts })
}

/// Days until the first served certificate expires (Envoy's
/// `server.days_until_first_cert_expiring`); `None` without TLS listeners.
pub(super) fn days_until_first_expiring(tls: &TlsListeners, now: i64) -> Option<i64> {
    tls.all()
        .iter()
        .flat_map(|server| {
            server
                .served()
                .iter()
                .filter_map(|c| c.facts.clone())
                .collect::<Vec<_>>()
        })
        .map(|facts| facts.days_until_expiration(now))
        .min()
}
