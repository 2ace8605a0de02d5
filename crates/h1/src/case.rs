//! Header names as a peer spelled them, for a proxy that must pass them on so (Envoy's
//! `preserve_case` header formatter): noted as a head is read, used as one is written. Most
//! peers write names in lower case, and nothing is kept for those.

use bytes::Bytes;
use http::HeaderName;

/// The spellings of a head's names that were not all in lower case, first one per name, in
/// the order read. It travels in the message's extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderCase(Vec<(HeaderName, Bytes)>);

impl HeaderCase {
    /// Notes `wire`, the spelling read of `name`, when it has a capital letter; `copy` gives
    /// the bytes to keep (a slice of the head's copy).
    pub(crate) fn note(&mut self, name: &HeaderName, wire: &[u8], copy: impl FnOnce() -> Bytes) {
        if wire.iter().any(u8::is_ascii_uppercase) && !self.0.iter().any(|(n, _)| n == name) {
            self.0.push((name.clone(), copy()));
        }
    }

    /// How `name` is written: as it was read, or in lower case.
    pub fn spelling<'a>(&'a self, name: &'a HeaderName) -> &'a [u8] {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or(name.as_str().as_bytes(), |(_, wire)| wire)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `name` as `case` spells it, or in lower case without one. Inlined: it is called for every
/// field written, and most heads have no spellings to look up.
#[inline]
pub(crate) fn spelled<'a>(case: Option<&'a HeaderCase>, name: &'a HeaderName) -> &'a [u8] {
    case.map_or(name.as_str().as_bytes(), |c| c.spelling(name))
}
