//! Transport sockets by endpoint (Envoy's `transport_socket_matches`): a cluster may speak TLS
//! with other settings, or plain text, to some of its endpoints, picked by labels the
//! endpoints carry (the `envoy.transport_socket_match` metadata).
//!
//! As Envoy: the first match whose labels the endpoint's own labels all have wins; if none
//! does, the first whose labels its locality's have; if none does either, the cluster's own
//! `tls` (or plain text). A match without labels takes every endpoint.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::tls::raw::RawClusterTls;
use crate::{ClusterTlsConfig, ConfigError};

/// The metadata a match compares: key -> value (numbers compared as numbers).
pub type Labels = BTreeMap<String, serde_json::Value>;

/// One of a cluster's transport sockets, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransportSocketMatch {
    pub name: String,
    /// What an endpoint's labels must hold; empty: every endpoint.
    #[serde(rename = "match")]
    pub labels: Labels,
    /// TLS to the endpoints it takes; `None`: plain text.
    pub tls: Option<ClusterTlsConfig>,
}

/// `{ name, match: { KEY: VALUE, ... }, tls: { ... } }` (no `tls`: plain text).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTransportSocketMatch {
    pub name: String,
    #[serde(default, rename = "match")]
    pub labels: Labels,
    pub tls: Option<RawClusterTls>,
}

/// Checks a cluster's matches: names given and distinct (an endpoint's choice is shown, and
/// found again, by name).
pub(crate) fn check(
    raw: &[RawTransportSocketMatch],
    path: &str,
) -> Result<Vec<TransportSocketMatch>, ConfigError> {
    let mut checked: Vec<TransportSocketMatch> = Vec::with_capacity(raw.len());
    for (i, m) in raw.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if m.name.is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                "expected a name",
            ));
        }
        if checked.iter().any(|c| c.name == m.name) {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!("`{}` is the name of an earlier match", m.name),
            ));
        }
        checked.push(TransportSocketMatch {
            name: m.name.clone(),
            labels: m.labels.clone(),
            tls: m
                .tls
                .clone()
                .map(|t| crate::tls::check::cluster_tls(t, &format!("{at}.tls")))
                .transpose()?,
        });
    }
    Ok(checked)
}

/// The index of the match that takes an endpoint with these labels (its own, then its
/// locality's); `None`: the cluster's own transport.
pub fn resolve<'a, M: 'a>(
    matches: impl IntoIterator<Item = (&'a Labels, M)> + Clone,
    endpoint: Option<&Labels>,
    locality: Option<&Labels>,
) -> Option<M> {
    [endpoint, locality].into_iter().find_map(|labels| {
        matches
            .clone()
            .into_iter()
            .find(|(wanted, _)| holds(labels, wanted))
            .map(|(_, m)| m)
    })
}

/// Whether `labels` holds every one of `wanted` (none wanted: always; no labels: only then).
fn holds(labels: Option<&Labels>, wanted: &Labels) -> bool {
    wanted.iter().all(|(key, value)| {
        labels
            .and_then(|l| l.get(key))
            .is_some_and(|v| same(v, value))
    })
}

/// Equal values; numbers by value (metadata numbers are doubles, a file's may be integers).
fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    normalized_value(a) == normalized_value(b)
}

fn normalized_value(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Value::Array(items) => Value::Array(items.iter().map(normalized_value).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalized_value(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The `envoy.transport_socket_match` entry of an xDS `Metadata`, as labels.
pub(crate) fn metadata_labels(
    metadata: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>,
) -> Option<Labels> {
    let fields = &metadata?.filter_metadata.get(METADATA_KEY)?.fields;
    Some(
        fields
            .iter()
            .map(|(k, v)| (k.clone(), crate::envoy::json(v)))
            .collect(),
    )
}

/// Where Envoy reads an endpoint's labels.
pub(crate) const METADATA_KEY: &str = "envoy.transport_socket_match";

/// A protobuf `Struct` as labels.
pub(crate) fn struct_labels(s: &envoy_types::pb::google::protobuf::Struct) -> Labels {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), crate::envoy::json(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, serde_json::Value)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn pick(
        matches: &[Labels],
        endpoint: Option<&Labels>,
        locality: Option<&Labels>,
    ) -> Option<usize> {
        resolve(
            matches.iter().enumerate().map(|(i, l)| (l, i)),
            endpoint,
            locality,
        )
    }

    #[test]
    fn the_first_match_the_endpoint_holds_wins() {
        let a = labels(&[("name", "a".into())]);
        let ab = labels(&[("name", "a".into()), ("tier", "gold".into())]);
        let matches = [ab.clone(), a.clone()];
        assert_eq!(pick(&matches, Some(&a), None), Some(1));
        assert_eq!(pick(&matches, Some(&ab), None), Some(0));
        // Nothing held: the cluster's own.
        let other = labels(&[("name", "b".into())]);
        assert_eq!(pick(&matches, Some(&other), None), None);
        assert_eq!(pick(&matches, None, None), None);
    }

    #[test]
    fn the_locality_is_asked_only_when_the_endpoint_matches_nothing() {
        let a = labels(&[("name", "a".into())]);
        let b = labels(&[("name", "b".into())]);
        let matches = [a.clone(), b.clone()];
        assert_eq!(pick(&matches, Some(&b), Some(&a)), Some(1));
        let none = labels(&[("name", "z".into())]);
        assert_eq!(pick(&matches, Some(&none), Some(&a)), Some(0));
        assert_eq!(pick(&matches, None, Some(&b)), Some(1));
    }

    #[test]
    fn a_match_without_labels_takes_every_endpoint_and_numbers_compare_by_value() {
        let matches = [labels(&[("port", serde_json::json!(8443))]), Labels::new()];
        let as_double = labels(&[("port", serde_json::json!(8443.0))]);
        // An integer in the file is the double a management server sends.
        assert_eq!(pick(&matches, Some(&as_double), None), Some(0));
        assert_eq!(pick(&matches, None, None), Some(1));
    }

    #[test]
    fn names_are_required_and_distinct() {
        let raw = |name: &str| RawTransportSocketMatch {
            name: name.into(),
            ..Default::default()
        };
        let error = check(&[raw("")], "clusters[0].transport_socket_matches").unwrap_err();
        assert!(error.to_string().contains("[0].name"), "{error}");
        let error = check(&[raw("a"), raw("a")], "m").unwrap_err();
        assert!(error.to_string().contains("earlier match"), "{error}");
        assert_eq!(check(&[raw("a"), raw("b")], "m").unwrap().len(), 2);
    }
}
