//! A small tokio service that embeds the balancer: a line-based TCP front that forwards each
//! request to one of three backends chosen by least request, and stops sending to a backend
//! once its health check marks it unhealthy.
//!
//! Everything runs on loopback and the program exits by itself:
//!
//! ```text
//! cargo run -p balancer --example embed
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use balancer::{Health, HostSet, HostSpec, LbPolicy, LoadBalancer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    // Three backends; the third is slow, so it tends to have more requests in flight.
    let mut backends = Vec::new();
    for (name, delay_ms) in [("alpha", 5), ("beta", 5), ("gamma", 40)] {
        backends.push(spawn_backend(name, Duration::from_millis(delay_ms)).await?);
    }

    // The host set is shared by the balancer and by whatever maintains it (here, the "health
    // checker" below). `beta` has twice the weight of the others.
    let hosts = HostSet::new(vec![
        HostSpec::new(backends[0]),
        HostSpec::new(backends[1]).with_weight(2),
        HostSpec::new(backends[2]),
    ])?;
    let balancer = Arc::new(LoadBalancer::new(hosts.clone(), LbPolicy::least_request())?);

    let front = TcpListener::bind("127.0.0.1:0").await?;
    let front_addr = front.local_addr()?;
    tokio::spawn(serve_front(front, Arc::clone(&balancer)));

    // 60 concurrent requests through the front.
    let served = send_requests(front_addr, 60).await?;
    println!("60 requests, all hosts healthy (beta has weight 2, gamma is slow): {served:?}");

    // A health check fails on alpha: the next picks leave it out.
    hosts.set_health(backends[0], Health::Unhealthy);
    let served = send_requests(front_addr, 30).await?;
    println!("30 requests, alpha unhealthy: {served:?}");
    assert!(!served.contains_key("alpha"));
    Ok(())
}

/// Accepts connections; for each request line, picks a backend and relays the exchange.
async fn serve_front(listener: TcpListener, balancer: Arc<LoadBalancer>) {
    while let Ok((client, _)) = listener.accept().await {
        let balancer = Arc::clone(&balancer);
        tokio::spawn(async move {
            if let Err(e) = relay(client, &balancer).await {
                eprintln!("front: {e}");
            }
        });
    }
}

async fn relay(client: TcpStream, balancer: &LoadBalancer) -> Result<(), Error> {
    let (read, mut write) = client.into_split();
    let mut request = String::new();
    BufReader::new(read).read_line(&mut request).await?;

    // The guard counts this request as in flight to the host until it is dropped at the end
    // of this function, after the response has been relayed.
    let picked = balancer.pick(None).ok_or("no backend available")?;
    let response = exchange(picked.addr(), &request).await?;
    write.write_all(response.as_bytes()).await?;
    Ok(())
}

/// Sends one line to `addr` and reads one line back.
async fn exchange(addr: SocketAddr, line: &str) -> Result<String, Error> {
    let stream = TcpStream::connect(addr).await?;
    let (read, mut write) = stream.into_split();
    write.write_all(line.as_bytes()).await?;
    let mut response = String::new();
    BufReader::new(read).read_line(&mut response).await?;
    Ok(response)
}

/// A backend that answers each request line with its name after `delay`.
async fn spawn_backend(name: &'static str, delay: Duration) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut line = String::new();
                if BufReader::new(read).read_line(&mut line).await.is_ok() {
                    tokio::time::sleep(delay).await;
                    let _ = write.write_all(format!("{name}\n").as_bytes()).await;
                }
            });
        }
    });
    Ok(addr)
}

/// Sends `count` concurrent requests to the front and counts which backend answered.
async fn send_requests(front: SocketAddr, count: usize) -> Result<BTreeMap<String, usize>, Error> {
    let mut tasks = Vec::new();
    for i in 0..count {
        tasks.push(tokio::spawn(async move {
            exchange(front, &format!("request {i}\n")).await
        }));
    }
    let mut served = BTreeMap::new();
    for task in tasks {
        let name = task.await??;
        *served.entry(name.trim().to_string()).or_insert(0) += 1;
    }
    Ok(served)
}
