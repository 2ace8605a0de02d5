use std::future::poll_fn;

use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

/// The codec's side of an in-memory connection, and the client's.
fn connection() -> (Rc<RefCell<Input<DuplexStream>>>, DuplexStream) {
    let (server, client) = tokio::io::duplex(64 * 1024);
    (
        Rc::new(RefCell::new(Input::new(server, 1024, 1024))),
        client,
    )
}

fn body_of(
    input: &Rc<RefCell<Input<DuplexStream>>>,
    length: BodyLength,
    expect: bool,
) -> IncomingBody {
    let generation = input.borrow_mut().start_body(length, expect);
    let shared: Rc<RefCell<Input<dyn Io>>> = input.clone();
    IncomingBody::new(shared, generation)
}

#[tokio::test]
async fn a_length_body_across_reads_leaves_the_next_request() {
    let (input, mut client) = connection();
    let body = body_of(&input, BodyLength::Length(10), false);
    assert_eq!(body.size_hint().exact(), Some(10));
    client.write_all(b"01234").await.unwrap();
    let reader = tokio::spawn(async move {
        client.write_all(b"56789GET").await.unwrap();
        client
    });
    let collected = body.collect().await.unwrap().to_bytes();
    assert_eq!(&collected[..], b"0123456789");
    reader.await.unwrap();
    // Whatever followed stays for the next head (it may not all have been read yet).
    assert!(b"GET".starts_with(&input.borrow().buf));
}

#[tokio::test]
async fn a_chunked_body_with_trailers() {
    let (input, mut client) = connection();
    let body = body_of(&input, BodyLength::Chunked, false);
    client
        .write_all(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nx-sum: 5\r\n\r\n")
        .await
        .unwrap();
    let collected = body.collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-sum"], "5");
    assert_eq!(&collected.to_bytes()[..], b"abcde");
    assert!(input.borrow().body_done());
}

#[tokio::test]
async fn the_client_going_away_mid_body_is_an_error() {
    let (input, mut client) = connection();
    let mut body = body_of(&input, BodyLength::Length(10), false);
    client.write_all(b"0123").await.unwrap();
    drop(client);
    assert_eq!(
        &body.frame().await.unwrap().unwrap().into_data().unwrap()[..],
        b"0123"
    );
    assert_eq!(
        body.frame().await.unwrap().unwrap_err(),
        BodyError::Incomplete
    );
}

#[tokio::test]
async fn continue_is_sent_when_the_body_is_first_read() {
    let (input, mut client) = connection();
    let mut body = body_of(&input, BodyLength::Length(2), true);
    // Nothing is written until someone reads the body.
    let mut probe = [0u8; 64];
    assert!(
        tokio::time::timeout(
            std::time::Duration::from_millis(20),
            client.read(&mut probe)
        )
        .await
        .is_err()
    );
    let reading = tokio::task::LocalSet::new();
    let frame = reading
        .run_until(async {
            let read = tokio::task::spawn_local(async move { body.frame().await });
            let mut got = [0u8; CONTINUE.len()];
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, CONTINUE);
            client.write_all(b"ok").await.unwrap();
            read.await.unwrap()
        })
        .await;
    assert_eq!(&frame.unwrap().unwrap().into_data().unwrap()[..], b"ok");
}

#[tokio::test]
async fn continue_is_not_sent_to_a_client_that_did_not_wait() {
    let (input, mut client) = connection();
    client.write_all(b"ok").await.unwrap();
    // The head's read took the body's bytes too.
    poll_fn(|cx| input.borrow_mut().poll_read_more(cx, 64))
        .await
        .unwrap();
    let body = body_of(&input, BodyLength::Length(2), true);
    assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
    drop(input);
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn a_body_outlived_by_its_exchange_reads_nothing_more() {
    let (input, mut client) = connection();
    let mut stale = body_of(&input, BodyLength::Length(4), false);
    client.write_all(b"ab").await.unwrap();
    poll_fn(|cx| input.borrow_mut().poll_read_more(cx, 64))
        .await
        .unwrap();
    assert!(
        !input.borrow_mut().skip_buffered_body(),
        "half a body is buffered"
    );
    input.borrow_mut().end_exchange();
    assert_eq!(
        stale.frame().await.unwrap().unwrap_err(),
        BodyError::Abandoned
    );
    // The next exchange's body is its own.
    let next = body_of(&input, BodyLength::Empty, false);
    assert!(next.is_end_stream());
    assert!(!stale.is_end_stream());
}

#[tokio::test]
async fn a_body_wholly_buffered_can_be_skipped() {
    let (input, mut client) = connection();
    let _unread = body_of(&input, BodyLength::Chunked, false);
    client.write_all(b"2\r\nab\r\n0\r\n\r\nGET").await.unwrap();
    poll_fn(|cx| input.borrow_mut().poll_read_more(cx, 64))
        .await
        .unwrap();
    assert!(input.borrow_mut().skip_buffered_body());
    assert_eq!(&input.borrow().buf[..], b"GET");
}
