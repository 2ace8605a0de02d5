//! Packets of one QUIC connection reach the worker that owns it, wherever they come from:
//! the connection IDs a worker hands out name the worker (their first four bytes, modulo the
//! worker count), and a reuse-port program (classic BPF, as Envoy's) picks the UDP socket of
//! the group by those bytes. So a client whose address changes (a NAT rebinding, Wi-Fi to
//! mobile) stays with its worker, and connection migration can be on.
//!
//! A client's first packets carry a connection ID it chose: the program reads the same bytes
//! of it, so they all reach one worker, whose answer gives the client an ID of its own.
//!
//! In a binary upgrade both processes read the same sockets for a while. The fifth byte of
//! an ID names the process (a random byte each): a packet of the old process's connections
//! that the new one reads fails validation and is dropped, not answered with a stateless
//! reset that would end the connection (QUIC sends the packet again, and the old process may
//! read it then).

use std::io;
use std::net::UdpSocket;
use std::time::Duration;

use quinn::{ConnectionId, ConnectionIdGenerator};

/// Length of the IDs handed out: the worker's four bytes, the process's one, and three more
/// of entropy at least (the worker's bytes are mostly random too).
const CID_LEN: usize = 8;

/// Connection IDs for worker `worker` of `workers`: random, but for their first four bytes,
/// which are the worker's number modulo the count, and their fifth, this process's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerConnectionIds {
    worker: u32,
    workers: u32,
    process: u8,
}

/// This process's byte in its connection IDs, drawn once.
fn process_byte() -> u8 {
    static BYTE: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *BYTE.get_or_init(|| {
        let mut byte = [0u8];
        if config::tls::material::provider()
            .secure_random
            .fill(&mut byte)
            .is_err()
        {
            byte[0] = crate::random::next_u64().to_le_bytes()[0];
        }
        byte[0]
    })
}

impl WorkerConnectionIds {
    pub(crate) fn new(worker: usize, workers: usize) -> Self {
        Self::of_process(worker, workers, process_byte())
    }

    fn of_process(worker: usize, workers: usize, process: u8) -> Self {
        let workers = u32::try_from(workers.max(1)).unwrap_or(u32::MAX);
        let worker = u32::try_from(worker).unwrap_or(0) % workers;
        Self {
            worker,
            workers,
            process,
        }
    }

    /// The worker the reuse-port program sends an ID's packets to.
    fn worker_of(&self, cid: &[u8]) -> Option<u32> {
        let first: [u8; 4] = cid.get(..4)?.try_into().ok()?;
        Some(u32::from_be_bytes(first) % self.workers)
    }
}

