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

use crate::intercept::produce::{self as door, wire as produce};
use crate::intercept::share;
use crate::policy::PolicySet;
use crate::proxy::error::RelayError;
use crate::proxy::sasl_phase::{self, Raw, Tokens};
use crate::proxy::{addresses, versions, Shared};

mod share_request;
use crate::transport::frame::{self, response_frame, Cursor};
pub(super) use share_request::ShareCx;

/// What the response to one request needs on its way back.
#[derive(Debug)]
pub(super) enum Handling {
    /// Forward the broker's bytes untouched.
    Forward,
    /// The answer to the proxy's own request (the barrier before closing
    /// an acks=0 connection): read and dropped, never sent to the client.
    Discard,
    /// Intersect the broker's API versions with the proxy's.
    ApiVersions,
    /// Rewrite the broker addresses it carries.
    Addresses(ApiKey),
    /// Answer from the proxy without asking the broker.
    Local(Bytes),
    /// A Fetch response to inspect for poison records.
    Fetch { isolation: i8 },
    /// A SaslHandshake answer: the raw SASL tokens its request announced
    /// follow only when a v0 handshake is accepted (with v1 they travel in
    /// SaslAuthenticate).
    SaslHandshake(Tokens),
    /// A Produce answer into which the partitions the proxy refused
    /// (dead-letter topics, the door) are merged.
    Produce(produce::Refused),
    /// A ShareFetch answer to judge, or a ShareAcknowledge answer, in a
    /// share session the proxy may owe acknowledgements to.
    Share(ShareCall),
    /// The answer to the proxy's own renewal in a share session
    /// (`intercept::share::renew`): read, settled, never sent to the client.
    Renewal(share::renew::Sent),
}

/// A share request's context for its answer (`intercept::share`).
#[derive(Debug)]
pub(super) struct ShareCall {
    pub key: ApiKey,
    /// The share session (group and member named in the request).
    pub session: Option<share::SessionKey>,
    /// Partitions where only the proxy acknowledged in the request: their
    /// acknowledgement errors are the proxy's, not the client's.
    pub proxy_only: Vec<(uuid::Uuid, i32)>,
}

#[derive(Debug)]
pub(super) struct Pending {
    pub correlation_id: Option<i32>,
    pub version: i16,
    pub handling: Handling,
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
    fn forward(pending: Option<Pending>) -> Self {
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

/// What classifying a request needs to know about the connection and the proxy.
pub(super) struct Context<'a> {
    /// What the raw SASL phase makes of this frame.
    pub raw: Raw,
    /// Policies are loaded: no raw SASL exchange of unknown length is allowed.
    pub policies_loaded: bool,
    pub intercepting: bool,
    /// Set while client Produce requests are checked (writes to
    /// dead-letter topics refused, or a policy with `on_produce: reject`).
    pub produce_guard: Option<&'a dyn produce::Topics>,
    /// `limits.fetch_max_version`, `share_groups.enabled`.
    pub offer: versions::Offer,
    /// Share sessions' books and this connection's share state, while
    /// policies are loaded.
    pub share: Option<ShareCx<'a>>,
}

/// Produce requests as the current policies see them: dead-letter topics
/// (when client writes to them are refused) and the door; topic ids are
/// resolved through the proxy's metadata.
pub(super) struct ProduceGuard<'a> {
    pub shared: &'a Shared,
    pub policies: &'a PolicySet,
    pub refuse_dead_letters: bool,
    /// The connection's partitions answered retriably.
    pub marks: Option<&'a door::Marks>,
    /// What judging left to do (filled while the request is checked).
    pub notes: std::cell::RefCell<door::Notes>,
}

