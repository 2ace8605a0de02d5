//! The `noop-upstream` binary: prints its address, serves, exits 0 on SIGTERM.

#[cfg(test)] // lets the helpers unwrap, like the tests themselves
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_noop-upstream");

#[test]
fn help_and_bad_arguments() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--listen"));

    let out = Command::new(BIN).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN)
        .args(["--listen", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[cfg(unix)]
#[test]
fn serves_then_exits_zero_on_sigterm() {
    let mut child = Command::new(BIN)
        .arg("--listen=127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("noop-upstream listening on ")
        .unwrap_or_else(|| panic!("unexpected banner {line:?}"))
        .parse()
        .unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let res = send(addr, get("/").body(empty()).unwrap()).await;
        assert_eq!(res.status(), http::StatusCode::OK);
    });

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Bounded: fail rather than hang if the signal is ignored.
    let deadline = std::time::Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("noop-upstream ignored SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
}
