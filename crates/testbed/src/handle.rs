//! The handle every testbed server returns, and the accept loop they share.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// How long a stopped server waits for in-flight connections before its accept task ends.
/// Bounded so a stuck client can't keep a test or the `demo` thread alive.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// State shared by a server's accept loop, its connections and its handles.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) local_addr: SocketAddr,
    pub(crate) connections: AtomicU64,
    pub(crate) requests: AtomicU64,
    /// `true` once shutdown was asked for. A watch channel because the flag must be
    /// settable from any thread, without a runtime, any number of times.
    stop: watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Resolves once shutdown was asked for (immediately if it already was).
    pub(crate) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            // The sender lives in `Shared`, which the accept loop keeps alive; should it ever be
            // gone, nobody can ask for shutdown any more, so never resolve.
            if rx.wait_for(|stopped| *stopped).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Handle to a running testbed server. Cheap to clone; dropping it does not stop the server
/// (call [`NoopHandle::shutdown`]), so a test may keep just the address.
#[derive(Clone, Debug)]
pub struct NoopHandle {
    shared: Arc<Shared>,
}

impl NoopHandle {
    pub(crate) fn new(local_addr: SocketAddr) -> Self {
        Self {
            shared: Arc::new(Shared {
                local_addr,
                connections: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                stop: watch::Sender::new(false),
            }),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Requests answered so far (for a [`FailingOrigin`](crate::FailingOrigin): request heads read).
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Stops accepting and closes the listener; open connections are asked to finish their
    /// in-flight requests and close. Idempotent, callable from any thread. The listener closes
    /// asynchronously, as soon as the accept task next runs.
    pub fn shutdown(&self) {
        self.shared.stop.send_replace(true);
    }
}

/// Binds `addr` and returns the handle plus the accept loop, which the caller spawns or
/// blocks on. `serve` runs one accepted connection to completion.
pub(crate) async fn listen<F, Fut>(
    addr: SocketAddr,
    serve: F,
) -> io::Result<(NoopHandle, impl Future<Output = ()> + Send + 'static)>
where
    F: Fn(TcpStream, Arc<Shared>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let handle = NoopHandle::new(listener.local_addr()?);
    let shared = handle.shared().clone();
    Ok((handle, accept_loop(listener, shared, serve)))
}

async fn accept_loop<F, Fut>(listener: TcpListener, shared: Arc<Shared>, serve: F)
where
    F: Fn(TcpStream, Arc<Shared>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // Every connection task holds a sender; `recv` returns `None` once all are gone.
    let (drain_tx, mut drain_rx) = mpsc::channel::<()>(1);
    let stopped = shared.stopped();
    tokio::pin!(stopped);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(_) => {
                    // Typically EMFILE: back off rather than spin, and keep serving.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let conn = serve(stream, shared.clone());
        let guard = drain_tx.clone();
        tokio::spawn(async move {
            conn.await;
            drop(guard);
        });
    }
    drop(listener);
    drop(drain_tx);
    let _ = tokio::time::timeout(DRAIN_GRACE, drain_rx.recv()).await;
}
