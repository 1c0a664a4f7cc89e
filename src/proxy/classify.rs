//! Classifying client requests: what each one's answer will need on its
//! way back, and what goes to the broker. `classify_request` is the request
//! pump's one call: it judges large Produce requests on a blocking thread
//! and, for the door's registry-backed policies, asks the registry and
//! judges again; `classify` itself is synchronous.
//!
//! Requests are peeked by hand (api key, version, correlation id, a few
//! fields), never decoded, except a Produce while client writes to
//! dead-letter topics are refused or a policy judges Produce
//! (`on_produce: reject`): see `produce` and `door`. A request outside the
//! versions the proxy offers is answered UNSUPPORTED_VERSION locally or
//! ends the connection. Raw SASL tokens (after a SaslHandshake v0 the
//! broker accepted) are forwarded unread only while `sasl_phase` says the
//! exchange is still going on.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use crate::intercept::produce as door;
use crate::intercept::share;
use crate::policy::PolicySet;
use crate::proxy::error::RelayError;
use crate::proxy::exchange::{
    self, learn_topic_ids, response_tags, withheld_reason_cleared, Classified, Context, Handling,
    Pending, ProduceGuard, ShareCx,
};
use crate::proxy::sasl_phase::Raw;
use crate::proxy::{versions, Shared};
use crate::transport::frame::{response_frame, RequestHead};

/// Produce frames at least this large are classified (and so judged at the
/// door) on a blocking thread: judging costs about a microsecond per record,
/// and a worker thread busy with it stalls every connection it serves.
const OFFLOAD_BYTES: usize = 256 * 1024;

/// The connection as the request side sees it: what the raw SASL phase
/// makes of this frame, the node id of its broker, its share state.
pub(super) type Conn<'a> = (Raw, i32, &'a share::renew::Conn);

/// Classify one frame of a connection (`head`: its request header, if it
/// has one; `marks`: its partitions the door answered retriably). The
/// frame comes back for sending unless `send` replaces it. A Produce the
/// door could not answer yet for want of schemas is judged again once the
/// registry has answered (at most its `timeout`, 200 ms while it is down),
/// so the request waits, in order on its connection.
pub(super) async fn classify_request(
    shared: &Arc<Shared>,
    marks: &Arc<door::Marks>,
    conn: Conn<'_>,
    (head, frame): (Option<RequestHead>, Bytes),
) -> Result<(Classified, Bytes), RelayError> {
    // Read per request, so a reload applies to open connections too.
    let policies = shared.engine.policies();
    if let Some(head) = head.filter(|h| h.api_key == ApiKey::Produce as i16) {
        learn_topic_ids(shared, &policies, head, &frame).await;
    }
    let on = (shared, marks, &policies);
    let (c, notes) = classify_maybe_offloaded(on, conn, head, frame.clone()).await?;
    // Only a Produce checked at the door leaves notes.
    let Some(notes) = notes else {
        return Ok((c, frame));
    };
    let registry = shared.engine.registry();
    let (c, notes) = match registry {
        Some(registry) if notes.ask_registry() => {
            let now = crate::clock::now_ms();
            for id in notes.recheck() {
                registry.cache().recheck(*id, now, door::RECHECK_FLOOR_MS);
            }
            registry.resolve_wants(registry.wait()).await;
            let again = classify_maybe_offloaded(on, conn, head, frame.clone()).await?;
            (again.0, again.1.unwrap_or_default())
        }
        _ => (c, notes),
    };
    notes.apply(Some(marks), registry.map_or(0, |r| r.outages()));
    Ok((c, frame))
}

/// Classify one frame, large Produce requests off the async workers.
async fn classify_maybe_offloaded(
    (shared, marks, policies): (&Arc<Shared>, &Arc<door::Marks>, &Arc<PolicySet>),
    (raw, node, share_conn): Conn<'_>,
    head: Option<RequestHead>,
    frame: Bytes,
) -> Result<(Classified, Option<door::Notes>), RelayError> {
    let produce = head.is_some_and(|h| h.api_key == ApiKey::Produce as i16);
    if !(produce && frame.len() >= OFFLOAD_BYTES) {
        let on = (&**shared, &**marks, &**policies);
        return classify_with_policies(on, (raw, node, Some(share_conn)), head, &frame);
    }
    let (shared, marks, policies) = (shared.clone(), marks.clone(), policies.clone());
    // A Produce: no share state needed.
    tokio::task::spawn_blocking(move || {
        let on = (&*shared, &*marks, &*policies);
        classify_with_policies(on, (raw, node, None), head, &frame)
    })
    .await
    .map_err(|e| RelayError::BadRequest(format!("judging a Produce request failed: {e}")))?
}

