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

/// While a frame is spliced, the source socket reports itself readable
/// only once this many of the frame's bytes (or all that are left) have
/// arrived (`SO_RCVLOWAT`). Without it, every 64 KiB loopback segment woke
/// the task for a splice in and a splice out. It is also kept to a quarter
/// of the socket's receive buffer (`SO_RCVBUF`, which counts the kernel's
/// overhead too), so that the window the broker may send into always holds
/// it: kernels before 4.18 do not grow the buffer to the mark. The buffer
/// grows as the connection is read, so only a connection's first frames get
/// a lower mark.
const LOW_WATER: usize = 256 << 10;

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
        let mut low_water = LowWater {
            socket: from,
            set: 1,
        };
        let most = rustix::net::sockopt::socket_recv_buffer_size(from).map_or(1, |b| b / 4);
        while len > 0 {
            // Never above what is left of the frame, so the wait always ends.
            low_water.ask(len.min(self.capacity).min(LOW_WATER).min(most).max(1));
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

/// The source socket's `SO_RCVLOWAT` while a frame is spliced, back to 1
/// (the default: readable at the first byte) when the frame is done or
/// its forwarding fails.
#[cfg(target_os = "linux")]
struct LowWater<'a> {
    socket: &'a TcpStream,
    set: usize,
}

#[cfg(target_os = "linux")]
impl LowWater<'_> {
    /// Ask for `bytes`. A socket that refuses keeps waking at every
    /// segment, which costs only wakeups.
    fn ask(&mut self, bytes: usize) {
        if bytes != self.set && set_rcvlowat(self.socket, bytes).is_ok() {
            self.set = bytes;
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for LowWater<'_> {
    fn drop(&mut self) {
        self.ask(1);
    }
}

#[cfg(target_os = "linux")]
fn set_rcvlowat(socket: &TcpStream, bytes: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is open for as long as `socket` is borrowed,
    // and the option value is a live c_int whose size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
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
        // The next frame's first bytes wake the reader again.
        assert_eq!(rcvlowat(&src_r), 1);
        let mut rest = vec![0; tail.len()];
        let mut src_r = src_r;
        src_r.read_exact(&mut rest).await.unwrap();
        assert_eq!(rest, tail);
    }

    /// The source socket's `SO_RCVLOWAT`.
    fn rcvlowat(s: &TcpStream) -> libc::c_int {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a live c_int and its size, on a descriptor open for the borrow.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                std::ptr::from_mut(&mut v).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        v
    }

    /// Forward `n` bytes from `src` to `dst` (whose other end is `dst_r`),
    /// failing after 10 s; what `dst_r` received.
    async fn forward_within_10s(
        src: &TcpStream,
        dst: &TcpStream,
        mut dst_r: TcpStream,
        n: usize,
    ) -> Vec<u8> {
        let reader = tokio::spawn(async move {
            let mut got = vec![0; n];
            dst_r.read_exact(&mut got).await.unwrap();
            got
        });
        let forwarded = pipe().unwrap().forward(src, dst, n);
        tokio::time::timeout(std::time::Duration::from_secs(10), forwarded)
            .await
            .expect("forwarded within 10 s")
            .unwrap();
        reader.await.unwrap()
    }

    #[tokio::test]
    async fn a_frame_trickling_in_below_the_low_water_mark_is_still_forwarded() {
        // 300 KiB in 7 KiB pieces, 1 ms apart: the mark (256 KiB, then
        // what is left) is never more than what will arrive.
        let (mut src_w, src_r) = pair().await;
        let (dst_w, dst_r) = pair().await;
        let body: Vec<u8> = (0..300 * 1024 + 1).map(|i| (i % 239) as u8).collect();
        let n = body.len();
        let writer = {
            let body = body.clone();
            tokio::spawn(async move {
                for piece in body.chunks(7 * 1024) {
                    src_w.write_all(piece).await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                src_w
            })
        };
        assert!(forward_within_10s(&src_r, &dst_w, dst_r, n).await == body);
        assert_eq!(rcvlowat(&src_r), 1);
        let _src_w = writer.await.unwrap();
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
    async fn a_source_with_a_small_fixed_receive_buffer_is_still_forwarded() {
        // SO_RCVBUF set by hand is never grown by the kernel, so the
        // 256 KiB mark is above the window the broker may send into. The
        // mark is kept to a quarter of the buffer for kernels before 4.18,
        // which would then wait forever; this kernel wakes the reader anyway
        // when the window is nearly closed, so here this only checks that
        // such a socket is forwarded at all.
        let (mut src_w, src_r) = pair().await;
        let (dst_w, dst_r) = pair().await;
        rustix::net::sockopt::set_socket_recv_buffer_size(&src_r, 16 * 1024).unwrap();
        let body: Vec<u8> = (0..1 << 20).map(|i| (i % 233) as u8).collect();
        let n = body.len();
        let writer = {
            let body = body.clone();
            tokio::spawn(async move { src_w.write_all(&body).await.unwrap() })
        };
        assert!(forward_within_10s(&src_r, &dst_w, dst_r, n).await == body);
        writer.await.unwrap();
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
        assert_eq!(rcvlowat(&src_r), 1);
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
