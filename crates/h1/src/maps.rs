//! A per-thread pool of emptied header maps. Each HTTP/1.1 request through the proxy parses two
//! heads (the request, the upstream's response); their maps are given back once written on the
//! other side, so a busy worker reuses the same few maps instead of allocating and freeing two
//! tables each per request.

use std::cell::{Cell, RefCell};

use http::HeaderMap;

/// Enough for the heads in flight on a worker at once (two a request: 8 busy HTTP/2 clients
/// of 10 streams overflowed 64); beyond it, maps are freed. Maps are kept only once that many
/// were in use at once.
const KEPT: usize = 256;
/// A map grown by an unusual head is freed rather than kept at its size.
const MAX_KEPT_CAPACITY: usize = 128;

thread_local! {
    static POOL: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
    /// The fewest maps the pool held since the last release: that many went unused.
    static LOW: Cell<usize> = const { Cell::new(0) };
}

/// A new map has room for this many fields at least, so that one made for a short response
/// head also fits the next request's.
const MIN_ROOM: usize = 24;

/// An empty map with room for `fields` entries, pooled when there is one.
pub(crate) fn take(fields: usize) -> HeaderMap {
    let pooled = POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let map = pool.pop();
        LOW.set(LOW.get().min(pool.len()));
        map
    });
    match pooled {
        Some(mut map) => {
            if map.capacity() < fields {
                map.reserve(fields);
            }
            map
        }
        None => HeaderMap::with_capacity(fields.max(MIN_ROOM)),
    }
}

/// Header fields a request head's map has room for beyond its own (those the proxy adds).
const ADDED_FIELDS: usize = 6;

/// An empty map for a request head of `fields` fields (parsed here, or read by another codec:
/// HTTP/2's), with room for those the proxy adds, from this thread's pool when it has one;
/// given back with [`recycle_header_map`] once written. The room made ahead is at most a
/// pooled map's (a client's count of fields is not trusted): a larger head grows the map as
/// it is filled.
pub fn request_header_map(fields: usize) -> HeaderMap {
    take(fields.min(MAX_KEPT_CAPACITY - ADDED_FIELDS) + ADDED_FIELDS)
}

/// Gives a map back to this thread's pool once its head is written: its entries are dropped
/// now, its tables kept for the next head.
pub fn recycle_header_map(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > MAX_KEPT_CAPACITY {
        return;
    }
    map.clear();
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.len() < KEPT {
            pool.push(map);
        }
    });
}

/// Frees this thread's maps that sat unused since the last call (the fewest pooled at once
/// since then), so that a burst's maps do not stay after it; a worker calls it every second
/// or so. A steady load keeps what it uses.
pub fn release_unused_header_maps() {
    let unused: Vec<HeaderMap> = POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let low = LOW.get().min(pool.len());
        let unused = pool.drain(..low).collect();
        LOW.set(pool.len());
        unused
    });
    drop(unused);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recycled_map_comes_back_empty_with_its_room() {
        let mut map = HeaderMap::with_capacity(20);
        map.insert("x-a", "1".parse().unwrap());
        map.append("x-a", "2".parse().unwrap());
        let room = map.capacity();
        recycle_header_map(map);
        let again = take(10);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), room);
    }

    #[test]
    fn a_pooled_map_too_small_grows() {
        recycle_header_map(HeaderMap::with_capacity(4));
        assert!(take(100).capacity() >= 100);
    }

    #[test]
    fn a_map_for_another_codec_has_room_for_the_added_fields_within_bounds() {
        while POOL.with(|pool| pool.borrow_mut().pop()).is_some() {}
        let map = request_header_map(10);
        assert!(map.capacity() >= 10 + ADDED_FIELDS);
        // A count past what a map holds (24,576) asks for no more than a pooled map's room.
        let map = request_header_map(1_000_000);
        assert!(map.capacity() >= MAX_KEPT_CAPACITY);
        assert!(map.capacity() <= 4 * MAX_KEPT_CAPACITY);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_bounded_maps() {
        while POOL.with(|pool| pool.borrow_mut().pop()).is_some() {}
        recycle_header_map(HeaderMap::with_capacity(1000));
        assert_eq!(POOL.with(|pool| pool.borrow().len()), 0);
        for _ in 0..KEPT + 10 {
            recycle_header_map(HeaderMap::with_capacity(8));
        }
        assert_eq!(POOL.with(|pool| pool.borrow().len()), KEPT);
    }

    #[test]
    fn maps_unused_for_a_round_are_freed() {
        let pooled = || POOL.with(|pool| pool.borrow().len());
        while POOL.with(|pool| pool.borrow_mut().pop()).is_some() {}
        release_unused_header_maps();
        for _ in 0..10 {
            recycle_header_map(HeaderMap::with_capacity(8));
        }
        // Given back during the round: not yet unused for a whole one.
        release_unused_header_maps();
        assert_eq!(pooled(), 10);
        // Up to 3 in use at once during the next round: 7 never left the pool.
        let in_use: Vec<HeaderMap> = (0..3).map(|_| take(4)).collect();
        in_use.into_iter().for_each(recycle_header_map);
        release_unused_header_maps();
        assert_eq!(pooled(), 3);
        // A round without any use frees the rest.
        release_unused_header_maps();
        assert_eq!(pooled(), 0);
    }
}
