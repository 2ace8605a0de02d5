//! One HTTP/1.1 exchange: the request head read and checked by the codec, the request served
//! by the handler (its body read from the connection as the upstream takes it), the response
//! written.

use std::cell::RefCell;
use std::future::poll_fn;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use h1::{Answering, BodyLength, HeadError, IncomingBody, RequestHead};
use http::{Method, StatusCode, Version};
use tokio::time::Instant;

use super::write::{self, Written};
use super::{FIRST_READ, Shared};
use crate::buffer_pool;
use crate::conn::Codecs;
use crate::conn::service::ProxyService;
use crate::context::{ConnCtx, RequestBody, SignalWatch, Tunnel};
use crate::http::local_reply;

/// What the connection does after an exchange.
pub(super) enum Next {
    KeepAlive,
    Close,
    /// The response was a 101: the connection is relayed to the upstream from here on.
    Tunnel(Box<Tunnel>),
}

/// Serves the request whose first bytes are in the buffer.
pub(super) async fn serve(
    input: &Shared,
    service: &ProxyService,
    codecs: &Codecs,
    drain: &mut SignalWatch,
) -> Next {
    let ctx = &*service.conn;
    let head = match read_head(input, ctx, codecs).await {
        Ok(head) => head,
        Err(None) => return Next::Close,
        Err(Some((refused, started))) => {
            return refuse(input, refused, (ctx, started), codecs).await;
        }
    };
    let RequestHead {
        request,
        body: length,
        keep_alive,
        expect_continue,
    } = head;
    let answering = Answering {
        head_request: request.method() == Method::HEAD,
        connect: request.method() == Method::CONNECT,
        version: request.version(),
        keep_alive,
    };
    let generation = input.borrow_mut().start_body(length, expect_continue);
    let body = (length != BodyLength::Empty).then(|| {
        let shared: Rc<RefCell<h1::Input<dyn h1::Io>>> = input.clone();
        IncomingBody::new(shared, generation)
    });
    let mut draining = drain.is_raised();
    let mut half_closed = false;
    // The response stays where it lands, here, until it is written: each move (`select!`'s
    // output, a return, a call) would copy it, 312 bytes.
    let mut answer = None;
    // The handler's state lives in this block, so it is dropped before the response is
    // written; it is part of this exchange's state (boxed once by the connection), not boxed
    // on its own.
    {
        let mut serving = pin!(
            service.serve_inline(request, move |(), received| match body {
                Some(body) => RequestBody::http1(body, received),
                None => RequestBody::empty(),
            })
        );
        let mut watching = true;
        // The handler first; then the drain signal and the client's side, as they come.
        poll_fn(|cx| {
            if let Poll::Ready(Ok(response)) = serving.as_mut().poll(cx) {
                answer = Some(response);
                return Poll::Ready(());
            }
            if !draining && drain.poll_raised(cx).is_ready() {
                draining = true;
            }
            if watching && let Poll::Ready(gone) = poll_client_gone(input, codecs.h1.max_head, cx)
            {
                watching = false;
                match gone {
                    ClientSide::Closed if codecs.h1.serve_half_closed => {
                        // It sent its whole request and then its FIN: it is answered, and the
                        // connection closes after (nothing more can come).
                        tracing::debug!(peer = %ctx.peer, "client half-closed the connection; its request is still served");
                        half_closed = true;
                    }
                    ClientSide::Closed | ClientSide::Reset => {
                        // The request is cancelled (no answer): its upstream try too.
                        tracing::debug!(peer = %ctx.peer, "client closed the connection mid-request");
                        return Poll::Ready(());
                    }
                    ClientSide::Unwatched => {}
                }
            }
            Poll::Pending
        })
        .await;
    }
    let Some(response) = answer.as_mut() else {
        return Next::Close;
    };
    // A 101, or a 2xx to CONNECT: the handler has left the tunnel's upstream side.
    let opened = response.status() == StatusCode::SWITCHING_PROTOCOLS
        || (answering.connect && response.status().is_success());
    let tunnel = if opened {
        ctx.tunnel.borrow_mut().take()
    } else {
        None
    };
    // After a CONNECT that opened no tunnel the connection closes (below): the answer says so.
    let answering = Answering {
        keep_alive: answering.keep_alive
            && !draining
            && !half_closed
            && (!answering.connect || tunnel.is_some()),
        ..answering
    };
    let written = write::response(
        input,
        response,
        answering,
        codecs.h1.write_buffer,
        codecs.h1.keep_case,
    )
    .await;
    // Its body (the request's log with it) ends with the write, as before the next request.
    drop(answer);
    // A body the exchange did not read to its end (the response came first) must end in what
    // is already buffered for the connection to go on to the next request.
    let body_finished = {
        let mut input = input.borrow_mut();
        let finished = input.body_done() || input.skip_buffered_body();
        input.end_exchange();
        finished
    };
    match (written, tunnel) {
        (Written::Complete { .. }, Some(tunnel)) => Next::Tunnel(tunnel),
        // After a CONNECT that opened no tunnel, the client may already be sending the
        // tunnel's bytes, not requests (Envoy closes too).
        (Written::Complete { keep_alive: true }, None)
            if body_finished && !drain.is_raised() && !answering.connect =>
        {
            Next::KeepAlive
        }
        _ => Next::Close,
    }
}

