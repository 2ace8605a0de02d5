//! A map shared between generations of [`super::Resources`] until one of them changes it.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A `BTreeMap` copied on write: cloning it is a reference count, and the first change
/// through `&mut` copies it if another generation still holds it. A route change then
/// copies none of a fleet's thousand clusters.
///
/// `&mut` access copies a shared map even when nothing changes: check first (as
/// [`SharedMap::retain_changed`] does) where a change is rare.
#[derive(Debug)]
pub struct SharedMap<K, V> {
    map: Arc<BTreeMap<K, V>>,
    stamp: u64,
}

/// Stamps for maps, one per map made and per `&mut` access, never the same twice.
static STAMPS: AtomicU64 = AtomicU64::new(1);

fn new_stamp() -> u64 {
    STAMPS.fetch_add(1, Ordering::Relaxed)
}

impl<K, V> SharedMap<K, V> {
    fn new(map: BTreeMap<K, V>) -> Self {
        Self {
            map: Arc::new(map),
            stamp: new_stamp(),
        }
    }

    /// A number that changes with every `&mut` access and that a clone shares: two maps
    /// with the same stamp hold the same entries. What is gathered from a map can be kept
    /// with its stamp and used again while the stamp stays.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Removes the entries `keep` refuses, copying the map only if there is one.
    pub fn retain_changed(&mut self, mut keep: impl FnMut(&K, &V) -> bool)
    where
        K: Ord + Clone,
        V: Clone,
    {
        if self.map.iter().any(|(k, v)| !keep(k, v)) {
            self.stamp = new_stamp();
            Arc::make_mut(&mut self.map).retain(|k, v| keep(k, v));
        }
    }
}

impl<K, V> Clone for SharedMap<K, V> {
    fn clone(&self) -> Self {
        Self {
            map: Arc::clone(&self.map),
            stamp: self.stamp,
        }
    }
}

impl<K, V> Default for SharedMap<K, V> {
    fn default() -> Self {
        Self::new(BTreeMap::new())
    }
}

impl<K, V> From<BTreeMap<K, V>> for SharedMap<K, V> {
    fn from(map: BTreeMap<K, V>) -> Self {
        Self::new(map)
    }
}

impl<'a, K, V> IntoIterator for &'a SharedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

impl<K, V> Deref for SharedMap<K, V> {
    type Target = BTreeMap<K, V>;

    fn deref(&self) -> &BTreeMap<K, V> {
        &self.map
    }
}

impl<K: Ord + Clone, V: Clone> DerefMut for SharedMap<K, V> {
    fn deref_mut(&mut self) -> &mut BTreeMap<K, V> {
        self.stamp = new_stamp();
        Arc::make_mut(&mut self.map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_copies_a_shared_map_and_leaves_the_other_holder_as_it_was() {
        let mut first = SharedMap::from(BTreeMap::from([(1, "a"), (2, "b")]));
        let second = first.clone();
        assert!(std::ptr::eq(&*first, &*second));
        assert_eq!(
            first.stamp(),
            second.stamp(),
            "a clone holds the same entries"
        );
        first.retain_changed(|_, _| true);
        assert!(
            std::ptr::eq(&*first, &*second),
            "nothing removed, nothing copied"
        );
        assert_eq!(first.stamp(), second.stamp());
        first.insert(3, "c");
        assert!(!std::ptr::eq(&*first, &*second));
        assert_ne!(first.stamp(), second.stamp());
        assert_eq!(second.len(), 2);
        assert_eq!(first.len(), 3);
        let before = first.stamp();
        first.retain_changed(|k, _| *k != 1);
        assert_ne!(first.stamp(), before, "an entry removed changes the stamp");
        assert_ne!(
            SharedMap::<u8, u8>::default().stamp(),
            SharedMap::<u8, u8>::default().stamp()
        );
        assert_eq!(first.keys().copied().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(second.keys().copied().collect::<Vec<_>>(), [1, 2]);
    }
}
