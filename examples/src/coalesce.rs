//! One TCP send per poll of a connection's task: what TLS and HTTP write during one poll leaves
//! in one `sendmsg`, and a closing connection's last bytes leave with its FIN.
//!
//! Without this, a short HTTPS connection sends separate TCP segments for its server flight, its
//! session tickets, its response, its close_notify and its FIN: tokio-rustls writes every TLS
//! record it produces at once, and hyper flushes the response before it shuts the connection
//! down. On loopback every segment costs the sender a system call and the receiver's whole TCP
//! input path (softirq, wake-up), charged to the sending process: about 4 % of our server's CPU
//! per segment and connection, measured with `perf`. The bytes on the wire are the same; only
//! the segments are fewer.
//!
//! How: [`coalesced`] splits a `TcpStream` into the stream handed to TLS
//! ([`CoalescedStream`]: writes and flushes append to a buffer) and a [`SendAfterPoll`] wrapper
//! for the connection's future, which sends the buffer after every poll of that future, before
//! the task sleeps, so nothing written is held back while the task waits for anything (the
//! peer, a handler, a timer). A shutdown sends the buffer with `MSG_MORE` and then the FIN, which
//! the kernel puts on the same segment.

use std::future::Future;
use std::io::{self, IoSlice, Read};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Past this many unsent bytes a write sends at once (and waits when the socket is full), so
/// a large response is not buffered whole.
const HIGH_WATER: usize = 64 * 1024;

/// Splits `tcp` into the stream to read and write through and the wrapper for the task's future
/// that sends what was written (see the module documentation). Both must be used by the same
/// task.
pub fn coalesced(tcp: TcpStream) -> (CoalescedStream, SendAfterPoll) {
    let shared = Arc::new(Shared {
        tcp,
        unsent: Mutex::new(Vec::new()),
    });
    (
        CoalescedStream {
            shared: Arc::clone(&shared),
        },
        SendAfterPoll { shared },
    )
}

struct Shared {
    tcp: TcpStream,
    /// Written, not yet sent. Only the connection's task touches it: the lock is never contended.
    unsent: Mutex<Vec<u8>>,
}

