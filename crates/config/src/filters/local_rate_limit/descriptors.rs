//! A local rate limit's descriptors (Envoy's): `descriptors` give a bucket to the lists a
//! request's `rate_limits` make (see `rate_limit_actions`), or one bucket per distinct value
//! where an entry leaves its value out.

use serde::{Deserialize, Serialize};

use super::{RawTokenBucket, TokenBucketConfig, token_bucket};
use crate::*;

/// A bucket for the requests a descriptor names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DescriptorLimit {
    pub entries: Vec<DescriptorEntry>,
    pub token_bucket: TokenBucketConfig,
    /// The bucket counts, but an empty one refuses nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow_mode: bool,
}

impl DescriptorLimit {
    /// Whether an entry leaves its value out: a bucket per distinct request list then.
    pub fn is_dynamic(&self) -> bool {
        self.entries.iter().any(|e| e.value.is_none())
    }

    /// Whether a request's list is this descriptor's: the same keys in the same order, and
    /// the same values where the descriptor gives one.
    pub fn matches(&self, request: &[(String, String)]) -> bool {
        self.entries.len() == request.len()
            && self
                .entries
                .iter()
                .zip(request)
                .all(|(mine, (key, value))| {
                    mine.key == *key && mine.value.as_ref().is_none_or(|v| v == value)
                })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DescriptorEntry {
    pub key: String,
    /// `None`: any value, each with a bucket of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptor {
    pub entries: Vec<RawDescriptorEntry>,
    pub token_bucket: RawTokenBucket,
    pub shadow_mode: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptorEntry {
    pub key: String,
    pub value: Option<String>,
}

pub(super) fn descriptors(
    raw: Vec<RawDescriptor>,
    path: &str,
) -> Result<Vec<DescriptorLimit>, ConfigError> {
    let mut out: Vec<DescriptorLimit> = Vec::with_capacity(raw.len());
    for (i, d) in raw.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        if d.entries.is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.entries"),
                "expected at least one entry",
            ));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for (j, e) in d.entries.into_iter().enumerate() {
            if e.key.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{at}.entries[{j}].key"),
                    "expected a key",
                ));
            }
            entries.push(DescriptorEntry {
                key: e.key,
                value: e.value.filter(|v| !v.is_empty()),
            });
        }
        if out.iter().any(|seen| seen.entries == entries) {
            return Err(ConfigError::invalid(
                format!("{at}.entries"),
                "another descriptor has the same entries",
            ));
        }
        out.push(DescriptorLimit {
            entries,
            token_bucket: token_bucket(d.token_bucket, &format!("{at}.token_bucket"))?,
            shadow_mode: d.shadow_mode.unwrap_or(false),
        });
    }
    Ok(out)
}
