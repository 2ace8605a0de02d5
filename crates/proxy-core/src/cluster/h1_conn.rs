//! An HTTP/1.1 connection to a host on the proxy's own codec (crates/h1), driven by the
//! request that uses it: the request is written and its response read in the request's own
//! task, with no task per connection and no hop between tasks. An idle connection is its
//! socket and a few words: its read buffer goes back to the worker's pool between exchanges.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes, BytesMut};
use h1::BodyLength;
use h1::client::{Decoded, OutgoingBody, ResponseDecoder, ResponseError, ResponseHead};
use http::Request;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::either::Either;

use super::HostPool;
use super::connect::OpenConn;
use crate::buffer_pool;
use crate::context::RequestBody;
use crate::error::{BodyError, ProxyError};
use crate::tls::UpstreamIo;

/// A write buffer that grew past this (a large head) is freed rather than kept while idle.
const MAX_KEPT_WRITE_BUFFER: usize = 4096;

/// The most room a response body read asks for. A read buffer that data frames still share
/// cannot be reused, so each read may allocate this much: bounded whatever the buffer limit.
const MAX_READ: usize = 16 * 1024;

/// An open HTTP/1.1 connection to a host.
pub(super) struct H1Conn {
    io: UpstreamIo,
    /// Bytes read and not yet used. No memory while idle.
    buf: BytesMut,
    /// What is being written: framing bytes, then data, then a suffix.
    out: Outgoing,
    /// Requests sent on the connection.
    pub(super) uses: u32,
    /// When it was opened, and when it last went idle (`max_connection_duration`,
    /// `idle_timeout`).
    pub(super) opened: Instant,
    pub(super) idle_since: Instant,
    /// The host's failure count when it was opened: one made before a later failure takes
    /// no new request.
    pub(super) failures_at_open: u32,
    _open: OpenConn,
}

impl H1Conn {
    /// Boxed once for its life: it moves between the pool and the responses read from it.
    pub(super) fn new(io: UpstreamIo, open: OpenConn, failures_at_open: u32) -> Box<Self> {
        Box::new(Self {
            io,
            buf: BytesMut::new(),
            out: Outgoing::default(),
            uses: 0,
            opened: Instant::now(),
            idle_since: Instant::now(),
            failures_at_open,
            _open: open,
        })
    }

    /// Whether an idle connection can carry a request: nothing arrived while it was idle.
    /// An upstream that closed it (or sent bytes nobody asked for) is seen here, before a
    /// request is written to it, so the request goes on another connection instead.
    pub(super) fn is_reusable(&mut self) -> bool {
        match &mut self.io {
            // The socket's readiness says it, as a poll would, without registering a waker or
            // spending the task's budget (about 30 instructions a request instead of 170):
            // nothing to read while the runtime has not seen the socket readable since a read
            // found it empty; if it has, one read of a byte finds a close, a byte, or nothing.
            Either::Left(tcp) => match tcp.try_read(&mut [0u8; 1]) {
                Err(error) => error.kind() == io::ErrorKind::WouldBlock,
                Ok(_) => false,
            },
            // Bytes on a TLS connection's socket may be a session ticket, no reason to drop
            // it: rustls reads them.
            Either::Right(_) => self.poll_open(&mut Context::from_waker(Waker::noop())),
        }
    }

    /// Whether an idle connection is still open, registering `cx` to be woken when its
    /// upstream closes it (or sends anything, which also ends it).
    pub(super) fn poll_open(&mut self, cx: &mut Context<'_>) -> bool {
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        Pin::new(&mut self.io)
            .poll_read(cx, &mut probe)
            .is_pending()
    }

    /// Makes the connection idle: its buffers go back, or are freed.
    pub(super) fn park(&mut self) {
        buffer_pool::give(std::mem::take(&mut self.buf));
        if self.out.framing.capacity() > MAX_KEPT_WRITE_BUFFER {
            self.out.framing = BytesMut::new();
        }
    }

