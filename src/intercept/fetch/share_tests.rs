//! `FetchFilter::filter_share` end to end: a ShareFetch response in, a
//! response out, the DLT on the in-process mock broker; what the member
//! gets delivered (acquired ranges) and what the proxy then owes.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::ShareFetchResponse;
use kafka_protocol::protocol::{Decodable, Encodable};
use uuid::Uuid;

use super::fetch_tests::{batch, filter_on, filter_with, in_dlt, Topics, POISON};
use super::share::ShareCall;
use super::*;
use crate::client::mock_broker::MockBroker;
use crate::intercept::share::{SessionKey, ShareAcks};
use crate::kafka::batch::{segments, Segment};
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::plan::share::REJECT;

const TOPIC_ID: Uuid = Uuid::from_u128(0x7);
/// The id topic `t` had before it was deleted and created again.
const OLD_ID: Uuid = Uuid::from_u128(0x6);
const VERSION: i16 = 1;

/// Topic `t`, by its id now and the one it had before.
const BY_ID: Topics = Topics(&[TOPIC_ID, OLD_ID]);

fn session() -> SessionKey {
    SessionKey {
        node: 1,
        group: "g".into(),
        member: "m".into(),
    }
}

/// A ShareFetch v1 response: `values` in one batch at offset 0, the member
/// having acquired `acquired` (first, last).
fn response(values: &[&str], acquired: &[(i64, i64)]) -> Bytes {
    response_of(batch(values, 0), acquired, 30_000)
}

/// The same batch with its last byte flipped: its CRC fails, so it cannot
/// be decoded.
fn corrupt(b: Bytes) -> Bytes {
    let mut b = b.to_vec();
    let last = b.len() - 1;
    b[last] ^= 0x55;
    Bytes::from(b)
}

/// A ShareFetch v1 response of `records` (topic `t`, partition 0), the
/// member having acquired `acquired`, locks of `lock_ms`.
fn response_of(records: Bytes, acquired: &[(i64, i64)], lock_ms: i32) -> Bytes {
    let first: Vec<_> = acquired.iter().map(|&(f, l)| (f, l, 1)).collect();
    response_delivered(records, &first, lock_ms)
}

/// The same, each acquired range (first, last, delivery count).
fn response_delivered(records: Bytes, acquired: &[(i64, i64, i16)], lock_ms: i32) -> Bytes {
    let acquired = acquired
        .iter()
        .map(|&(f, l, n)| {
            AcquiredRecords::default()
                .with_first_offset(f)
                .with_last_offset(l)
                .with_delivery_count(n)
        })
        .collect();
    let resp = ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(lock_ms)
        .with_responses(vec![ShareFetchableTopicResponse::default()
            .with_topic_id(TOPIC_ID)
            .with_partitions(vec![PartitionData::default()
                .with_partition_index(0)
                .with_records(Some(records))
                .with_acquired_records(acquired)])]);
    let mut out = bytes::BytesMut::new();
    resp.encode(&mut out, VERSION).expect("encode");
    out.freeze()
}

/// (acquired ranges, offsets of the data records) of a filtered response.
fn seen(body: Bytes) -> (Vec<(i64, i64)>, Vec<i64>) {
    let resp = ShareFetchResponse::decode(&mut body.clone(), VERSION).expect("decode");
    let p = &resp.responses[0].partitions[0];
    let ranges = p
        .acquired_records
        .iter()
        .map(|a| (a.first_offset, a.last_offset))
        .collect();
    let mut offsets = Vec::new();
    for seg in segments(p.records.as_ref().expect("records")) {
        let Segment::Batch(b) = seg else {
            panic!("not a whole batch")
        };
        if b.is_control() {
            continue;
        }
        for r in b.decode().expect("decode").records() {
            offsets.push(r.offset);
        }
    }
    (ranges, offsets)
}

