//! Exchanges: what the proxy does with each kind of request and with the
//! broker's answer to it, one [`Exchange`] per API key antidote changes,
//! named in the two tables below ([`request`], [`respond`]). `classify`
//! reads the request header, refuses versions the proxy does not offer and
//! hands the rest to the key's exchange; `relay` keeps the pumps, the
//! correlation of answers with requests and splicing.
//!
//! Every exchange keeps these invariants:
//! - It forwards the bytes untouched unless it has something to change
//!   ([`passthrough`] changes nothing, and is the exchange of every key not
//!   named in the tables); what it changes in an answer it re-frames with
//!   the broker's own response header.
//! - It never forwards what it could not read: a request or an answer that
//!   does not decode is an error that ends this connection (the client
//!   reconnects and asks again), never passed on half-understood.
//! - Broker addresses in any answer are the proxy's before the client sees
//!   them ([`addresses`]: Metadata, FindCoordinator, DescribeCluster, the
//!   NodeEndpoints of Produce, Fetch and share answers), and listeners for
//!   brokers newly named open before the answer is released.
//! - Records of a policy topic reach a client only judged ([`fetch`],
//!   [`share`]): what cannot be judged now is held (Fetch) or withheld
//!   (ShareFetch), never forwarded; a client's Produce to a dead-letter
//!   topic or refused at the door never reaches the broker ([`produce`]).
//! - What the request side decides travels with the request as its
//!   exchange's [`Exchange::Call`] (in [`Handling`]), so the answer is
//!   handled by what its own request said, in order.
//!
//! A new API key: one module implementing [`Exchange`], one variant of
//! [`Handling`] for its `Call`, one line in each table.

mod addresses;
mod api_versions;
mod fetch;
mod passthrough;
mod produce;
mod sasl;
mod share;

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::error::RelayError;
use super::sasl_phase::{Raw, SaslPhase};
use super::{versions, Shared};
use crate::intercept::fetch::Holds;
use crate::intercept::share::renew;
use crate::transport::frame::{Cursor, RequestHead, ResponseFrame, LENGTH_PREFIX, RESPONSE_ID_END};

pub(super) use produce::{learn_topic_ids, ProduceGuard};
pub(super) use share::{withheld_reason_cleared, ShareCx, ShareNeeds};

/// One API key's exchange: what a request needs, and the frame its answer
/// becomes. Implemented by a unit type per key; called through the tables.
pub(super) trait Exchange {
    /// What the answer needs from its request, kept with the request in
    /// [`Handling`] until the answer arrives.
    type Call;

    /// What the answer to the request `frame` (its header `head`, a version
    /// the proxy offers) will need and what goes to the broker; an error
    /// ends the connection.
    fn request(frame: &Bytes, head: RequestHead, cx: &Context) -> Result<Classified, RelayError>;

    /// The frame to send the client for the broker's answer `frame` to a
    /// request of `version` whose exchange decided `call`.
    async fn respond(
        cx: Cx<'_>,
        call: Self::Call,
        version: i16,
        frame: Bytes,
    ) -> Result<ResponseFrame, RelayError>;
}

/// The request table: the exchange of each key.
pub(super) fn request(
    key: ApiKey,
    frame: &Bytes,
    head: RequestHead,
    cx: &Context,
) -> Result<Classified, RelayError> {
    match key {
        ApiKey::ApiVersions => api_versions::ApiVersions::request(frame, head, cx),
        ApiKey::Produce => produce::Produce::request(frame, head, cx),
        ApiKey::SaslHandshake => sasl::Handshake::request(frame, head, cx),
        ApiKey::ShareFetch | ApiKey::ShareAcknowledge => share::Share::request(frame, head, cx),
        ApiKey::Fetch => fetch::Fetch::request(frame, head, cx),
        _ => addresses::Addresses::request(frame, head, cx),
    }
}

/// The response table: the frame to send the client for the broker's
/// answer `frame` to a request whose exchange decided `handling`.
pub(super) async fn respond(
    cx: Cx<'_>,
    handling: Handling,
    version: i16,
    frame: Bytes,
) -> Result<ResponseFrame, RelayError> {
    use passthrough::Passthrough;
    match handling {
        Handling::Forward => Passthrough::respond(cx, (), version, frame).await,
        // The relay answers these without the broker's answer (Local) or
        // reads it itself (`own_answer`); as a frame they pass unchanged.
        Handling::Local(_) | Handling::Discard | Handling::Renewal(_) => {
            Passthrough::respond(cx, (), version, frame).await
        }
        Handling::ApiVersions => api_versions::ApiVersions::respond(cx, (), version, frame).await,
        Handling::SaslHandshake(t) => sasl::Handshake::respond(cx, t, version, frame).await,
        Handling::Addresses(key) => addresses::Addresses::respond(cx, key, version, frame).await,
        Handling::Produce(r) => produce::Produce::respond(cx, r, version, frame).await,
        Handling::Fetch(isolation) => fetch::Fetch::respond(cx, isolation, version, frame).await,
        Handling::Share(call) => share::Share::respond(cx, call, version, frame).await,
    }
}

