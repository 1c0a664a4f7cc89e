//! Byte streams: plaintext or TLS, to clients and to brokers, behind one type
//! so the relay does not care which it has.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::HostPort;
use crate::transport::tls;

/// Anything the relay can read frames from and write frames to.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A boxed stream, plaintext or TLS.
pub type BoxIo = Box<dyn Io>;

/// One side of a relayed connection: plain TCP kept as such (its bytes can
/// be spliced, `transport::splice`), or a TLS stream.
pub enum Conn {
    Tcp(TcpStream),
    Boxed(BoxIo),
}

impl Conn {
    pub fn boxed(self) -> BoxIo {
        match self {
            Conn::Tcp(t) => Box::new(t),
            Conn::Boxed(b) => b,
        }
    }
}

/// Open a connection to a broker, with TLS when configured.
pub async fn connect(
    addr: &HostPort,
    tls: Option<&tls::Upstream>,
    timeout: Duration,
) -> std::io::Result<BoxIo> {
    connect_conn(addr, tls, timeout).await.map(Conn::boxed)
}

/// [`connect`], keeping a plain TCP connection unboxed.
pub async fn connect_conn(
    addr: &HostPort,
    tls: Option<&tls::Upstream>,
    timeout: Duration,
) -> std::io::Result<Conn> {
    let target = (addr.host.as_str(), addr.port);
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(target))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connecting to {addr} timed out"),
            )
        })??;
    tcp.set_nodelay(true)?;
    match tls {
        None => Ok(Conn::Tcp(tcp)),
        Some(t) => {
            let name = t
                .server_name(&addr.host)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let stream = tokio::time::timeout(timeout, t.connector.connect(name, tcp))
                .await
                .map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("TLS handshake with {addr} timed out"),
                    )
                })??;
            Ok(Conn::Boxed(Box::new(stream)))
        }
    }
}
