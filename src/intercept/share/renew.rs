//! Renewals in the member's own share session: the proxy's ShareAcknowledge
//! (v2, KIP-1222), sent on the member's connection just before one of the
//! client's requests, and the client's later session epochs renumbered.
//!
//! Only the member's own session may acknowledge what it acquired (a new
//! session, epoch 0, releases it all), so the proxy speaks in that session:
//! before relaying a client's ShareFetch or ShareAcknowledge of a session
//! with something due in the withheld book (`withheld::Withheld::due`), it
//! sends its own ShareAcknowledge first, with `IsRenewAck`, RENEW (4) for
//! the ranges whose lock nears its end and RELEASE (2) for those whose
//! reason cleared, at the epoch the broker expects next. Kafka handles one
//! request of a connection at a time, in order, so that epoch is the one
//! the client's request carries, advanced by the proxy's requests so far;
//! the client's request and every later one of the session go up with
//! their epoch advanced once more per request the proxy injected
//! (`ShareRequestMetadata.nextEpoch`: after Int32.MAX comes 1). Epoch 0
//! (a new session) and -1 (closing) pass unchanged and start the count
//! again. A renewal never rides a fetching ShareFetch (the broker refuses
//! renewals there unless it fetches nothing), and never a client's request
//! (an acknowledgement the broker refuses rolls back every acknowledgement
//! of its partition in that request, the client's too). The broker's answer
//! to the proxy's request never reaches the client (`answered`).
//!
//! Renewals need the broker's ShareAcknowledge v2, learnt from the
//! ApiVersions answer on the connection (`Conn::learn_versions`); without
//! it (or with `share_groups.renew_withheld: false`) a session's withheld
//! ranges are dropped from the book, counted, and come back on lock expiry.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI16, AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::share_acknowledge_request::{
    AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch,
};
use kafka_protocol::messages::{
    ApiKey, GroupId, RequestHeader, ShareAcknowledgeRequest, ShareAcknowledgeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tracing::debug;
use uuid::Uuid;

use super::withheld::{Due, Rules, Withheld};
use super::SessionKey;
use crate::metrics::{self, ShareSeen};
use crate::plan::share::{Span, RELEASE};

/// The acknowledge type RENEW (KIP-1222; `AcknowledgeType.RENEW` in Kafka 4.2+).
pub const RENEW: i8 = 4;

/// The ShareAcknowledge version that carries renewals.
pub const RENEW_VERSION: i16 = 2;

/// The client id of the proxy's own requests.
const CLIENT_ID: &str = "antidote";

/// One connection's share state: what the broker offers, and per share
/// session the requests the proxy injected since its epoch 0.
pub struct Conn {
    /// The broker's highest ShareAcknowledge version (-1: not known yet).
    ack_max: AtomicI16,
    injected: Mutex<HashMap<SessionKey, u32>>,
    /// Correlation ids of the proxy's requests count down from here.
    next_id: AtomicI32,
}

impl Default for Conn {
    fn default() -> Self {
        Conn {
            ack_max: AtomicI16::new(-1),
            injected: Mutex::new(HashMap::new()),
            next_id: AtomicI32::new(i32::MIN + 1),
        }
    }
}

impl Conn {
    /// The broker answered ApiVersions: its ShareAcknowledge versions, if
    /// it offers the API.
    pub fn learn_versions(&self, share_ack_max: Option<i16>) {
        self.ack_max
            .store(share_ack_max.unwrap_or(-1), Ordering::Relaxed);
    }

    /// Whether the broker takes renewals (ShareAcknowledge v2).
    pub fn renews(&self) -> bool {
        self.ack_max.load(Ordering::Relaxed) >= RENEW_VERSION
    }

    fn injected(&self) -> std::sync::MutexGuard<'_, HashMap<SessionKey, u32>> {
        self.injected.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sessions this connection carried (to forget when it closes).
    pub fn sessions(&self) -> Vec<SessionKey> {
        self.injected().keys().cloned().collect()
    }

    fn correlation_id(&self) -> i32 {
        // Counting down from i32::MIN + 1 wraps to i32::MAX after 2^32
        // requests; any id will do (answers are matched in order).
        self.next_id.fetch_sub(1, Ordering::Relaxed)
    }
}

/// Advance a session epoch by `n` requests (`ShareRequestMetadata.nextEpoch`:
/// 1, 2, ..., Int32.MAX, 1, ...). Epoch 0 and -1 (and anything below)
/// stay as they are.
pub fn advance(epoch: i32, n: u32) -> i32 {
    if epoch <= 0 {
        return epoch;
    }
    let cycle = i64::from(i32::MAX);
    ((i64::from(epoch) - 1 + i64::from(n)) % cycle + 1) as i32
}

/// Where a ShareFetch or ShareAcknowledge body keeps its session epoch
/// (after the group and member ids, both compact nullable strings), and
/// the epoch.
pub fn epoch_at(body: &[u8]) -> Option<(usize, i32)> {
    let mut at = 0;
    for _ in 0..2 {
        let (len, n) = uvarint(body.get(at..)?)?;
        at += n + usize::try_from(len.saturating_sub(1)).ok()?;
    }
    let b = body.get(at..at + 4)?;
    Some((at, i32::from_be_bytes([b[0], b[1], b[2], b[3]])))
}

fn uvarint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(5) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// What the proxy does before a client's share request goes up.
#[derive(Debug, Default)]
pub struct Before {
    /// Its own request, to send first.
    pub inject: Option<Injected>,
    /// The epoch the client's request goes up with, when it differs.
    pub epoch: Option<i32>,
}

/// The proxy's ShareAcknowledge, framed, and what its answer settles.
#[derive(Debug)]
pub struct Injected {
    pub frame: Bytes,
    pub correlation_id: i32,
    pub sent: Sent,
}

/// A renewal on its way: its answer goes to `answered`.
#[derive(Debug)]
pub struct Sent {
    pub session: SessionKey,
    /// The book's ids of the renewed ranges, by partition.
    pub renewed: Vec<((Uuid, i32), u64)>,
    pub at: Instant,
}

/// What decides the renewals of one request.
pub struct Renewing<'a> {
    /// `share_groups.renew_withheld`.
    pub enabled: bool,
    pub rules: Rules,
    /// Whether the reason a topic's records were withheld for has cleared.
    pub cleared: &'a dyn Fn(Uuid, &'static str) -> bool,
}