/// The broker's answer `frame` to one of the proxy's own requests
/// (`handling`: the barrier before closing, or a renewal in a share
/// session): settled, never sent to the client.
pub(super) fn own_answer(shared: &Shared, handling: Handling, frame: &Bytes) {
    if let Handling::Renewal(sent) = handling {
        renew::answered(&shared.share_acks.withheld, sent, frame);
    }
}

/// What the response to one request needs on its way back: one variant
/// per exchange, holding its [`Exchange::Call`], and the proxy's own.
#[derive(Debug)]
pub(super) enum Handling {
    /// Forward the broker's bytes untouched ([`passthrough`]).
    Forward,
    /// The answer to the proxy's own request (the barrier before closing
    /// an acks=0 connection): read and dropped, never sent to the client.
    Discard,
    /// Intersect the broker's API versions with the proxy's ([`api_versions`]).
    ApiVersions,
    /// Rewrite the broker addresses it carries ([`addresses`]).
    Addresses(ApiKey),
    /// Answer from the proxy without asking the broker.
    Local(Bytes),
    /// A Fetch response to judge, at the request's isolation level ([`fetch`]).
    Fetch(i8),
    /// A SaslHandshake answer: the raw SASL tokens its request announced
    /// follow only when a v0 handshake is accepted ([`sasl`]).
    SaslHandshake(super::sasl_phase::Tokens),
    /// A Produce answer into which the partitions the proxy refused
    /// (dead-letter topics, the door) are merged ([`produce`]).
    Produce(crate::intercept::produce::wire::Refused),
    /// A ShareFetch answer to judge, or a ShareAcknowledge answer, in a
    /// share session the proxy may owe acknowledgements to ([`share`]).
    Share(ShareNeeds),
    /// The answer to the proxy's own renewal in a share session
    /// (`intercept::share::renew`): read, settled, never sent to the client.
    Renewal(renew::Sent),
}

/// One request's entry in the connection's queue of answers to come.
#[derive(Debug)]
pub(super) struct Pending {
    pub correlation_id: Option<i32>,
    pub version: i16,
    pub handling: Handling,
}

impl Pending {
    /// The entry of the request `head`, handled as `handling`.
    pub(super) fn of(head: RequestHead, handling: Handling) -> Pending {
        Pending {
            correlation_id: Some(head.correlation_id),
            version: head.api_version,
            handling,
        }
    }
}

/// What the request pump sends to the broker for one client frame.
#[derive(Debug)]
pub(super) enum Send {
    /// The frame as it arrived.
    Original,
    /// A rewritten frame (a Produce without the partitions refused).
    Replaced(Bytes),
    /// Nothing: the proxy answers (or, for acks=0, drops) it itself.
    Nothing,
}

/// One client frame, classified.
#[derive(Debug)]
pub(super) struct Classified {
    pub pending: Option<Pending>,
    pub send: Send,
    /// Close the connection once this frame is sent (and the answers
    /// pending before it are delivered): a Produce with acks=0 some
    /// partition of which the proxy refused. The producer cannot be told
    /// otherwise; Kafka closes the connection in that case too, so that the
    /// producer notices, refreshes its metadata and reports the records.
    pub close: bool,
    /// The proxy's own request, to send (and its answer to expect) before
    /// this frame: a renewal in a share session.
    pub inject: Option<(Pending, Bytes)>,
}

impl Classified {
    /// The request `head` forwarded as it came, its answer handled as `handling`.
    pub(super) fn answered(head: RequestHead, handling: Handling) -> Self {
        Classified::forward(Some(Pending::of(head, handling)))
    }

    /// The frame forwarded as it came, its answer expected as `pending`
    /// (`None`: no answer comes); a local answer sends nothing.
    pub(super) fn forward(pending: Option<Pending>) -> Self {
        let send = match pending.as_ref().map(|p| &p.handling) {
            Some(Handling::Local(_)) => Send::Nothing,
            _ => Send::Original,
        };
        Classified {
            pending,
            send,
            close: false,
            inject: None,
        }
    }
}

/// What the request side needs to know about the connection and the proxy.
pub(super) struct Context<'a> {
    /// What the raw SASL phase makes of this frame.
    pub raw: Raw,
    /// Policies are loaded: records are judged, and no raw SASL exchange of
    /// unknown length is allowed.
    pub policies_loaded: bool,
    /// Set while client Produce requests are checked (writes to
    /// dead-letter topics refused, or a policy with `on_produce: reject`).
    pub produce_guard: Option<&'a dyn crate::intercept::produce::wire::Topics>,
    /// `limits.fetch_max_version`, `share_groups.enabled`.
    pub offer: versions::Offer,
    /// Share sessions' books and this connection's share state, while
    /// policies are loaded.
    pub share: Option<ShareCx<'a>>,
}

/// What the response side may use: the proxy's shared state, this
/// connection's Fetch holds and its SASL and share state.
pub(super) struct Cx<'a> {
    pub shared: &'a Arc<Shared>,
    pub holds: &'a mut Holds,
    pub sasl: &'a SaslPhase,
    pub share: &'a renew::Conn,
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

/// The tagged-field bytes of an empty response header for `key`/`version`.
pub(super) fn response_tags(key: ApiKey, version: i16) -> &'static [u8] {
    if key.response_header_version(version) >= 1 {
        &[0]
    } else {
        &[]
    }
}

fn bad(e: impl std::fmt::Display) -> RelayError {
    RelayError::BadResponse(e.to_string())
}
