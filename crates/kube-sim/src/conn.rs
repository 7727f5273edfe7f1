//! The listener: counts the open client connections, which the cost model charges for
//! (see [`LoadModel::per_connection`](crate::LoadModel::per_connection)).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::load::Gate;

/// A [`TcpListener`] whose accepted connections count in the gate while they are open.
#[derive(Debug)]
pub(crate) struct CountingListener {
    inner: TcpListener,
    gate: Arc<Gate>,
}

impl CountingListener {
    pub(crate) fn new(inner: TcpListener, gate: Arc<Gate>) -> Self {
        Self { inner, gate }
    }
}

/// An accepted connection; leaves the count when dropped (closed by either side).
#[derive(Debug)]
pub(crate) struct Counted {
    stream: TcpStream,
    gate: Arc<Gate>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.gate.connection_closed();
    }
}

impl axum::serve::Listener for CountingListener {
    type Io = Counted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    self.gate.connection_opened();
                    let gate = self.gate.clone();
                    return (Counted { stream, gate }, addr);
                }
                Err(err) => {
                    // Out of file descriptors and the like: wait instead of spinning (as
                    // axum's own TCP listener does).
                    tracing::warn!(error = %err, "kube-sim cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
