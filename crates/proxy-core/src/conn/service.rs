//! The per-connection service handed to the codec: one call per request.

use std::pin::Pin;
use std::rc::Rc;

use hyper::body::Incoming;

use crate::context::{ConnCtx, InFlight, RequestBody};
use crate::http::{HttpSlot, ResponseBody, handler};

#[derive(Clone)]
pub(super) struct ProxyService {
    pub(super) conn: Rc<ConnCtx>,
    /// The listener's routes and filters as of each request.
    pub(super) http: Rc<HttpSlot>,
}

impl hyper::service::Service<http::Request<Incoming>> for ProxyService {
    type Response = http::Response<ResponseBody>;
    type Error = std::convert::Infallible;
    // Boxed so the codec can be taken apart when parked (that needs Unpin futures).
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>>>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let conn = &self.conn;
        let served = conn.requests.get() + 1;
        conn.requests.set(served);
        if req.version() == http::Version::HTTP_2
            && conn.listener.max_requests_per_connection == Some(served)
        {
            // Counted here, when decided, so the count is there before the response is.
            conn.listener.stats.cx_max_requests.inc();
            conn.retire.notify_one();
        }
        let in_flight = InFlight::new(conn, &req);
        let mut req = req.map(|body| RequestBody::new(body, in_flight.received_counter()));
        if req.version() == http::Version::HTTP_2 {
            // The codec spawns this request's stream task next (conn/stream_exec.rs): its idle
            // timer also counts the body's frames going upstream.
            super::stream_exec::next_stream(req.body_mut().track_progress());
        }
        Box::pin(handler::handle(
            req,
            Rc::clone(conn),
            self.http.current(),
            in_flight,
        ))
    }
}
