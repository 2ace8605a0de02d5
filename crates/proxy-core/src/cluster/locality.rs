//! The numbers the balancer knows localities by, one per name for the whole process, so that
//! a cluster's localities and the local cluster's (zone-aware routing) compare. Names are few
//! (a fleet's zones) and kept for the process's life.

use std::sync::{Mutex, PoisonError};

static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The number of locality `name`: 0 for none, else 1 + its place among the names seen.
pub(crate) fn id(name: Option<&str>) -> u32 {
    let Some(name) = name else {
        return 0;
    };
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let index = match names.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            names.push(name.to_owned());
            names.len() - 1
        }
    };
    index as u32 + 1
}

/// The name of locality `id`.
pub(crate) fn name(id: u32) -> Option<String> {
    let names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    id.checked_sub(1)
        .and_then(|i| names.get(i as usize))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_number_and_none_is_zero() {
        let a = id(Some("test-region/zone-a/"));
        let b = id(Some("test-region/zone-b/"));
        assert_ne!(a, b);
        assert_eq!(id(Some("test-region/zone-a/")), a);
        assert_eq!(id(None), 0);
        assert_eq!(name(b).as_deref(), Some("test-region/zone-b/"));
        assert_eq!(name(0), None);
    }
}