impl ConnectionIdGenerator for WorkerConnectionIds {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut bytes = [0u8; CID_LEN];
        // IDs must not let an observer link them: cryptographic randomness.
        if config::tls::material::provider()
            .secure_random
            .fill(&mut bytes)
            .is_err()
        {
            bytes = crate::random::next_u64().to_be_bytes();
        }
        let drawn = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let base = drawn / self.workers * self.workers;
        let named = base
            .checked_add(self.worker)
            .unwrap_or(base - self.workers + self.worker);
        bytes[..4].copy_from_slice(&named.to_be_bytes());
        bytes[4] = self.process;
        ConnectionId::new(&bytes)
    }

    /// An ID of another worker's, or another process's, is not this one's: its packet is
    /// dropped, never answered with a stateless reset, which would end that connection.
    fn validate(&self, cid: &ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        let ours = cid.len() == CID_LEN
            && self.worker_of(cid) == Some(self.worker)
            && cid.get(4) == Some(&self.process);
        if ours {
            Ok(())
        } else {
            Err(quinn_proto::InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The reuse-port program: the socket at index (the ID's first four bytes modulo `workers`),
/// the ID being a short header's destination ID (byte 1 on) or a long header's (byte 6 on,
/// after the flags, version and ID length); a packet too short for either goes by the
/// kernel's flow hash. Envoy's program, with the modulo.
fn steering_program(workers: u32) -> [libc::sock_filter; 14] {
    use libc::{
        BPF_A, BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_JA, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD,
        BPF_LEN, BPF_MOD, BPF_RET, BPF_W,
    };
    let op = |code: u32| u16::try_from(code).unwrap_or(0);
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: op(code),
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: op(code),
        jt,
        jf,
        k,
    };
    // The kernel's flow hash, an ancillary load.
    let rxhash = (libc::SKF_AD_OFF + libc::SKF_AD_RXHASH) as u32;
    [
        stmt(BPF_LD | BPF_W | BPF_LEN, 0), // 0: A = length
        jump(BPF_JMP | BPF_JGE | BPF_K, 1 + CID_LEN as u32, 0, 9), // 1: too short: 11
        stmt(BPF_LD | BPF_B | BPF_ABS, 0), // 2: A = first byte
        stmt(BPF_ALU | BPF_AND | BPF_K, 0x80), // 3: the long-header bit
        jump(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2), // 4: long header: 7
        stmt(BPF_LD | BPF_W | BPF_ABS, 1), // 5: A = DCID[0..4] (short)
        stmt(BPF_JMP | BPF_JA, 5),         // 6: to 12
        stmt(BPF_LD | BPF_W | BPF_LEN, 0), // 7: A = length
        jump(BPF_JMP | BPF_JGE | BPF_K, 14, 0, 2), // 8: too short: 11
        stmt(BPF_LD | BPF_W | BPF_ABS, 6), // 9: A = DCID[0..4] (long)
        stmt(BPF_JMP | BPF_JA, 1),         // 10: to 12
        stmt(BPF_LD | BPF_W | BPF_ABS, rxhash), // 11: A = flow hash
        stmt(BPF_ALU | BPF_MOD | BPF_K, workers), // 12: A %= workers
        stmt(BPF_RET | BPF_A, 0),          // 13: that socket
    ]
}

/// Attaches the program to `socket`'s reuse-port group of `workers` sockets, bound in worker
/// order (so the group's index of each is its worker's number).
#[allow(unsafe_code)]
pub(crate) fn steer_by_connection_id(socket: &UdpSocket, workers: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let workers = u32::try_from(workers.max(1)).unwrap_or(u32::MAX);
    let mut program = steering_program(workers);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `program`, which outlives the call; the kernel copies it.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if set == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes the program off `socket`'s group, if one is attached (an earlier process's): the
/// kernel then spreads packets by their addresses.
#[allow(unsafe_code)]
pub(crate) fn detach_steering(socket: &UdpSocket) {
    use std::os::fd::AsRawFd;
    let unused: libc::c_int = 0;
    // SAFETY: a plain int option value, read by the kernel during the call; ENOENT (no
    // program attached) is the usual answer and is fine.
    let _ = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DETACH_REUSEPORT_BPF,
            std::ptr::from_ref(&unused).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_worker_and_others_are_refused() {
        for workers in [1, 2, 3, 16] {
            for worker in 0..workers {
                let mut ids = WorkerConnectionIds::new(worker, workers);
                for _ in 0..200 {
                    let cid = ids.generate_cid();
                    assert_eq!(cid.len(), CID_LEN);
                    assert_eq!(ids.worker_of(&cid), Some(worker as u32));
                    assert!(ids.validate(&cid).is_ok());
                    let other = WorkerConnectionIds::new((worker + 1) % workers, workers);
                    assert_eq!(other.validate(&cid).is_ok(), workers == 1);
                }
            }
        }
        let ids = WorkerConnectionIds::new(0, 2);
        assert!(
            ids.validate(&ConnectionId::new(&[0; 4])).is_err(),
            "too short"
        );
    }

    #[test]
    fn ids_differ() {
        let mut ids = WorkerConnectionIds::new(1, 4);
        let a = ids.generate_cid();
        let b = ids.generate_cid();
        assert_ne!(a, b);
    }

    #[test]
    fn ids_of_another_process_are_refused() {
        let mut old = WorkerConnectionIds::of_process(1, 2, 7);
        let new = WorkerConnectionIds::of_process(1, 2, 8);
        let cid = old.generate_cid();
        assert!(old.validate(&cid).is_ok());
        assert!(new.validate(&cid).is_err());
    }
}
