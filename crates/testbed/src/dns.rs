//! A DNS server on UDP that answers A and AAAA queries from a table the test changes while it
//! runs: names the proxy resolves, and answers that change under it.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// What the server answers.
#[derive(Default)]
struct Zone {
    /// Lower-case names without the final dot.
    names: HashMap<String, Vec<IpAddr>>,
    ttl: u32,
    /// Every query gets SERVFAIL.
    failing: bool,
    /// A queries get SERVFAIL (AAAA queries are answered).
    failing_a: bool,
    /// How long each answer is held back.
    delay: Duration,
}

/// A DNS server for tests. Names it does not know get NXDOMAIN; a known name with no address
/// of the type asked gets an empty answer. Stops when dropped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let dns = testbed::DnsServer::bind("127.0.0.1:0".parse().unwrap()).await?;
/// dns.set("backend.test", &["127.0.0.2".parse().unwrap()]);
/// assert_eq!(dns.queries(), 0);
/// # Ok(())
/// # }
/// ```
pub struct DnsServer {
    addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    queries: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DnsServer {
    pub async fn bind(addr: SocketAddr) -> io::Result<DnsServer> {
        let socket = UdpSocket::bind(addr).await?;
        let addr = socket.local_addr()?;
        let zone = Arc::new(Mutex::new(Zone::default()));
        let queries = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(serve(
            Arc::new(socket),
            Arc::clone(&zone),
            Arc::clone(&queries),
        ));
        Ok(DnsServer {
            addr,
            zone,
            queries,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `name` resolves to `addrs` from now on (none: the name exists with no address).
    pub fn set(&self, name: &str, addrs: &[IpAddr]) {
        self.zone().names.insert(normal(name), addrs.to_vec());
    }

    /// `name` no longer exists (NXDOMAIN).
    pub fn remove(&self, name: &str) {
        self.zone().names.remove(&normal(name));
    }

    /// The TTL of the answers, in seconds (0 by default: nothing is cached).
    pub fn set_ttl(&self, seconds: u32) {
        self.zone().ttl = seconds;
    }

    /// While set, every query gets SERVFAIL.
    pub fn set_failing(&self, failing: bool) {
        self.zone().failing = failing;
    }

    /// While set, A queries get SERVFAIL and AAAA queries are answered (a partial failure).
    pub fn set_failing_a(&self, failing: bool) {
        self.zone().failing_a = failing;
    }

    /// Each answer is sent this long after its query (a slow server).
    pub fn set_delay(&self, delay: Duration) {
        self.zone().delay = delay;
    }

    /// Queries received so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    fn zone(&self) -> std::sync::MutexGuard<'_, Zone> {
        self.zone.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

async fn serve(socket: Arc<UdpSocket>, zone: Arc<Mutex<Zone>>, queries: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((len, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        // Not a DNS message: nothing to answer.
        let Ok(request) = Message::from_vec(&buf[..len]) else {
            continue;
        };
        queries.fetch_add(1, Ordering::Relaxed);
        let (response, delay) = {
            let zone = zone.lock().unwrap_or_else(PoisonError::into_inner);
            (answer(&request, &zone), zone.delay)
        };
        let Ok(bytes) = response.to_vec() else {
            continue;
        };
        if delay.is_zero() {
            let _ = socket.send_to(&bytes, peer).await;
        } else {
            let socket = Arc::clone(&socket);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = socket.send_to(&bytes, peer).await;
            });
        }
    }
}

fn answer(request: &Message, zone: &Zone) -> Message {
    let mut response = Message::response(request.metadata.id, OpCode::Query);
    response.metadata.message_type = MessageType::Response;
    response.metadata.authoritative = true;
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_queries(request.queries.iter().cloned());
    let Some(query) = request.queries.first() else {
        response.metadata.response_code = ResponseCode::FormErr;
        return response;
    };
    if zone.failing || (zone.failing_a && query.query_type() == RecordType::A) {
        response.metadata.response_code = ResponseCode::ServFail;
        return response;
    }
    let Some(addrs) = zone.names.get(&normal(&query.name().to_ascii())) else {
        response.metadata.response_code = ResponseCode::NXDomain;
        return response;
    };
    for addr in addrs {
        let rdata = match (query.query_type(), addr) {
            (RecordType::A, IpAddr::V4(v4)) => RData::A(A(*v4)),
            (RecordType::AAAA, IpAddr::V6(v6)) => RData::AAAA(AAAA(*v6)),
            _ => continue,
        };
        response.add_answer(Record::from_rdata(query.name().clone(), zone.ttl, rdata));
    }
    response
}
