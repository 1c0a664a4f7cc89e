//! Why a relayed connection ended abnormally: the one error type of the
//! pumps (`relay`), the request classifier (`classify`) and the raw SASL
//! phase (`sasl_phase`), so that none of them imports another for it.

use crate::transport::frame::FrameError;

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("client: {0}")]
    ClientFrame(FrameError),
    #[error("broker: {0}")]
    BrokerFrame(FrameError),
    #[error("client sent a malformed request: {0}")]
    BadRequest(String),
    #[error("refused the client's request: {0}")]
    Refused(String),
    #[error("broker sent a malformed response: {0}")]
    BadResponse(String),
    #[error("Fetch response: {0}")]
    Filter(#[from] crate::intercept::fetch::FilterError),
    #[error("broker closed the connection with {0} response(s) pending")]
    BrokerClosed(usize),
    #[error("writing to client: {0}")]
    ClientWrite(std::io::Error),
    #[error("writing to broker: {0}")]
    BrokerWrite(std::io::Error),
}
