//! Exchanges: what the proxy does with the broker's answer to each kind of
//! request, one module per kind, chosen by the `Handling` the request side
//! (`classify`) decided for that request. `relay` keeps the pumps, the
//! correlation of answers with requests and splicing; everything an API
//! key changes in its answer lives here.
//!
//! Every exchange keeps these invariants:
//! - It forwards the broker's bytes untouched unless it has something to
//!   change ([`passthrough`] changes nothing, and is the exchange of every
//!   key not named below); what it changes it re-frames with the broker's
//!   own response header.
//! - It never forwards what it could not read: an answer that does not
//!   decode is an error that ends this connection (the client reconnects
//!   and asks again), never passed on half-understood.
//! - Broker addresses in any answer are the proxy's before the client sees
//!   them ([`addresses`]: Metadata, FindCoordinator, DescribeCluster, the
//!   NodeEndpoints of Produce, Fetch and share answers), and listeners for
//!   brokers newly named open before the answer is released.
//! - Records of a policy topic reach a client only judged ([`fetch`],
//!   [`share`]): what cannot be judged now is held (Fetch) or withheld
//!   (ShareFetch), never forwarded.
//!
//! The table, by `Handling`: `Forward`, `Local`, `SaslHandshake` ->
//! [`passthrough`]; `ApiVersions` -> [`api_versions`]; `Addresses` ->
//! [`addresses`]; `Produce` -> [`produce`]; `Fetch` -> [`fetch`];
//! `Share` -> [`share`].

mod addresses;
mod api_versions;
mod fetch;
mod passthrough;
mod produce;
mod share;

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::classify::Handling;
use super::error::RelayError;
use super::Shared;
use crate::intercept::fetch::Holds;
use crate::transport::frame::{Cursor, ResponseFrame, LENGTH_PREFIX, RESPONSE_ID_END};

/// What an exchange may use: the proxy's shared state and this
/// connection's Fetch holds.
pub(super) struct Cx<'a> {
    pub shared: &'a Arc<Shared>,
    pub holds: &'a mut Holds,
}

/// The frame to send the client for the broker's answer `frame` to a
/// request that was classified `handling`.
pub(super) async fn respond(
    cx: Cx<'_>,
    handling: Handling,
    version: i16,
    frame: Bytes,
) -> Result<ResponseFrame, RelayError> {
    match handling {
        // Discard and Renewal never get here: the response pump takes their answers.
        Handling::Forward
        | Handling::Local(_)
        | Handling::SaslHandshake(_)
        | Handling::Discard
        | Handling::Renewal(_) => Ok(passthrough::respond(frame)),
        Handling::ApiVersions => api_versions::respond(cx, version, frame),
        Handling::Addresses(key) => addresses::respond(cx, key, version, frame).await,
        Handling::Produce(refused) => produce::respond(cx, &refused, version, frame).await,
        Handling::Fetch { isolation } => fetch::respond(cx, isolation, version, frame).await,
        Handling::Share(call) => share::respond(cx, &call, version, frame).await,
    }
}

/// An answer split at its body: the frame's response header (without the
/// length prefix) and the body.
pub(super) struct Answer {
    frame: Bytes,
    header_end: usize,
}

impl Answer {
    /// `frame` (an answer to `key` at `version`), split.
    fn of(frame: Bytes, key: ApiKey, version: i16) -> Result<Answer, RelayError> {
        let mut r = Cursor::new(&frame, RESPONSE_ID_END);
        if key.response_header_version(version) >= 1 {
            r.skip_tagged_fields()
                .ok_or_else(|| RelayError::BadResponse(format!("{key:?} response header")))?;
        }
        let header_end = r.pos();
        Ok(Answer { frame, header_end })
    }

    fn body(&self) -> Bytes {
        self.frame.slice(self.header_end..)
    }

    fn header(&self) -> &[u8] {
        &self.frame[LENGTH_PREFIX..self.header_end]
    }

    /// The frame to send: the broker's own if `body` is `None`, else its
    /// header with `body`.
    fn with(self, body: Option<Bytes>) -> ResponseFrame {
        match body {
            Some(body) => ResponseFrame::new(self.header(), body),
            None => ResponseFrame::whole(self.frame),
        }
    }
}

fn bad(e: impl std::fmt::Display) -> RelayError {
    RelayError::BadResponse(e.to_string())
}
