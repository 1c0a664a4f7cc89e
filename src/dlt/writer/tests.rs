//! The dead-letter producer and ledger loader against an in-process mock
//! broker (`mock_broker`): the failures tansu cannot be made to produce.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use uuid::Uuid;

use super::*;
use crate::client::mock_broker::MockBroker;
use crate::config::DltCompression;
use crate::dlt::backoff;
use crate::dlt_record::*;
use crate::kafka::batch::Batch;
use crate::kafka::builder::{build_batch, BuildOptions};
use crate::kafka::compression::Compression;
use crate::policy::Invalid;

fn endpoint() -> client::Endpoint {
    client::Endpoint {
        tls: None,
        sasl: None,
        timeout: Duration::from_secs(2),
        max_frame: 1 << 20,
    }
}

fn config(partitions: i32, compression: DltCompression) -> DeadLetterConfig {
    DeadLetterConfig {
        partitions,
        compression,
        timeout: Duration::from_secs(3),
        ..Default::default()
    }
}

fn policies(topics: &str) -> Arc<PolicySet> {
    let text =
        format!("policies:\n  - name: p\n    topics: [{topics}]\n    value: {{ format: json }}\n");
    Arc::new(PolicySet::parse(&text, Path::new("p.yaml")).expect("policy"))
}

fn start(mock: &MockBroker, cfg: &DeadLetterConfig, pols: Arc<PolicySet>) -> Arc<DeadLetter> {
    DeadLetter::start(
        cfg,
        std::slice::from_ref(&mock.addr),
        endpoint(),
        endpoint(),
        pols,
    )
}

/// A poison record of `topic`/`partition`@`offset` with a value of `len`
/// bytes that do not compress much.
fn diversion(topic: &str, partition: i32, offset: i64, len: usize) -> Diversion {
    let value: Vec<u8> = (0..len)
        .map(|i| (i * 7919 % 251) as u8 ^ (offset as u8))
        .collect();
    Diversion {
        dlt_topic: format!("{topic}.dlt"),
        origin_topic: Arc::from(topic),
        origin_partition: partition,
        origin_offset: offset,
        origin_timestamp: 1_700_000_000_000,
        key: None,
        value: Some(Bytes::from(value)),
        headers: vec![],
        invalid: Invalid {
            class: Class::Poison,
            rule: "schema".into(),
            reason: "bad".into(),
            contract: None,
        },
        policy: Arc::from("p"),
        blocked_by: None,
        last_offset: None,
    }
}

async fn divert_all(dl: &DeadLetter, ds: &[Diversion]) -> Vec<bool> {
    tokio::time::timeout(Duration::from_secs(5), dl.ready())
        .await
        .expect("ledger loads")
        .expect("running");
    let tickets: Vec<_> = ds.iter().map(|d| dl.submit(d).expect("submit")).collect();
    let mut out = Vec::new();
    for t in tickets {
        out.push(t.wait().await.is_ok());
    }
    out
}

/// (origin offset, codec) of every record stored in `topic`/`partition`.
fn stored(mock: &MockBroker, topic: &str, partition: usize) -> Vec<(i64, Option<Compression>)> {
    let mut out = Vec::new();
    for (_, b) in mock.records(topic, partition) {
        let b = Batch::new(b).expect("batch");
        let codec = b.compression();
        for r in b.decode().expect("decode").records() {
            let ctx = crate::dlt::trust::open(
                crate::dlt::trust::Reader::Inspect,
                topic,
                partition as i32,
                &r,
            )
            .expect("antidote's frame");
            if crate::dlt_marker::is_marker(&ctx) {
                continue;
            }
            let o = Origin::of(&ctx).expect("origin headers");
            out.push((o.offset, codec));
        }
    }
    out
}