impl produce::Topics for ProduceGuard<'_> {
    fn is_dead_letter(&self, name: &str) -> bool {
        self.refuse_dead_letters && self.policies.is_dead_letter_topic(name)
    }
    fn name_of(&self, id: &uuid::Uuid) -> Option<String> {
        self.shared.topic_names.get(id).map(|n| n.to_string())
    }
    fn at_door(
        &self,
        topic: Option<&str>,
        partition: i32,
        records: &Bytes,
    ) -> Option<produce::Refusal> {
        match door::gate(self.policies, topic) {
            door::Gate::Open => None,
            door::Gate::UnknownTopic => Some(door::unknown_topic_id()),
            door::Gate::Judge(policy) => {
                let topic = topic.unwrap_or_default();
                let budget = &self.shared.engine.budget;
                if let Some(r) = self
                    .marks
                    .and_then(|m| m.still_refused(topic, partition, records))
                {
                    return Some(r);
                }
                let mut notes = self.notes.borrow_mut();
                door::judge(policy, topic, partition, records, budget, &mut notes)
            }
        }
    }
}

/// Produce v13+ names topics by id: before checking it for dead-letter
/// topics and at the door, look up ids the proxy has not seen (a topic
/// created since the last metadata refresh). Ids still unknown are not
/// dead-letter topics the proxy knows of (the broker answers for them);
/// the door refuses them retriably (UNKNOWN_TOPIC_ID).
pub(super) async fn learn_produce_topic_ids(shared: &Arc<Shared>, frame: &Bytes) {
    let Some(head) = frame::peek_request(frame) else {
        return;
    };
    let checked = !shared.config.dead_letter.allow_client_produce
        || shared.engine.policies().rejects_at_produce();
    if head.api_key != ApiKey::Produce as i16
        || head.api_version < 13
        || !checked
        || !shared.intercepting()
    {
        return;
    }
    let ids = produce::topic_ids(frame, head.api_version);
    if ids.iter().any(|id| !shared.topic_names.contains_key(id)) {
        shared.resolve_topic_ids(&ids).await;
    }
}

/// Produce frames at least this large are classified (and so judged at the
/// door) on a blocking thread: judging costs about a microsecond per record,
/// and a worker thread busy with it stalls every connection it serves.
const OFFLOAD_BYTES: usize = 256 * 1024;

/// Classify one frame of a connection (`marks`: its partitions the door
/// answered retriably; `raw_sasl`: what the raw SASL phase makes of it).
/// The frame comes back for sending unless `send` replaces it. A Produce
/// the door could not answer yet for want of schemas is judged again once
/// the registry has answered (at most its `timeout`, 200 ms while it is
/// down), so the request waits, in order on its connection.
pub(super) async fn classify_request(
    shared: &Arc<Shared>,
    marks: &Arc<door::Marks>,
    (raw_sasl, node, share_conn): (Raw, i32, &share::renew::Conn),
    frame: Bytes,
) -> Result<(Classified, Bytes), RelayError> {
    let conn = (raw_sasl, node, share_conn);
    let (c, notes) = classify_maybe_offloaded(shared, marks, conn, frame.clone()).await?;
    let registry = shared.engine.registry();
    let (c, notes) = match registry {
        Some(registry) if notes.ask_registry() => {
            let now = crate::clock::now_ms();
            for id in notes.recheck() {
                registry.cache().recheck(*id, now, door::RECHECK_FLOOR_MS);
            }
            registry.resolve_wants(registry.wait()).await;
            classify_maybe_offloaded(shared, marks, conn, frame.clone()).await?
        }
        _ => (c, notes),
    };
    let outage = registry.map_or(0, |r| r.outages());
    notes.apply(Some(marks), outage);
    Ok((c, frame))
}

/// Classify one frame, large Produce requests off the async workers.
async fn classify_maybe_offloaded(
    shared: &Arc<Shared>,
    marks: &Arc<door::Marks>,
    (raw, node, share_conn): (Raw, i32, &share::renew::Conn),
    frame: Bytes,
) -> Result<(Classified, door::Notes), RelayError> {
    let produce = frame::peek_request(&frame).is_some_and(|h| h.api_key == ApiKey::Produce as i16);
    if !(produce && frame.len() >= OFFLOAD_BYTES) {
        return classify_with_policies(shared, marks, (raw, node, Some(share_conn)), &frame);
    }
    let shared = shared.clone();
    let marks = marks.clone();
    // A Produce: no share state needed.
    tokio::task::spawn_blocking(move || {
        classify_with_policies(&shared, &marks, (raw, node, None), &frame)
    })
    .await
    .map_err(|e| RelayError::BadRequest(format!("judging a Produce request failed: {e}")))?
}

