//! A provider's remote key set: fetched through its cluster by one worker at a time, shared by
//! all, kept across generations. The first worker to build the filter fetches at once; the
//! set is fetched again `cache_duration` after a success (requests keep the keys they have
//! meanwhile), and `failed_refetch_duration` after a failure. While there are no keys at all,
//! the fetching worker tries again on its own at that pace, so keys come as soon as their
//! server does. A request that finds no keys waits for a fetch under way, and gets 401
//! (`Jwks remote fetch is failed`) if there is none or it fails: never a hang.

use std::collections::HashMap;
use std::rc::{Rc, Weak as RcWeak};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::header::{ACCEPT, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use jwt::Jwks;

use crate::catalog::JwtAuthnStats;
use crate::cluster::Cluster;
use crate::context::RequestBody;
use config::RemoteJwks;

/// A key set larger than this is refused (a real one is a few kilobytes).
const MAX_JWKS_BYTES: usize = 1 << 20;

/// The longest a request waits for a fetch under way, whatever the fetch's timeout.
const MAX_REQUEST_WAIT: Duration = Duration::from_secs(15);

/// The remote key sets in use, by their settings: a provider of a new generation (or of
/// another listener) with the same source takes the keys already fetched.
static IN_USE: LazyLock<Mutex<HashMap<String, Weak<RemoteKeys>>>> = LazyLock::new(Default::default);

/// One remote source's keys and the state of its fetches.
pub(crate) struct RemoteKeys {
    source: RemoteJwks,
    keys: ArcSwapOption<Jwks>,
    /// When the next fetch is due, in milliseconds of [`now_ms`].
    due_ms: AtomicU64,
    /// The fetch under way, if any; changed only under this lock.
    fetch: Mutex<Under>,
    /// Whether a fetch is under way, and the cluster it goes through: read without the
    /// lock on each request (written under it).
    busy: AtomicBool,
    busy_through: AtomicUsize,
    /// The cluster of the newest generation that built a filter with this source: only a
    /// fetch through it takes over one through an older generation's.
    newest: AtomicUsize,
    /// Counts finished fetches, for requests waiting on one.
    finished: tokio::sync::watch::Sender<u64>,
}

/// The fetch under way: its number (0: none; each fetch has its own) and the cluster it goes
/// through (its shared part's address).
#[derive(Default)]
struct Under {
    number: u64,
    through: usize,
    /// The numbers given so far.
    given: u64,
}

/// Milliseconds since the first call: a process clock for due times.
fn now_ms() -> u64 {
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    START.elapsed().as_millis() as u64
}

/// Why a fetch failed, for the log.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("{0}")]
    Upstream(#[from] crate::error::ProxyError),
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("the body did not come within the timeout")]
    BodyTimeout,
    #[error("the body failed: {0}")]
    Body(String),
    #[error("the key set is over {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    #[error("{0}")]
    Jwks(#[from] jwt::JwksError),
}

impl FetchError {
    /// Whether another try may do better: no answer, or a 5xx (as Envoy's fetcher retries).
    fn retriable(&self) -> bool {
        match self {
            FetchError::Upstream(_) | FetchError::BodyTimeout | FetchError::Body(_) => true,
            FetchError::Status(status) => status.is_server_error(),
            FetchError::TooLarge | FetchError::Jwks(_) => false,
        }
    }
}

impl RemoteKeys {
    /// The shared keys of `source`: those in use if any provider has them, else new ones.
    pub(crate) fn of(source: &RemoteJwks) -> Arc<RemoteKeys> {
        // The settings as written name the source (not the cluster's place in the config,
        // which another cluster's coming or going shifts).
        let key = format!(
            "{}\n{}\n{:?}\n{:?}\n{:?}\n{}\n{:?}",
            source.cluster,
            source.uri,
            source.timeout,
            source.cache_duration,
            source.failed_refetch_duration,
            source.retries,
            source.retry_back_off,
        );
        let mut in_use = IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(keys) = in_use.get(&key).and_then(Weak::upgrade) {
            return keys;
        }
        in_use.retain(|_, keys| keys.strong_count() > 0);
        let keys = Arc::new(RemoteKeys {
            source: source.clone(),
            keys: ArcSwapOption::empty(),
            due_ms: AtomicU64::new(0),
            fetch: Mutex::new(Under::default()),
            busy: AtomicBool::new(false),
            busy_through: AtomicUsize::new(0),
            newest: AtomicUsize::new(0),
            finished: tokio::sync::watch::Sender::new(0),
        });
        in_use.insert(key, Arc::downgrade(&keys));
        keys
    }

    /// The keys fetched last, if any.
    pub(crate) fn current(&self) -> Option<Arc<Jwks>> {
        self.keys.load_full()
    }

    /// Marks `cluster` as the newest generation's: a filter of it is being built.
    pub(crate) fn prefer(&self, cluster: &Rc<Cluster>) {
        self.newest.store(address(cluster), Ordering::Release);
    }

    fn under(&self) -> std::sync::MutexGuard<'_, Under> {
        self.fetch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a fetch on this worker, through `cluster`, when one is due and none is under
    /// way; or when one is under way through an older generation's cluster and this is the
    /// newest generation's.
    pub(crate) fn refresh_if_due(self: &Arc<Self>, cluster: &Rc<Cluster>, stats: &Rc<JwtAuthnStats>) {
        let through = address(cluster);
        let newest = self.newest.load(Ordering::Acquire) == through;
        // Without the lock: the common case of nothing to do.
        if self.busy.load(Ordering::Acquire) {
            if !newest || self.busy_through.load(Ordering::Acquire) == through {
                return;
            }
        } else if now_ms() < self.due_ms.load(Ordering::Relaxed) {
            return;
        }
        let number = {
            let mut under = self.under();
            let take_over = under.number != 0 && newest && under.through != through;
            let due = under.number == 0 && now_ms() >= self.due_ms.load(Ordering::Relaxed);
            if !(take_over || due) {
                return;
            }
            under.given += 1;
            under.number = under.given;
            under.through = through;
            self.busy.store(true, Ordering::Release);
            self.busy_through.store(through, Ordering::Release);
            under.number
        };
        let fetch = Fetch {
            keys: Arc::downgrade(self),
            number,
        };
        let (cluster, stats) = (Rc::downgrade(cluster), Rc::clone(stats));
        tokio::task::spawn_local(fetch.until_keys(cluster, stats));
    }

    /// The keys for a request: those there are, else those of the fetch under way, when it
    /// ends (waiting at most its timeout, and never over [`MAX_REQUEST_WAIT`]); `None` when
    /// there are none and no fetch is under way, or it failed.
    pub(crate) async fn for_request(&self) -> Option<Arc<Jwks>> {
        let mut finished = self.finished.subscribe();
        if let Some(keys) = self.current() {
            return Some(keys);
        }
        if !self.busy.load(Ordering::Acquire) {
            // One may have ended between the two loads.
            return self.current();
        }
        let limit = self.source.timeout.min(MAX_REQUEST_WAIT);
        let _ = tokio::time::timeout(limit, finished.changed()).await;
        self.current()
    }
}

/// The address of a cluster's shared part: the same for every worker's copy of one
/// generation's cluster, another for a changed one.
fn address(cluster: &Cluster) -> usize {
    Arc::as_ptr(cluster.shared()) as usize
}

/// One fetch of one source, by its number: what it does counts only while it is the one
/// under way (a newer generation's may have taken over). Dropped unfinished (its task gone),
/// it lets the next request start another.
struct Fetch {
    keys: Weak<RemoteKeys>,
    number: u64,
}

impl Fetch {
    /// The source, while this is its fetch under way.
    fn current(&self) -> Option<Arc<RemoteKeys>> {
        let keys = self.keys.upgrade()?;
        let mine = keys.under().number == self.number;
        mine.then_some(keys)
    }

    /// Ends the fetch, if it is still the one under way: the next is due `after` from now;
    /// requests waiting are woken.
    fn finish(&self, keys: &RemoteKeys, after: Option<Duration>) {
        let mut under = keys.under();
        if under.number != self.number {
            return;
        }
        if let Some(after) = after {
            let due = now_ms().saturating_add(after.as_millis() as u64);
            keys.due_ms.store(due, Ordering::Relaxed);
        }
        under.number = 0;
        keys.busy.store(false, Ordering::Release);
        drop(under);
        keys.finished.send_modify(|n| *n += 1);
    }

    /// Fetches until it has keys, until another fetch takes over, or until the source or the
    /// cluster of the generation that started it is gone. Between tries it holds nothing:
    /// requests meanwhile are answered at once.
    async fn until_keys(mut self, cluster: RcWeak<Cluster>, stats: Rc<JwtAuthnStats>) {
        loop {
            let (Some(remote), Some(through)) = (self.current(), cluster.upgrade()) else {
                return;
            };
            let source = remote.source.clone();
            drop(remote);
            let outcome = fetch_with_retries(&source, &through).await;
            let Some(remote) = self.current() else {
                return;
            };
            match outcome {
                Ok(jwks) => {
                    stats.jwks_fetch_success.inc();
                    remote.keys.store(Some(Arc::new(jwks)));
                    self.finish(&remote, Some(source.cache_duration));
                    return;
                }
                Err(error) => {
                    stats.jwks_fetch_failed.inc();
                    tracing::warn!(uri = %source.uri, cluster = %source.cluster, %error, "JWKS fetch failed");
                    self.finish(&remote, Some(source.failed_refetch_duration));
                    if remote.current().is_some() {
                        // The keys there are serve; the next request after the wait fetches.
                        return;
                    }
                    drop(remote);
                    tokio::time::sleep(source.failed_refetch_duration).await;
                    // No keys at all: try again, unless another fetch is under way.
                    let Some(remote) = self.keys.upgrade() else {
                        return;
                    };
                    let mut under = remote.under();
                    if under.number != 0 {
                        return;
                    }
                    under.given += 1;
                    under.number = under.given;
                    under.through = address(&through);
                    remote.busy.store(true, Ordering::Release);
                    remote.busy_through.store(under.through, Ordering::Release);
                    self.number = under.number;
                }
            }
        }
    }
}

impl Drop for Fetch {
    fn drop(&mut self) {
        if let Some(keys) = self.keys.upgrade() {
            self.finish(&keys, None);
        }
    }
}

/// One fetch with the source's retries, back-off doubling between tries.
async fn fetch_with_retries(source: &RemoteJwks, cluster: &Rc<Cluster>) -> Result<Jwks, FetchError> {
    let mut wait = source.retry_back_off.base_interval;
    let mut tries_left = source.retries;
    loop {
        match fetch_once(source, cluster).await {
            Ok(jwks) => return Ok(jwks),
            Err(error) if tries_left == 0 || !error.retriable() => return Err(error),
            Err(error) => {
                tracing::debug!(uri = %source.uri, %error, "JWKS fetch failed; trying again");
                tries_left -= 1;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(source.retry_back_off.max_interval);
            }
        }
    }
}

async fn fetch_once(source: &RemoteJwks, cluster: &Cluster) -> Result<Jwks, FetchError> {
    let (mut head, ()) = Request::new(()).into_parts();
    head.method = Method::GET;
    head.headers
        .insert(ACCEPT, HeaderValue::from_static("application/json"));
    let client = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let admitted = cluster.admit(&head.headers, client, None)?;
    let path = (source.uri.path_and_query().cloned())
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    // Checked at load: the URI has a host.
    let authority = (source.uri.authority())
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        .unwrap_or_else(|| admitted.host().addr_text().clone());
    let host = admitted.host();
    let protocol = host.protocol_for(head.version);
    crate::cluster::write_request_for(&mut head, path, authority, protocol, host.tls())?;
    let request = Request::from_parts(head, RequestBody::empty());
    let (_, response) = admitted.send_copy(request, source.timeout).await?;
    if response.status() != StatusCode::OK {
        return Err(FetchError::Status(response.status()));
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_JWKS_BYTES);
    let body: Bytes = match tokio::time::timeout(source.timeout, body.collect()).await {
        Err(_) => return Err(FetchError::BodyTimeout),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            return Err(FetchError::TooLarge);
        }
        Ok(Err(error)) => return Err(FetchError::Body(error.to_string())),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let text = String::from_utf8_lossy(&body);
    Ok(Jwks::parse(&text)?)
}
