//! What the client has subscribed to and accepted, per type. It outlives streams: a new
//! stream asks again for the same names and says which versions it already holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::{Handler, type_url};

/// One type's subscription.
#[derive(Debug, Default)]
pub(crate) struct TypeState {
    pub(crate) type_url: &'static str,
    /// State of the world: the version of the last accepted response, sent back in every
    /// request (an ACK, a NACK, a new stream) as what the client has.
    pub(crate) accepted_version: String,
    /// The nonce of the last response of this type on the current stream.
    pub(crate) nonce: String,
    /// The names subscribed; unused for wildcard types.
    pub(crate) names: Arc<BTreeSet<String>>,
    /// State of the world: the names last sent on this stream. Once the last name has gone,
    /// ACKs repeat these: an empty list would be a wildcard to the server.
    pub(crate) asked: Vec<String>,
    /// Delta: the version of every resource held, by name.
    pub(crate) held: BTreeMap<String, String>,
}

impl TypeState {
    pub(crate) fn is_wildcard(&self) -> bool {
        type_url::is_wildcard(self.type_url)
    }

    /// Whether a stream should ask for this type at all: wildcards always, others once
    /// something names a resource of theirs.
    pub(crate) fn is_subscribed(&self) -> bool {
        self.is_wildcard() || !self.names.is_empty()
    }
}

pub(crate) struct Subscriptions {
    types: Vec<TypeState>,
}

/// A change of the names wanted: `(added, removed)`.
pub(crate) type NameChange = (Vec<String>, Vec<String>);

impl Subscriptions {
    pub(crate) fn new<H: Handler>(handler: &H) -> Self {
        let mut subscriptions = Self {
            types: type_url::ALL
                .into_iter()
                .map(|type_url| TypeState {
                    type_url,
                    ..Default::default()
                })
                .collect(),
        };
        subscriptions.refresh_all(handler);
        subscriptions
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut TypeState> {
        self.types.iter_mut()
    }

    pub(crate) fn get_mut(&mut self, type_url: &str) -> Option<&mut TypeState> {
        self.types.iter_mut().find(|t| t.type_url == type_url)
    }

    /// A new stream: no nonce is valid on it, and the names are what the handler needs now.
    pub(crate) fn new_stream<H: Handler>(&mut self, handler: &H) {
        for state in &mut self.types {
            state.nonce.clear();
            state.asked.clear();
        }
        self.refresh_all(handler);
    }

    fn refresh_all<H: Handler>(&mut self, handler: &H) {
        for state in &mut self.types {
            if !state.is_wildcard() {
                state.names = handler.wanted(state.type_url);
            }
        }
    }

    /// The named types whose wanted names changed, with what was added and removed. Delta
    /// forgets the versions of resources no longer subscribed.
    pub(crate) fn changes<H: Handler>(&mut self, handler: &H) -> Vec<(&'static str, NameChange)> {
        let mut changes = Vec::new();
        for state in self.types.iter_mut().filter(|t| !t.is_wildcard()) {
            let wanted = handler.wanted(state.type_url);
            // The same set handed out again, or an equal one.
            if Arc::ptr_eq(&wanted, &state.names) || wanted == state.names {
                continue;
            }
            let added: Vec<String> = wanted.difference(&state.names).cloned().collect();
            let removed: Vec<String> = state.names.difference(&wanted).cloned().collect();
            for name in &removed {
                state.held.remove(name);
            }
            state.names = wanted;
            changes.push((state.type_url, (added, removed)));
        }
        changes
    }
}
