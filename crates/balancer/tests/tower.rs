//! The tower adapter: calls are balanced, guards live until the response, readiness and
//! errors behave.
#![cfg(feature = "tower")]
#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use balancer::{Balance, BalanceLayer, Endpoints, Health, HostSpec, LbPolicy, NoHostAvailable};
use common::addr;
use tokio::sync::oneshot;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

#[test]
fn calls_are_spread_by_the_policy() {
    let hits: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let endpoints = (0..3)
        .map(|i| {
            let hits = Arc::clone(&hits);
            let svc = service_fn(move |req: u32| {
                hits[i].fetch_add(1, Ordering::Relaxed);
                async move { Ok::<_, Infallible>(req * 2) }
            });
            (HostSpec::new(addr(i)), svc)
        })
        .collect();
    let mut balance = Balance::new(endpoints, LbPolicy::RoundRobin).unwrap();
    runtime().block_on(async {
        for i in 0..300 {
            let response = balance.ready().await.unwrap().call(i).await.unwrap();
            assert_eq!(response, i * 2);
        }
    });
    for h in hits.iter() {
        assert_eq!(h.load(Ordering::Relaxed), 100);
    }
}

#[test]
fn the_guard_lives_until_the_response_completes() {
    let (tx, rx) = oneshot::channel::<&'static str>();
    let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
    let svc = service_fn(move |_: ()| {
        let rx = rx.lock().unwrap().take().unwrap();
        async move { Ok::<_, Infallible>(rx.await.unwrap()) }
    });
    let mut balance = Balance::new(
        vec![(HostSpec::new(addr(0)), svc)],
        LbPolicy::least_request(),
    )
    .unwrap();
    let hosts = balance.hosts().clone();
    let active = || hosts.snapshot().get(0).unwrap().active_requests();

    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(
        Service::<()>::poll_ready(&mut balance, &mut cx),
        Poll::Ready(Ok(()))
    ));
    let mut response = pin!(balance.call(()));
    assert!(response.as_mut().poll(&mut cx).is_pending());
    assert_eq!(active(), 1, "in flight while the response is pending");
    tx.send("done").unwrap();
    match response.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(body)) => assert_eq!(body, "done"),
        other => panic!("{other:?}"),
    }
    assert_eq!(active(), 0, "released as soon as the response is ready");
}

#[test]
fn hash_keys_pin_requests_to_a_host() {
    let endpoints = (0..5)
        .map(|i| {
            let svc = service_fn(move |_: String| async move { Ok::<_, Infallible>(i) });
            (HostSpec::new(addr(i)), svc)
        })
        .collect();
    let mut balance = Balance::new(endpoints, LbPolicy::maglev())
        .unwrap()
        .with_hash_key(|req: &String| Some(balancer::hash_key(req.as_bytes())));
    runtime().block_on(async {
        for user in ["ada", "grace", "edsger"] {
            let first = balance
                .ready()
                .await
                .unwrap()
                .call(user.to_string())
                .await
                .unwrap();
            for _ in 0..20 {
                let again = balance
                    .ready()
                    .await
                    .unwrap()
                    .call(user.to_string())
                    .await
                    .unwrap();
                assert_eq!(again, first);
            }
        }
    });
}

#[test]
fn no_available_host_is_an_error_and_layers_build_the_service() {
    let svc = service_fn(|_: ()| async { Ok::<_, Infallible>(()) });
    let endpoints = Endpoints::new(vec![(HostSpec::new(addr(0)), svc)]).unwrap();
    let layer = BalanceLayer::with_panic_threshold(LbPolicy::Random, 0.0).unwrap();
    let mut balance = ServiceBuilder::new().layer(layer).service(endpoints);
    balance.hosts().set_health(addr(0), Health::Unhealthy);
    let result = runtime().block_on(async { balance.ready().await.unwrap().call(()).await });
    let error = result.unwrap_err();
    assert!(error.is::<NoHostAvailable>(), "{error}");

    assert!(
        BalanceLayer::new(LbPolicy::Maglev(balancer::MaglevOptions {
            table_size: 100
        }))
        .is_err()
    );
}

#[test]
fn readiness_waits_for_every_service_and_repolls_only_the_called_one() {
    let polls: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
    let endpoints = (0..2)
        .map(|i| {
            let polls = Arc::clone(&polls);
            (HostSpec::new(addr(i)), CountingService { index: i, polls })
        })
        .collect();
    let mut balance = Balance::new(endpoints, LbPolicy::RoundRobin).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(balance.poll_ready(&mut cx).is_ready());
    assert_eq!(
        polls[0].load(Ordering::Relaxed) + polls[1].load(Ordering::Relaxed),
        2
    );
    drop(balance.call(()));
    assert!(balance.poll_ready(&mut cx).is_ready());
    assert_eq!(
        polls[0].load(Ordering::Relaxed) + polls[1].load(Ordering::Relaxed),
        3
    );
}

#[derive(Clone)]
struct CountingService {
    index: usize,
    polls: Arc<[AtomicUsize; 2]>,
}

impl Service<()> for CountingService {
    type Response = ();
    type Error = Infallible;
    type Future = std::future::Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.polls[self.index].fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        std::future::ready(Ok(()))
    }
}
