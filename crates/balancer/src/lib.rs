//! Load-balancing policies over a set of upstream hosts.
//!
//! The crate is independent of the proxy and of any async runtime: a policy only chooses an
//! index into the host list it was built for. Legate keeps one policy instance per worker
//! thread, so a pick touches memory no other thread writes; the types are still `Send + Sync`
//! and can be shared when that is more convenient.
//!
//! ```
//! use balancer::RoundRobin;
//!
//! let hosts = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
//! let rr = RoundRobin::new(hosts.len()).expect("at least one host");
//! let picked: Vec<&str> = (0..4).map(|_| hosts[rr.pick()]).collect();
//! assert_eq!(picked, ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.1:80"]);
//! ```

mod error;
mod round_robin;

pub use error::BuildError;
pub use round_robin::RoundRobin;
