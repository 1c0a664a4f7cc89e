//! Batch filtering as the proxy does it for one partition of a Fetch
//! response: `plan_partition` (split, decompress, decode, judge every record
//! under the reference JSON policy, plan diversions) and, when something
//! changes, `apply_chunks` (splice and re-compress the batches that lost
//! records; kept batches stay slices of the input, as the proxy writes
//! them). Throughput is in records.
//!
//! Variants: clean / 0.1 % poison / 100 % poison, uncompressed / lz4 / zstd,
//! and "cached": the same batches fetched again (second consumer group) once
//! the first fetch's diversions are acknowledged, when the verdict cache
//! answers and batches that lost records are resent as spliced before;
//! "threads": 1 and 2 threads rewriting at once with a shared cache.
//!
//! Before measuring, the setup asserts the zero-copy property of the clean
//! path: a batch with nothing to remove is forwarded as the original
//! `Bytes` (same pointer), not a copy.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use antidote::kafka::batch::{segments, Segment};
use antidote::kafka::compression::Compression;
use antidote::kafka::splice::splice;
use antidote::plan::budget::DecodeBudget;
use antidote::plan::verdicts::VerdictCache;
use antidote::plan::{plan_partition, plan_partition_with, Env, PartitionInput, Visibility};
use antidote::policy::Policy;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

/// Partition 0 of `topic` at the bench clock.
fn input<'a>(
    policy: &'a Arc<Policy>,
    topic: &'a Arc<str>,
    records: &'a Bytes,
    visibility: &'a Visibility,
) -> PartitionInput<'a> {
    PartitionInput {
        policy,
        topic,
        partition: 0,
        records,
        visibility,
        now_ms: common::NOW_MS,
        deadline: None,
    }
}

const BATCHES: usize = 4;
const PER_BATCH: usize = 1000;

fn assert_clean_path_is_zero_copy(section: &Bytes) {
    let policy = common::load_policy("geofence.yaml");
    let topic: Arc<str> = Arc::from("geofence.triggers");
    let cache = VerdictCache::new(1024);
    let vis = Visibility::new(false, None);
    let plan = plan_partition(&input(&policy, &topic, section, &vis), &cache);
    assert_eq!(plan.stats.validated as usize, BATCHES * PER_BATCH);
    assert!(plan.diversions.is_empty());
    // Nothing changes: the interceptor forwards the response as it arrived.
    assert!(
        !plan.changes_anything(),
        "clean section must not be rebuilt"
    );
    for seg in segments(section) {
        let Segment::Batch(batch) = seg else {
            panic!("unexpected segment")
        };
        // The batch is a slice of the section, not a copy...
        let off = batch.bytes().as_ptr() as usize - section.as_ptr() as usize;
        assert!(off < section.len());
        // ...and splicing it with nothing removed returns those same bytes.
        let decoded = batch.decode().unwrap();
        let out = splice(&batch, &decoded, &vec![true; decoded.len()], None).unwrap();
        assert_eq!(
            out.as_ptr(),
            batch.bytes().as_ptr(),
            "clean splice copied the batch"
        );
        assert_eq!(out.len(), batch.bytes().len());
    }
}

