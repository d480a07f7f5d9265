//! The version of the status line. hyper answers an HTTP/1.0 request with `HTTP/1.0 200 OK`,
//! and has no setting to say otherwise; the endpoint has always said `HTTP/1.1`, as RFC 9110
//! (section 6.2) asks of a server: the highest version it conforms to, of the request's major
//! version. Only those bytes change: hyper still speaks HTTP/1.0 to such a client (no chunked
//! body, the connection closed after the response), which an HTTP/1.1 response may do.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What hyper writes first to an HTTP/1.0 client, and what is written instead.
const HTTP_10: &[u8] = b"HTTP/1.0 ";
const HTTP_11: &[u8] = b"HTTP/1.1 ";

/// A connection's stream, whose first bytes written say `HTTP/1.1 ` where they said
/// `HTTP/1.0 `. Reads pass through.
pub(super) struct Http11<S> {
    stream: S,
    /// Bytes written so far.
    written: usize,
}

impl<S> Http11<S> {
    pub(super) fn new(stream: S) -> Self {
        Self { stream, written: 0 }
    }

    pub(super) fn into_inner(self) -> S {
        self.stream
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Http11<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Http11<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // The part of `buf` that falls in the first bytes of the stream, if they are those of
        // HTTP/1.0: it is written alone, as HTTP/1.1 (a write may take less than it is given).
        let at = this.written;
        let first = HTTP_10.len().saturating_sub(at).min(buf.len());
        let out = if first > 0 && buf[..first] == HTTP_10[at..at + first] {
            &HTTP_11[at..at + first]
        } else {
            buf
        };
        let written = ready!(Pin::new(&mut this.stream).poll_write(cx, out))?;
        this.written = this.written.saturating_add(written);
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// What `writes` come to through [`Http11`].
    fn written(writes: &[&[u8]]) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut stream = Http11::new(Vec::new());
            for &chunk in writes {
                stream.write_all(chunk).await.unwrap();
            }
            String::from_utf8(stream.into_inner()).unwrap()
        })
    }

    #[test]
    fn only_the_version_of_the_status_line_changes() {
        assert_eq!(
            written(&[b"HTTP/1.0 200 OK\r\nA: HTTP/1.0 \r\n\r\nHTTP/1.0 "]),
            "HTTP/1.1 200 OK\r\nA: HTTP/1.0 \r\n\r\nHTTP/1.0 "
        );
        assert_eq!(
            written(&[b"HTT", b"P/1.", b"0 404 Not Found\r\n"]),
            "HTTP/1.1 404 Not Found\r\n"
        );
        assert_eq!(written(&[b"HTTP/1.1 200 OK\r\n"]), "HTTP/1.1 200 OK\r\n");
        assert_eq!(written(&[b"HTTP/1.", b"1 HTTP/1.0 "]), "HTTP/1.1 HTTP/1.0 ");
        assert_eq!(written(&[b"x", b"HTTP/1.0 "]), "xHTTP/1.0 ");
    }
}
