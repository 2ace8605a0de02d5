//! HTTP/1.1 connections: the codec while requests come, and *parking* in between. An idle
//! keep-alive connection gives up its codec (and its read and write buffers) after a short
//! while and keeps only its socket; when the client sends again, a fresh codec takes over
//! with any bytes the old one had read but not used. Idle connections thus cost little more
//! than their socket, which is what lets a proxy hold tens of thousands of them (lesson L2).

use std::future::poll_fn;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;

use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::io::DownstreamIo;
use super::service::ProxyService;
use super::{Codecs, ConnCtx};

pub(super) async fn serve_h1(
    mut io: DownstreamIo,
    service: ProxyService,
    codecs: &Codecs,
    mut drain: watch::Receiver<bool>,
) {
    let ctx = Rc::clone(&service.conn);
    loop {
        if !io.has_buffered() {
            // Parked: hold nothing but the socket until the client speaks, or idles out.
            let idle_until = ctx.last_active.get() + codecs.idle_timeout;
            tokio::select! {
                ready = io.tcp().readable() => if ready.is_err() { return },
                _ = drain.wait_for(|draining| *draining) => {
                    let _ = io.shutdown().await;
                    return;
                }
                _ = tokio::time::sleep_until(idle_until) => {
                    ctx.listener.stats.cx_idle_timeout.inc();
                    let _ = io.shutdown().await;
                    return;
                }
                () = crate::context::sleep_until_some(ctx.expires_at()) => {
                    ctx.listener.stats.cx_max_duration.inc();
                    let _ = io.shutdown().await;
                    return;
                }
            }
        }
        // Boxed, so that the state of an active connection is not part of every connection's
        // task: a parked one costs only what the loop above needs.
        match Box::pin(serve_h1_until_idle(io, &service, codecs, &mut drain)).await {
            Some(parked) => io = parked,
            None => return,
        }
    }
}

/// Runs the HTTP/1.1 codec until the connection ends (`None`, the socket shut down) or has
/// been idle long enough to park (`Some`: the socket and any bytes already read).
async fn serve_h1_until_idle(
    io: DownstreamIo,
    service: &ProxyService,
    codecs: &Codecs,
    drain: &mut watch::Receiver<bool>,
) -> Option<DownstreamIo> {
    let ctx: &ConnCtx = &service.conn;
    // Boxed: taking it apart on parking needs it Unpin.
    let mut conn = Box::pin(
        codecs
            .h1
            .serve_connection(TokioIo::new(io), service.clone()),
    );
    let mut parking = false;
    let mut closing_after_exchange = false;
    let mut draining = false;
    let park_after = codecs.park_after;
    let park_timer = tokio::time::sleep(park_after);
    tokio::pin!(park_timer);
    let result = loop {
        tokio::select! {
            // The codec first: on a drain that finds the connection's first request in our
            // buffer, hyper must have taken it in, or its graceful shutdown closes the
            // connection unanswered.
            biased;
            result = poll_fn(|cx| conn.as_mut().poll_without_shutdown(cx)) => break result,
            _ = drain.wait_for(|draining| *draining), if !draining => {
                draining = true;
                parking = false;
                conn.as_mut().graceful_shutdown();
            }
            _ = &mut park_timer, if !parking && !draining => {
                let idle_since = ctx.last_active.get();
                if ctx.in_flight.get() == 0 && idle_since.elapsed() >= park_after {
                    tracing::trace!(peer = %ctx.peer, "parking idle connection");
                    conn.as_mut().graceful_shutdown();
                    // hyper stops at once only when it is idle between messages. If it
                    // is not (a head half read, a response still flushing), it has just
                    // switched keep-alive off and will finish that exchange and close:
                    // then the socket must close too, not be parked.
                    match poll_fn(|cx| Poll::Ready(conn.as_mut().poll_without_shutdown(cx))).await {
                        Poll::Ready(result) => {
                            parking = true;
                            break result;
                        }
                        Poll::Pending => {}
                    }
                    parking = true;
                    closing_after_exchange = true;
                } else {
                    park_timer.as_mut().reset(idle_since.max(Instant::now()) + park_after);
                }
            }
        }
    };
    let parts = (*Pin::into_inner(conn)).into_parts();
    let mut io = parts.io.into_inner();
    let tunnel = ctx.tunnel.borrow_mut().take();
    if let (Ok(()), Some(tunnel)) = (&result, tunnel) {
        // The 101 is out: from here on the connection is a byte relay, not HTTP.
        let http = service.http.current();
        // Boxed: only upgraded connections carry the relay's state.
        Box::pin(crate::http::relay_tunnel(
            io,
            parts.read_buf,
            *tunnel,
            ctx,
            http.upgrade_idle_timeout,
            http.upgrade_buffer,
        ))
        .await;
        return None;
    }
    // hyper's head timer runs from the end of the last exchange, not from the next request's
    // first byte, so on a loaded worker it can fire before the park timer: a connection with
    // nothing of a new request read is idle, not slow, and parks.
    let idle_head_timeout = matches!(&result, Err(err) if err.is_timeout())
        && parts.read_buf.is_empty()
        && ctx.in_flight.get() == 0
        && !draining
        && !closing_after_exchange;
    if idle_head_timeout {
        tracing::trace!(peer = %ctx.peer, "parked on the head timer");
        crate::memory::codec_released();
        return Some(io);
    }
    if let Err(err) = result {
        if err.is_timeout() {
            ctx.listener.stats.cx_headers_timeout.inc();
        }
        tracing::debug!(error = %err, "downstream connection ended with an error");
    } else if parking && !closing_after_exchange {
        tracing::trace!(peer = %ctx.peer, buffered = parts.read_buf.len(), "parked");
        io.set_prefix(&parts.read_buf);
        crate::memory::codec_released();
        return Some(io);
    }
    let _ = io.shutdown().await;
    None
}
