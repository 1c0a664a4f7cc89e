//! Moving the rest of a forwarded frame from one TCP socket to another
//! through a pipe (Linux `splice(2)`), without copying it into the process.
//!
//! A response the proxy forwards unchanged (no policy looks at it) is bytes
//! in and the same bytes out; read into a buffer and written back, it costs
//! two copies between the kernel and the process. Spliced, the kernel moves
//! the socket's pages into a pipe and from the pipe into the other socket.
//! Only plain TCP on both sides can be spliced (TLS must see the bytes);
//! the relay asks [`AsTcp`] and otherwise copies.
//!
//! The pipe is opened for one frame and closed after it, so an idle
//! connection holds no extra descriptors. It is filled only while empty
//! and then drained completely: a splice into a pipe can find it full of
//! partly used pages before its byte count says so, and an `EAGAIN` from
//! the socket side must mean "nothing to read" for the readiness wait that
//! follows it to be right.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// A stream whose bytes can be spliced: the plain-TCP halves of a
/// connection. Everything else (TLS, the boxed streams) says `None`.
pub trait AsTcp {
    fn as_tcp(&self) -> Option<&TcpStream> {
        None
    }
}

impl AsTcp for tokio::net::tcp::OwnedReadHalf {
    fn as_tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl AsTcp for tokio::net::tcp::OwnedWriteHalf {
    fn as_tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl<T> AsTcp for tokio::io::ReadHalf<T> {}
impl<T> AsTcp for tokio::io::WriteHalf<T> {}

/// Pipe capacity asked for; the kernel may round it or refuse (then the
/// default 64 KiB stays). 1 MiB is the unprivileged maximum by default.
const PIPE_BYTES: usize = 1 << 20;

/// A pipe for one frame, or `None` when none can be opened now (say the
/// descriptor limit is reached): the caller then copies instead.
pub fn pipe() -> Option<Pipe> {
    #[cfg(target_os = "linux")]
    {
        use rustix::pipe::{fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, PipeFlags};
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK).ok()?;
        let _ = fcntl_setpipe_size(&write, PIPE_BYTES);
        let capacity = fcntl_getpipe_size(&write).ok()?;
        Some(Pipe {
            read,
            write,
            capacity,
        })
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Both ends of an empty pipe and its capacity in bytes.
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    /// Move exactly `len` bytes from `from` to `to`. An end of stream on
    /// `from` before `len` bytes is `UnexpectedEof`; errors on `to` are
    /// returned as they are, with [`Side`] saying which socket failed.
    #[cfg(target_os = "linux")]
    pub async fn forward(
        self,
        from: &TcpStream,
        to: &TcpStream,
        mut len: usize,
    ) -> Result<(), (Side, io::Error)> {
        use rustix::pipe::{splice, SpliceFlags};
        let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
        while len > 0 {
            // Fill: the pipe is empty, so EAGAIN means the socket is.
            let mut in_pipe = loop {
                from.readable().await.map_err(|e| (Side::From, e))?;
                let want = len.min(self.capacity);
                match from.try_io(Interest::READABLE, || {
                    splice(from, None, &self.write, None, want, flags).map_err(io::Error::from)
                }) {
                    Ok(0) => return Err((Side::From, io::ErrorKind::UnexpectedEof.into())),
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err((Side::From, e)),
                }
            };
            len -= in_pipe;
            // Drain: the pipe holds bytes, so EAGAIN means the socket is full.
            while in_pipe > 0 {
                to.writable().await.map_err(|e| (Side::To, e))?;
                match to.try_io(Interest::WRITABLE, || {
                    splice(&self.read, None, to, None, in_pipe, flags).map_err(io::Error::from)
                }) {
                    Ok(0) => return Err((Side::To, io::ErrorKind::WriteZero.into())),
                    Ok(n) => in_pipe -= n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err((Side::To, e)),
                }
            }
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub async fn forward(
        self,
        _from: &TcpStream,
        _to: &TcpStream,
        _len: usize,
    ) -> Result<(), (Side, io::Error)> {
        Err((Side::From, io::ErrorKind::Unsupported.into()))
    }
}

/// Which socket a splice failed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    From,
    To,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of TCP streams on loopback.
    pub(crate) async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn moves_exactly_len_bytes_and_leaves_the_rest() {
        let (mut src_w, src_r) = pair().await;
        let (dst_w, mut dst_r) = pair().await;
        // 5 MiB in uneven writes, then a tail that must stay unread.
        let body: Vec<u8> = (0..5 * 1024 * 1024 + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let tail = b"next frame".to_vec();
        let writer = {
            let (body, tail) = (body.clone(), tail.clone());
            tokio::spawn(async move {
                for chunk in body.chunks(300_001) {
                    src_w.write_all(chunk).await.unwrap();
                }
                src_w.write_all(&tail).await.unwrap();
                src_w
            })
        };
        let reader = {
            let n = body.len();
            tokio::spawn(async move {
                let mut got = vec![0; n];
                dst_r.read_exact(&mut got).await.unwrap();
                got
            })
        };
        pipe()
            .unwrap()
            .forward(&src_r, &dst_w, body.len())
            .await
            .unwrap();
        assert!(reader.await.unwrap() == body);
        let _src_w = writer.await.unwrap();
        let mut rest = vec![0; tail.len()];
        let mut src_r = src_r;
        src_r.read_exact(&mut rest).await.unwrap();
        assert_eq!(rest, tail);
    }

    #[tokio::test]
    async fn a_slow_reader_gets_every_byte_in_order() {
        // The destination fills up (EAGAIN on the drain side) many times.
        let (mut src_w, src_r) = pair().await;
        let (dst_w, mut dst_r) = pair().await;
        let body: Vec<u8> = (0..12 << 20).map(|i| (i % 241) as u8).collect();
        let n = body.len();
        let writer = {
            let body = body.clone();
            tokio::spawn(async move { src_w.write_all(&body).await.unwrap() })
        };
        let reader = tokio::spawn(async move {
            let mut got = Vec::with_capacity(n);
            let mut chunk = vec![0; 256 * 1024];
            while got.len() < n {
                let k = dst_r.read(&mut chunk).await.unwrap();
                assert!(k > 0, "closed after {} bytes", got.len());
                got.extend_from_slice(&chunk[..k]);
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            got
        });
        pipe().unwrap().forward(&src_r, &dst_w, n).await.unwrap();
        writer.await.unwrap();
        assert!(reader.await.unwrap() == body);
    }

    #[tokio::test]
    async fn an_early_end_of_stream_is_an_error_of_the_source() {
        let (mut src_w, src_r) = pair().await;
        let (dst_w, _dst_r) = pair().await;
        src_w.write_all(&[1; 1000]).await.unwrap();
        drop(src_w);
        let err = pipe()
            .unwrap()
            .forward(&src_r, &dst_w, 2000)
            .await
            .unwrap_err();
        assert_eq!(err.0, Side::From);
        assert_eq!(err.1.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_closed_destination_is_an_error_of_the_destination() {
        let (mut src_w, src_r) = pair().await;
        let (dst_w, dst_r) = pair().await;
        drop(dst_r);
        tokio::spawn(async move {
            let _ = src_w.write_all(&vec![7; 8 << 20]).await;
        });
        let err = pipe()
            .unwrap()
            .forward(&src_r, &dst_w, 8 << 20)
            .await
            .unwrap_err();
        assert_eq!(err.0, Side::To);
    }
}
