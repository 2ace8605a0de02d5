//! HTTP/1.1 connections, on the codec in crates/h1: one task reads each request head, serves
//! the request, and writes its response, then reads the next. Between requests a connection is
//! *parked*: it gives its read buffer back to the worker's pool and holds only its socket until
//! the client sends again, which is what lets a proxy hold tens of thousands of idle
//! connections (lesson L2). A cleartext connection idle for `park_after` (a second) goes
//! further: its task ends and hands back the socket alone ([`Parked`]), for the worker to
//! hold without a task until the client sends again.
//!
//! ```text
//! mod.rs          the connection: parked between requests, an exchange at a time, upgrades
//! exchange.rs     one request: its head read (within request_headers_timeout) and served
//! write.rs        one response: its head and body written, with the framing the codec chose
//! ```

mod exchange;
mod write;

use std::cell::RefCell;
use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::task::Poll;

use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};

use super::io::DownstreamIo;
use super::service::ProxyService;
use super::{Codecs, ConnCtx, ConnSettings, Parked};
use crate::box_pool::PooledBox;
use crate::buffer_pool;
use crate::context::{ListenerCtx, SignalWatch, Tunnel};
use exchange::Next;

/// The connection's input (its socket and what has been read), shared with the body of the
/// request being served. It is borrowed only within a poll, never across an await.
type Shared = Rc<RefCell<h1::Input<DownstreamIo>>>;

/// What the first read of a request asks room for: most heads fit.
const FIRST_READ: usize = buffer_pool::BUFFER;

/// Serves the connection until it closes or is [`Parked`]. The input is made before the
/// `async` block so that the socket is not also kept, moved-from, in the connection's state.
pub(super) fn serve_h1(
    io: DownstreamIo,
    mut service: ProxyService,
    settings: Rc<ConnSettings>,
    mut drain: SignalWatch,
) -> impl Future<Output = Option<Parked>> {
    let mut input: Shared = Rc::new(RefCell::new(h1::Input::new(
        io,
        settings.codecs.h1.read_size,
        settings.codecs.h1.max_head,
    )));
    async move {
        let codecs = &settings.codecs;
        // One timer for the connection's life, re-armed only when it fires (see `park`): a busy
        // connection adds and removes no timer per request. First armed no later than the
        // earliest deadline there can be.
        let mut timer = pin!(tokio::time::sleep_until(
            service.conn.last_active.get() + codecs.park_after.min(codecs.idle_timeout)
        ));
        let next = loop {
            if input.borrow().buf.is_empty() {
                let waited = park(
                    &input,
                    &service.conn,
                    codecs,
                    &mut drain,
                    timer.as_mut(),
                    settings.park_idle,
                );
                match waited.await {
                    Waited::Request => {}
                    Waited::Close => break Next::Close,
                    Waited::Idle(close_at) => {
                        match into_parked(input, service, &settings, close_at) {
                            Ok(parked) => return parked,
                            // TLS, or still shared: the connection stays as it is.
                            Err(kept) => {
                                (input, service) = kept;
                                timer.as_mut().reset(close_at);
                                continue;
                            }
                        }
                    }
                }
            }
            // Boxed, so that the state of an exchange is not part of every connection's task: a
            // parked one costs only what `park` needs. The box is from the worker's pool: no
            // allocation per request.
            let exchange =
                PooledBox::pin_with(|| exchange::serve(&input, &service, codecs, &mut drain));
            match exchange.await {
                Next::KeepAlive => {}
                next => break next,
            }
        };
        if let Next::Tunnel(tunnel) = next {
            // Boxed: only upgraded connections carry the relay's state.
            Box::pin(relay_upgraded(input, *tunnel, &service)).await;
            return None;
        }
        buffer_pool::give(std::mem::take(&mut input.borrow_mut().buf));
        // A lingering close: the client gets what was written even if it is still sending.
        let _ = poll_fn(|cx| {
            let mut input = input.borrow_mut();
            std::pin::Pin::new(&mut input.io).poll_shutdown(cx)
        })
        .await;
        None
    }
}

/// The idle connection as its socket and context alone (`None` in the rare case that the
/// runtime will not let the socket go: it is closed), if it is cleartext with nothing
/// carried over and nothing else holds its input or context; else both back.
fn into_parked(
    input: Shared,
    service: ProxyService,
    settings: &Rc<ConnSettings>,
    close_at: Instant,
) -> Result<Option<Parked>, (Shared, ProxyService)> {
    let parkable = {
        let input = input.borrow();
        input.buf.is_empty() && input.io.is_plain()
    };
    if !parkable || Rc::strong_count(&input) > 1 || Rc::strong_count(&service.conn) > 1 {
        return Err((input, service));
    }
    let ProxyService { conn, http } = service;
    // Both held once (checked above): neither can fail.
    let (Ok(input), Ok(ctx)) = (Rc::try_unwrap(input), ConnCtx::park(conn)) else {
        return Ok(None);
    };
    let (io, buf) = input.into_inner().into_parts();
    buffer_pool::give(buf);
    let Ok(tcp) = io.into_plain_tcp() else {
        return Ok(None);
    };
    Ok(tcp.into_std().ok().map(|socket| Parked {
        socket,
        ctx,
        http,
        settings: Rc::clone(settings),
        close_at,
    }))
}

