//! Share requests and answers on the wire: the proxy's acknowledgements
//! merged into a client's ShareFetch or ShareAcknowledge (`add_acks`), and
//! the broker's acknowledgement errors kept from the client for the
//! partitions only the proxy acknowledged (`settle_*`): those errors are
//! the proxy's, and hold nothing the client needs (a record whose
//! acknowledgement failed comes back when its lock expires, and is judged
//! and settled again).

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::share_acknowledge_request::{
    AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch as AckBatchA,
};
use kafka_protocol::messages::share_fetch_request::{
    AcknowledgementBatch as AckBatchF, FetchPartition, FetchTopic,
};
use kafka_protocol::messages::{
    ApiKey, ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest,
    ShareFetchResponse,
};
use kafka_protocol::protocol::Decodable;
use tracing::debug;
use uuid::Uuid;

use super::acks::{Owed, ShareAcks};
use super::SessionKey;
use crate::metrics::ShareSeen;
use crate::plan::share::{self, AckBatch};

/// What adding the proxy's acknowledgements did to one request.
#[derive(Debug, Default)]
pub struct Added {
    /// The request's new body, when acknowledgements were added.
    pub body: Option<BytesMut>,
    /// The share session the request belongs to (group and member named).
    pub session: Option<SessionKey>,
    /// Partitions where only the proxy acknowledged in this request.
    pub proxy_only: Vec<(Uuid, i32)>,
}

/// The proxy's acknowledgements owed in the session of this ShareFetch
/// (`key`) or ShareAcknowledge request, merged into it. A session opened
/// afresh (epoch 0) releases what the old one held: nothing is owed then.
/// A ShareFetch closing its session (epoch -1) carries none (the broker
/// releases the records, which come back and are settled then).
pub fn add_acks(
    key: ApiKey,
    version: i16,
    body: &Bytes,
    node: i32,
    book: &ShareAcks,
    now: Instant,
    seen: &mut ShareSeen,
) -> anyhow::Result<Added> {
    match key {
        ApiKey::ShareFetch => {
            let mut req = ShareFetchRequest::decode(&mut body.clone(), version)?;
            let Some(session) = session_key(node, &req.group_id, &req.member_id) else {
                return Ok(Added::default());
            };
            let epoch = req.share_session_epoch;
            if epoch <= 0 {
                book.forget(&session);
                return Ok(Added::with_session(session));
            }
            let forgotten: Vec<(Uuid, i32)> = req
                .forgotten_topics_data
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |&p| (t.topic_id, p)))
                .collect();
            let mut parts = partitions_fetch(&mut req.topics);
            let proxy_only = owed_into(book, &session, now, &mut parts, &forgotten, seen);
            if !parts.changed {
                return Ok(Added::with_session(session));
            }
            req.topics = parts.into_fetch();
            Ok(Added::changed(encode(&req, version)?, session, proxy_only))
        }
        ApiKey::ShareAcknowledge => {
            let mut req = ShareAcknowledgeRequest::decode(&mut body.clone(), version)?;
            let Some(session) = session_key(node, &req.group_id, &req.member_id) else {
                return Ok(Added::default());
            };
            if req.share_session_epoch == 0 {
                book.forget(&session);
                return Ok(Added::with_session(session));
            }
            let mut parts = partitions_ack(&mut req.topics);
            let proxy_only = owed_into(book, &session, now, &mut parts, &[], seen);
            if !parts.changed {
                return Ok(Added::with_session(session));
            }
            req.topics = parts.into_ack();
            Ok(Added::changed(encode(&req, version)?, session, proxy_only))
        }
        _ => Ok(Added::default()),
    }
}

impl Added {
    fn with_session(session: SessionKey) -> Self {
        Added {
            session: Some(session),
            ..Added::default()
        }
    }

