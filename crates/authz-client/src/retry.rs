//! The tries of one check: the first, then retries as the embedder's [`CheckRetry`] allows,
//! in both modes. All of them stay within the client's timeout (the caller's).

use std::time::Duration;

use http::{HeaderMap, StatusCode};

use crate::{AuthzError, CheckRetry, TryFailure};
use grpc_channel::Backoff;

/// A try that got no answer, by what failed.
pub(crate) enum Failed {
    /// No connection: nothing reached the service.
    Connect(AuthzError),
    /// The connection failed once the check was on its way.
    Reset(AuthzError),
    /// HTTP/2: the service refused the call's stream, unseen.
    Refused(AuthzError),
}

impl From<Failed> for AuthzError {
    fn from(failed: Failed) -> Self {
        match failed {
            Failed::Connect(e) | Failed::Reset(e) | Failed::Refused(e) => e,
        }
    }
}

/// Tries until an outcome `policy` does not retry, or its retries are spent. `head` reads an
/// answer's status and headers, which the policy's conditions look at.
pub(crate) async fn tries<T>(
    policy: Option<&dyn CheckRetry>,
    backoff: &Backoff,
    head: fn(&T) -> (StatusCode, &HeaderMap),
    mut try_once: impl AsyncFnMut() -> Result<T, Failed>,
) -> Result<T, Failed> {
    let mut retries = 0;
    loop {
        let Some(policy) = policy else {
            return try_once().await;
        };
        let outcome = match policy.per_try_timeout() {
            None => try_once().await,
            // A try that outlasts its limit is given up as a reset one (Envoy's per-try
            // timeout): it may have reached the service.
            Some(limit) => tokio::time::timeout(limit, try_once())
                .await
                .unwrap_or(Err(Failed::Reset(AuthzError::Timeout(limit)))),
        };
        let again = retries < policy.max_retries()
            && match &outcome {
                Ok(answer) => {
                    let (status, headers) = head(answer);
                    policy.retry_answer(status, headers)
                }
                Err(Failed::Connect(_)) => policy.retry_failure(TryFailure::Connect),
                Err(Failed::Reset(_)) => policy.retry_failure(TryFailure::Reset),
                Err(Failed::Refused(_)) => policy.retry_failure(TryFailure::RefusedStream),
            };
        if !again {
            return outcome;
        }
        retries += 1;
        tracing::debug!(retry = retries, "ext_authz: retrying a failed check");
        // Not before a connect may be tried again: a retry refused by the connect back-off
        // would be spent without reaching the service.
        let wait = jittered(policy.back_off(retries)).max(backoff.remaining());
        tokio::time::sleep(wait).await;
    }
}

/// A random wait below `ceiling` (Envoy's fully jittered back-off): tries from many workers
/// and proxies must not arrive together.
fn jittered(ceiling: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let micros = ceiling.as_micros() as u64;
    if micros == 0 {
        return Duration::ZERO;
    }
    // A fresh OS-keyed hasher per retry: retries are rare, and this needs no generator state.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    Duration::from_micros(hasher.finish() % micros)
}