/// The 101 is out: from here on the connection is a byte relay, not HTTP. Nothing else holds
/// the input (an upgrade request's body is empty).
async fn relay_upgraded(input: Shared, tunnel: Tunnel, service: &ProxyService) {
    let Ok(input) = Rc::try_unwrap(input) else {
        return;
    };
    let (io, rest) = input.into_inner().into_parts();
    let http = service.http.current();
    crate::http::relay_tunnel(
        io.relay(),
        rest.freeze(),
        tunnel,
        &service.conn,
        http.upgrade_idle_timeout,
        http.upgrade_buffer,
    )
    .await;
}

/// What waiting for the client's next request came to.
enum Waited {
    /// Bytes of the next request are in the buffer.
    Request,
    /// The connection is to close: the client closed it, it idled out or reached its maximum
    /// duration, or the proxy drains.
    Close,
    /// Idle for `park_after`: to be parked as its socket alone, and closed at this time unless
    /// the client sends again.
    Idle(Instant),
}

/// Waits until the client sends again. Meanwhile the connection holds no buffer: it takes one
/// from the worker's pool to read once the socket is readable.
///
/// `timer` may be armed for an earlier time than any deadline here (they all move later as
/// the connection is used): when it fires, the deadlines are checked and it is re-armed for
/// the next one, or the connection is found idle for `park_after`.
async fn park(
    input: &Shared,
    ctx: &ConnCtx,
    codecs: &Codecs,
    drain: &mut SignalWatch,
    mut timer: Pin<&mut Sleep>,
    park_idle: bool,
) -> Waited {
    loop {
        let buffered = {
            let mut input = input.borrow_mut();
            if input.buf.capacity() > 0 {
                buffer_pool::give(std::mem::take(&mut input.buf));
                tracing::trace!(peer = %ctx.peer, buffered = 0, "parked");
            }
            input.io.has_buffered()
        };
        if !buffered {
            tokio::select! {
                ready = poll_fn(|cx| input.borrow().io.tcp().poll_read_ready(cx)) => {
                    if ready.is_err() {
                        return Waited::Close;
                    }
                }
                () = drain.raised() => return Waited::Close,
                () = timer.as_mut() => {
                    let deadline =
                        parked_deadline(ctx.last_active.get(), ctx.expires_at(), &ctx.listener, codecs);
                    let Some(next) = deadline else {
                        return Waited::Close;
                    };
                    let idle_from = ctx.last_active.get() + codecs.park_after;
                    if !park_idle {
                        timer.as_mut().reset(next);
                    } else if Instant::now() >= idle_from {
                        return Waited::Idle(next);
                    } else {
                        timer.as_mut().reset(next.min(idle_from));
                    }
                    continue;
                }
            }
        }
        // Readiness can be stale, or TLS records without data: a read that would wait means
        // the connection is still idle.
        let read = poll_fn(|cx| {
            let mut input = input.borrow_mut();
            if input.buf.capacity() == 0 {
                input.buf = buffer_pool::take();
            }
            Poll::Ready(input.poll_read_more(cx, FIRST_READ))
        });
        match read.await {
            Poll::Ready(Ok(0) | Err(_)) => return Waited::Close,
            Poll::Ready(Ok(_)) => return Waited::Request,
            Poll::Pending => {}
        }
    }
}

/// On the parked connection's timer: when to look again, or `None` if it is to close now
/// (idle timeout, maximum duration: counted in `listener`'s stats).
pub(super) fn parked_deadline(
    last_active: Instant,
    expires_at: Option<Instant>,
    listener: &ListenerCtx,
    codecs: &Codecs,
) -> Option<Instant> {
    let now = Instant::now();
    let idle_until = last_active + codecs.idle_timeout;
    if now >= idle_until {
        listener.stats.cx_idle_timeout.inc();
        return None;
    }
    // A connection in use (idle for less than park_after) is retired by a response saying
    // `connection: close`, not by closing it under a request on its way.
    let expires_at = expires_at.map(|at| at.max(last_active + codecs.park_after));
    if expires_at.is_some_and(|at| now >= at) {
        listener.stats.cx_max_duration.inc();
        return None;
    }
    Some(expires_at.map_or(idle_until, |at| at.min(idle_until)))
}
