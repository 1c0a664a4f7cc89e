//! ShareFetch and ShareAcknowledge (KIP-932): a ShareFetch answer judged
//! (`intercept::fetch::share`: records of policy topics, the acquired
//! ranges, the acknowledgements the proxy then owes); both kinds with the
//! proxy's own acknowledgement errors kept from the client (partitions
//! where only the proxy acknowledged) and their NodeEndpoints rewritten.
//! The requests carry the acknowledgements the proxy owes and, before
//! them, its renewals of what it withheld ([`request`]). With no policy
//! loaded, the addresses exchange's.

mod request;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ShareAcknowledgeResponse, ShareFetchResponse};
use kafka_protocol::protocol::{Decodable, Encodable};

pub(in crate::proxy) use request::{withheld_reason_cleared, ShareCx};

use super::addresses::Addresses;
use super::{bad, Answer, Classified, Context, Cx, Exchange};
use crate::intercept::fetch::share::ShareCall as Judging;
use crate::intercept::share::{self, wire};
use crate::metrics::{self, ShareSeen};
use crate::proxy::addresses::Seen;
use crate::proxy::error::RelayError;
use crate::transport::frame::{RequestHead, ResponseFrame};

/// What a share request's answer needs.
#[derive(Debug)]
pub(in crate::proxy) struct ShareNeeds {
    pub key: ApiKey,
    /// The share session (group and member named in the request).
    pub session: Option<share::SessionKey>,
    /// Partitions where only the proxy acknowledged in the request: their
    /// acknowledgement errors are the proxy's, not the client's.
    pub proxy_only: Vec<(uuid::Uuid, i32)>,
}

pub(super) struct Share;

impl Exchange for Share {
    type Call = ShareNeeds;

    fn request(frame: &Bytes, head: RequestHead, cx: &Context) -> Result<Classified, RelayError> {
        let key = ApiKey::try_from(head.api_key)
            .map_err(|_| RelayError::BadRequest("unknown api key".into()))?;
        match &cx.share {
            Some(share) => request::request(frame, head, key, share),
            None => Addresses::request(frame, head, cx),
        }
    }

    async fn respond(
        cx: Cx<'_>,
        call: ShareNeeds,
        version: i16,
        frame: Bytes,
    ) -> Result<ResponseFrame, RelayError> {
        let answer = Answer::of(frame, call.key, version)?;
        if call.key != ApiKey::ShareFetch {
            let body = acknowledge(&cx, &call, version, answer.body()).await?;
            return Ok(answer.with(body));
        }
        let body = fetch(&cx, &call, version, answer.body()).await?;
        Ok(match body {
            Some(chunks) => ResponseFrame::chunks(answer.header(), chunks),
            None => answer.with(None),
        })
    }
}

/// A ShareFetch answer, settled and judged, as chunks; `None`: forward as
/// it came.
async fn fetch(
    cx: &Cx<'_>,
    call: &ShareNeeds,
    version: i16,
    body: Bytes,
) -> Result<Option<Vec<Bytes>>, RelayError> {
    let mut seen = ShareSeen::default();
    let settled = if call.proxy_only.is_empty() {
        body
    } else {
        let mut m = ShareFetchResponse::decode(&mut body.clone(), version).map_err(bad)?;
        match wire::settle_fetch_errors(&mut m, &call.proxy_only, &mut seen) {
            true => encode(&m, version)?,
            false => body,
        }
    };
    let judging = Judging {
        session: call.session.as_ref(),
        book: &cx.shared.share_acks,
        removed_ack: cx.shared.config.share_groups.removed_ack.ack_type(),
        last_delivery: cx.shared.config.share_groups.last_delivery,
        settled: seen,
    };
    let filtered = cx
        .shared
        .fetch_filter
        .filter_share(cx.shared, settled.clone(), version, judging)
        .await?;
    // Settled but not filtered: the settled body still goes out.
    Ok(filtered.or_else(|| (!call.proxy_only.is_empty()).then(|| vec![settled])))
}

/// A ShareAcknowledge answer, settled, its NodeEndpoints rewritten.
async fn acknowledge(
    cx: &Cx<'_>,
    call: &ShareNeeds,
    version: i16,
    body: Bytes,
) -> Result<Option<Bytes>, RelayError> {
    let mut m = ShareAcknowledgeResponse::decode(&mut body.clone(), version).map_err(bad)?;
    let mut settled = ShareSeen::default();
    let mut changed = wire::settle_ack_errors(&mut m, &call.proxy_only, &mut settled);
    metrics::global().share_seen(settled);
    let mut seen = Seen::default();
    for e in &mut m.node_endpoints {
        let addrs = &cx.shared.addrs;
        addrs.rewrite_endpoint(e.node_id, &mut e.host, &mut e.port, &mut seen);
        changed = true;
    }
    cx.shared.learn(seen).await;
    changed.then(|| encode(&m, version)).transpose()
}

fn encode<M: Encodable>(m: &M, version: i16) -> Result<Bytes, RelayError> {
    Ok(crate::transport::frame::encode(m, version)
        .map_err(bad)?
        .freeze())
}