fn spans(owed: &[crate::intercept::share::acks::Owed]) -> Vec<(i64, i64)> {
    owed.iter().map(|o| o.span).collect()
}

async fn run(f: &FetchFilter, book: &ShareAcks, body: Bytes) -> Bytes {
    let s = session();
    let call = ShareCall {
        session: Some(&s),
        book,
        removed_ack: REJECT,
        last_delivery: 2,
        settled: Default::default(),
    };
    let chunks = (f.filter_share(&BY_ID, body, VERSION, call).await)
        .expect("filter")
        .expect("the response changes");
    crate::kafka::splice::join(&chunks)
}

#[tokio::test]
async fn acquired_poison_is_diverted_first_then_neither_delivered_nor_acquired_and_owed_a_reject() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let book = ShareAcks::default();
    let body = response(&[r#"{"a":0}"#, POISON, r#"{"a":2}"#], &[(0, 2)]);
    let out = run(&f, &book, body).await;
    assert_eq!(
        in_dlt(&mock),
        [1],
        "in its DLT when the response is released"
    );
    assert_eq!(seen(out), (vec![(0, 0), (2, 2)], vec![0, 2]));
    let owed = book.take(&session(), std::time::Instant::now());
    let owed: Vec<((i64, i64), i8)> = owed.iter().map(|o| (o.span, o.ack)).collect();
    assert_eq!(owed, [((1, 1), REJECT)]);
}

#[tokio::test]
async fn poison_another_member_acquired_is_removed_but_not_diverted_or_owed() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let book = ShareAcks::default();
    // This member acquired offset 0 only; 1 is another's (or aborted).
    let body = response(&[r#"{"a":0}"#, POISON, r#"{"a":2}"#], &[(0, 0)]);
    let out = run(&f, &book, body).await;
    assert!(in_dlt(&mock).is_empty(), "the acquirer's proxy diverts it");
    let (ranges, offsets) = seen(out);
    assert_eq!(ranges, [(0, 0)]);
    assert!(!offsets.contains(&1), "poison bytes never reach a client");
    assert_eq!(book.waiting(), 0);
}

#[tokio::test]
async fn a_dlt_that_refuses_writes_withholds_only_the_poison_and_owes_nothing_for_it() {
    let mock = MockBroker::start().await;
    mock.state().fail.insert(("t.dlt".into(), 0), 19); // NOT_ENOUGH_REPLICAS
    let f = filter_on(&mock, Duration::from_millis(800)).await;
    let book = ShareAcks::default();
    let body = response(&[r#"{"a":0}"#, POISON, r#"{"a":2}"#], &[(0, 2)]);
    let out = run(&f, &book, body.clone()).await;
    // Share groups promise no order: the valid records go out, the poison
    // stays acquired without an acknowledgement (its lock brings it back).
    assert_eq!(seen(out), (vec![(0, 0), (2, 2)], vec![0, 2]));
    assert!(in_dlt(&mock).is_empty());
    assert_eq!(book.waiting(), 0);
    // Delivered again once the DLT is back: diverted and owed now.
    mock.state().fail.clear();
    let out = run(
        &f,
        &book,
        response(&[r#"{"a":0}"#, POISON, r#"{"a":2}"#], &[(1, 1)]),
    )
    .await;
    assert_eq!(in_dlt(&mock), [1]);
    assert_eq!(seen(out).0, Vec::<(i64, i64)>::new());
    let owed = book.take(&session(), std::time::Instant::now());
    assert_eq!(spans(&owed), [(1, 1)]);
}

#[tokio::test]
async fn a_record_in_its_dlt_already_is_owed_a_reject_without_a_second_write() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let book = ShareAcks::default();
    let body = response(&[r#"{"a":0}"#, POISON], &[(0, 1)]);
    run(&f, &book, body.clone()).await;
    book.take(&session(), std::time::Instant::now());
    // Its lock expired before the client's next request: delivered again.
    let out = run(&f, &book, response(&[r#"{"a":0}"#, POISON], &[(1, 1)])).await;
    assert_eq!(in_dlt(&mock), [1], "written once");
    assert_eq!(seen(out).0, Vec::<(i64, i64)>::new());
    let owed = book.take(&session(), std::time::Instant::now());
    assert_eq!(spans(&owed), [(1, 1)]);
}

#[tokio::test]
async fn a_clean_share_fetch_response_goes_out_as_it_came_and_owes_nothing() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let book = ShareAcks::default();
    let s = session();
    let call = ShareCall {
        session: Some(&s),
        book: &book,
        removed_ack: REJECT,
        last_delivery: 2,
        settled: Default::default(),
    };
    let body = response(&[r#"{"a":0}"#, r#"{"a":1}"#], &[(0, 1)]);
    let out = f
        .filter_share(&BY_ID, body, VERSION, call)
        .await
        .expect("filter");
    assert!(out.is_none(), "forwarded as its original bytes");
    assert_eq!(book.waiting(), 0);
}

#[tokio::test]
async fn while_its_dlt_cannot_be_read_back_records_are_withheld_save_valid_ones_at_their_last_delivery(
) {
    let mock = MockBroker::start().await;
    // The DLT holds a record and every Fetch of it fails: never read back.
    mock.add_topic("t.dlt", 1);
    let old = NewRecord {
        timestamp: 1_700_000_000_000,
        key: None,
        value: Some(Bytes::from_static(b"x")),
        headers: vec![],
    };
    mock.append(
        "t.dlt",
        0,
        build_batch(&[old], &BuildOptions::default()).expect("batch"),
    );
    mock.state().fail_fetches = usize::MAX;
    let f = filter_on(&mock, Duration::from_millis(300)).await;
    let book = ShareAcks::default();
    let values = [r#"{"a":0}"#, POISON, r#"{"a":2}"#, POISON, r#"{"a":4}"#];
    // 0..=1 delivered for the first time, 2..=4 for the last (`last_delivery` 2).
    let body = response_delivered(batch(&values, 0), &[(0, 1, 1), (2, 4, 2)], 30_000);
    let out = run(&f, &book, body).await;
    // Any record might be in its DLT already (diverted before, replayed
    // since): none is given while the ledger cannot tell, save valid ones
    // the broker would archive next (then given rather than lost). The
    // poison cannot be written: withheld, no acknowledgement. (A valid
    // record's bytes may stay in the section: a share consumer gives only
    // the acquired offsets.)
    assert_eq!(seen(out), (vec![(2, 2), (4, 4)], vec![0, 2, 4]));
    assert_eq!(mock.records("t.dlt", 0).len(), 1, "nothing written");
    assert_eq!(book.waiting(), 0);
}

/// Valid records 0..=2, then a batch 3..=5 that cannot be decoded.
fn with_undecodable_batch() -> Bytes {
    let mut records = batch(&[r#"{"a":0}"#, r#"{"a":1}"#, r#"{"a":2}"#], 0).to_vec();
    records.extend_from_slice(&corrupt(batch(
        &[r#"{"a":3}"#, r#"{"a":4}"#, r#"{"a":5}"#],
        3,
    )));
    Bytes::from(records)
}

const DIVERT_WHOLE: &str = "    on_undecodable: divert\n";

#[tokio::test]
async fn a_batch_diverted_whole_whose_write_fails_is_withheld_whole_never_left_to_gap() {
    let mock = MockBroker::start().await;
    mock.state().fail.insert(("t.dlt".into(), 0), 19); // NOT_ENOUGH_REPLICAS
    let f = filter_with(&mock, Duration::from_millis(600), DIVERT_WHOLE).await;
    let book = ShareAcks::default();
    let out = run(
        &f,
        &book,
        response_of(with_undecodable_batch(), &[(0, 5)], 30_000),
    )
    .await;
    // 4 and 5 must not stay acquired without records: the Java client
    // acknowledges those as GAP and the broker archives them, neither
    // delivered nor in the DLT.
    assert_eq!(seen(out), (vec![(0, 2)], vec![0, 1, 2]));
    assert!(in_dlt(&mock).is_empty());
    assert_eq!(book.waiting(), 0, "nothing of the batch acknowledged");
}

#[tokio::test]
async fn a_member_with_part_of_a_batch_diverted_whole_before_has_that_part_acknowledged() {
    let mock = MockBroker::start().await;
    let f = filter_with(&mock, Duration::from_secs(3), DIVERT_WHOLE).await;
    let book = ShareAcks::default();
    // The first member acquired the batch's first offset: diverted whole.
    run(
        &f,
        &book,
        response_of(with_undecodable_batch(), &[(0, 3)], 30_000),
    )
    .await;
    assert_eq!(in_dlt(&mock), [3]);
    assert_eq!(
        spans(&book.take(&session(), std::time::Instant::now())),
        [(3, 3)]
    );
    // Another delivery acquires only 4..=5 of it: in the DLT already, so
    // acknowledged, not left acquired without records.
    let out = run(
        &f,
        &book,
        response_of(with_undecodable_batch(), &[(4, 5)], 30_000),
    )
    .await;
    assert_eq!(in_dlt(&mock), [3], "written once");
    assert_eq!(seen(out).0, Vec::<(i64, i64)>::new());
    assert_eq!(
        spans(&book.take(&session(), std::time::Instant::now())),
        [(4, 5)]
    );
}

#[tokio::test]
async fn the_acknowledgement_deadline_runs_from_the_responses_arrival_not_from_the_dlt_wait() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(5)).await;
    mock.state().produce_delay = Some(Duration::from_millis(1200));
    let book = ShareAcks::default();
    let arrived = std::time::Instant::now();
    // A 20 s lock: the proxy's acknowledgement must reach the broker by
    // 15 s after the response arrived (min(lock / 4, 5 s) kept as margin);
    // the DLT wait alone is 1.2 s. (A 2 s lock made a loaded machine's
    // slow filter miss the deadline itself and drop the acknowledgement.)
    let body = response_of(batch(&[r#"{"a":0}"#, POISON], 0), &[(0, 1)], 20_000);
    run(&f, &book, body).await;
    // The fault took effect: the DLT write was held up, so a deadline
    // counted from after it would be past the bound below.
    assert!(
        arrived.elapsed() >= Duration::from_millis(1200),
        "the DLT write was not delayed"
    );
    assert_eq!(in_dlt(&mock), [1]);
    let owed = book.take(&session(), arrived);
    assert_eq!(spans(&owed), [(1, 1)]);
    // Up to 600 ms for the test's own steps before the filter starts; a
    // deadline counted after the DLT wait would be 1.2 s later.
    let bound = arrived + Duration::from_millis(15_600);
    assert!(
        owed[0].expires <= bound,
        "expires {:?} after the lock's deadline",
        owed[0].expires - bound
    );
}

#[tokio::test]
async fn ranges_a_broker_could_not_have_acquired_withhold_the_partition() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let values = [r#"{"a":0}"#, POISON, r#"{"a":2}"#];
    for bad in [
        vec![(0, 1), (1, 2)],                 // overlapping
        vec![(2, 2), (0, 0)],                 // unsorted
        vec![(0, 5)],                         // past the records
        vec![(0, 0), (1, 1), (2, 2), (4, 4)], // more than records + 1... and outside
        vec![(0, 0), (1, 1), (2, 2), (2, 1)], // backwards
    ] {
        let book = ShareAcks::default();
        let out = run(&f, &book, response(&values, &bad)).await;
        assert_eq!(seen(out), (vec![], vec![]), "{bad:?}");
        assert_eq!(book.waiting(), 0, "{bad:?}");
    }
    assert!(
        in_dlt(&mock).is_empty(),
        "nothing judged from ranges not believed"
    );
}

#[tokio::test]
async fn a_topic_entry_with_only_an_error_does_not_make_the_ledger_forget_the_topic() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let book = ShareAcks::default();
    run(&f, &book, response(&[r#"{"a":0}"#, POISON], &[(0, 1)])).await;
    let ledger = f.dead_letter.ledger();
    let t: std::sync::Arc<str> = "t".into();
    let live = ledger.topic_id("t");
    assert!(live.is_some_and(|id| id != OLD_ID));
    assert_eq!(ledger.diverted_in(&t, 0, 0, 10), [1]);
    // A member still asking by the deleted topic's id: UNKNOWN_TOPIC_ID.
    let stale = ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(30_000)
        .with_responses(vec![ShareFetchableTopicResponse::default()
            .with_topic_id(OLD_ID)
            .with_partitions(vec![PartitionData::default()
                .with_partition_index(0)
                .with_error_code(100)])]);
    let mut body = bytes::BytesMut::new();
    stale.encode(&mut body, VERSION).expect("encode");
    let s = session();
    let call = ShareCall {
        session: Some(&s),
        book: &book,
        removed_ack: REJECT,
        last_delivery: 2,
        settled: Default::default(),
    };
    f.filter_share(&BY_ID, body.freeze(), VERSION, call)
        .await
        .expect("filter");
    assert_eq!(ledger.topic_id("t"), live);
    assert_eq!(
        ledger.diverted_in(&t, 0, 0, 10),
        [1],
        "the diversion is remembered"
    );
}

/// The value of `name{topic="t",partition="<partition>",...}` series whose
/// labels contain `extra`, summed, in the process's metrics.
fn counted(name: &str, partition: i32, extra: &str) -> f64 {
    let text = crate::metrics::global().render();
    let want = format!("partition=\"{partition}\"");
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains("topic=\"t\"") && l.contains(&want))
        .filter(|l| l.contains(extra))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_member_is_counted_for_the_records_it_acquired_not_for_the_whole_batch() {
    let mock = MockBroker::start().await;
    let f = filter_with(&mock, Duration::from_secs(3), "    on_invalid: drop\n").await;
    let book = ShareAcks::default();
    // Partition 7: no other test counts there.
    let body = |acquired: &[(i64, i64)]| {
        let resp = ShareFetchResponse::decode(
            &mut response(&[r#"{"a":0}"#, POISON, r#"{"a":2}"#], acquired),
            VERSION,
        )
        .expect("decode");
        let mut resp = resp;
        resp.responses[0].partitions[0].partition_index = 7;
        let mut out = bytes::BytesMut::new();
        resp.encode(&mut out, VERSION).expect("encode");
        out.freeze()
    };
    let read = || {
        (
            counted("antidote_records_validated_total", 7, ""),
            counted("antidote_records_passed_total", 7, ""),
            counted("antidote_records_invalid_total", 7, "action=\"dropped\""),
        )
    };
    // A batch sent again for the one record released: 0 and 1 were
    // settled long ago (another member's deliveries counted them).
    let before = read();
    let _ = f
        .filter_share(
            &BY_ID,
            body(&[(2, 2)]),
            VERSION,
            ShareCall {
                session: Some(&session()),
                book: &book,
                removed_ack: REJECT,
                last_delivery: 2,
                settled: Default::default(),
            },
        )
        .await
        .expect("filter");
    let after = read();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (1.0, 1.0, 0.0),
        "judged, passed, dropped for the one record acquired"
    );
    // Acquired whole: every record counted once.
    run(&f, &book, body(&[(0, 2)])).await;
    let whole = read();
    assert_eq!(
        (whole.0 - after.0, whole.1 - after.1, whole.2 - after.2),
        (3.0, 2.0, 1.0)
    );
}
