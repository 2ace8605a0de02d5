//! Listening sockets: one `SO_REUSEPORT` socket per worker per listener.

mod reuse_port;

pub(crate) use reuse_port::bind_per_worker;