    fn changed(body: BytesMut, session: SessionKey, proxy_only: Vec<(Uuid, i32)>) -> Self {
        Added {
            body: Some(body),
            session: Some(session),
            proxy_only,
        }
    }
}

/// What `session` is owed, merged into `parts`; what could not go in waits
/// for the next request. The partitions only the proxy acknowledges.
fn owed_into(
    book: &ShareAcks,
    session: &SessionKey,
    now: Instant,
    parts: &mut Parts,
    forgotten: &[(Uuid, i32)],
    seen: &mut ShareSeen,
) -> Vec<(Uuid, i32)> {
    let owed = book.take(session, now);
    let (proxy_only, back) = merge_into(parts, owed, forgotten, seen);
    if !back.is_empty() {
        seen.acks("overflow", book.owe(session, back));
    }
    proxy_only
}

fn session_key(
    node: i32,
    group: &Option<kafka_protocol::messages::GroupId>,
    member: &Option<kafka_protocol::protocol::StrBytes>,
) -> Option<SessionKey> {
    Some(SessionKey {
        node,
        group: group.as_ref()?.0.to_string(),
        member: member.as_ref()?.to_string(),
    })
}

use crate::transport::frame::encode;

/// A request's acknowledgements by partition, in the order they came.
struct Parts {
    /// (topic id, partition) -> batches, and everything else of the entry.
    order: Vec<(Uuid, i32)>,
    batches: BTreeMap<(Uuid, i32), Vec<AckBatch>>,
    /// The request's partition entries, kept to write back (ShareFetch).
    fetch: BTreeMap<(Uuid, i32), FetchPartition>,
    changed: bool,
}

/// ShareFetch's and ShareAcknowledge's acknowledgement batches: two
/// generated types with the same fields.
trait WireBatch: Sized {
    fn batch(&self) -> AckBatch;
    fn wire(b: AckBatch) -> Self;
}

macro_rules! wire_batch {
    ($t:ty) => {
        impl WireBatch for $t {
            fn batch(&self) -> AckBatch {
                AckBatch {
                    first: self.first_offset,
                    last: self.last_offset,
                    types: self.acknowledge_types.clone(),
                }
            }
            fn wire(b: AckBatch) -> Self {
                <$t>::default()
                    .with_first_offset(b.first)
                    .with_last_offset(b.last)
                    .with_acknowledge_types(b.types)
            }
        }
    };
}
wire_batch!(AckBatchF);
wire_batch!(AckBatchA);

fn partitions_fetch(topics: &mut [FetchTopic]) -> Parts {
    let mut parts = Parts::new();
    for t in topics.iter_mut() {
        for p in t.partitions.drain(..) {
            let at = (t.topic_id, p.partition_index);
            let b = p
                .acknowledgement_batches
                .iter()
                .map(WireBatch::batch)
                .collect();
            parts.push(at, b);
            parts.fetch.insert(at, p);
        }
    }
    parts
}

fn partitions_ack(topics: &mut [AcknowledgeTopic]) -> Parts {
    let mut parts = Parts::new();
    for t in topics.iter_mut() {
        for p in t.partitions.drain(..) {
            let b = p
                .acknowledgement_batches
                .iter()
                .map(WireBatch::batch)
                .collect();
            parts.push((t.topic_id, p.partition_index), b);
        }
    }
    parts
}

impl Parts {
    fn new() -> Self {
        Parts {
            order: Vec::new(),
            batches: BTreeMap::new(),
            fetch: BTreeMap::new(),
            changed: false,
        }
    }

    fn push(&mut self, at: (Uuid, i32), batches: Vec<AckBatch>) {
        if !self.batches.contains_key(&at) {
            self.order.push(at);
        }
        self.batches.entry(at).or_default().extend(batches);
    }

    /// Topics in first-seen order, partitions in theirs.
    fn grouped(&self) -> Vec<(Uuid, Vec<i32>)> {
        let mut out: Vec<(Uuid, Vec<i32>)> = Vec::new();
        for &(t, p) in &self.order {
            match out.iter_mut().find(|(id, _)| *id == t) {
                Some((_, ps)) => ps.push(p),
                None => out.push((t, vec![p])),
            }
        }
        out
    }

