//! Binary upgrade without a refused connection: the running process hands its listening
//! sockets to a new one over a Unix socket (as Envoy's hot restart, HAProxy's `-x` and
//! Pingora's graceful upgrade do). The kernel's accept queues never close: while the new
//! process starts, the old one keeps accepting from the same sockets; once the new one
//! serves, it tells the old one to drain, and the old one stops accepting and exits when its
//! requests in flight are done.
//!
//! The exchange, one request and one answer at a time on a stream socket:
//!
//! ```text
//! new -> old   listener N\n
//! old -> new   {"address":"127.0.0.1:8080","shared":false,"udp":2}\n
//!              + the sockets (SCM_RIGHTS): TCP, then `udp` UDP ones (HTTP/3) in worker order
//!              end\n                                            when there is no listener N
//! new -> old   drain\n
//! old -> new   ok\n   (the old process has removed its upgrade socket and starts draining)
//! ```

use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::{Inherited, LiveConfig, Sockets};

/// Sockets sent in one message at most (the kernel's SCM_MAX_FD is 253).
const MAX_FDS: usize = 253;
/// How long either side waits for the other's answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize)]
struct ListenerHeader {
    address: SocketAddr,
    shared: bool,
    /// How many of the sockets, the last ones, are HTTP/3's UDP sockets.
    #[serde(default)]
    udp: usize,
}

/// The process this one upgrades, connected and asked for its sockets.
pub struct Predecessor {
    stream: UnixStream,
    sockets: Option<Sockets>,
}

impl Predecessor {
    /// Connects to the running process's upgrade socket at `path` and takes a copy of every
    /// listening socket it has. It keeps serving until [`retire`](Self::retire).
    pub fn connect(path: &Path) -> io::Result<Predecessor> {
        let stream = UnixStream::connect(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot reach the running proxy at {}: {e}", path.display()),
            )
        })?;
        stream.set_read_timeout(Some(ANSWER_WITHIN))?;
        let mut inherited = Vec::new();
        for n in 0.. {
            (&stream).write_all(format!("listener {n}\n").as_bytes())?;
            match receive(&stream)? {
                None => break,
                Some(listener) => inherited.push(listener),
            }
        }
        tracing::info!(
            listeners = inherited.len(),
            "inherited the sockets of the running proxy"
        );
        Ok(Predecessor {
            stream,
            sockets: Some(Sockets::inherit(inherited)),
        })
    }

    /// The inherited sockets, for [`StartOptions`](crate::StartOptions); taken once.
    pub(crate) fn take_sockets(&mut self) -> Sockets {
        self.sockets.take().unwrap_or_default()
    }

    /// Tells the old process to stop accepting and drain; returns once it has agreed.
    pub fn retire(self) -> io::Result<()> {
        (&self.stream).write_all(b"drain\n")?;
        let mut answer = String::new();
        BufReader::new(&self.stream).read_line(&mut answer)?;
        if answer.trim() != "ok" {
            return Err(io::Error::other(format!(
                "the running proxy answered `{}` to drain",
                answer.trim()
            )));
        }
        Ok(())
    }
}

/// Reads one answer: a listener with its sockets, or `None` at the end.
fn receive(stream: &UnixStream) -> io::Result<Option<Inherited>> {
    let mut data = [0u8; 1024];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut data)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    let text = std::str::from_utf8(&data[..received.bytes])
        .map_err(|_| io::Error::other("the running proxy sent something unreadable"))?;
    let line = text.trim_end();
    if line == "end" {
        return Ok(None);
    }
    let header: ListenerHeader = serde_json::from_str(line)
        .map_err(|e| io::Error::other(format!("unexpected answer from the running proxy: {e}")))?;
    let udp = fds.split_off(fds.len().saturating_sub(header.udp));
    let sockets: Vec<TcpListener> = fds.into_iter().map(TcpListener::from).collect();
    if sockets.is_empty() && udp.is_empty() {
        return Err(io::Error::other(format!(
            "the running proxy sent no socket for {}",
            header.address
        )));
    }
    Ok(Some(Inherited {
        address: header.address,
        shared: header.shared,
        sockets,
        udp: udp.into_iter().map(UdpSocket::from).collect(),
    }))
}