#[tokio::test]
async fn a_batch_refused_as_too_large_is_split_down_to_single_records() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    mock.state().max_batch_bytes = Some(4000);
    let dl = start(&mock, &config(1, DltCompression::None), policies("t"));
    let ds: Vec<_> = (0..8)
        .map(|o| diversion("t", 0, o, if o == 3 { 6000 } else { 900 }))
        .collect();
    let ok = divert_all(&dl, &ds).await;
    // Only the record too large on its own fails; the others are in order.
    assert_eq!(ok, [true, true, true, false, true, true, true, true]);
    let offsets: Vec<i64> = stored(&mock, "t.dlt", 0).iter().map(|s| s.0).collect();
    assert_eq!(offsets, [0, 1, 2, 4, 5, 6, 7]);
    {
        let st = mock.state();
        assert!(st
            .produced
            .iter()
            .any(|p| p.3 == client::errors::MESSAGE_TOO_LARGE && p.2 == 1));
        assert!(st
            .produced
            .iter()
            .any(|p| p.3 == client::errors::MESSAGE_TOO_LARGE && p.2 > 1));
    }
    let failed = dl.submit(&ds[3]).expect("submit").wait().await;
    assert!(
        failed.is_err(),
        "a record too large keeps failing (its partition stays held)"
    );
}

#[tokio::test]
async fn a_failed_partition_fails_only_its_jobs_and_acknowledged_ones_are_never_rewritten() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 2);
    mock.state().fail.insert(("t.dlt".into(), 1), 19); // NOT_ENOUGH_REPLICAS
    let dl = start(&mock, &config(2, DltCompression::Gzip), policies("t"));
    let ds = [diversion("t", 0, 10, 50), diversion("t", 1, 20, 50)];
    assert_eq!(divert_all(&dl, &ds).await, [true, false]);
    assert!(dl.is_diverted(&super::ledger_key(&ds[0])));
    assert!(!dl.is_diverted(&super::ledger_key(&ds[1])));
    // The broker recovers; the next fetch diverts both again: only the
    // failed one is written.
    mock.state().fail.clear();
    assert_eq!(divert_all(&dl, &ds).await, [true, true]);
    assert_eq!(stored(&mock, "t.dlt", 0).len(), 1);
    assert_eq!(stored(&mock, "t.dlt", 1).len(), 1);
}

#[tokio::test]
async fn dlt_batches_are_compressed_and_topics_created_with_max_message_bytes() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    let dl = start(&mock, &config(1, DltCompression::default()), policies("t"));
    assert_eq!(divert_all(&dl, &[diversion("t", 0, 1, 100)]).await, [true]);
    assert_eq!(stored(&mock, "t.dlt", 0), [(1, Some(Compression::Gzip))]);
    let created = mock.state().created.clone();
    assert_eq!(
        created,
        [(
            "t.dlt".to_string(),
            vec![("max.message.bytes".to_string(), (1u32 << 20).to_string())]
        )]
    );
}

/// A DLT batch as the proxy writes it, for `(topic, offset, topic id)`.
fn dlt_batch(records: &[(&str, i64, Option<Uuid>)]) -> Bytes {
    let recs: Vec<_> = records
        .iter()
        .map(|(t, o, id)| {
            diversion(t, 0, *o, 10).to_record(1, *id, &crate::dlt::trust::seal("t.dlt", 0))
        })
        .collect();
    build_batch(&recs, &BuildOptions::default()).expect("batch")
}

async fn wait_ready(dl: &DeadLetter) {
    for _ in 0..200 {
        if dl.is_ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the ledger never became ready");
}

#[tokio::test]
async fn the_ledger_is_read_from_each_partitions_log_start() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    mock.add_topic("t.dlt", 1);
    let old: Vec<_> = (95..100).map(|o| ("t", o, None)).collect();
    let kept: Vec<_> = (100..105).map(|o| ("t", o, None)).collect();
    mock.append("t.dlt", 0, dlt_batch(&old));
    mock.append("t.dlt", 0, dlt_batch(&kept));
    {
        // Retention deleted the first segment: the log starts at 5.
        let mut st = mock.state();
        let log = &mut st.topics.get_mut("t.dlt").expect("dlt").1[0];
        log.log_start = 5;
        log.batches.remove(0);
    }
    let dl = start(&mock, &config(1, DltCompression::Gzip), policies("t"));
    wait_ready(&dl).await;
    assert_eq!(
        dl.ledger().diverted_in(&Arc::from("t"), 0, 0, 1000),
        [100, 101, 102, 103, 104]
    );
    assert_eq!(
        mock.state().fetch_errors,
        0,
        "never fetched below the log start"
    );
}