    fn into_fetch(mut self) -> Vec<FetchTopic> {
        self.grouped()
            .into_iter()
            .map(|(t, ps)| {
                let partitions = ps
                    .into_iter()
                    .map(|p| {
                        let batches = self.batches.remove(&(t, p)).unwrap_or_default();
                        self.fetch
                            .remove(&(t, p))
                            .unwrap_or_else(|| FetchPartition::default().with_partition_index(p))
                            .with_acknowledgement_batches(
                                batches.into_iter().map(AckBatchF::wire).collect(),
                            )
                    })
                    .collect();
                FetchTopic::default()
                    .with_topic_id(t)
                    .with_partitions(partitions)
            })
            .collect()
    }

    fn into_ack(mut self) -> Vec<AcknowledgeTopic> {
        self.grouped()
            .into_iter()
            .map(|(t, ps)| {
                let partitions = ps
                    .into_iter()
                    .map(|p| {
                        let batches = self.batches.remove(&(t, p)).unwrap_or_default();
                        AcknowledgePartition::default()
                            .with_partition_index(p)
                            .with_acknowledgement_batches(
                                batches.into_iter().map(AckBatchA::wire).collect(),
                            )
                    })
                    .collect();
                AcknowledgeTopic::default()
                    .with_topic_id(t)
                    .with_partitions(partitions)
            })
            .collect()
    }
}

/// Merge `owed` into `parts`; the partitions only the proxy acknowledges,
/// and what could not go in (a malformed client batch in that partition, or
/// a partition the request forgets: those wait or are dropped).
fn merge_into(
    parts: &mut Parts,
    owed: Vec<Owed>,
    forgotten: &[(Uuid, i32)],
    seen: &mut ShareSeen,
) -> (Vec<(Uuid, i32)>, Vec<Owed>) {
    let mut by_part: BTreeMap<(Uuid, i32), Vec<Owed>> = BTreeMap::new();
    for o in owed {
        if forgotten.contains(&(o.topic_id, o.partition)) {
            continue; // the session lets the partition go: its locks go too
        }
        by_part
            .entry((o.topic_id, o.partition))
            .or_default()
            .push(o);
    }
    let mut proxy_only = Vec::new();
    let mut back = Vec::new();
    for (at, owed) in by_part {
        let ours: Vec<(share::Span, i8)> = owed.iter().map(|o| (o.span, o.ack)).collect();
        let client = parts.batches.get(&at).cloned().unwrap_or_default();
        match share::merge(&client, &ours) {
            Some(merged) => {
                if client.is_empty() {
                    proxy_only.push(at);
                }
                if !parts.batches.contains_key(&at) {
                    parts.order.push(at);
                }
                parts.batches.insert(at, merged);
                parts.changed = true;
                let offsets = owed.iter().map(|o| share::count(&[o.span]));
                seen.acks("sent", offsets.fold(0, u64::saturating_add));
            }
            None => {
                debug!(topic_id = %at.0, partition = at.1,
                    "client acknowledgements malformed: the proxy's wait for the next request");
                back.extend(owed);
            }
        }
    }
    (proxy_only, back)
}

/// Keep the acknowledgement errors of `proxy_only` partitions from the
/// client (ShareFetch answers); whether anything changed.
pub fn settle_fetch_errors(
    resp: &mut ShareFetchResponse,
    proxy_only: &[(Uuid, i32)],
    seen: &mut ShareSeen,
) -> bool {
    let mut changed = false;
    for t in &mut resp.responses {
        for p in &mut t.partitions {
            if proxy_only.contains(&(t.topic_id, p.partition_index)) {
                changed |= settle(
                    &mut p.acknowledge_error_code,
                    &mut p.acknowledge_error_message,
                    seen,
                );
            }
        }
    }
    changed
}

