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

/// Open a connection to a broker, with TLS when configured.
pub async fn connect(
    addr: &HostPort,
    tls: Option<&tls::Upstream>,
    timeout: Duration,
) -> std::io::Result<BoxIo> {
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
        None => Ok(Box::new(tcp)),
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
            Ok(Box::new(stream))
        }
    }
}