#[tokio::test]
async fn ledger_read_errors_are_retried_and_readiness_waits_for_them() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    mock.add_topic("t.dlt", 1);
    mock.append("t.dlt", 0, dlt_batch(&[("t", 7, None)]));
    mock.state().fail_fetches = 4;
    let dl = start(&mock, &config(1, DltCompression::Gzip), policies("t"));
    assert!(!dl.is_ready());
    wait_ready(&dl).await;
    assert_eq!(dl.ledger().diverted_in(&Arc::from("t"), 0, 0, 100), [7]);
    assert!(mock.state().fetch_errors >= 4);
}

#[tokio::test]
async fn only_records_from_the_topics_own_dlt_with_its_current_id_count() {
    let mock = MockBroker::start().await;
    let t_id = mock.add_topic("t", 1);
    mock.add_topic("u", 1);
    mock.add_topic("t.dlt", 1);
    mock.add_topic("u.dlt", 1);
    // In t's DLT: the current id, an earlier incarnation's id, no id.
    mock.append(
        "t.dlt",
        0,
        dlt_batch(&[
            ("t", 1, Some(t_id)),
            ("t", 2, Some(Uuid::from_u128(99))),
            ("t", 3, None),
        ]),
    );
    // Forged into u's DLT, naming t.
    mock.append(
        "u.dlt",
        0,
        dlt_batch(&[("t", 7, Some(t_id)), ("u", 5, None)]),
    );
    let dl = start(&mock, &config(1, DltCompression::Gzip), policies("t, u"));
    wait_ready(&dl).await;
    assert_eq!(dl.ledger().diverted_in(&Arc::from("t"), 0, 0, 100), [1, 3]);
    assert_eq!(dl.ledger().diverted_in(&Arc::from("u"), 0, 0, 100), [5]);
}

#[tokio::test]
async fn a_reload_loads_the_dlts_it_adds_and_they_read_as_not_loaded_until_then() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    mock.add_topic("u", 1);
    mock.add_topic("u.dlt", 1);
    mock.append("u.dlt", 0, dlt_batch(&[("u", 4, None)]));
    let dl = start(&mock, &config(1, DltCompression::Gzip), policies("t"));
    wait_ready(&dl).await;
    let u: Arc<str> = Arc::from("u");
    assert!(dl.ledger().diverted_in(&u, 0, 0, 100).is_empty());
    dl.policies_changed(policies("t, u"));
    for _ in 0..200 {
        if dl.is_loaded("u.dlt") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(dl.is_loaded("u.dlt"));
    assert_eq!(dl.ledger().diverted_in(&u, 0, 0, 100), [4]);
    wait_ready(&dl).await;
}

