//! A UDP relay on loopback between a QUIC client and a server that can hold back the
//! client's packets that end its handshake (its Handshake and 1-RTT packets), so that,
//! between [`HandshakeHold::hold`] and [`HandshakeHold::release`], the server sees only the
//! client's first flight and its 0-RTT packets: what a server sees of a replayed first
//! flight, or of a client whose last handshake packets are slow. It holds the server's
//! packets too until [`HandshakeHold::release_server`], so that all a client sends first
//! goes in 0-RTT (it cannot have heard from the server). The client's packets that went
//! through while held (its first flight) are kept, to be sent again from elsewhere
//! ([`HandshakeHold::replay`]), as an attacker who recorded them would.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio::sync::watch;

/// The relay; it stops when dropped.
pub struct HandshakeHold {
    addr: SocketAddr,
    server: SocketAddr,
    /// The client's datagrams passed on while its handshake's end was held.
    first_flight: Arc<Mutex<Vec<Vec<u8>>>>,
    holding: watch::Sender<Holding>,
    task: tokio::task::JoinHandle<()>,
}

impl HandshakeHold {
    /// A relay to `server`, holding nothing yet.
    pub async fn start(server: SocketAddr) -> io::Result<Self> {
        let front = UdpSocket::bind(SocketAddr::new(server.ip(), 0)).await?;
        let back = UdpSocket::bind(SocketAddr::new(server.ip(), 0)).await?;
        back.connect(server).await?;
        let addr = front.local_addr()?;
        let (holding, told) = watch::channel(Holding::default());
        let first_flight = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(relay(front, back, told, Arc::clone(&first_flight)));
        Ok(Self {
            addr,
            server,
            first_flight,
            holding,
            task,
        })
    }

    /// Where the client sends.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds back, from now on, the client's packets that end a handshake, and all the
    /// server's.
    pub fn hold(&self) {
        let _ = self.holding.send(Holding {
            client: true,
            server: true,
        });
    }

    /// Sends the server's packets held, in order, and the server's after as they come.
    pub fn release_server(&self) {
        self.holding.send_modify(|h| h.server = false);
    }

    /// Sends all that was held, in order, and everything after as it comes.
    pub fn release(&self) {
        let _ = self.holding.send(Holding::default());
    }

    /// Sends the client's first flight (what went through while held) to the server again,
    /// from a socket of its own, which is returned: the server's answers go there.
    pub async fn replay(&self) -> io::Result<UdpSocket> {
        let socket = UdpSocket::bind(SocketAddr::new(self.server.ip(), 0)).await?;
        let flight = self
            .first_flight
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        for datagram in flight {
            socket.send_to(&datagram, self.server).await?;
        }
        Ok(socket)
    }
}

