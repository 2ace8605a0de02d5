//! A map shared between generations of [`super::Resources`] until one of them changes it.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// A `BTreeMap` copied on write: cloning it is a reference count, and the first change
/// through `&mut` copies it if another generation still holds it. A route change then
/// copies none of a fleet's thousand clusters.
///
/// `&mut` access copies a shared map even when nothing changes: check first (as
/// [`SharedMap::retain_changed`] does) where a change is rare.
#[derive(Debug)]
pub struct SharedMap<K, V>(Arc<BTreeMap<K, V>>);

impl<K, V> SharedMap<K, V> {
    /// Removes the entries `keep` refuses, copying the map only if there is one.
    pub fn retain_changed(&mut self, mut keep: impl FnMut(&K, &V) -> bool)
    where
        K: Ord + Clone,
        V: Clone,
    {
        if self.0.iter().any(|(k, v)| !keep(k, v)) {
            Arc::make_mut(&mut self.0).retain(|k, v| keep(k, v));
        }
    }
}

impl<K, V> Clone for SharedMap<K, V> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<K, V> Default for SharedMap<K, V> {
    fn default() -> Self {
        Self(Arc::new(BTreeMap::new()))
    }
}

impl<K, V> From<BTreeMap<K, V>> for SharedMap<K, V> {
    fn from(map: BTreeMap<K, V>) -> Self {
        Self(Arc::new(map))
    }
}

impl<'a, K, V> IntoIterator for &'a SharedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<K, V> Deref for SharedMap<K, V> {
    type Target = BTreeMap<K, V>;

    fn deref(&self) -> &BTreeMap<K, V> {
        &self.0
    }
}

impl<K: Ord + Clone, V: Clone> DerefMut for SharedMap<K, V> {
    fn deref_mut(&mut self) -> &mut BTreeMap<K, V> {
        Arc::make_mut(&mut self.0)
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
        first.retain_changed(|_, _| true);
        assert!(
            std::ptr::eq(&*first, &*second),
            "nothing removed, nothing copied"
        );
        first.insert(3, "c");
        assert!(!std::ptr::eq(&*first, &*second));
        assert_eq!(second.len(), 2);
        assert_eq!(first.len(), 3);
        first.retain_changed(|k, _| *k != 1);
        assert_eq!(first.keys().copied().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(second.keys().copied().collect::<Vec<_>>(), [1, 2]);
    }
}