/// Classify one frame under the current policies (read per request, so a
/// reload applies to open connections too).
fn classify_with_policies(
    shared: &Shared,
    marks: &door::Marks,
    (raw_sasl, node, share_conn): (Raw, i32, Option<&share::renew::Conn>),
    frame: &Bytes,
) -> Result<(Classified, door::Notes), RelayError> {
    let policies = shared.engine.policies();
    let refuse_dlt = !shared.config.dead_letter.allow_client_produce && !policies.is_empty();
    let guard = ProduceGuard {
        shared,
        policies: &policies,
        refuse_dead_letters: refuse_dlt,
        marks: Some(marks),
        notes: Default::default(),
    };
    let checked = refuse_dlt || policies.rejects_at_produce();
    let cleared = |topic_id: uuid::Uuid, reason: &'static str| {
        share_request::withheld_reason_cleared(shared, &policies, topic_id, reason)
    };
    let share = share_conn
        .filter(|_| shared.intercepting())
        .map(|conn| ShareCx::of(shared, node, conn, &cleared));
    let ctx = Context {
        raw: raw_sasl,
        policies_loaded: !policies.is_empty(),
        intercepting: shared.intercepting(),
        produce_guard: checked.then_some(&guard as &dyn produce::Topics),
        offer: versions::Offer::of(&shared.config),
        share,
    };
    let c = classify(frame, &ctx)?;
    Ok((c, guard.notes.into_inner()))
}

/// The isolation level of a Fetch request (v4+), found by hand.
fn fetch_isolation(frame: &[u8], version: i16) -> Option<i8> {
    let flexible = ApiKey::Fetch.request_header_version(version) >= 2;
    let mut r = Cursor::new(frame, frame::request_body_offset(frame, flexible)?);
    if version < 15 {
        r.i32()?; // replica_id (a tagged field from v15)
    }
    r.skip(12)?; // max_wait_ms, min_bytes, max_bytes
    if version >= 4 {
        r.i8()
    } else {
        Some(0)
    }
}

