//! Share requests: the proxy's acknowledgements owed in the session merged
//! in (`intercept::share::wire`), a renewal of what it withheld in the
//! session injected before the request and the request's epoch advanced
//! (`intercept::share::renew`), and what the answer needs.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::ShareNeeds;
use crate::intercept::share;
use crate::metrics::{self, ShareSeen};
use crate::policy::PolicySet;
use crate::proxy::error::RelayError;
use crate::proxy::exchange::{Classified, Handling, Pending, Send};
use crate::proxy::Shared;
use crate::transport::frame;

/// What a share request needs: the books (acknowledgements owed, ranges
/// withheld), the node id of the broker this connection leads to (-1:
/// bootstrap), the connection's share state and the renewal rules.
pub(in crate::proxy) struct ShareCx<'a> {
    pub book: &'a share::ShareAcks,
    pub node: i32,
    pub conn: &'a share::renew::Conn,
    pub renewing: share::renew::Renewing<'a>,
}

impl<'a> ShareCx<'a> {
    /// The books of `shared`, the connection's share state `conn` to node
    /// `node`, and the renewal rules of the config.
    pub(in crate::proxy) fn of(
        shared: &'a Shared,
        node: i32,
        conn: &'a share::renew::Conn,
        cleared: &'a dyn Fn(uuid::Uuid, &'static str) -> bool,
    ) -> Self {
        let config = &shared.config.share_groups;
        ShareCx {
            book: &shared.share_acks,
            node,
            conn,
            renewing: share::renew::Renewing {
                enabled: config.renew_withheld,
                rules: share::withheld::Rules {
                    max_renewals: config.max_renewals,
                },
                cleared,
            },
        }
    }
}

/// Whether the reason a share consumer's records were withheld for has
/// cleared, as far as the proxy can tell cheaply: the topic's DLTs read
/// back (`not_loaded`), or no policy covers the topic any more. For the
/// other reasons (a DLT write not acknowledged, a registry, a breaker, a
/// batch that cannot be judged) nothing cheap tells: their ranges are
/// released after `share_groups.max_renewals` renewals.
pub(in crate::proxy) fn withheld_reason_cleared(
    shared: &Shared,
    policies: &PolicySet,
    topic_id: uuid::Uuid,
    reason: &'static str,
) -> bool {
    let Some(name) = shared.topic_names.get(&topic_id).map(|n| n.to_string()) else {
        return false;
    };
    match policies.for_topic(&name) {
        None => true,
        Some(_) if reason != "not_loaded" => false,
        Some(policy) => shared.dead_letter.is_loaded_for(policy, &name),
    }
}

/// A ShareFetch or ShareAcknowledge while policies are loaded: the
/// acknowledgements the proxy owes in its session go into it, a renewal of
/// what the proxy withheld in the session goes before it (its epoch then
/// advanced), and its answer is judged (ShareFetch) and settled.
pub(super) fn request(
    frame: &Bytes,
    head: frame::RequestHead,
    key: ApiKey,
    cx: &ShareCx,
) -> Result<Classified, RelayError> {
    let mut seen = ShareSeen::default();
    let out = request_seen(frame, head, key, cx, &mut seen);
    metrics::global().share_seen(seen);
    out
}

/// `request`, what the books did noted in `seen`.
fn request_seen(
    frame: &Bytes,
    head: frame::RequestHead,
    key: ApiKey,
    cx: &ShareCx,
    seen: &mut ShareSeen,
) -> Result<Classified, RelayError> {
    let v = head.api_version;
    let bad = |why: String| RelayError::BadRequest(format!("{key:?} v{v}: {why}"));
    let flexible = key.request_header_version(v) >= 2;
    let at = frame::request_body_offset(frame, flexible)
        .ok_or_else(|| bad("malformed request header".into()))?;
    let now = std::time::Instant::now();
    let body = frame.slice(at..);
    let added = share::wire::add_acks(key, v, &body, cx.node, cx.book, now, seen);
    let added = added.map_err(|e| bad(e.to_string()))?;
    let mut out = match added.body {
        Some(body) => {
            let mut out = Vec::with_capacity(at - frame::LENGTH_PREFIX + body.len());
            out.extend_from_slice(&frame[frame::LENGTH_PREFIX..at]);
            out.extend_from_slice(&body);
            Some(frame::with_length_prefix(&out))
        }
        None => None,
    };
    let mut inject = None;
    let epoch = frame.get(at..).and_then(share::renew::epoch_at);
    if let (Some(session), Some((_, epoch))) = (&added.session, epoch) {
        let book = &cx.book.withheld;
        let renewing = &cx.renewing;
        let before = share::renew::before(cx.conn, book, session, epoch, now, renewing, seen);
        if let Some(epoch) = before.epoch {
            let f = out.as_ref().unwrap_or(frame);
            out = Some(share::renew::set_epoch(f, at, epoch).ok_or_else(|| bad("epoch".into()))?);
        }
        inject = before.inject.map(|i| {
            let p = Pending {
                correlation_id: Some(i.correlation_id),
                version: share::renew::RENEW_VERSION,
                handling: Handling::Renewal(i.sent),
            };
            (p, i.frame)
        });
    }
    Ok(Classified {
        pending: Some(Pending {
            correlation_id: Some(head.correlation_id),
            version: v,
            handling: Handling::Share(ShareNeeds {
                key,
                session: added.session,
                proxy_only: added.proxy_only,
            }),
        }),
        send: out.map_or(Send::Original, Send::Replaced),
        close: false,
        inject,
    })
}
