//! Internals measured in isolation by the `legate-benches` crate (feature `bench`). Not an
//! API: nothing here is stable.

use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{HeaderValue, Request, Response};

use crate::context::RequestBody;
use crate::filters::testing::{Setup, setup};
use crate::filters::{Exchange, FilterState, Flow, ResponseInfo};

/// A listener's filter chain, run over a made-up request without any I/O.
pub struct FilterChainBench {
    setup: Setup,
}

impl FilterChainBench {
    /// `filters`: the `http_filters` list items as YAML (indented six spaces), or `[]`.
    pub fn new(filters: &str) -> Self {
        let routes = "      - match: { prefix: / }\n        direct_response: { status: 200 }";
        Self {
            setup: setup(filters, routes),
        }
    }

    /// One GET through the request phases and the response phases. The filters must not wait
    /// (no `ext_authz`): the request phase is polled once.
    pub fn run(&self) -> bool {
        let chain = &self.setup.chain;
        // As the request path does: an empty chain is not entered.
        if chain.is_empty() {
            let req = Request::new(RequestBody::empty());
            let response = Response::new(());
            return std::hint::black_box((req, response))
                .1
                .status()
                .is_success();
        }
        let exchange = Exchange {
            conn: &self.setup.conn,
            client: &self.setup.client,
            host: Some(&HeaderValue::from_static("bench.test")),
            virtual_host: Some(0),
            route: Some(0),
            weighted_cluster: None,
            trace: None,
        };
        let mut state = FilterState::default();
        let mut req = Request::new(RequestBody::empty());
        let flow = {
            let request = pin!(chain.on_request(&mut req, &exchange, &mut state));
            match request.poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(flow) => flow,
                Poll::Pending => panic!("a benchmarked filter waited"),
            }
        };
        let answered = matches!(flow, Ok(Flow::Respond(_)));
        let mut head = Response::new(crate::http::ResponseBody::local(bytes::Bytes::new()));
        let info = ResponseInfo {
            upstream: None,
            head_request: false,
            upgraded: false,
            grpc_request: false,
        };
        let body = {
            let response = pin!(chain.on_response(&mut head, &exchange, &info, &mut state));
            match response.poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(body) => body,
                Poll::Pending => panic!("a benchmarked filter waited"),
            }
        };
        answered || body.is_some()
    }
}