    fn poll_read_more(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.buf.capacity() == 0 {
            self.buf = buffer_pool::take();
        }
        self.buf.reserve(want);
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    /// Writes what is queued, then flushes.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let slices = [
                IoSlice::new(&self.out.framing),
                IoSlice::new(&self.out.data),
                IoSlice::new(self.out.suffix),
            ];
            let n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.advance(n);
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Reads until a final response head is whole, skipping interim (1xx) ones, while
    /// `upload` sends the request body: an upstream may answer before it has read it all.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        upload: &mut Option<Upload>,
        limits: &Limits,
    ) -> Poll<Result<ResponseHead, ExchangeError>> {
        if let Some(sending) = upload.as_mut() {
            match sending.poll(self, cx) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => *upload = None,
                Poll::Ready(Err(UploadError::Client(error))) => {
                    return Poll::Ready(Err(ExchangeError::Client(error)));
                }
                // The upstream may have answered and closed: its answer is read below.
                Poll::Ready(Err(UploadError::Upstream(error))) => {
                    tracing::debug!(%error, "upstream stopped taking the request body");
                    sending.failed = true;
                }
            }
        }
        loop {
            // Nothing read yet (the usual case when the request has just gone): no parse.
            if !self.buf.is_empty() {
                // Called directly, not through a pointer: the plain parse is inlined here.
                let (buf, max, head) = (&mut self.buf, limits.max_head, limits.head_request);
                let parsed = if limits.keep_case {
                    h1::client::parse_response_keeping_case(buf, max, head)
                } else {
                    h1::client::parse_response(buf, max, head)
                };
                match parsed {
                    Ok(Some(head)) if is_interim(&head) => continue,
                    Ok(Some(head)) => return Poll::Ready(Ok(head)),
                    Ok(None) => {}
                    Err(error) => return Poll::Ready(Err(ExchangeError::Response(error))),
                }
            }
            match ready!(self.poll_read_more(cx, buffer_pool::BUFFER)) {
                Ok(0) => return Poll::Ready(Err(ExchangeError::Closed)),
                Ok(_) => {}
                Err(error) => return Poll::Ready(Err(ExchangeError::Io(error))),
            }
        }
    }
}

/// A 1xx other than 101: hyper's client skips these, and so does this one.
fn is_interim(head: &ResponseHead) -> bool {
    head.parts.status.is_informational()
        && head.parts.status != http::StatusCode::SWITCHING_PROTOCOLS
}

/// Bytes queued for the socket, written in order with one vectored write where the socket
/// takes them: a chunk's size line, its data (not copied again here), its CRLF.
#[derive(Default)]
struct Outgoing {
    framing: BytesMut,
    data: Bytes,
    suffix: &'static [u8],
}

impl Outgoing {
    fn is_empty(&self) -> bool {
        self.framing.is_empty() && self.data.is_empty() && self.suffix.is_empty()
    }

    fn advance(&mut self, mut n: usize) {
        let from_framing = n.min(self.framing.len());
        self.framing.advance(from_framing);
        n -= from_framing;
        let from_data = n.min(self.data.len());
        self.data.advance(from_data);
        if self.data.is_empty() {
            // Written: an empty slice would still hold the memory it was cut from (the client
            // connection's buffer, a chunk of copies) for as long as this connection lives.
            self.data = Bytes::new();
        }
        n -= from_data;
        self.suffix = &self.suffix[n.min(self.suffix.len())..];
    }
}

/// The rest of a request body, sent as the upstream takes it (backpressure: a frame is asked
/// for only once the last one is written).
pub(super) struct Upload {
    body: RequestBody,
    length: BodyLength,
    /// The trailer fields the request declared (`Trailer`), the only ones sent.
    trailers: Option<Box<[http::HeaderName]>>,
    sent: u64,
    done: bool,
    /// The upstream stopped taking the body; what it answered is still read.
    failed: bool,
    /// The request's own body failed after the response head: the response fails too, once
    /// what of it has come is read.
    client_failed: Option<BodyError>,
}

enum UploadError {
    Client(BodyError),
    Upstream(io::Error),
}