/// Classify one frame under `policies`.
fn classify_with_policies(
    (shared, marks, policies): (&Shared, &door::Marks, &PolicySet),
    (raw_sasl, node, share_conn): (Raw, i32, Option<&share::renew::Conn>),
    head: Option<RequestHead>,
    frame: &Bytes,
) -> Result<(Classified, Option<door::Notes>), RelayError> {
    let loaded = !policies.is_empty();
    let refuse_dlt = !shared.config.dead_letter.allow_client_produce && loaded;
    let guard = ProduceGuard {
        shared,
        policies,
        refuse_dead_letters: refuse_dlt,
        marks: Some(marks),
        notes: Default::default(),
    };
    let checked = refuse_dlt || policies.rejects_at_produce();
    let cleared = |topic_id: uuid::Uuid, reason: &'static str| {
        withheld_reason_cleared(shared, policies, topic_id, reason)
    };
    let share_key = |h: &RequestHead| {
        let k = h.api_key;
        k == ApiKey::ShareFetch as i16 || k == ApiKey::ShareAcknowledge as i16
    };
    let share = share_conn
        .filter(|_| loaded && head.as_ref().is_some_and(share_key))
        .map(|conn| ShareCx::of(shared, node, conn, &cleared));
    let ctx = Context {
        raw: raw_sasl,
        policies_loaded: loaded,
        produce_guard: checked.then_some(&guard as &dyn door::wire::Topics),
        offer: shared.offer,
        share,
    };
    let c = classify(frame, head, &ctx)?;
    let produce = head.is_some_and(|h| h.api_key == ApiKey::Produce as i16);
    Ok((c, (checked && produce).then(|| guard.notes.into_inner())))
}

/// Decide what the response to `frame` (its header `head`, if it has one)
/// will need and what goes to the broker: raw SASL tokens and requests
/// outside the versions the proxy offers here, the rest by the key's
/// exchange. A request the proxy refuses outright is an error (the
/// connection closes).
pub(super) fn classify(
    frame: &Bytes,
    head: Option<RequestHead>,
    ctx: &Context,
) -> Result<Classified, RelayError> {
    if ctx.raw == Raw::Token {
        return Ok(Classified::forward(Some(raw_token())));
    }
    // A v0 exchange of unknown length, allowed only with no policy loaded.
    let open_ended = ctx.raw == Raw::Unbounded && !ctx.policies_loaded;
    let Some(head) = head.filter(|h| is_known_request(h.api_key, h.api_version)) else {
        if open_ended {
            return Ok(Classified::forward(Some(raw_token())));
        }
        return Err(RelayError::BadRequest(match head {
            Some(h) => format!("unknown api key {} version {}", h.api_key, h.api_version),
            None => format!(
                "a {}-byte frame is too short for a request header",
                frame.len()
            ),
        }));
    };
    let key = ApiKey::try_from(head.api_key)
        .map_err(|_| RelayError::BadRequest("unknown api key".into()))?;
    // ApiVersions answers a version newer than it knows itself (KIP-511).
    if key != ApiKey::ApiVersions && !versions::in_proxy_range(key, head.api_version, ctx.offer) {
        // Raw tokens that happen to look like a request are still tokens.
        if open_ended {
            return Ok(Classified::forward(Some(raw_token())));
        }
        let local = Handling::Local(refusal(key, head)?);
        return Ok(Classified::answered(head, local));
    }
    exchange::request(key, frame, head, ctx)
}

/// A raw SASL token: answered by one raw blob, no correlation id.
fn raw_token() -> Pending {
    Pending {
        correlation_id: None,
        version: 0,
        handling: Handling::Forward,
    }
}

/// The UNSUPPORTED_VERSION answer to a request outside the advertised
/// ranges, or an error (closing the connection, as a broker does) when the
/// API has no top-level error code to carry it.
fn refusal(key: ApiKey, head: RequestHead) -> Result<Bytes, RelayError> {
    let v = head.api_version;
    let body = versions::refusal(key, v).ok_or_else(|| {
        RelayError::BadRequest(format!(
            "{key:?} v{v} is outside the versions the proxy offers"
        ))
    })?;
    Ok(response_frame(
        head.correlation_id,
        response_tags(key, v),
        &body,
    ))
}