fn bench_filter(c: &mut Criterion) {
    if std::env::var_os("FILTER_LOOPS").is_some() {
        return; // counting instructions of `bench_threads`' rewrite only
    }
    let policy = common::load_policy("geofence.yaml");
    let topic: Arc<str> = Arc::from("geofence.triggers");
    let vis = Visibility::new(false, None);

    let mut group = c.benchmark_group("filter");
    group.throughput(Throughput::Elements((BATCHES * PER_BATCH) as u64));
    for (codec_name, codec) in [
        ("none", Compression::None),
        ("lz4", Compression::Lz4),
        ("zstd", Compression::Zstd),
    ] {
        for (poison_name, every) in [
            ("clean", 0usize),
            ("poison0.1pct", 1000),
            ("poison100pct", 1),
        ] {
            let section = common::json_section(BATCHES, PER_BATCH, every, codec);
            if every == 0 {
                assert_clean_path_is_zero_copy(&section);
            }
            let expected_invalid = (0..BATCHES * PER_BATCH)
                .filter(|&i| common::is_poison(i, every))
                .count();
            // Sanity: the plan finds exactly the poison records.
            {
                let cache = VerdictCache::new(1024);
                let plan = plan_partition(&input(&policy, &topic, &section, &vis), &cache);
                assert_eq!(
                    plan.diversions.len(),
                    expected_invalid,
                    "{codec_name}/{poison_name}"
                );
                assert_eq!(plan.changes_anything(), expected_invalid > 0);
                let out = plan.apply(None).unwrap();
                // A batch that lost its tail ends in a commit marker (a
                // control batch), which holds no data record.
                let kept: usize = segments(&out)
                    .iter()
                    .map(|s| match s {
                        Segment::Batch(b) if b.is_control() => 0,
                        Segment::Batch(b) => b.records_count() as usize,
                        _ => panic!("unexpected segment in output"),
                    })
                    .sum();
                assert_eq!(kept, BATCHES * PER_BATCH - expected_invalid);
            }
            let id = format!("{codec_name}/{poison_name}");
            // First fetch: every record judged.
            group.bench_with_input(BenchmarkId::new("judge", &id), &section, |b, section| {
                b.iter(|| {
                    let cache = VerdictCache::new(16);
                    let plan = plan_partition(&input(&policy, &topic, section, &vis), &cache);
                    let out = if plan.changes_anything() {
                        Some(plan.apply_chunks(None).unwrap())
                    } else {
                        None
                    };
                    black_box((plan.diversions.len(), out))
                })
            });
            // Fetched again (another group) after the first fetch's
            // diversions were acknowledged: verdicts and spliced batches
            // come from the cache, nothing is judged, decoded or diverted.
            let cache = VerdictCache::new(1024);
            let first = plan_partition(&input(&policy, &topic, &section, &vis), &cache);
            let mut diverted: Vec<i64> = first.diversions.iter().map(|d| d.origin_offset).collect();
            diverted.sort_unstable();
            let _ = first.apply(None).unwrap();
            let ledger = |from: i64, to: i64| -> Vec<i64> {
                diverted
                    .iter()
                    .copied()
                    .filter(|o| (from..to).contains(o))
                    .collect()
            };
            let budget = DecodeBudget::unlimited();
            group.bench_with_input(BenchmarkId::new("cached", &id), &section, |b, section| {
                b.iter(|| {
                    let plan = plan_partition_with(
                        &input(&policy, &topic, section, &vis),
                        &Env {
                            verdicts: &cache,
                            budget: &budget,
                            already: &ledger,
                        },
                    );
                    assert_eq!(plan.stats.cached_batches as usize, BATCHES);
                    assert!(plan.diversions.is_empty());
                    let out = if plan.changes_anything() {
                        Some(plan.apply_chunks(None).unwrap())
                    } else {
                        None
                    };
                    black_box((plan.diversions.len(), out))
                })
            });
        }
    }
    group.finish();
}

/// Scaling with cores: 1 and 2 threads each rewriting partitions of their
/// own at once (0.1 % poison, uncompressed), sharing one verdict cache as
/// the connections on the runtime's worker threads do. Throughput counts
/// every thread's records, so 2 threads at twice the 1-thread rate means
/// nothing shared serializes them.
fn bench_threads(c: &mut Criterion) {
    // FILTER_FORMAT: the reference policy and values of one format (json,
    // the default, so that earlier counts stay comparable; avro; protobuf).
    let format = std::env::var("FILTER_FORMAT").unwrap_or_else(|_| "json".into());
    let (file, value): (&str, fn(&common::Trigger) -> Bytes) = match format.as_str() {
        "json" => ("geofence.yaml", common::json_value),
        "avro" => ("geofence-avro.yaml", common::avro_value),
        "protobuf" => ("geofence-protobuf.yaml", common::protobuf_value),
        other => panic!("FILTER_FORMAT: json, avro or protobuf, not {other}"),
    };
    // FILTER_POISON_EVERY: one poison record in that many (default 1000:
    // one per batch, so every batch loses a record; 0: none, so no batch
    // does, the case a lever for clean batches must show).
    let every = std::env::var("FILTER_POISON_EVERY").map_or(1000, |v| {
        v.parse::<usize>().expect("FILTER_POISON_EVERY: a count")
    });
    let policy = common::load_policy(file);
    let vis = Visibility::new(false, None);
    let section = common::section(value, BATCHES, PER_BATCH, every, Compression::None);
    let cache = VerdictCache::new(100_000);
    let serial = AtomicUsize::new(0);
    let rewrite = || {
        // A topic never seen: every batch is judged.
        let n = serial.fetch_add(1, Ordering::Relaxed);
        let topic: Arc<str> = Arc::from(format!("t{n}"));
        let plan = plan_partition(&input(&policy, &topic, &section, &vis), &cache);
        let out = plan.changes_anything().then(|| plan.apply_chunks(None));
        black_box((plan.diversions.len(), out));
    };
    // `FILTER_LOOPS=<n>`: rewrite the partition n times on this thread and
    // exit, for counting instructions per record under valgrind
    // (`scripts/bench/judge-cost.sh --filter`), which the machine's noise
    // does not move.
    if let Ok(loops) = std::env::var("FILTER_LOOPS") {
        let loops: usize = loops.parse().expect("FILTER_LOOPS: a count");
        (0..loops).for_each(|_| rewrite());
        eprintln!(
            "threads: {loops} rewrites of {} {format} records",
            BATCHES * PER_BATCH
        );
        std::process::exit(0);
    }
    let mut group = c.benchmark_group("threads");
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements((threads * BATCHES * PER_BATCH) as u64));
        group.bench_function(BenchmarkId::new("judge/none/poison0.1pct", threads), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| (0..iters).for_each(|_| rewrite()));
                    }
                });
                start.elapsed()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_filter, bench_threads);
criterion_main!(benches);
