//! Listening sockets (one `SO_REUSEPORT` socket per worker per listener) and the limits
//! accepted connections are admitted under.

mod limit;
mod reuse_port;

pub(crate) use limit::{ConnPermit, ConnectionLimits, Limit};
pub(crate) use reuse_port::{bind_per_worker, bind_shared, join_reuse_port, reuse_port_supported};
