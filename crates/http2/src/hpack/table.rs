//! The dynamic table (RFC 7541 section 2.3.2): newest entry first, bounded by the size
//! the decoding side allows, counted as RFC 7541 section 4.1 says.

use std::collections::VecDeque;

use bytes::Bytes;

/// What an entry costs in the table beyond its name and value.
pub const ENTRY_OVERHEAD: usize = 32;

#[derive(Debug, Clone)]
pub struct Entry {
    pub name: Bytes,
    pub value: Bytes,
}

impl Entry {
    pub fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

#[derive(Debug)]
pub struct DynamicTable {
    entries: VecDeque<Entry>,
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    pub fn new(max_size: usize) -> Self {
        DynamicTable {
            entries: VecDeque::new(),
            size: 0,
            max_size,
        }
    }

    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// The entry at `index` from the newest (0).
    pub fn get(&self, index: usize) -> Option<&Entry> {
        self.entries.get(index)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    /// Adds an entry, evicting the oldest until it fits. One larger than the whole table
    /// empties it and is not added (RFC 7541 section 4.4).
    pub fn insert(&mut self, entry: Entry) {
        let size = entry.size();
        if size > self.max_size {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.entries.push_front(entry);
    }

    /// A new maximum size, evicting entries to fit it.
    pub fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
        // A table that shrank for good gives its memory back.
        if self.entries.is_empty() {
            self.entries.shrink_to_fit();
        }
    }

    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            match self.entries.pop_back() {
                Some(old) => self.size -= old.size(),
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }
}