#[tokio::test]
async fn a_reload_that_makes_a_topic_write_to_a_loaded_shared_dlt_reads_it_again() {
    let shared = |topics: &str| {
        let text = format!(
            "policies:\n  - name: p\n    topics: [{topics}]\n    value: {{ format: json }}\n    dead_letter: {{ topic: all.dlt }}\n"
        );
        Arc::new(PolicySet::parse(&text, Path::new("p.yaml")).expect("policy"))
    };
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    mock.add_topic("u", 1);
    mock.add_topic("all.dlt", 1);
    mock.append("all.dlt", 0, dlt_batch(&[("t", 1, None), ("u", 4, None)]));
    let dl = start(&mock, &config(1, DltCompression::Gzip), shared("t"));
    wait_ready(&dl).await;
    let u: Arc<str> = Arc::from("u");
    assert!(
        dl.ledger().diverted_in(&u, 0, 0, 100).is_empty(),
        "u is not policed yet"
    );
    dl.policies_changed(shared("t, u"));
    for _ in 0..200 {
        if !dl.ledger().diverted_in(&u, 0, 0, 100).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(dl.ledger().diverted_in(&u, 0, 0, 100), [4]);
}

#[tokio::test]
async fn a_dlt_first_asked_about_later_is_loaded_on_demand() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    let dl = start(
        &mock,
        &config(1, DltCompression::Gzip),
        policies("t, \"v*\""),
    );
    wait_ready(&dl).await;
    // v1 and its DLT appear after the start.
    mock.add_topic("v1", 1);
    mock.add_topic("v1.dlt", 1);
    mock.append("v1.dlt", 0, dlt_batch(&[("v1", 2, None)]));
    assert!(!dl.is_loaded("v1.dlt"), "unknown until read");
    for _ in 0..200 {
        if dl.is_loaded("v1.dlt") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(dl.ledger().diverted_in(&Arc::from("v1"), 0, 0, 100), [2]);
}

#[test]
fn x_error_is_bounded_in_the_written_record() {
    let mut d = diversion("t", 0, 1, 10);
    d.invalid.reason = format!("/payload: {} is not valid", "é".repeat(100_000));
    let r = d.to_record(1, None, &crate::dlt::trust::seal("t.dlt", 0));
    let (_, v) = r
        .headers
        .iter()
        .find(|(k, _)| k == H_ERROR)
        .expect("x-error");
    let v = v.as_ref().expect("value");
    assert!(v.len() <= MAX_ERROR_BYTES, "{}", v.len());
    assert!(std::str::from_utf8(v)
        .expect("utf-8")
        .ends_with("[truncated]"));
}

#[test]
fn backoff_is_jittered_within_its_bounds() {
    let base = Duration::from_millis(100);
    let cap = Duration::from_secs(1);
    let draws: Vec<_> = (0..50).map(|_| backoff(2, base, cap)).collect();
    assert!(draws
        .iter()
        .all(|d| *d >= Duration::from_millis(200) && *d <= Duration::from_millis(400)));
    assert!(
        draws.iter().any(|d| *d != draws[0]),
        "not jittered: {draws:?}"
    );
    assert!(backoff(30, base, cap) <= cap);
}

#[tokio::test]
async fn concurrent_submits_of_one_record_share_one_write() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    let dl = loaded_writer_of_t(&mock).await;
    // Two fetches divert the same record before either write is done. Both
    // submits happen before the producer task runs, so they would land in
    // one round, where the producer's own ledger check sees neither done:
    // only the join keeps this to one write.
    let d = diversion("t", 0, 42, 50);
    let first = dl.submit(&d).expect("submit");
    let second = dl.submit(&d).expect("submit");
    assert!(first.wait().await.is_ok());
    assert!(second.wait().await.is_ok());
    assert_eq!(
        stored(&mock, "t.dlt", 0),
        [(42, Some(Compression::None))],
        "written once"
    );
    let records_produced: i32 = mock.state().produced.iter().map(|p| p.2).sum();
    assert_eq!(records_produced, 1, "one record sent to the DLT in all");
    assert!(dl.is_diverted(&super::ledger_key(&d)));
}

/// A dead-letter writer for topic `t` on `mock`, once its ledger has read
/// the DLTs.
async fn loaded_writer_of_t(mock: &MockBroker) -> Arc<DeadLetter> {
    let dl = start(mock, &config(1, DltCompression::None), policies("t"));
    tokio::time::timeout(Duration::from_secs(5), dl.ready())
        .await
        .expect("ledger loads")
        .expect("running");
    dl
}