/// What the client did to its connection while its request was served.
enum ClientSide {
    /// It closed its sending side (a FIN): it has gone, or only half-closed.
    Closed,
    /// The connection failed (a reset): it has gone.
    Reset,
    /// It cannot be watched any more (see [`poll_client_gone`]).
    Unwatched,
}

/// Ready when the client closes the connection while its request is served, which cancels
/// the request unless the listener serves half-closed ones. Only watched once the request's
/// body is all read: until then the body's reader owns the socket's read readiness (a second
/// reader would take its wake-ups). What arrives meanwhile (the next pipelined request) is
/// kept, up to a head's worth.
fn poll_client_gone(
    input: &Shared,
    max_buffered: usize,
    cx: &mut std::task::Context<'_>,
) -> Poll<ClientSide> {
    let mut input = input.borrow_mut();
    loop {
        if !input.body_done() || input.buf.len() >= max_buffered {
            return Poll::Ready(ClientSide::Unwatched);
        }
        match std::task::ready!(input.poll_read_more(cx, FIRST_READ)) {
            Ok(0) => return Poll::Ready(ClientSide::Closed),
            Err(_) => return Poll::Ready(ClientSide::Reset),
            Ok(_) => {}
        }
    }
}

/// Reads until the buffer holds a whole request head. `Err(None)`: the connection is to
/// close without an answer (the client went away, or took longer than
/// `request_headers_timeout` from its first byte); `Err(Some(_))`: a head to refuse, and
/// when its first byte was there.
async fn read_head(
    input: &Shared,
    ctx: &ConnCtx,
    codecs: &Codecs,
) -> Result<RequestHead, Option<(HeadError, Instant)>> {
    // Read when a head is not whole at once (or refused), not for each request: its first
    // bytes are here already, so this is as good as when they came.
    let mut started = None;
    let mut parked = false;
    loop {
        // Called directly, not through a pointer to either: the plain parse is inlined here.
        let parsed = {
            let buf = &mut input.borrow_mut().buf;
            if codecs.h1.keep_case {
                h1::parse_request_keeping_case(buf, codecs.h1.max_head)
            } else {
                h1::parse_request(buf, codecs.h1.max_head)
            }
        };
        match parsed {
            Ok(Some(head)) => return Ok(head),
            Ok(None) => {}
            Err(refused) => {
                return Err(Some((refused, *started.get_or_insert_with(Instant::now))));
            }
        }
        let started = *started.get_or_insert_with(Instant::now);
        let deadline = started + codecs.request_headers_timeout;
        let park_at = (!parked).then(|| started + codecs.park_after);
        let want = input.borrow().buf.len().max(FIRST_READ);
        tokio::select! {
            read = poll_fn(|cx| input.borrow_mut().poll_read_more(cx, want)) => match read {
                Ok(0) | Err(_) => return Err(None),
                Ok(_) => {}
            },
            _ = tokio::time::sleep_until(deadline) => {
                ctx.listener.stats.cx_headers_timeout.inc();
                return Err(None);
            }
            _ = tokio::time::sleep_until(park_at.unwrap_or(deadline)), if park_at.is_some() => {
                // A head begun and not finished: keep only its bytes, not the read buffer.
                parked = true;
                let mut input = input.borrow_mut();
                let kept = BytesMut::from(&input.buf[..]);
                tracing::trace!(peer = %ctx.peer, buffered = kept.len(), "parked");
                buffer_pool::give(std::mem::replace(&mut input.buf, kept));
            }
        }
    }
}

/// Answers a head the codec refused, then closes: after a malformed head the stream may
/// hold anything.
async fn refuse(
    input: &Shared,
    refused: HeadError,
    (ctx, started): (&ConnCtx, Instant),
    codecs: &Codecs,
) -> Next {
    tracing::debug!(error = %refused, "refused a request head");
    let status = refused.status();
    let body = match status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "request headers too large\n",
        StatusCode::HTTP_VERSION_NOT_SUPPORTED => "HTTP version not supported\n",
        StatusCode::NOT_IMPLEMENTED => "transfer coding not supported\n",
        _ => "bad request\n",
    };
    crate::context::refused_head(ctx, status, body.len(), started);
    let mut reply = local_reply::text(status, Bytes::from_static(body.as_bytes()));
    let answering = Answering {
        head_request: false,
        connect: false,
        version: Version::HTTP_11,
        keep_alive: false,
    };
    write::response(
        input,
        &mut reply,
        answering,
        codecs.h1.write_buffer,
        codecs.h1.keep_case,
    )
    .await;
    Next::Close
}