/// Before a client's request of `session` with epoch `epoch` goes up on
/// `conn` at `now`: the proxy's renewal to send first, if anything is due,
/// and the client's epoch renumbered.
pub fn before(
    conn: &Conn,
    book: &Withheld,
    session: &SessionKey,
    epoch: i32,
    now: Instant,
    renewing: &Renewing,
    seen: &mut ShareSeen,
) -> Before {
    if epoch <= 0 {
        // A new session, or the last request of this one: the broker
        // releases what the member holds.
        conn.injected().remove(session);
        book.forget(session, "member_gone", seen);
        return Before::default();
    }
    let shift = {
        let mut injected = conn.injected();
        match injected.get(session) {
            Some(&n) => n,
            None => {
                injected.insert(session.clone(), 0);
                0
            }
        }
    };
    let renumbered = |n| (n > 0).then(|| advance(epoch, n));
    if !book.has(session) {
        return Before {
            inject: None,
            epoch: renumbered(shift),
        };
    }
    if !renewing.enabled || !conn.renews() {
        let why = if renewing.enabled {
            "no_v2"
        } else {
            "disabled"
        };
        book.forget(session, why, seen);
        return Before {
            inject: None,
            epoch: renumbered(shift),
        };
    }
    let due = book.due(session, now, renewing.rules, renewing.cleared, seen);
    if due.is_empty() {
        return Before {
            inject: None,
            epoch: renumbered(shift),
        };
    }
    let correlation_id = conn.correlation_id();
    seen.renewals("sent", due.renew.len() as u64);
    seen.renewals("released", due.release.len() as u64);
    let (frame, sent) = request(correlation_id, session, advance(epoch, shift), due, now);
    *conn.injected().entry(session.clone()).or_default() += 1;
    Before {
        inject: Some(Injected {
            frame,
            correlation_id,
            sent,
        }),
        epoch: renumbered(shift + 1),
    }
}