/// Whether a header names an API key and version the proxy knows; used to
/// tell requests from raw SASL tokens, which never look like one.
pub(super) fn is_known_request(key: i16, version: i16) -> bool {
    ApiKey::try_from(key)
        .map(|k| {
            let r = k.valid_versions();
            // ApiVersions may legitimately be newer than we know (KIP-511).
            version >= 0 && (version <= r.max || k == ApiKey::ApiVersions && version < 100)
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::exchange::Send;
    use crate::proxy::sasl_phase::Tokens;
    use crate::transport::frame;

    fn request(key: i16, version: i16, body: &[u8]) -> Bytes {
        let mut b = vec![];
        b.extend_from_slice(&key.to_be_bytes());
        b.extend_from_slice(&version.to_be_bytes());
        b.extend_from_slice(&7i32.to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
        if ApiKey::try_from(key)
            .map(|k| k.request_header_version(version) >= 2)
            .unwrap_or(false)
        {
            b.push(0); // no tagged fields
        }
        b.extend_from_slice(body);
        frame::with_length_prefix(&b)
    }

    /// `classify` with the header peeked, as the request pump does.
    fn classify(frame: &Bytes, ctx: &Context) -> Result<Classified, RelayError> {
        super::classify(frame, frame::peek_request(frame), ctx)
    }

    fn ctx(raw: Raw) -> Context<'static> {
        Context {
            raw,
            policies_loaded: false,
            produce_guard: None,
            offer: versions::Offer::default(),
            share: None,
        }
    }

    fn pending(frame: &Bytes, raw: Raw) -> Option<Pending> {
        classify(frame, &ctx(raw)).unwrap().pending
    }

    #[test]
    fn produce_with_acks_zero_expects_no_response() {
        // v3: transactional_id null (-1), acks 0
        assert!(pending(&request(0, 3, &[0xff, 0xff, 0, 0]), Raw::Closed).is_none());
        // v9 (flexible): compact null transactional id (0), acks -1
        assert!(pending(&request(0, 9, &[0, 0xff, 0xff]), Raw::Closed).is_some());
    }

    #[test]
    fn raw_sasl_tokens_are_relayed_only_while_the_phase_is_open() {
        let token = frame::with_length_prefix(b"\0admin\0secret");
        assert!(classify(&token, &ctx(Raw::Closed)).is_err());
        let p = pending(&token, Raw::Token).unwrap();
        assert_eq!(p.correlation_id, None);
        // In the open phase every frame is a token, as the broker reads it,
        // even one that looks like an offered request.
        let p = pending(&request(3, 1, &[]), Raw::Token).unwrap();
        assert_eq!(p.correlation_id, None);
        // The handshake itself does not switch modes: its answer does.
        let plain = [&5i16.to_be_bytes()[..], b"PLAIN"].concat();
        let p = pending(&request(17, 0, &plain), Raw::Closed).unwrap();
        assert!(matches!(
            p.handling,
            Handling::SaslHandshake(Tokens::Count(1))
        ));
        let p = pending(&request(17, 1, &plain), Raw::Closed).unwrap();
        assert!(matches!(
            p.handling,
            Handling::SaslHandshake(Tokens::Count(0))
        ));
    }

    #[test]
    fn an_open_ended_raw_exchange_ends_as_soon_as_policies_are_loaded() {
        let fetch3 = request(1, 3, &[]);
        // No policy: a v0 exchange of unknown length keeps today's rule.
        assert!(pending(&fetch3, Raw::Unbounded)
            .unwrap()
            .correlation_id
            .is_none());
        let loaded = Context {
            policies_loaded: true,
            ..ctx(Raw::Unbounded)
        };
        assert!(classify(&fetch3, &loaded).is_err());
        let token = frame::with_length_prefix(b"\x60\x81kerberos");
        assert!(classify(&token, &loaded).is_err());
    }

    #[test]
    fn requests_outside_the_offered_versions_are_refused() {
        // ShareFetch v1 with share groups turned off: answered locally
        // with UNSUPPORTED_VERSION.
        let off = Context {
            offer: versions::Offer {
                share_groups: false,
                ..versions::Offer::default()
            },
            ..ctx(Raw::Closed)
        };
        let c = classify(&request(78, 1, &[]), &off).unwrap();
        assert!(matches!(c.send, Send::Nothing));
        let Some(Pending {
            handling: Handling::Local(out),
            ..
        }) = c.pending
        else {
            panic!("expected a local answer");
        };
        assert_eq!(frame::peek_correlation_id(&out), Some(7));
        // Flexible response header: one empty tagged-field byte, then
        // throttle_time_ms, then error_code.
        assert_eq!(&out[9..13], &[0, 0, 0, 0]);
        assert_eq!(&out[13..15], &35i16.to_be_bytes());
        // Fetch v3 has no top-level error code: the connection closes.
        assert!(classify(&request(1, 3, &[]), &ctx(Raw::Closed)).is_err());
    }

    #[test]
    fn metadata_and_coordinator_responses_are_marked_for_rewriting() {
        for key in [3i16, 10, 60] {
            let p = pending(&request(key, 1, &[]), Raw::Closed).unwrap();
            assert!(matches!(p.handling, Handling::Addresses(_)), "key {key}");
        }
        let p = pending(&request(1, 12, &[]), Raw::Closed).unwrap();
        assert!(matches!(p.handling, Handling::Forward));
    }
}