impl Upload {
    fn poll(&mut self, conn: &mut H1Conn, cx: &mut Context<'_>) -> Poll<Result<(), UploadError>> {
        if self.failed {
            return Poll::Pending;
        }
        loop {
            ready!(conn.poll_write_out(cx)).map_err(UploadError::Upstream)?;
            if self.done {
                return Poll::Ready(Ok(()));
            }
            let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
            let chunked = self.length == BodyLength::Chunked;
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => {
                        self.sent += data.len() as u64;
                        if let BodyLength::Length(declared) = self.length
                            && self.sent > declared
                        {
                            return Poll::Ready(Err(UploadError::Client(
                                "the request body is longer than its content-length".into(),
                            )));
                        }
                        if chunked {
                            h1::encode_chunk_header(data.len(), &mut conn.out.framing);
                            conn.out.suffix = b"\r\n";
                        }
                        conn.out.data = data;
                    }
                    Err(frame) => {
                        // Trailers go only where the framing carries them.
                        if chunked && let Ok(trailers) = frame.into_trailers() {
                            h1::client::encode_request_last_chunk(
                                &trailers,
                                self.trailers.as_deref().unwrap_or_default(),
                                &mut conn.out.framing,
                            );
                            self.done = true;
                        }
                    }
                },
                Some(Err(error)) => return Poll::Ready(Err(UploadError::Client(error))),
                None => {
                    match self.length {
                        BodyLength::Chunked => {
                            h1::encode_last_chunk(None, &mut conn.out.framing);
                        }
                        BodyLength::Length(declared) if self.sent < declared => {
                            return Poll::Ready(Err(UploadError::Client(
                                "the request body is shorter than its content-length".into(),
                            )));
                        }
                        _ => {}
                    }
                    self.done = true;
                }
            }
        }
    }
}

/// What an exchange needs to know to read its response.
struct Limits {
    max_head: usize,
    head_request: bool,
    keep_case: bool,
}

/// Why an exchange got no response.
pub(super) enum ExchangeError {
    /// Writing the head failed: nothing of the request was taken, it can go elsewhere.
    Unsent(io::Error),
    Io(io::Error),
    /// The upstream closed the connection before a response head.
    Closed,
    Response(ResponseError),
    /// The client's request body failed.
    Client(BodyError),
    /// A 101 to a request that asked for no upgrade (those go on connections of their own,
    /// upgrade.rs): the connection no longer speaks HTTP.
    UnaskedUpgrade,
}

impl ExchangeError {
    pub(super) fn into_proxy_error(self, pool: &HostPool) -> ProxyError {
        let addr = pool.addr;
        match self {
            ExchangeError::Unsent(source) | ExchangeError::Io(source) => {
                ProxyError::UpstreamReset {
                    addr,
                    source: Box::new(source),
                }
            }
            ExchangeError::Closed => ProxyError::UpstreamReset {
                addr,
                source: "the connection closed before a response".into(),
            },
            ExchangeError::Response(ResponseError::ContentLengthAndTransferEncoding) => {
                ProxyError::UpstreamFraming {
                    addr,
                    what: "both content-length and transfer-encoding",
                }
            }
            ExchangeError::Response(error) => ProxyError::UpstreamProtocol {
                addr,
                source: Box::new(error),
            },
            ExchangeError::Client(source) => ProxyError::ClientAborted { source },
            ExchangeError::UnaskedUpgrade => ProxyError::UpstreamProtocol {
                addr,
                source: "101 Switching Protocols to a request without an upgrade".into(),
            },
        }
    }
}