/// The proxy's ShareAcknowledge v2 for what is `due`, framed.
fn request(
    correlation_id: i32,
    session: &SessionKey,
    epoch: i32,
    due: Due,
    now: Instant,
) -> (Bytes, Sent) {
    let mut parts: BTreeMap<(Uuid, i32), Vec<(Span, i8)>> = BTreeMap::new();
    let mut renewed = Vec::new();
    for (id, h) in &due.renew {
        let at = (h.topic_id, h.partition);
        parts.entry(at).or_default().push((h.span, RENEW));
        renewed.push((at, *id));
    }
    for h in &due.release {
        let at = (h.topic_id, h.partition);
        parts.entry(at).or_default().push((h.span, RELEASE));
    }
    let mut topics: Vec<AcknowledgeTopic> = Vec::new();
    for ((topic_id, partition), mut acks) in parts {
        acks.sort_unstable();
        let batches = acks
            .into_iter()
            .map(|((first, last), ack)| {
                AcknowledgementBatch::default()
                    .with_first_offset(first)
                    .with_last_offset(last)
                    .with_acknowledge_types(vec![ack])
            })
            .collect();
        let p = AcknowledgePartition::default()
            .with_partition_index(partition)
            .with_acknowledgement_batches(batches);
        match topics.last_mut() {
            Some(t) if t.topic_id == topic_id => t.partitions.push(p),
            _ => topics.push(
                AcknowledgeTopic::default()
                    .with_topic_id(topic_id)
                    .with_partitions(vec![p]),
            ),
        }
    }
    let req = ShareAcknowledgeRequest::default()
        .with_group_id(Some(GroupId(StrBytes::from_string(session.group.clone()))))
        .with_member_id(Some(StrBytes::from_string(session.member.clone())))
        .with_share_session_epoch(epoch)
        .with_is_renew_ack(!due.renew.is_empty())
        .with_topics(topics);
    let sent = Sent {
        session: session.clone(),
        renewed,
        at: now,
    };
    (frame(correlation_id, &req), sent)
}

/// `req` as a ShareAcknowledge v2 request frame (request header v2).
fn frame(correlation_id: i32, req: &ShareAcknowledgeRequest) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::ShareAcknowledge as i16)
        .with_request_api_version(RENEW_VERSION)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
    let mut b = BytesMut::new();
    b.put_i32(0);
    let hv = ApiKey::ShareAcknowledge.request_header_version(RENEW_VERSION);
    // Neither can fail: every field is set within its version's range.
    let _ = header.encode(&mut b, hv);
    let _ = req.encode(&mut b, RENEW_VERSION);
    let len = i32::try_from(b.len() - 4).unwrap_or(i32::MAX);
    b[..4].copy_from_slice(&len.to_be_bytes());
    b.freeze()
}

/// The broker's answer `frame` to the proxy's renewal `sent`: refused
/// partitions leave the book (their records come back when their locks
/// expire), the rest expire one lock duration after the renewal left.
/// Never forwarded.
pub fn answered(book: &Withheld, sent: Sent, frame: &Bytes) {
    let mut seen = ShareSeen::default();
    settle_renewal(book, sent, frame, &mut seen);
    metrics::global().share_seen(seen);
}

fn settle_renewal(book: &Withheld, sent: Sent, frame: &Bytes, seen: &mut ShareSeen) {
    let head = crate::transport::frame::RESPONSE_ID_END;
    let body = (frame.get(head..))
        .and_then(tags_len)
        .and_then(|tags| frame.get(head + tags..).map(|_| frame.slice(head + tags..)));
    let decoded =
        body.and_then(|mut b| ShareAcknowledgeResponse::decode(&mut b, RENEW_VERSION).ok());
    let ids = |pred: &dyn Fn(&(Uuid, i32)) -> bool| -> Vec<u64> {
        (sent.renewed.iter())
            .filter(|(at, _)| pred(at))
            .map(|&(_, id)| id)
            .collect()
    };
    let Some(resp) = decoded.filter(|r| r.error_code == 0) else {
        debug!(session = ?sent.session, "the broker refused the proxy's renewal");
        seen.renewals("refused", sent.renewed.len() as u64);
        book.refused(&sent.session, &ids(&|_| true), seen);
        return;
    };
    let mut refused = Vec::new();
    for t in &resp.responses {
        for p in &t.partitions {
            if p.error_code != 0 {
                debug!(topic_id = %t.topic_id, partition = p.partition_index,
                    error = p.error_code, "the broker refused the proxy's renewal of a partition");
                refused.push((t.topic_id, p.partition_index));
            }
        }
    }
    let bad = ids(&|at| refused.contains(at));
    seen.renewals("refused", bad.len() as u64);
    book.refused(&sent.session, &bad, seen);
    let good = ids(&|at| !refused.contains(at));
    book.renewed(
        &sent.session,
        &good,
        sent.at,
        resp.acquisition_lock_timeout_ms,
    );
}

