//! The per-connection service: one call per request, into http/handler.rs. HTTP/2 requests
//! come from hyper's codec through the `Service` impl; HTTP/1.1 requests from h1/, HTTP/3
//! ones from http3_stream.rs.

use std::cell::Cell;
use std::convert::Infallible;
use std::pin::Pin;
use std::rc::Rc;

use futures_util::FutureExt;
use hyper::body::Incoming;

use crate::context::{ConnCtx, InFlight, RequestBody};
use crate::http::{HttpSlot, ResponseBody, handler};

#[derive(Clone)]
pub(super) struct ProxyService {
    pub(super) conn: Rc<ConnCtx>,
    /// The listener's routes and filters as of each request.
    pub(super) http: Rc<HttpSlot>,
}

/// A request being served: the response it will get.
pub(super) type Serving =
    Pin<Box<dyn Future<Output = Result<http::Response<ResponseBody>, Infallible>>>>;

impl ProxyService {
    /// Counts the request and starts serving it; `body` makes its body, given the counter
    /// of bytes received for the access log. Boxed, for hyper's HTTP/2 codec.
    pub(super) fn serve<B: 'static, F>(&self, req: http::Request<B>, body: F) -> Serving
    where
        F: FnOnce(B, Option<Rc<Cell<u64>>>) -> RequestBody + 'static,
    {
        // The h2 crate's HPACK table keeps the values it indexes, shared, for the connection's
        // life: they must not hold the chunk an HTTP/1.1 upstream's head was copied into.
        // (Legate's own codec copies what its table keeps.) `map`, not an async block, which
        // would hold the handler's future twice.
        Box::pin(self.serve_inline(req, body).map(|served| {
            served.map(|mut response| {
                h1::own_values(response.headers_mut());
                response
            })
        }))
    }

    /// As [`Self::serve`], unboxed: the HTTP/1.1 exchange holds the future in its own state
    /// (itself boxed once), which saves an allocation and a copy of the handler's state per
    /// request.
    pub(super) fn serve_inline<B, F>(
        &self,
        req: http::Request<B>,
        body: F,
    ) -> impl Future<Output = Result<http::Response<ResponseBody>, Infallible>> + use<B, F>
    where
        F: FnOnce(B, Option<Rc<Cell<u64>>>) -> RequestBody,
    {
        let conn = &self.conn;
        let served = conn.requests.get() + 1;
        conn.requests.set(served);
        if req.version() >= http::Version::HTTP_2
            && conn.listener.max_requests_per_connection == Some(served)
        {
            // Counted here, when decided, so the count is there before the response is.
            conn.listener.stats.cx_max_requests.inc();
            conn.retire.notify_one();
        }
        let in_flight = InFlight::new(conn, &req);
        let received = in_flight.received_counter();
        let mut req = req.map(|b| body(b, received));
        if req.version() == http::Version::HTTP_2 {
            // The codec spawns this request's stream task next (conn/stream_exec.rs): its idle
            // timer also counts the body's frames going upstream.
            super::stream_exec::next_stream(req.body_mut().track_progress());
        }
        handler::handle(req, Rc::clone(conn), self.http.current(), in_flight)
    }
}

impl hyper::service::Service<http::Request<Incoming>> for ProxyService {
    type Response = http::Response<ResponseBody>;
    type Error = Infallible;
    // Boxed so the codec can be taken apart when parked (that needs Unpin futures).
    type Future = Serving;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        self.serve(req, RequestBody::new)
    }
}
