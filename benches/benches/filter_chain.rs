//! What does the extension seam cost per request: Legate's filter chain (an enum matched in
//! each phase), or tower's `Service`/`Layer` as linkerd2-proxy composes it?
//!
//! Each variant takes a request with no body through N filters that have nothing to do, to a
//! response, and back:
//! - `chain`: Legate's [`FilterChain`] from config: `local_rate_limit` without a bucket,
//!   `headers` without rules, `cors` for a request without `Origin` (each looks at the request
//!   and moves on), request phases then response phases.
//! - `tower_static`: N pass-through layers stacked at compile time around a `service_fn`: the
//!   best tower can do, but its order and set are fixed in the binary, not read from config.
//! - `tower_boxed`: the same layers composed at run time, as a config-driven chain must be:
//!   each layer's service is type-erased (`UnsyncBoxService`, the futures are not `Send` on a
//!   worker), so every layer boxes its future on every request.
//!
//! Futures are polled once with a no-op waker: nothing here waits.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use proxy_core::bench::FilterChainBench;
use tower::util::UnsyncBoxService;
use tower::{Layer, Service, ServiceExt};

/// The filters of an N-filter chain.
const FILTERS: [&str; 3] = [
    "      - local_rate_limit: {}",
    "      - headers: {}",
    "      - cors: { allow_origins: [\"https://app.test\"] }",
];

/// A layer that passes the request and the response through, as a filter with nothing to do.
#[derive(Clone)]
struct PassThrough<S>(S);

impl<S, B> Service<Request<B>> for PassThrough<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> S::Future {
        // A filter looks at its request: the same header lookup the chain's filters make.
        black_box(req.headers().get("origin"));
        self.0.call(req)
    }
}

struct PassThroughLayer;

impl<S> Layer<S> for PassThroughLayer {
    type Service = PassThrough<S>;
    fn layer(&self, inner: S) -> PassThrough<S> {
        PassThrough(inner)
    }
}

#[derive(Clone)]
struct Origin;

impl Service<Request<()>> for Origin {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(())))
    }
}

fn poll_once<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("nothing here waits"),
    }
}

type Boxed = UnsyncBoxService<Request<()>, Response<()>, Infallible>;

fn boxed_stack(n: usize) -> Boxed {
    let mut service = UnsyncBoxService::new(Origin);
    for _ in 0..n {
        service = UnsyncBoxService::new(PassThroughLayer.layer(service));
    }
    service
}

fn seam(c: &mut Criterion) {
    let mut group = c.benchmark_group("filter_seam");
    for n in [0usize, 1, 3] {
        let filters = if n == 0 {
            "      []".to_string()
        } else {
            FILTERS[..n].join("\n")
        };
        let chain = FilterChainBench::new(&filters);
        group.bench_with_input(BenchmarkId::new("chain", n), &n, |b, _| {
            b.iter(|| black_box(chain.run()))
        });

        let mut boxed = boxed_stack(n);
        group.bench_with_input(BenchmarkId::new("tower_boxed", n), &n, |b, _| {
            b.iter(|| {
                let service = poll_once(boxed.ready()).unwrap_or_else(|e| match e {});
                black_box(poll_once(service.call(Request::new(()))))
            })
        });
    }
    // Static stacks: a distinct type per depth.
    let mut s0 = Origin;
    let mut s1 = PassThroughLayer.layer(Origin);
    let mut s3 = PassThroughLayer.layer(PassThroughLayer.layer(PassThroughLayer.layer(Origin)));
    group.bench_function(BenchmarkId::new("tower_static", 0), |b| {
        b.iter(|| black_box(poll_once(s0.call(Request::new(())))))
    });
    group.bench_function(BenchmarkId::new("tower_static", 1), |b| {
        b.iter(|| black_box(poll_once(s1.call(Request::new(())))))
    });
    group.bench_function(BenchmarkId::new("tower_static", 3), |b| {
        b.iter(|| black_box(poll_once(s3.call(Request::new(())))))
    });
    group.finish();
}

criterion_group!(benches, seam);
criterion_main!(benches);