/// The length of a response header's tagged fields (flexible header v1).
fn tags_len(b: &[u8]) -> Option<usize> {
    let (n, len) = uvarint(b)?;
    let mut at = len;
    for _ in 0..n {
        let (_, l) = uvarint(b.get(at..)?)?;
        at += l;
        let (size, l) = uvarint(b.get(at..)?)?;
        at += l + usize::try_from(size).ok()?;
    }
    Some(at)
}

/// Write `epoch` into the request `frame` whose body starts at `body_at`.
pub fn set_epoch(frame: &Bytes, body_at: usize, epoch: i32) -> Option<Bytes> {
    let (at, _) = epoch_at(frame.get(body_at..)?)?;
    let mut out = BytesMut::from(&frame[..]);
    out[body_at + at..body_at + at + 4].copy_from_slice(&epoch.to_be_bytes());
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::ShareFetchRequest;
    use std::time::Duration;

    const T: Uuid = Uuid::from_u128(0xabc);
    const LOCK: Duration = Duration::from_millis(4000);

    fn session() -> SessionKey {
        SessionKey {
            node: 1,
            group: "g".into(),
            member: "m".into(),
        }
    }

    fn never(_: Uuid, _: &'static str) -> bool {
        false
    }

    fn on() -> Renewing<'static> {
        Renewing {
            enabled: true,
            rules: Rules { max_renewals: 20 },
            cleared: &never,
        }
    }

    fn v2() -> Conn {
        let conn = Conn::default();
        conn.learn_versions(Some(2));
        conn
    }

    /// A ShareFetch request frame (header v2, client id "c") at `epoch`.
    fn share_fetch(epoch: i32, version: i16) -> (Bytes, usize) {
        let req = ShareFetchRequest::default()
            .with_group_id(Some(GroupId(StrBytes::from_static_str("g"))))
            .with_member_id(Some(StrBytes::from_static_str("m")))
            .with_share_session_epoch(epoch)
            .with_max_wait_ms(500)
            .with_topics(vec![FetchTopic::default()
                .with_topic_id(T)
                .with_partitions(vec![
                    FetchPartition::default().with_partition_index(0)
                ])]);
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::ShareFetch as i16)
            .with_request_api_version(version)
            .with_correlation_id(9)
            .with_client_id(Some(StrBytes::from_static_str("c")));
        let mut b = BytesMut::new();
        b.put_i32(0);
        header.encode(&mut b, 2).unwrap();
        let at = b.len();
        req.encode(&mut b, version).unwrap();
        let len = (b.len() - 4) as i32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        (b.freeze(), at)
    }

    fn decode_injected(frame: &Bytes) -> (RequestHeader, ShareAcknowledgeRequest) {
        let len = i32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        let mut b = frame.slice(4..);
        let hv = ApiKey::ShareAcknowledge.request_header_version(RENEW_VERSION);
        let header = RequestHeader::decode(&mut b, hv).unwrap();
        let req = ShareAcknowledgeRequest::decode(&mut b, RENEW_VERSION).unwrap();
        assert!(b.is_empty(), "every byte read");
        (header, req)
    }

    #[test]
    fn epochs_advance_as_the_broker_counts_them_and_0_and_minus_1_stay() {
        assert_eq!(advance(5, 0), 5);
        assert_eq!(advance(5, 3), 8);
        assert_eq!(advance(i32::MAX, 1), 1, "nextEpoch wraps to 1");
        assert_eq!(advance(i32::MAX - 1, 3), 2);
        assert_eq!(advance(1, u32::MAX), advance(1, u32::MAX % i32::MAX as u32));
        assert_eq!(advance(0, 4), 0);
        assert_eq!(advance(-1, 4), -1);
    }

    #[test]
    fn the_epoch_is_found_and_written_in_both_request_versions() {
        for version in [1, 2] {
            let (frame, at) = share_fetch(41, version);
            assert_eq!(epoch_at(&frame[at..]).map(|e| e.1), Some(41));
            let out = set_epoch(&frame, at, i32::MAX).unwrap();
            let back = ShareFetchRequest::decode(&mut out.slice(at..), version).unwrap();
            assert_eq!(back.share_session_epoch, i32::MAX);
            assert_eq!(back.max_wait_ms, 500, "nothing else moved");
        }
        // Null group and member (compact length 0).
        assert_eq!(epoch_at(&[0, 0, 0, 0, 0, 7]), Some((2, 7)));
        assert_eq!(epoch_at(&[0, 0, 0]), None);
    }

    #[test]
    fn a_due_renewal_goes_first_at_the_sessions_epoch_and_later_requests_are_advanced() {
        let conn = v2();
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        let spans = [((3, 5), "dlt"), ((9, 9), "not_loaded")];
        book.withhold(&session(), (T, 0), &spans, t0, 4000, seen);
        book.withhold(&session(), (T, 2), &[((0, 0), "dlt")], t0, 4000, seen);
        // Nothing due yet: the client's epoch goes up unchanged.
        let b = before(&conn, &book, &session(), 7, t0, &on(), seen);
        assert!(b.inject.is_none() && b.epoch.is_none());
        let now = t0 + LOCK / 2;
        let b = before(&conn, &book, &session(), 8, now, &on(), seen);
        let inject = b.inject.unwrap();
        assert_eq!(b.epoch, Some(9), "the client's request follows the proxy's");
        let (header, req) = decode_injected(&inject.frame);
        assert_eq!(header.request_api_key, ApiKey::ShareAcknowledge as i16);
        assert_eq!(header.request_api_version, 2);
        assert_eq!(header.correlation_id, inject.correlation_id);
        assert_eq!(req.share_session_epoch, 8);
        assert!(req.is_renew_ack);
        assert_eq!(req.group_id.as_ref().map(|g| g.0.as_str()), Some("g"));
        assert_eq!(req.member_id.as_deref(), Some("m"));
        let wire: Vec<(i32, i64, i64, Vec<i8>)> = req.topics[0]
            .partitions
            .iter()
            .flat_map(|p| {
                p.acknowledgement_batches.iter().map(move |b| {
                    let t = b.acknowledge_types.clone();
                    (p.partition_index, b.first_offset, b.last_offset, t)
                })
            })
            .collect();
        assert_eq!(
            wire,
            [
                (0, 3, 5, vec![RENEW]),
                (0, 9, 9, vec![RENEW]),
                (2, 0, 0, vec![RENEW])
            ]
        );
        assert_eq!(inject.sent.renewed.len(), 3);
        // Pipelined requests of the session, and after a second renewal.
        let b = before(&conn, &book, &session(), 9, now, &on(), seen);
        assert_eq!((b.inject.is_none(), b.epoch), (true, Some(10)));
        let later = now + LOCK / 2;
        let b = before(&conn, &book, &session(), 10, later, &on(), seen);
        let (_, req) = decode_injected(&b.inject.unwrap().frame);
        assert_eq!((req.share_session_epoch, b.epoch), (11, Some(12)));
        // A new session (epoch 0) starts the count again and forgets the ranges.
        let b = before(&conn, &book, &session(), 0, later, &on(), seen);
        assert_eq!((b.inject.is_none(), b.epoch), (true, None));
        assert_eq!(book.ranges(), 0);
        let b = before(&conn, &book, &session(), 1, later, &on(), seen);
        assert_eq!(b.epoch, None);
    }

    #[test]
    fn the_renewal_takes_the_wrap_after_int32_max() {
        let conn = v2();
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        book.withhold(&session(), (T, 0), &[((1, 1), "dlt")], t0, 4000, seen);
        let b = before(
            &conn,
            &book,
            &session(),
            i32::MAX,
            t0 + LOCK / 2,
            &on(),
            seen,
        );
        let (_, req) = decode_injected(&b.inject.unwrap().frame);
        assert_eq!((req.share_session_epoch, b.epoch), (i32::MAX, Some(1)));
    }

    #[test]
    fn a_cleared_range_is_released_without_the_renew_flag() {
        let conn = v2();
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        book.withhold(
            &session(),
            (T, 0),
            &[((4, 6), "not_loaded")],
            t0,
            4000,
            seen,
        );
        let loaded = |_: Uuid, _: &'static str| true;
        let renewing = Renewing {
            cleared: &loaded,
            ..on()
        };
        let b = before(&conn, &book, &session(), 3, t0, &renewing, seen);
        let (_, req) = decode_injected(&b.inject.unwrap().frame);
        assert!(!req.is_renew_ack);
        let batch = &req.topics[0].partitions[0].acknowledgement_batches[0];
        assert_eq!(
            (
                batch.first_offset,
                batch.last_offset,
                batch.acknowledge_types.clone()
            ),
            (4, 6, vec![RELEASE])
        );
        assert_eq!(book.ranges(), 0);
    }

    #[test]
    fn without_v2_or_turned_off_the_ranges_are_dropped_and_nothing_is_injected() {
        for (conn, enabled) in [(Conn::default(), true), (v2(), false)] {
            let book = Withheld::default();
            let seen = &mut ShareSeen::default();
            let t0 = Instant::now();
            book.withhold(&session(), (T, 0), &[((1, 1), "dlt")], t0, 4000, seen);
            let renewing = Renewing { enabled, ..on() };
            let b = before(&conn, &book, &session(), 3, t0 + LOCK / 2, &renewing, seen);
            assert!(b.inject.is_none() && b.epoch.is_none());
            assert_eq!(book.ranges(), 0);
        }
    }

    fn answer(correlation_id: i32, resp: &ShareAcknowledgeResponse) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i32(0);
        b.put_i32(correlation_id);
        b.put_u8(0); // no tagged fields in the v1 response header
        resp.encode(&mut b, RENEW_VERSION).unwrap();
        let len = (b.len() - 4) as i32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        b.freeze()
    }

    #[test]
    fn the_brokers_answer_drops_refused_partitions_and_takes_its_lock_duration() {
        use kafka_protocol::messages::share_acknowledge_response::{
            PartitionData, ShareAcknowledgeTopicResponse,
        };
        let conn = v2();
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        book.withhold(&session(), (T, 0), &[((1, 1), "dlt")], t0, 4000, seen);
        book.withhold(&session(), (T, 1), &[((2, 2), "dlt")], t0, 4000, seen);
        let sent_at = t0 + LOCK / 2;
        let inject = before(&conn, &book, &session(), 3, sent_at, &on(), seen)
            .inject
            .unwrap();
        let resp = ShareAcknowledgeResponse::default()
            .with_acquisition_lock_timeout_ms(10_000)
            .with_responses(vec![ShareAcknowledgeTopicResponse::default()
                .with_topic_id(T)
                .with_partitions(vec![
                    PartitionData::default().with_partition_index(0),
                    PartitionData::default()
                        .with_partition_index(1)
                        .with_error_code(5), // INVALID_RECORD_STATE-like
                ])]);
        answered(&book, inject.sent, &answer(inject.correlation_id, &resp));
        assert_eq!(book.ranges(), 1, "partition 1 refused");
        // Partition 0's lock is 10 s from the renewal: due 5 s after it.
        let at = sent_at + Duration::from_millis(4900);
        assert!(before(&conn, &book, &session(), 5, at, &on(), seen)
            .inject
            .is_none());
        let at = sent_at + Duration::from_secs(5);
        assert!(before(&conn, &book, &session(), 6, at, &on(), seen)
            .inject
            .is_some());
        // A top-level error (or an answer that does not decode): all refused.
        let inject = before(&conn, &book, &session(), 8, at + LOCK * 3, &on(), seen).inject;
        assert!(inject.is_none(), "expired meanwhile");
        book.withhold(&session(), (T, 0), &[((1, 1), "dlt")], at, 4000, seen);
        let i = before(&conn, &book, &session(), 8, at + LOCK / 2, &on(), seen)
            .inject
            .unwrap();
        let bad = ShareAcknowledgeResponse::default().with_error_code(72);
        answered(&book, i.sent, &answer(i.correlation_id, &bad));
        assert_eq!(book.ranges(), 0);
    }
}