/// Keep the errors of `proxy_only` partitions from the client
/// (ShareAcknowledge answers); whether anything changed.
pub fn settle_ack_errors(
    resp: &mut ShareAcknowledgeResponse,
    proxy_only: &[(Uuid, i32)],
    seen: &mut ShareSeen,
) -> bool {
    let mut changed = false;
    for t in &mut resp.responses {
        for p in &mut t.partitions {
            if proxy_only.contains(&(t.topic_id, p.partition_index)) {
                changed |= settle(&mut p.error_code, &mut p.error_message, seen);
            }
        }
    }
    changed
}

fn settle(
    code: &mut i16,
    message: &mut Option<kafka_protocol::protocol::StrBytes>,
    seen: &mut ShareSeen,
) -> bool {
    if *code == 0 {
        return false;
    }
    debug!(
        error = *code,
        "the broker refused the proxy's acknowledgement: the record comes back when its lock expires"
    );
    seen.acks("refused", 1);
    *code = 0;
    *message = None;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proxy's acknowledgements owed in `book`, added to `body`
    /// (version 1) on a connection to `node`.
    fn add(key: ApiKey, body: &Bytes, node: i32, book: &ShareAcks) -> Added {
        let seen = &mut ShareSeen::default();
        add_acks(key, 1, body, node, book, Instant::now(), seen).unwrap()
    }
    use crate::plan::share::{ACCEPT, REJECT};
    use kafka_protocol::messages::GroupId;
    use kafka_protocol::protocol::StrBytes;
    use std::time::Duration;

    const T: Uuid = Uuid::from_u128(0xabc);

    fn session() -> SessionKey {
        SessionKey {
            node: 1,
            group: "g".into(),
            member: "m".into(),
        }
    }

    fn owed(offset: i64) -> Owed {
        Owed {
            topic_id: T,
            partition: 0,
            span: (offset, offset),
            ack: REJECT,
            expires: Instant::now() + Duration::from_secs(30),
        }
    }

    fn fetch(epoch: i32, acks: Vec<(i64, i64, Vec<i8>)>) -> Bytes {
        let batches = acks
            .into_iter()
            .map(|(f, l, t)| {
                AckBatchF::default()
                    .with_first_offset(f)
                    .with_last_offset(l)
                    .with_acknowledge_types(t)
            })
            .collect();
        let req = ShareFetchRequest::default()
            .with_group_id(Some(GroupId(StrBytes::from_static_str("g"))))
            .with_member_id(Some(StrBytes::from_static_str("m")))
            .with_share_session_epoch(epoch)
            .with_topics(vec![FetchTopic::default()
                .with_topic_id(T)
                .with_partitions(vec![FetchPartition::default()
                    .with_partition_index(0)
                    .with_acknowledgement_batches(batches)])]);
        encode(&req, 1).unwrap().freeze()
    }

    fn acks_of(body: BytesMut) -> Vec<(i64, i64, Vec<i8>)> {
        let req = ShareFetchRequest::decode(&mut body.freeze(), 1).unwrap();
        req.topics[0].partitions[0]
            .acknowledgement_batches
            .iter()
            .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
            .collect()
    }

    #[test]
    fn owed_rejects_join_the_clients_acks_and_an_offset_is_acknowledged_once() {
        let book = ShareAcks::default();
        book.owe(&session(), [owed(3), owed(4)]);
        // The client (wrongly) acknowledges 4, which the proxy removed.
        let body = fetch(2, vec![(0, 2, vec![ACCEPT]), (4, 5, vec![ACCEPT])]);
        let added = add(ApiKey::ShareFetch, &body, 1, &book);
        assert_eq!(
            acks_of(added.body.unwrap()),
            vec![
                (0, 2, vec![ACCEPT]),
                (3, 4, vec![REJECT]),
                (5, 5, vec![ACCEPT])
            ]
        );
        assert!(
            added.proxy_only.is_empty(),
            "the client acknowledged there too"
        );
        assert_eq!(book.waiting(), 0);
    }

    #[test]
    fn a_partition_only_the_proxy_acknowledges_is_named_for_its_answer() {
        let book = ShareAcks::default();
        book.owe(&session(), [owed(7)]);
        let body = fetch(5, vec![]);
        let added = add(ApiKey::ShareFetch, &body, 1, &book);
        assert_eq!(acks_of(added.body.unwrap()), vec![(7, 7, vec![REJECT])]);
        assert_eq!(added.proxy_only, vec![(T, 0)]);
    }

    #[test]
    fn a_new_or_closing_share_fetch_session_owes_nothing() {
        for epoch in [0, -1] {
            let book = ShareAcks::default();
            book.owe(&session(), [owed(7)]);
            let added = add(ApiKey::ShareFetch, &fetch(epoch, vec![]), 1, &book);
            assert!(added.body.is_none(), "epoch {epoch}");
            assert_eq!(book.waiting(), 0, "epoch {epoch}: forgotten");
        }
    }

    #[test]
    fn another_node_or_member_gets_none_of_them() {
        let book = ShareAcks::default();
        book.owe(&session(), [owed(7)]);
        let added = add(ApiKey::ShareFetch, &fetch(3, vec![]), 2, &book);
        assert!(added.body.is_none());
        assert_eq!(book.waiting(), 1);
    }

    #[test]
    fn malformed_client_acks_leave_the_request_alone_and_the_acks_wait() {
        let book = ShareAcks::default();
        book.owe(&session(), [owed(7)]);
        let body = fetch(3, vec![(0, 3, vec![ACCEPT, ACCEPT])]);
        let added = add(ApiKey::ShareFetch, &body, 1, &book);
        assert!(added.body.is_none());
        assert_eq!(book.waiting(), 1);
    }

    #[test]
    fn share_acknowledge_carries_them_too_even_when_it_closes_the_session() {
        let book = ShareAcks::default();
        book.owe(&session(), [owed(9)]);
        let req = ShareAcknowledgeRequest::default()
            .with_group_id(Some(GroupId(StrBytes::from_static_str("g"))))
            .with_member_id(Some(StrBytes::from_static_str("m")))
            .with_share_session_epoch(-1);
        let body = encode(&req, 1).unwrap().freeze();
        let added = add(ApiKey::ShareAcknowledge, &body, 1, &book);
        let back = ShareAcknowledgeRequest::decode(&mut added.body.unwrap().freeze(), 1).unwrap();
        let b = &back.topics[0].partitions[0].acknowledgement_batches[0];
        assert_eq!(
            (b.first_offset, b.last_offset, b.acknowledge_types.clone()),
            (9, 9, vec![REJECT])
        );
        assert_eq!(added.proxy_only, vec![(T, 0)]);
    }

    #[test]
    fn the_proxys_acknowledgement_errors_are_kept_from_the_client_and_only_those() {
        use kafka_protocol::messages::share_fetch_response::{
            PartitionData, ShareFetchableTopicResponse,
        };
        let part = |i: i32| {
            PartitionData::default()
                .with_partition_index(i)
                .with_acknowledge_error_code(3)
        };
        let mut resp = ShareFetchResponse::default().with_responses(vec![
            ShareFetchableTopicResponse::default()
                .with_topic_id(T)
                .with_partitions(vec![part(0), part(1)]),
        ]);
        assert!(settle_fetch_errors(
            &mut resp,
            &[(T, 0)],
            &mut ShareSeen::default()
        ));
        let codes: Vec<i16> = resp.responses[0]
            .partitions
            .iter()
            .map(|p| p.acknowledge_error_code)
            .collect();
        assert_eq!(codes, [0, 3]);
    }
}