/// Decide what the response to `frame` will need and what goes to the
/// broker; a request the proxy refuses outright is an error (the
/// connection closes).
pub(super) fn classify(frame: &Bytes, ctx: &Context) -> Result<Classified, RelayError> {
    if ctx.raw == Raw::Token {
        return Ok(Classified::forward(Some(raw_token())));
    }
    // A v0 exchange of unknown length, allowed only with no policy loaded.
    let open_ended = ctx.raw == Raw::Unbounded && !ctx.policies_loaded;
    let head = frame::peek_request(frame).filter(|h| is_known_request(h.api_key, h.api_version));
    let Some(head) = head else {
        if open_ended {
            return Ok(Classified::forward(Some(raw_token())));
        }
        return Err(RelayError::BadRequest(match frame::peek_request(frame) {
            Some(h) => format!("unknown api key {} version {}", h.api_key, h.api_version),
            None => format!(
                "a {}-byte frame is too short for a request header",
                frame.len()
            ),
        }));
    };
    let key = ApiKey::try_from(head.api_key)
        .map_err(|_| RelayError::BadRequest("unknown api key".into()))?;
    let v = head.api_version;
    let pending = |handling| Pending {
        correlation_id: Some(head.correlation_id),
        version: v,
        handling,
    };
    let handling = match key {
        ApiKey::ApiVersions if v > versions::max_api_versions_version() => {
            let body = versions::unsupported_version_body()
                .map_err(|e| RelayError::BadRequest(e.to_string()))?;
            Handling::Local(response_frame(head.correlation_id, &[], &body))
        }
        // Raw tokens that happen to look like a request are still tokens.
        _ if !versions::in_proxy_range(key, v, ctx.offer) && open_ended => {
            return Ok(Classified::forward(Some(raw_token())))
        }
        _ if !versions::in_proxy_range(key, v, ctx.offer) => Handling::Local(refusal(key, head)?),
        ApiKey::ApiVersions => Handling::ApiVersions,
        ApiKey::Produce if ctx.produce_guard.is_some() => {
            return classify_produce(frame, head, ctx.produce_guard)
        }
        ApiKey::Produce if produce_acks(frame, v) == Some(0) => {
            return Ok(Classified::forward(None))
        }
        ApiKey::SaslHandshake => {
            Handling::SaslHandshake(sasl_phase::handshake(frame, v, ctx.policies_loaded)?)
        }
        ApiKey::ShareFetch | ApiKey::ShareAcknowledge if ctx.share.is_some() => {
            return share_request::classify_share(frame, head, key, ctx.share.as_ref());
        }
        ApiKey::Fetch if ctx.intercepting => Handling::Fetch {
            isolation: fetch_isolation(frame, v)
                .ok_or_else(|| RelayError::BadRequest("truncated Fetch request".into()))?,
        },
        k if addresses::carries_addresses(k, v) => Handling::Addresses(k),
        _ => Handling::Forward,
    };
    Ok(Classified::forward(Some(pending(handling))))
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
fn refusal(key: ApiKey, head: frame::RequestHead) -> Result<Bytes, RelayError> {
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

/// The tagged-field bytes of an empty response header for `key`/`version`.
fn response_tags(key: ApiKey, version: i16) -> &'static [u8] {
    if key.response_header_version(version) >= 1 {
        &[0]
    } else {
        &[]
    }
}

/// A Produce while writes to dead-letter topics are refused or a policy
/// judges Produce.
fn classify_produce(
    frame: &Bytes,
    head: frame::RequestHead,
    topics: Option<&dyn produce::Topics>,
) -> Result<Classified, RelayError> {
    let v = head.api_version;
    let pending = |handling| {
        Some(Pending {
            correlation_id: Some(head.correlation_id),
            version: v,
            handling,
        })
    };
    let decision = match topics {
        Some(t) => {
            produce::check(frame, v, t).map_err(|e| RelayError::BadRequest(e.to_string()))?
        }
        None => produce::Decision::Untouched,
    };
    Ok(match decision {
        produce::Decision::Untouched => match produce_acks(frame, v) {
            Some(0) => Classified::forward(None),
            _ if addresses::carries_addresses(ApiKey::Produce, v) => {
                Classified::forward(pending(Handling::Addresses(ApiKey::Produce)))
            }
            _ => Classified::forward(pending(Handling::Forward)),
        },
        produce::Decision::Split {
            request,
            refused,
            acks,
        } => Classified {
            pending: if acks == 0 {
                None
            } else {
                pending(Handling::Produce(refused))
            },
            send: Send::Replaced(request),
            close: acks == 0,
            inject: None,
        },
        produce::Decision::AllRefused { body } => Classified {
            close: body.is_none(),
            pending: body.and_then(|b| {
                let out =
                    response_frame(head.correlation_id, response_tags(ApiKey::Produce, v), &b);
                pending(Handling::Local(out))
            }),
            send: Send::Nothing,
            inject: None,
        },
    })
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

/// The `acks` field of a Produce request, found by hand so that produce
/// traffic is never decoded.
fn produce_acks(frame: &[u8], version: i16) -> Option<i16> {
    let flexible = ApiKey::Produce.request_header_version(version) >= 2;
    let mut r = Cursor::new(frame, frame::request_body_offset(frame, flexible)?);
    if version >= 3 {
        r.skip_nullable_string(version >= 9)?; // transactional_id
    }
    r.i16()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn ctx(raw: Raw) -> Context<'static> {
        Context {
            raw,
            policies_loaded: false,
            intercepting: false,
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
        assert_eq!(produce_acks(&request(0, 2, &[0, 1]), 2), Some(1));
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
