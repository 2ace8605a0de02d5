//! Connecting to the service over TCP or a Unix socket, and the backoff between failed
//! attempts.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::net::{TcpStream, UnixStream};
use tokio_util::either::Either;

use crate::{Endpoint, Tls};

const FIRST_BACKOFF: Duration = Duration::from_millis(25);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A connection to the service: TCP, a Unix socket, or TLS over TCP.
pub type Stream =
    Either<Either<TcpStream, UnixStream>, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// Connects to `endpoint`, with TLS when `tls` is given (TCP only: checked at load).
pub async fn connect(endpoint: &Endpoint, tls: Option<&Tls>) -> io::Result<Stream> {
    match (endpoint, tls) {
        (Endpoint::Tcp(addr), tls) => {
            let stream = TcpStream::connect(addr).await?;
            // Checks are small messages waiting for an answer: never hold them back.
            stream.set_nodelay(true)?;
            match tls {
                None => Ok(Either::Left(Either::Left(stream))),
                Some(tls) => {
                    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                    let stream = connector.connect(tls.server_name.clone(), stream).await?;
                    Ok(Either::Right(Box::new(stream)))
                }
            }
        }
        (Endpoint::Unix(_), Some(_)) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TLS is for a TCP address",
        )),
        (Endpoint::Unix(path), None) => Ok(Either::Left(Either::Right(
            UnixStream::connect(path).await?,
        ))),
    }
}

/// After a failed connect, further attempts wait (25 ms doubling to 1 s): while the service is
/// down, checks fail at once instead of each paying a connect attempt.
#[derive(Default)]
pub struct Backoff {
    state: Mutex<Option<(Instant, Duration)>>,
}

impl Backoff {
    /// `Err` with the time left while the last failure's wait has not passed.
    pub fn check(&self) -> Result<(), Duration> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *state {
            Some((until, _)) if Instant::now() < until => Err(until - Instant::now()),
            _ => Ok(()),
        }
    }

    /// How long until the next connect attempt may be made.
    pub fn remaining(&self) -> Duration {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.map_or(Duration::ZERO, |(until, _)| {
            until.saturating_duration_since(Instant::now())
        })
    }

    pub fn failed(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let delay = state.map_or(FIRST_BACKOFF, |(_, d)| (d * 2).min(MAX_BACKOFF));
        *state = Some((Instant::now() + delay, delay));
    }

    pub fn succeeded(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}
