//! What a change replaced, freed off its path: the resources a change made obsolete (a route
//! table of a thousand routes is a million instructions to free) are handed to a thread that
//! drops them, so neither the management server's ACK nor a worker's requests wait for it.

use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

type Retired = Box<dyn Send>;

/// Drops `value` on the retiring thread; here, when that thread could not start (it then
/// only costs the time it would have anyway). The queue is not bounded: changes come a few
/// a second at most, and each is freed in a millisecond or two.
pub(crate) fn retire<T: Send + 'static>(value: T) {
    static RETIRING: OnceLock<Option<Sender<Retired>>> = OnceLock::new();
    let sender = RETIRING.get_or_init(|| {
        let (sender, receiver) = channel::<Retired>();
        let spawned = std::thread::Builder::new()
            .name("legate-retire".into())
            .spawn(move || {
                // Ends with the process: the sender is never dropped.
                for retired in receiver {
                    drop(retired);
                }
            });
        match spawned {
            Ok(_) => Some(sender),
            Err(error) => {
                tracing::warn!(%error, "cannot start the thread that frees replaced config; it is freed in place");
                None
            }
        }
    });
    let value: Retired = Box::new(value);
    let unsent = match sender {
        Some(sender) => sender.send(value).err().map(|e| e.0),
        None => Some(value),
    };
    drop(unsent);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notes the thread it is dropped on.
    struct Watched(std::sync::mpsc::Sender<Option<String>>);

    impl Drop for Watched {
        fn drop(&mut self) {
            let name = std::thread::current().name().map(str::to_owned);
            let _ = self.0.send(name);
        }
    }

    #[test]
    fn a_retired_value_is_dropped_on_the_retiring_thread() {
        let (sender, dropped) = std::sync::mpsc::channel();
        retire(Watched(sender));
        let name = dropped
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("dropped");
        assert_eq!(name.as_deref(), Some("legate-retire"));
    }
}
