//! Listening sockets (one `SO_REUSEPORT` socket per worker per listener, TCP and, for HTTP/3,
//! UDP) and the limits accepted connections are admitted under.

mod limit;
mod quic_steering;
mod reuse_port;
mod udp;

pub(crate) use limit::{ConnPermit, ConnectionLimits, Limit};
pub(crate) use quic_steering::WorkerConnectionIds;
pub(crate) use reuse_port::{bind_per_worker, bind_shared, join_reuse_port, reuse_port_supported};
pub(crate) use udp::QuicSockets;

/// Keep-alive settings as the socket takes them (unset values are the system's).
pub(crate) fn tcp_keepalive(k: config::TcpKeepalive) -> socket2::TcpKeepalive {
    let mut probes = socket2::TcpKeepalive::new();
    if let Some(time) = k.time {
        probes = probes.with_time(time);
    }
    if let Some(interval) = k.interval {
        probes = probes.with_interval(interval);
    }
    if let Some(count) = k.probes {
        probes = probes.with_retries(count);
    }
    probes
}