impl Shared {
    fn unsent(&self) -> MutexGuard<'_, Vec<u8>> {
        self.unsent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends all unsent bytes (`MSG_MORE` when the caller shuts down next). Pending when the
    /// socket is full: the task is woken when it can send again.
    fn poll_send(&self, cx: &mut Context<'_>, more: bool) -> Poll<io::Result<()>> {
        let mut unsent = self.unsent();
        while !unsent.is_empty() {
            ready!(self.tcp.poll_write_ready(cx))?;
            let flags = if more { libc::MSG_MORE } else { 0 };
            let sent = self.tcp.try_io(Interest::WRITABLE, || {
                socket2::SockRef::from(&self.tcp).send_with_flags(&unsent, flags)
            });
            match sent {
                Ok(n) => {
                    unsent.drain(..n);
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The connection as TLS reads and writes it: reads go straight to the socket, writes wait in a
/// buffer for the end of the task's poll ([`SendAfterPoll`]), a shutdown sends them with the FIN.
pub struct CoalescedStream {
    shared: Arc<Shared>,
}

impl CoalescedStream {
    /// The underlying socket (for its addresses and options).
    pub fn tcp(&self) -> &TcpStream {
        &self.shared.tcp
    }
}

impl AsyncRead for CoalescedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let tcp = &self.shared.tcp;
        loop {
            ready!(tcp.poll_read_ready(cx))?;
            // rustls reads into an initialized buffer: this does not zero anything.
            let unfilled = buf.initialize_unfilled();
            let wanted = unfilled.len();
            let mut got = 0;
            // As tokio's own `TcpStream` does: a read that does not fill the buffer has drained
            // the socket, so its readiness is cleared now rather than by one more `recv` that
            // returns EAGAIN. `try_io` clears it only if no new readiness came meanwhile.
            let outcome = tcp.try_io(Interest::READABLE, || {
                got = (&*socket2::SockRef::from(tcp)).read(unfilled)?;
                if got > 0 && got < wanted {
                    Err(io::ErrorKind::WouldBlock.into())
                } else {
                    Ok(())
                }
            });
            match outcome {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock && got == 0 => {}
                Ok(()) | Err(_) if got > 0 => {
                    buf.advance(got);
                    return Poll::Ready(Ok(()));
                }
                Ok(()) => return Poll::Ready(Ok(())),
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }
}

impl AsyncWrite for CoalescedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.shared.unsent().len() >= HIGH_WATER {
            ready!(self.shared.poll_send(cx, false))?;
        }
        self.shared.unsent().extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.shared.unsent().len() >= HIGH_WATER {
            ready!(self.shared.poll_send(cx, false))?;
        }
        let mut unsent = self.shared.unsent();
        let mut written = 0;
        for buf in bufs {
            unsent.extend_from_slice(buf);
            written += buf.len();
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Ready at once: the bytes leave when this poll of the task ends ([`SendAfterPoll`]),
    /// before the task waits for anything.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Sends what is unsent with `MSG_MORE`, then shuts the write side: the kernel sets the FIN
    /// on the segment still queued, so the last bytes and the FIN leave together.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.shared.poll_send(cx, true))?;
        Poll::Ready(socket2::SockRef::from(&self.shared.tcp).shutdown(std::net::Shutdown::Write))
    }
}

/// Wraps a connection's future: after each poll of it, sends what its [`CoalescedStream`] has
/// buffered. A send error is left for the stream's next read or write to meet (the socket
/// reports it again); a full socket wakes the task when it drains.
pub struct SendAfterPoll {
    shared: Arc<Shared>,
}

impl SendAfterPoll {
    /// Runs `future` with a send after every poll of it. The future is pinned by the caller
    /// (`std::pin::pin!` in the task's own async block), so a large connection future is not
    /// moved once more.
    pub async fn wrap<F: Future>(self, mut future: Pin<&mut F>) -> F::Output {
        std::future::poll_fn(move |cx| {
            let outcome = future.as_mut().poll(cx);
            // Pending: the socket is full and the task will be woken when it drains. An error:
            // the connection is broken; its next read or write returns the error.
            let _ = self.shared.poll_send(cx, false);
            outcome
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// Written and flushed bytes reach the peer while the task waits on something else than
    /// the socket (here a timer far longer than the test's patience), so a handler that streams
    /// is never held back; and a shutdown delivers the rest and the EOF.
    #[tokio::test]
    async fn sends_before_the_task_sleeps_and_ends_with_eof() {
        let (mut client, server) = pair().await;
        let (mut stream, send) = coalesced(server);
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let writer = std::pin::pin!(async move {
                stream.write_all(b"first ").await.unwrap();
                stream.flush().await.unwrap();
                // The task sleeps here until the client has read the first bytes.
                released.await.unwrap();
                stream.write_all(b"second").await.unwrap();
                stream.shutdown().await.unwrap();
            });
            send.wrap(writer).await
        });
        let mut first = [0u8; 6];
        tokio::time::timeout(Duration::from_secs(30), client.read_exact(&mut first))
            .await
            .expect("the flushed bytes arrive while the writer waits")
            .unwrap();
        assert_eq!(&first, b"first ");
        release.send(()).unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut rest))
            .await
            .expect("the rest and the EOF arrive")
            .unwrap();
        assert_eq!(rest, b"second");
        task.await.unwrap();
    }

    /// Reads pass through; a response larger than the high-water mark and the socket buffers
    /// arrives whole (writes wait for the socket to drain instead of buffering without bound).
    #[tokio::test]
    async fn echoes_a_large_payload() {
        let (mut client, server) = pair().await;
        let (mut stream, send) = coalesced(server);
        let payload: Vec<u8> = (0..8 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let expected = payload.clone();
        let task = tokio::spawn(async move {
            let echo = std::pin::pin!(async move {
                let mut request = [0u8; 5];
                stream.read_exact(&mut request).await.unwrap();
                assert_eq!(&request, b"hello");
                for chunk in payload.chunks(10_000) {
                    stream.write_all(chunk).await.unwrap();
                }
                stream.shutdown().await.unwrap();
            });
            send.wrap(echo).await
        });
        client.write_all(b"hello").await.unwrap();
        let mut received = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), client.read_to_end(&mut received))
            .await
            .expect("the payload arrives")
            .unwrap();
        assert!(
            received == expected,
            "payload differs ({} bytes)",
            received.len()
        );
        task.await.unwrap();
    }
}