/// A mock with topic `t` and its (empty) DLT, and a dead-letter writer
/// whose ledger has read that DLT.
async fn loaded_t_and_its_dlt() -> (MockBroker, Arc<DeadLetter>) {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    mock.add_topic("t.dlt", 1);
    let dl = loaded_writer_of_t(&mock).await;
    (mock, dl)
}

/// A DLT record of `d` as another instance would have written it.
fn written_elsewhere(d: &Diversion) -> Bytes {
    build_batch(
        &[d.to_record(
            1_700_000_000_000,
            None,
            &crate::dlt::trust::seal("t.dlt", 0),
        )],
        &BuildOptions::default(),
    )
    .expect("batch")
}

#[tokio::test]
async fn the_tail_learns_a_diversion_another_instance_wrote_after_the_start() {
    let (mock, dl) = loaded_t_and_its_dlt().await;
    let key: LedgerKey = (Arc::from("t"), 0, 42);
    assert!(!dl.is_diverted(&key));
    mock.append("t.dlt", 0, written_elsewhere(&diversion("t", 0, 42, 10)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !dl.is_diverted(&key) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(dl.is_diverted(&key), "the tail did not learn it within 3 s");
}

#[tokio::test]
async fn a_record_another_instance_wrote_is_not_written_again() {
    let (mock, dl) = loaded_t_and_its_dlt().await;
    // Written by someone else just now: the tail may not have seen it, the
    // read before the write does.
    mock.append("t.dlt", 0, written_elsewhere(&diversion("t", 0, 7, 10)));
    let ok = divert_all(&dl, &[diversion("t", 0, 7, 10), diversion("t", 0, 8, 10)]).await;
    assert_eq!(ok, [true, true]);
    let offsets: Vec<i64> = stored(&mock, "t.dlt", 0).iter().map(|s| s.0).collect();
    assert_eq!(offsets, [7, 8], "offset 7 once, offset 8 written");
}

/// Another instance's DLT record of offset 7 is in the DLT, and `disturb`
/// makes the next Fetches say nothing about where the partition ends. The
/// writer must still find the record, and not write it again.
async fn offset_7_is_found_despite(disturb: impl FnOnce(&mut crate::client::mock_broker::State)) {
    let (mock, dl) = loaded_t_and_its_dlt().await;
    mock.append("t.dlt", 0, written_elsewhere(&diversion("t", 0, 7, 10)));
    disturb(&mut mock.state());
    let ok = divert_all(&dl, &[diversion("t", 0, 7, 10)]).await;
    assert_eq!(ok, [true]);
    let offsets: Vec<i64> = stored(&mock, "t.dlt", 0).iter().map(|s| s.0).collect();
    assert_eq!(offsets, [7], "offset 7 once: not written again");
    // The fault took effect: some Fetch was answered disturbed (the
    // callers disturb three; the tail may meet some of them too).
    let st = mock.state();
    assert!(
        st.fail_fetches + st.hide_records < 3,
        "no Fetch met the disturbance"
    );
}

#[tokio::test]
async fn a_dlt_read_whose_answer_lacks_the_partition_is_retried_before_writing() {
    // The next Fetches name the partition only with an error.
    offset_7_is_found_despite(|st| st.fail_fetches = 3).await;
}

#[tokio::test]
async fn a_dlt_read_answered_below_its_end_without_records_is_retried_before_writing() {
    // The next Fetches give the partition's end past the record but no
    // records, as tansu 0.6 does between raising the watermark and storing
    // the batch.
    offset_7_is_found_despite(|st| st.hide_records = 3).await;
}

#[tokio::test]
async fn a_dlt_that_never_gives_records_below_its_end_holds_the_write() {
    let (mock, dl) = loaded_t_and_its_dlt().await;
    mock.append("t.dlt", 0, written_elsewhere(&diversion("t", 0, 7, 10)));
    mock.state().hide_records = usize::MAX;
    let ok = divert_all(&dl, &[diversion("t", 0, 8, 10)]).await;
    assert_eq!(ok, [false], "the write waits: the DLT's end cannot be read");
    let offsets: Vec<i64> = stored(&mock, "t.dlt", 0).iter().map(|s| s.0).collect();
    assert_eq!(offsets, [7], "nothing written while the end is unknown");
}

/// How many lease markers `topic`/`partition` holds.
fn lease_markers(mock: &MockBroker, topic: &str, partition: usize) -> usize {
    mock.records(topic, partition)
        .into_iter()
        .map(|(_, b)| {
            let b = Batch::new(b).expect("batch");
            let d = b.decode().expect("decode");
            d.records()
                .filter(|r| r.header(crate::dlt_marker::H_MARKER) == Some(Some(&b"lease"[..])))
                .count()
        })
        .sum()
}

#[tokio::test]
async fn a_write_read_for_before_another_instance_took_the_lease_is_not_written_twice() {
    // Kafka fences an older epoch only once the partition has appended a
    // newer one. Instance 1 reads, then its write is slow to land; instance
    // 2 takes the lease meanwhile. Without a lease marker, instance 2 reads
    // before instance 1's write lands and writes the record again.
    let (mock, dl1) = loaded_t_and_its_dlt().await;
    let dl2 = loaded_writer_of_t(&mock).await;
    {
        let mut st = mock.state();
        st.kafka_fencing = true;
        st.produce_delay = Some(Duration::from_millis(300));
    }
    let d = diversion("t", 0, 7, 10);
    let first = tokio::spawn({
        let (dl1, d) = (dl1.clone(), d.clone());
        async move { divert_all(&dl1, &[d]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = divert_all(&dl2, &[d]).await;
    assert_eq!(first.await.expect("task"), [true]);
    assert_eq!(second, [true]);
    let offsets: Vec<i64> = stored(&mock, "t.dlt", 0).iter().map(|s| s.0).collect();
    assert_eq!(offsets, [7], "offset 7 once");
    assert_eq!(
        lease_markers(&mock, "t.dlt", 0),
        1,
        "instance 2's lease (epoch 1) wrote a marker; instance 1's (epoch 0) did not"
    );
}

/// A record too large for its DLT is retried on every fetch of its
/// partition while the partition is held. The retries keep the lease: a new
/// lease would bump the epoch and write a lease marker each time, growing
/// the DLT by a few records a second for as long as the partition is held
/// (what Apache Kafka showed in tests/test_dlt_retention.py).
#[tokio::test]
async fn a_record_too_large_for_its_dlt_is_retried_under_the_same_lease() {
    let (mock, dl) = loaded_t_and_its_dlt().await;
    {
        let mut st = mock.state();
        st.kafka_fencing = true;
        st.max_batch_bytes = Some(4000);
    }
    let big = diversion("t", 0, 3, 6000);
    for _ in 0..3 {
        assert_eq!(divert_all(&dl, std::slice::from_ref(&big)).await, [false]);
    }
    assert_eq!(divert_all(&dl, &[diversion("t", 0, 4, 100)]).await, [true]);
    let epochs: Vec<i16> = mock.state().epochs.values().copied().collect();
    assert_eq!(epochs, [0], "one InitProducerId, the first epoch");
    assert_eq!(lease_markers(&mock, "t.dlt", 0), 0);
    let offsets: Vec<i64> = stored(&mock, "t.dlt", 0).iter().map(|s| s.0).collect();
    assert_eq!(offsets, [4]);
}

/// A record stamped past what the DLT accepts is written with the time of
/// its diversion, under the same lease; one also too large fails alone,
/// like any record too large, still under the same lease.
#[tokio::test]
async fn a_record_stamped_past_the_dlts_limit_is_written_retimed_under_the_same_lease() {
    let (mock, dl) = loaded_t_and_its_dlt().await;
    let limit = crate::clock::now_ms() + 3_600_000;
    {
        let mut st = mock.state();
        st.kafka_fencing = true;
        st.max_timestamp = Some(limit);
        st.max_batch_bytes = Some(4000);
    }
    let mut future = diversion("t", 0, 1, 100);
    future.origin_timestamp = limit + 86_400_000;
    let mut big = diversion("t", 0, 2, 6000);
    big.origin_timestamp = limit + 86_400_000;
    let ds = [
        diversion("t", 0, 0, 100),
        future,
        big,
        diversion("t", 0, 3, 100),
    ];
    assert_eq!(divert_all(&dl, &ds).await, [true, true, false, true]);
    assert_eq!(divert_all(&dl, &ds[2..3]).await, [false]);
    let offsets: Vec<i64> = stored(&mock, "t.dlt", 0).iter().map(|s| s.0).collect();
    assert_eq!(offsets, [0, 1, 3]);
    let epochs: Vec<i16> = mock.state().epochs.values().copied().collect();
    assert_eq!(epochs, [0], "one InitProducerId, the first epoch");
    assert_eq!(lease_markers(&mock, "t.dlt", 0), 0);
}

/// Fencing fails closed: while the transaction coordinator cannot be had,
/// a diversion is not written (its partition is held by the caller) and
/// nothing is cached; once it answers, the same diversion is written once.
#[tokio::test]
async fn without_a_lease_nothing_is_written_and_the_next_try_takes_one() {
    let (mock, dl) = loaded_t_and_its_dlt().await;
    mock.state().coordinator_error = Some(15); // COORDINATOR_NOT_AVAILABLE
    let d = diversion("t", 0, 7, 20);
    assert!(dl.submit(&d).expect("submit").wait().await.is_err());
    assert!(
        stored(&mock, "t.dlt", 0).is_empty(),
        "nothing written unfenced"
    );
    assert!(!dl.is_diverted(&super::ledger_key(&d)));
    mock.state().coordinator_error = None;
    assert!(dl.submit(&d).expect("submit").wait().await.is_ok());
    assert_eq!(stored(&mock, "t.dlt", 0), [(7, Some(Compression::None))]);
}

#[tokio::test]
async fn a_read_before_a_write_that_starts_below_the_log_start_reads_on_to_the_end() {
    // Retention (or DeleteRecords) moved the DLT's log start past where this
    // instance had read to; another instance's records lie between the new
    // log start and the end. The read before a write must go on from the log
    // start to the end, not take the log start for the end.
    let mock = MockBroker::start().await;
    mock.add_topic("t.dlt", 1);
    for o in 0..6 {
        mock.append(
            "t.dlt",
            0,
            written_elsewhere(&diversion("t", 0, 10 + o, 10)),
        );
    }
    mock.state().topics.get_mut("t.dlt").expect("dlt").1[0].log_start = 3;
    let mut cluster = client::Cluster::new(vec![mock.addr.clone()], endpoint());
    let found = crate::dlt::ledger::tail::catch_up(&mut cluster, "t.dlt", 0, 1, |_| true)
        .await
        .expect("read");
    let offsets: Vec<i64> = found.iter().map(|o| o.offset).collect();
    assert_eq!(offsets, [13, 14, 15], "from the log start to the end");
}

#[tokio::test]
async fn a_read_before_a_write_past_the_end_of_a_recreated_dlt_reads_it_from_its_start() {
    // The DLT was deleted and created again (or truncated): this instance had
    // read the old one to offset 5, the new one ends at 2. Its records are
    // another instance's writes: the read must find them, from the start.
    let mock = MockBroker::start().await;
    mock.add_topic("t.dlt", 1);
    for o in 0..2 {
        mock.append(
            "t.dlt",
            0,
            written_elsewhere(&diversion("t", 0, 20 + o, 10)),
        );
    }
    let mut cluster = client::Cluster::new(vec![mock.addr.clone()], endpoint());
    let found = crate::dlt::ledger::tail::catch_up(&mut cluster, "t.dlt", 0, 5, |_| true)
        .await
        .expect("read");
    let offsets: Vec<i64> = found.iter().map(|o| o.offset).collect();
    assert_eq!(offsets, [20, 21], "the new DLT's records, from its start");
}

#[tokio::test]
async fn a_follower_past_the_end_of_a_recreated_partition_reads_it_from_its_start() {
    // The blocked-key follower and re-drive had read the old DLT to offset
    // 5; the new one ends at 2: they read it from its start, not wait (or
    // fail) until its end passes 5.
    let mock = MockBroker::start().await;
    mock.add_topic("t.dlt", 1);
    for o in 0..2 {
        mock.append(
            "t.dlt",
            0,
            written_elsewhere(&diversion("t", 0, 30 + o, 10)),
        );
    }
    let mut cluster = client::Cluster::new(vec![mock.addr.clone()], endpoint());
    let mut seen = Vec::new();
    let next = crate::dlt::read::follow(&mut cluster, "t.dlt", 0, Some(5), &mut |r| {
        seen.push(r.offset);
        true
    })
    .await
    .expect("read");
    assert_eq!(seen, [0, 1], "the new partition's records, from its start");
    assert_eq!(next, 2);
}

/// The DLT follower reads each DLT partition once for all its readers, each
/// from its own position: the ledger from where its load stopped, the
/// blocked keys from the DLT's start. A DLT created again below the
/// ledger's position (deleted, another instance wrote the next diversion)
/// is read again from its start, so its records reach the ledger.
#[tokio::test]
async fn the_follower_reads_a_dlt_once_for_every_reader_from_its_own_position() {
    use crate::dlt::blocked::BlockedKeys;
    use crate::dlt::breaker::Breakers;
    use crate::dlt::follower::{Follower, KeyReaders};
    let mock = MockBroker::start().await;
    mock.add_topic("t", 1);
    mock.add_topic("t.dlt", 1);
    let keyed = |o: i64| {
        let mut d = diversion("t", 0, o, 10);
        d.key = Some(Bytes::from(format!("k{o}")));
        written_elsewhere(&d)
    };
    for o in 40..43 {
        mock.append("t.dlt", 0, keyed(o));
    }
    let text = "policies:\n  - name: p\n    topics: [t]\n    value: { format: json }\n    ordering: per_key\n";
    let pols = Arc::new(PolicySet::parse(text, Path::new("p.yaml")).expect("policy"));
    let (dl, workers) = DeadLetter::new(
        &config(1, DltCompression::None),
        std::slice::from_ref(&mock.addr),
        endpoint(),
        endpoint(),
        pols,
    );
    let blocked = Arc::new(BlockedKeys::default());
    let readers = KeyReaders {
        blocked: blocked.clone(),
        breakers: Arc::new(Breakers::default()),
        redrive: None,
    };
    let mut follower = Follower::new(workers.loader, Some(readers));
    follower.load_and_round().await;
    let key = |o| (Arc::from("t"), 0, o);
    assert!(
        (40..43).all(|o| dl.is_diverted(&key(o))),
        "the ledger's load"
    );
    assert_eq!(
        blocked.summary().0,
        3,
        "the blocked keys, from the DLT's start"
    );
    assert!(blocked.is_loaded());
    assert!(
        blocked.is_current_for(&["t.dlt".to_string()]),
        "read through in this round"
    );
    assert_eq!(dl.ledger().tail_position(&("t.dlt".into(), 0)), Some(3));
    // The DLT deleted and created again: one record, below the position.
    mock.state().topics.get_mut("t.dlt").expect("dlt").1[0] = Default::default();
    mock.append("t.dlt", 0, keyed(50));
    follower.load_and_round().await;
    assert!(dl.is_diverted(&key(50)), "read again from the start");
    assert_eq!(blocked.summary().0, 4);
    assert_eq!(dl.ledger().tail_position(&("t.dlt".into(), 0)), Some(1));
}