impl Drop for HandshakeHold {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Which side's packets are held (the client's that end a handshake; all the server's).
#[derive(Clone, Copy, Default)]
struct Holding {
    client: bool,
    server: bool,
}

async fn relay(
    front: UdpSocket,
    back: UdpSocket,
    mut told: watch::Receiver<Holding>,
    first_flight: Arc<Mutex<Vec<Vec<u8>>>>,
) {
    let mut client = None;
    let mut held_from_client: Vec<Vec<u8>> = Vec::new();
    let mut held_from_server: Vec<Vec<u8>> = Vec::new();
    let mut holding = Holding::default();
    let mut from_client = vec![0u8; 65_536];
    let mut from_server = vec![0u8; 65_536];
    loop {
        tokio::select! {
            got = front.recv_from(&mut from_client) => {
                let Ok((n, peer)) = got else { return };
                client = Some(peer);
                let datagram = &from_client[..n];
                if holding.client && ends_handshake(datagram) {
                    held_from_client.push(datagram.to_vec());
                } else {
                    if holding.client
                        && let Ok(mut flight) = first_flight.lock()
                    {
                        flight.push(datagram.to_vec());
                    }
                    let _ = back.send(datagram).await;
                }
            }
            got = back.recv(&mut from_server) => {
                let Ok(n) = got else { return };
                if holding.server {
                    held_from_server.push(from_server[..n].to_vec());
                } else if let Some(client) = client {
                    let _ = front.send_to(&from_server[..n], client).await;
                }
            }
            changed = told.changed() => {
                if changed.is_err() {
                    return;
                }
                let was_holding = holding.client;
                holding = *told.borrow_and_update();
                if holding.client && !was_holding && let Ok(mut flight) = first_flight.lock() {
                    flight.clear();
                }
                if !holding.server && let Some(client) = client {
                    for datagram in held_from_server.drain(..) {
                        let _ = front.send_to(&datagram, client).await;
                    }
                }
                if !holding.client {
                    for datagram in held_from_client.drain(..) {
                        let _ = back.send(&datagram).await;
                    }
                }
            }
        }
    }
}

/// Whether a client's datagram holds a packet that only a client past its first flight
/// sends: a Handshake packet (its Finished) or a 1-RTT (short header) one. Its packets are
/// walked by their long headers' lengths (RFC 9000 section 17.2); the type bits are not
/// protected.
fn ends_handshake(datagram: &[u8]) -> bool {
    let mut rest = datagram;
    while let Some(&first) = rest.first() {
        if rest.iter().all(|b| *b == 0) {
            // Padding after the last packet.
            return false;
        }
        // (The fixed bit, 0x40, says nothing: peers may grease it, RFC 9287.)
        if first & 0x80 == 0 {
            return true;
        }
        const HANDSHAKE: u8 = 2;
        let kind = (first >> 4) & 0x03;
        if kind == HANDSHAKE {
            return true;
        }
        match long_packet_len(rest, kind) {
            Some(len) if len <= rest.len() => rest = &rest[len..],
            _ => return false,
        }
    }
    false
}

/// The length of the long-header packet `packet` begins with (Initial or 0-RTT).
fn long_packet_len(packet: &[u8], kind: u8) -> Option<usize> {
    const INITIAL: u8 = 0;
    let mut at = 5; // the first byte and the version
    let dcid = usize::from(*packet.get(at)?);
    at += 1 + dcid;
    let scid = usize::from(*packet.get(at)?);
    at += 1 + scid;
    if kind == INITIAL {
        let (token, n) = varint(packet.get(at..)?)?;
        at += n + usize::try_from(token).ok()?;
    }
    let (length, n) = varint(packet.get(at..)?)?;
    Some(at + n + usize::try_from(length).ok()?)
}

/// A QUIC variable-length integer: its value and its size.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let first = *bytes.first()?;
    let size = 1usize << (first >> 6);
    let mut value = u64::from(first & 0x3f);
    for byte in bytes.get(1..size)? {
        value = (value << 8) | u64::from(*byte);
    }
    Some((value, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long-header packet of `kind` with a 4-byte DCID, no SCID, and `payload` bytes.
    fn long(kind: u8, payload: usize) -> Vec<u8> {
        let mut packet = vec![0xc0 | (kind << 4), 0, 0, 0, 1, 4, 1, 2, 3, 4, 0];
        if kind == 0 {
            packet.push(0); // no token
        }
        // A two-byte length.
        packet.extend_from_slice(&[0x40 | (payload >> 8) as u8, payload as u8]);
        packet.extend(std::iter::repeat_n(0xaa, payload));
        packet
    }

    #[test]
    fn finds_the_packets_that_end_a_handshake_among_coalesced_ones() {
        assert!(!ends_handshake(&long(0, 300)), "Initial");
        assert!(
            !ends_handshake(&[long(0, 300), long(1, 100)].concat()),
            "Initial, 0-RTT"
        );
        assert!(
            ends_handshake(&[long(0, 40), long(2, 60)].concat()),
            "Initial ACK, Handshake"
        );
        assert!(ends_handshake(&[0x41, 1, 2, 3]), "1-RTT");
        assert!(
            ends_handshake(&[0x01, 1, 2, 3]),
            "1-RTT, its fixed bit greased"
        );
        let padded = [long(0, 40), vec![0; 100]].concat();
        assert!(!ends_handshake(&padded), "padding after the packet");
        assert!(!ends_handshake(&long(0, 300)[..20]), "cut short");
        assert_eq!(varint(&[0x25]), Some((37, 1)));
        assert_eq!(varint(&[0x7b, 0xbd]), Some((15_293, 2)));
    }
}