/// Set once a new process has taken this one's sockets over and asked it to drain.
static HANDED_OVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process drains because a new one took its sockets over (rather than stopping,
/// or a listener going).
pub(crate) fn handed_over() -> bool {
    HANDED_OVER.load(std::sync::atomic::Ordering::Relaxed)
}

/// The running side: answers a new process at `path`. The receiver fires when a new process
/// has taken over and this one should drain.
pub(crate) fn serve(path: &Path, live: Weak<LiveConfig>) -> io::Result<oneshot::Receiver<()>> {
    // A file left by a process that is gone would make the bind fail.
    if path.exists() && UnixStream::connect(path).is_err() {
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen for upgrades on {}: {e}", path.display()),
        )
    })?;
    let (retire, retired) = oneshot::channel();
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("legate-upgrade".into())
        .spawn(move || accept(listener, path, live, retire))?;
    Ok(retired)
}

fn accept(
    listener: UnixListener,
    path: PathBuf,
    live: Weak<LiveConfig>,
    retire: oneshot::Sender<()>,
) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        match answer(&stream, &live) {
            Ok(true) => {
                HANDED_OVER.store(true, std::sync::atomic::Ordering::Relaxed);
                // The new process takes the path over; this one stops listening on it.
                let _ = std::fs::remove_file(&path);
                let _ = (&stream).write_all(b"ok\n");
                let _ = retire.send(());
                return;
            }
            Ok(false) => {} // the new process went away without taking over
            Err(error) => tracing::warn!(%error, "upgrade exchange failed"),
        }
    }
}

/// Answers one new process. `true` when it asked this one to drain.
fn answer(stream: &UnixStream, live: &Weak<LiveConfig>) -> io::Result<bool> {
    stream.set_read_timeout(Some(ANSWER_WITHIN))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(false);
        }
        let request = line.trim();
        if request == "drain" {
            return Ok(true);
        }
        let Some(n) = request
            .strip_prefix("listener ")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            return Err(io::Error::other(format!("unknown request `{request}`")));
        };
        let Some(live) = live.upgrade() else {
            return Ok(false);
        };
        let generation = live.current();
        let Some(listener) = generation.listeners.get(n) else {
            let mut out = stream;
            out.write_all(b"end\n")?;
            continue;
        };
        let sockets = listener.sockets.handover()?;
        let udp = match &listener.quic {
            Some(quic) => quic.handover()?,
            None => Vec::new(),
        };
        // Half the room each at most: a UDP socket left out leaves its worker's traffic to
        // the old process's copy until it exits.
        let udp = &udp[..udp.len().min(MAX_FDS / 2)];
        let sockets = if listener.sockets.shared {
            &sockets[..sockets.len().min(1)]
        } else {
            &sockets[..sockets.len().min(MAX_FDS - udp.len())]
        };
        let header = ListenerHeader {
            address: listener.sockets.address,
            shared: listener.sockets.shared,
            udp: udp.len(),
        };
        let mut text = serde_json::to_string(&header).map_err(io::Error::other)?;
        text.push('\n');
        let fds: Vec<BorrowedFd<'_>> = (sockets.iter().map(AsFd::as_fd))
            .chain(udp.iter().map(AsFd::as_fd))
            .collect();
        send(stream, text.as_bytes(), &fds)?;
    }
}

fn send(stream: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many sockets for one message"));
    }
    let sent = rustix::net::sendmsg(
        stream,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::empty(),
    )?;
    if sent != data.len() {
        return Err(io::Error::other("short write on the upgrade socket"));
    }
    Ok(())
}