/// Sends a request on `conn` and reads its response head. The body, if the upstream
/// answered before taking all of it, goes on being sent as the response body is read. The
/// request stays in `req` until its head is written: after `ExchangeError::Unsent` it is there
/// whole, to be sent elsewhere. Taken by reference, so that no level of the send keeps a copy.
pub(super) async fn exchange(
    mut conn: Box<H1Conn>,
    req: &mut Request<RequestBody>,
    pool: &Rc<HostPool>,
) -> Result<(http::response::Parts, H1Response), ExchangeError> {
    let outgoing = if req.body().is_end_stream() {
        OutgoingBody::None
    } else if let Some(len) = req.body().size_hint().exact() {
        OutgoingBody::Known(len)
    } else {
        OutgoingBody::Unknown
    };
    let length = h1::client::encode_request_head_cased(
        req,
        outgoing,
        pool.settings.keep_case,
        &mut conn.out.framing,
    );
    if let Err(error) = std::future::poll_fn(|cx| conn.poll_write_out(cx)).await {
        return Err(ExchangeError::Unsent(error));
    }
    conn.uses += 1;
    let body = std::mem::replace(req.body_mut(), RequestBody::empty());
    let mut upload = (length != BodyLength::Empty).then(|| Upload {
        body,
        length,
        trailers: h1::client::declared_trailers(req.headers()),
        sent: 0,
        done: false,
        failed: false,
        client_failed: None,
    });
    let limits = Limits {
        max_head: pool.settings.buffer_limit.max(8192),
        head_request: req.method() == http::Method::HEAD,
        keep_case: pool.settings.keep_case,
    };
    let response = std::future::poll_fn(|cx| conn.poll_head(cx, &mut upload, &limits)).await;
    let response = match response {
        Ok(response) if response.parts.status == http::StatusCode::SWITCHING_PROTOCOLS => {
            return Err(ExchangeError::UnaskedUpgrade);
        }
        Ok(response) => response,
        Err(error) => return Err(error),
    };
    let failed_upload = upload.as_ref().is_some_and(|upload| upload.failed);
    let decoder = ResponseDecoder::new(response.length, pool.settings.buffer_limit);
    let body = H1Response {
        decoder,
        keep_alive: response.keep_alive && !failed_upload,
        // Boxed: only a response that came before its request body was sent has one.
        upload: upload.filter(|upload| !upload.failed).map(Box::new),
        read_size: pool.settings.buffer_limit.min(MAX_READ),
        conn: Some(conn),
        pool: Rc::clone(pool),
    };
    Ok((response.parts, body))
}

/// A response body read from its connection as it is asked for. Read to its end, the
/// connection goes back to the pool if it can carry another request; dropped earlier, it
/// closes, since the rest of the response would still be on the wire.
pub(crate) struct H1Response {
    conn: Option<Box<H1Conn>>,
    decoder: ResponseDecoder,
    /// The rest of the request body, when the upstream answered before taking it all.
    upload: Option<Box<Upload>>,
    keep_alive: bool,
    read_size: usize,
    pool: Rc<HostPool>,
}

impl H1Response {
    /// The body is complete: the connection is pooled or closed.
    fn finish(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        // A request body not all sent, or bytes beyond the response: the connection cannot
        // carry another exchange.
        if self.keep_alive && self.upload.is_none() && conn.buf.is_empty() {
            conn.park();
            self.pool.put_back(conn);
        }
        self.upload = None;
    }

    fn fail(&mut self, error: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.conn = None;
        self.upload = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for H1Response {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_mut() else {
            // Over: read to its end, or failed (and failed it stays).
            return Poll::Ready(
                (!this.decoder.is_done())
                    .then(|| Err("the upstream response failed before its end".into())),
            );
        };
        if let Some(upload) = this.upload.as_mut() {
            match upload.poll(conn, cx) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => this.upload = None,
                // The upstream stopped taking the body: the response goes on; the connection
                // will not be reused.
                Poll::Ready(Err(UploadError::Upstream(_))) => {
                    this.upload = None;
                    this.keep_alive = false;
                }
                // The request's own body failed (the client went away, a filter cut it short):
                // the upstream may wait for the rest, so the response fails too, as an HTTP/2
                // upstream's stream is reset, once what of it has come is read.
                Poll::Ready(Err(UploadError::Client(error))) => {
                    upload.failed = true;
                    upload.client_failed = Some(error);
                    this.keep_alive = false;
                }
            }
        }
        loop {
            match this.decoder.decode(&mut conn.buf) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::Trailers(trailers)) => {
                    this.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::NeedMore) => {}
                Err(error) => return this.fail(Box::new(error)),
            }
            if let Some(error) = this.upload.as_mut().and_then(|u| u.client_failed.take()) {
                return this.fail(error);
            }
            let want = this.decoder.next_read(this.read_size);
            match ready!(conn.poll_read_more(cx, want)) {
                Ok(0) => {
                    if let Err(error) = this.decoder.eof() {
                        return this.fail(Box::new(error));
                    }
                }
                Ok(_) => {}
                Err(error) => return this.fail(Box::new(error)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

impl Drop for H1Response {
    fn drop(&mut self) {
        // A body with nothing to read (HEAD, 204, 304) may never be polled.
        if self.decoder.is_done() {
            self.finish();
        }
    }
}
