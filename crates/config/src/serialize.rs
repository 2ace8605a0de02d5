//! How typed config values are written back out, for `/config_dump`: header names and values
//! as text, statuses as numbers (durations are in `crate::units`). The typed config
//! derives `Serialize` with these helpers, so a new key appears in the dump by being declared.

use std::fmt::Display;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::Serializer;
use serde::ser::SerializeSeq;

pub(crate) use crate::units::{ser_duration as duration, ser_opt_duration as opt_duration};

pub(crate) fn status<S: Serializer>(status: &StatusCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(status.as_u16())
}

pub(crate) fn opt_status<S: Serializer>(
    status: &Option<StatusCode>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match status {
        Some(status) => s.serialize_u16(status.as_u16()),
        None => s.serialize_none(),
    }
}

pub(crate) fn header_name<S: Serializer>(name: &HeaderName, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(name.as_str())
}

pub(crate) fn opt_header_name<S: Serializer>(
    name: &Option<HeaderName>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match name {
        Some(name) => s.serialize_str(name.as_str()),
        None => s.serialize_none(),
    }
}

pub(crate) fn header_names<S: Serializer>(names: &[HeaderName], s: S) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(names.len()))?;
    for name in names {
        seq.serialize_element(name.as_str())?;
    }
    seq.end()
}

pub(crate) fn opt_header_names<S: Serializer>(
    names: &Option<Vec<HeaderName>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match names {
        Some(names) => header_names(names, s),
        None => s.serialize_none(),
    }
}

/// Header pairs as a map of name to value.
pub(crate) fn header_pairs<S: Serializer>(
    pairs: &[(HeaderName, HeaderValue)],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(pairs.len()))?;
    for (name, value) in pairs {
        map.serialize_entry(name.as_str(), &String::from_utf8_lossy(value.as_bytes()))?;
    }
    map.end()
}

pub(crate) fn header_value<S: Serializer>(value: &HeaderValue, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(value.as_bytes()))
}

pub(crate) fn opt_header_value<S: Serializer>(
    value: &Option<HeaderValue>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => header_value(value, s),
        None => s.serialize_none(),
    }
}

/// A body as text (invalid UTF-8 shown with replacement characters).
pub(crate) fn bytes_text<S: Serializer>(bytes: &Bytes, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes))
}

pub(crate) fn opt_bytes_text<S: Serializer>(
    bytes: &Option<Bytes>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match bytes {
        Some(bytes) => bytes_text(bytes, s),
        None => s.serialize_none(),
    }
}

pub(crate) fn display<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// A load-balancing policy as written: `lb_policy: NAME`, and the section of its options.
pub(crate) fn opt_method<S: Serializer>(
    method: &Option<http::Method>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match method {
        Some(m) => s.serialize_str(m.as_str()),
        None => s.serialize_none(),
    }
}

/// Bytes as a health-check payload the file reads back: `{ text: HEX }`.
pub(crate) fn opt_hex<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match bytes {
        Some(b) => serde::Serialize::serialize(&serde_json::json!({ "text": hex(b) }), s),
        None => s.serialize_none(),
    }
}

pub(crate) fn hex_list<S: Serializer>(list: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
    let list: Vec<serde_json::Value> = list
        .iter()
        .map(|b| serde_json::json!({ "text": hex(b) }))
        .collect();
    serde::Serialize::serialize(&list, s)
}

/// `healthy_panic_threshold`, `overprovisioning_factor` and `locality_weighted`.
pub(crate) fn lb_settings<S: Serializer>(
    settings: &balancer::LbSettings,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(5))?;
    map.serialize_entry("healthy_panic_threshold", &settings.panic_threshold)?;
    map.serialize_entry("overprovisioning_factor", &settings.overprovisioning_factor)?;
    map.serialize_entry("locality_weighted", &settings.locality_weighted)?;
    let z = &settings.zone_aware;
    map.serialize_entry(
        "zone_aware",
        &serde_json::json!({
            "routing_enabled": z.routing_enabled,
            "min_cluster_size": z.min_cluster_size,
            "force_local_zone_min_size": z.force_local_zone_min_size,
            "fail_traffic_on_panic": z.fail_traffic_on_panic,
            "locality_basis": if z.weight_basis { "healthy_hosts_weight" } else { "healthy_hosts_num" },
        }),
    )?;
    map.serialize_entry(
        "slow_start",
        &settings.slow_start.map(|s| {
            serde_json::json!({
                "window": crate::units::format_duration(s.window),
                "aggression": s.aggression,
                "min_weight_percent": s.min_weight_percent,
            })
        }),
    )?;
    map.end()
}

pub(crate) fn lb_policy<S: Serializer>(
    policy: &balancer::LbPolicy,
    s: S,
) -> Result<S::Ok, S::Error> {
    use balancer::LbPolicy;
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(2))?;
    map.serialize_entry("lb_policy", policy.name())?;
    match policy {
        LbPolicy::LeastRequest(o) => map.serialize_entry(
            "least_request",
            &serde_json::json!({
                "choice_count": o.choice_count,
                "active_request_bias": o.active_request_bias,
            }),
        )?,
        LbPolicy::RingHash(o) => map.serialize_entry(
            "ring_hash",
            &serde_json::json!({
                "minimum_ring_size": o.minimum_ring_size,
                "maximum_ring_size": o.maximum_ring_size,
            }),
        )?,
        LbPolicy::Maglev(o) => {
            map.serialize_entry("maglev", &serde_json::json!({ "table_size": o.table_size }))?
        }
        _ => {}
    }
    map.end()
}

/// String patterns as written: each `{ exact | prefix | suffix | contains | regex: ... }`.
pub(crate) fn string_matches<S: Serializer>(
    list: &[crate::StringMatch],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(list.iter().map(OneStringMatch))
}

/// One string pattern as written: `{ prefix: /v1 }`.
pub(crate) struct OneStringMatch<'a>(pub(crate) &'a crate::StringMatch);

impl serde::Serialize for OneStringMatch<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        self.0.write(&mut map)?;
        map.end()
    }
}

/// Bytes as lowercase hexadecimal.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// For `skip_serializing_if` on a setting that is on unless said otherwise.
pub(crate) fn is_true(value: &bool) -> bool {
    *value
}

/// A variant without data written as `true` (`connect: true`), as the file sets it.
pub(crate) fn unit_true<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bool(true)
}
