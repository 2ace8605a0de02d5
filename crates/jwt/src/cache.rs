//! Tokens whose signature verified, remembered so that a client sending the same token again
//! costs a lookup instead of a verification (Envoy's `jwt_cache_config`). The entries hold
//! for one key set: when the set changes (a key rotated in or out), they are forgotten, so a
//! token signed by a key that left the set is verified again, and refused.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::Jwks;

/// A bounded set of verified tokens, per provider and per thread (no lock: each worker has
/// its own). The oldest entry goes first when it is full.
pub struct VerifiedTokens {
    /// The key set the entries verified against. Held, so its address is not reused while
    /// the entries are compared with it.
    keys: Option<Arc<Jwks>>,
    tokens: HashSet<Box<str>>,
    order: VecDeque<Box<str>>,
    capacity: usize,
    max_token_size: usize,
}

impl std::fmt::Debug for VerifiedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedTokens")
            .field("len", &self.tokens.len())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl VerifiedTokens {
    /// Up to `capacity` tokens of at most `max_token_size` bytes each.
    pub fn new(capacity: usize, max_token_size: usize) -> Self {
        Self {
            keys: None,
            tokens: HashSet::new(),
            order: VecDeque::new(),
            capacity,
            max_token_size,
        }
    }

    /// Whether `token` verified against this very key set before.
    pub fn contains(&mut self, token: &str, keys: &Arc<Jwks>) -> bool {
        self.same_keys(keys);
        self.tokens.contains(token)
    }

    /// Remembers that `token` verified against `keys` (a token over the size limit is not
    /// remembered).
    pub fn insert(&mut self, token: &str, keys: &Arc<Jwks>) {
        self.same_keys(keys);
        if token.len() > self.max_token_size || self.capacity == 0 || self.tokens.contains(token) {
            return;
        }
        if self.tokens.len() >= self.capacity
            && let Some(oldest) = self.order.pop_front()
        {
            self.tokens.remove(&oldest);
        }
        let token: Box<str> = token.into();
        self.order.push_back(token.clone());
        self.tokens.insert(token);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Forgets every entry if `keys` is not the set they verified against.
    fn same_keys(&mut self, keys: &Arc<Jwks>) {
        if !self.keys.as_ref().is_some_and(|k| Arc::ptr_eq(k, keys)) {
            self.tokens.clear();
            self.order.clear();
            self.keys = Some(Arc::clone(keys));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_hold_for_one_key_set_and_the_oldest_goes_first() {
        let set = Arc::new(Jwks::default());
        let mut cache = VerifiedTokens::new(2, 8);
        assert!(!cache.contains("a", &set));
        cache.insert("a", &set);
        cache.insert("b", &set);
        assert!(cache.contains("a", &set) && cache.contains("b", &set));
        cache.insert("c", &set);
        assert!(!cache.contains("a", &set), "the oldest went");
        assert!(cache.contains("c", &set));
        cache.insert("too long a token", &set);
        assert!(!cache.contains("too long a token", &set));
        // Another set (equal in content, rotated in by a refresh): nothing holds.
        let rotated = Arc::new(Jwks::default());
        assert!(!cache.contains("c", &rotated));
        assert!(cache.is_empty());
    }
}
