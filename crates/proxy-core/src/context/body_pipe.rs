//! A body whose frames another task makes (an external processor's answers to a streamed
//! body): the task sends each frame when it is ready and the codec reads them. At most
//! [`FRAMES_WAITING`] frames wait between the two, so a slow reader holds the task back.
//! A body whose task went away without ending it fails: it is never taken as complete.

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tokio::sync::mpsc;

use crate::error::BodyError;

/// Frames sent and not yet read.
const FRAMES_WAITING: usize = 2;

/// Why a piped body failed without its maker saying why.
#[derive(Debug, thiserror::Error)]
#[error("the body's maker went away before its end")]
pub(crate) struct PipeBroken;

enum Item {
    Frame { frame: Frame<Bytes>, last: bool },
    Failed(BodyError),
}

/// The making side.
pub(crate) struct PipeSender(mpsc::Sender<Item>);

/// The reading side: the body's frames.
pub(crate) struct PipeReceiver {
    items: mpsc::Receiver<Item>,
    ended: bool,
}

/// A pipe for one body.
pub(crate) fn body_pipe() -> (PipeSender, PipeReceiver) {
    let (sender, items) = mpsc::channel(FRAMES_WAITING);
    (
        PipeSender(sender),
        PipeReceiver {
            items,
            ended: false,
        },
    )
}

impl PipeSender {
    /// Sends a frame, waiting for room; `last` ends the body with it (an empty last data
    /// frame just ends it). `false` once the body's reader has gone.
    pub(crate) async fn send(&self, frame: Frame<Bytes>, last: bool) -> bool {
        self.0.send(Item::Frame { frame, last }).await.is_ok()
    }

    /// Resolves once the body's reader has gone.
    pub(crate) async fn closed(&self) {
        self.0.closed().await;
    }

    /// Fails the body: the reader gets `error` after the frames before it.
    pub(crate) async fn fail(&self, error: BodyError) {
        let _ = self.0.send(Item::Failed(error)).await;
    }
}

impl PipeReceiver {
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match self.items.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Item::Frame { frame, last })) => {
                self.ended = last;
                if last && frame.data_ref().is_some_and(Bytes::is_empty) {
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Item::Failed(error))) => {
                self.ended = true;
                Poll::Ready(Some(Err(error)))
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(Some(Err(Box::new(PipeBroken))))
            }
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use super::*;

    async fn next(receiver: &mut PipeReceiver) -> Option<Result<Frame<Bytes>, BodyError>> {
        std::future::poll_fn(|cx| receiver.poll_frame(cx)).await
    }

    #[tokio::test]
    async fn frames_then_the_end_or_a_failure() {
        let (sender, mut receiver) = body_pipe();
        tokio::spawn(async move {
            assert!(
                sender
                    .send(Frame::data(Bytes::from_static(b"ab")), false)
                    .await
            );
            assert!(sender.send(Frame::data(Bytes::new()), true).await);
        });
        let frame = next(&mut receiver).await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "ab");
        assert!(next(&mut receiver).await.is_none());
        assert!(receiver.is_end_stream());

        // A maker that goes away without ending the body fails it.
        let (sender, mut receiver) = body_pipe();
        drop(sender);
        let failed = next(&mut receiver).await.unwrap().unwrap_err();
        assert!(failed.is::<PipeBroken>());
        assert!(next(&mut receiver).await.is_none());
    }

    #[tokio::test]
    async fn a_slow_reader_holds_the_maker_back_and_a_gone_one_stops_it() {
        let (sender, receiver) = body_pipe();
        for _ in 0..FRAMES_WAITING {
            assert!(
                sender
                    .send(Frame::data(Bytes::from_static(b"x")), false)
                    .await
            );
        }
        use futures_util::FutureExt;
        let third = sender.send(Frame::data(Bytes::from_static(b"x")), false);
        assert!(
            third.now_or_never().is_none(),
            "a third frame waits for the reader"
        );
        drop(receiver);
        assert!(
            !sender
                .send(Frame::data(Bytes::from_static(b"x")), false)
                .await
        );
    }
}
