//! One record judged by `Policy::judge`, per value format, on ~200-byte
//! geofence triggers. Throughput is in records (validations).
//!
//! - json_rules: JSON decode + coordinate, one_of, min/max, max_age rules,
//!   required header (no JSON Schema).
//! - json_cel, json_cel_ten: json_rules plus a CEL condition comparing two
//!   fields the rules read already (`message.lat > message.lon`), or the
//!   ten-clause one of `CEL_TEN` (what a condition adds to a judged record).
//! - json_schema: the reference policy `policies/geofence.yaml` (the above
//!   plus JSON Schema).
//! - json_schema_gaps: the same, every other record without the optional
//!   `speed_mps` (records unlike the first one, whose layout is learned).
//! - avro: `policies/geofence-avro.yaml` (Confluent wire, schema id 1).
//! - protobuf: `policies/geofence-protobuf.yaml` (Confluent wire).
//! - avro_registry, protobuf_registry: the same policies with `registry:
//!   true` instead of `schema_ids`, schema id 1 already in the schema cache
//!   (the cost of judging once the registry has answered).
//! - avro_registry_contract, avro_registry_contract_field: avro_registry
//!   with schema id 1 carrying a Confluent data-contract rule (mode READ,
//!   onFailure DLQ): `CEL` `message.lat > message.lon` (two fields
//!   compared), or `CEL_FIELD` `typeName == 'DOUBLE' ; value < 100.0`
//!   (checked on `lat` and `lon`); avro_registry is their baseline. The
//!   setup also asserts that a record breaking the rule is refused by it.
//! - avro_registry_contract_write: the CEL rule with mode WRITE, never run
//!   on reads (what a schema with rules costs before its rules run).
//!
//! Each case judges a rotating set of 1024 distinct records, and the setup
//! asserts that all of them are valid and that a poisoned one is not (so the
//! benchmark cannot silently measure an early-exit error path).
//!
//! `scripts/bench/judge-cost.sh` counts instructions per judged record
//! under valgrind instead of time (`VALIDATE_ONLY`, `VALIDATE_LOOPS` below).

mod common;

use std::sync::Arc;

use antidote::kafka::record::{Header, Record};
use antidote::policy::contract::compile_contract;
use antidote::policy::formats::compile_schema as compile;
use antidote::policy::{Policy, PolicySet, SchemaCache, Verdict};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

const N: usize = 1024;

struct Owned {
    key: Bytes,
    value: Bytes,
    hkey: &'static [u8],
    hval: Bytes,
}

fn owned(values: impl Fn(&common::Trigger) -> Bytes) -> (Vec<Owned>, Owned) {
    let mk = |i: usize, poison: bool| Owned {
        key: Bytes::from(format!("device-{:08}", i)),
        value: values(&common::trigger(i, poison)),
        hkey: b"idempotency-key",
        hval: Bytes::from(format!("k-{i:012}")),
    };
    ((0..N).map(|i| mk(i, false)).collect(), mk(7, true))
}

fn record(o: &Owned, i: usize) -> Record<'_> {
    Record {
        offset: i as i64,
        timestamp: common::NOW_MS - 10,
        key: Some(&o.key),
        value: Some(&o.value),
        headers: vec![Header {
            key: o.hkey,
            value: Some(&o.hval),
        }],
    }
}

fn bench_one(
    c: &mut Criterion,
    name: &str,
    policy: Arc<Policy>,
    values: impl Fn(&common::Trigger) -> Bytes,
) {
    let (records, poison) = owned(values);
    let avg = records.iter().map(|o| o.value.len()).sum::<usize>() / N;
    for (i, o) in records.iter().enumerate() {
        let v = policy.judge(&record(o, i), common::NOW_MS);
        assert_eq!(v, Verdict::Valid, "{name}: record {i} should be valid");
    }
    assert!(
        !policy.judge(&record(&poison, 0), common::NOW_MS).is_valid(),
        "{name}: poison must be invalid"
    );
    let recs: Vec<Record<'_>> = records
        .iter()
        .enumerate()
        .map(|(i, o)| record(o, i))
        .collect();

    // `VALIDATE_ONLY=<name> VALIDATE_LOOPS=<n>`: judge n records of this
    // policy and exit, for counting instructions per record under
    // valgrind (the difference between two values of n,
    // `scripts/bench/judge-cost.sh`), which the machine's noise does not move.
    if let (Ok(only), Ok(loops)) = (
        std::env::var("VALIDATE_ONLY"),
        std::env::var("VALIDATE_LOOPS"),
    ) {
        if only == name {
            let loops: usize = loops.parse().expect("VALIDATE_LOOPS: a count");
            let valid = (0..loops)
                .filter(|i| {
                    policy
                        .judge(black_box(&recs[i % N]), common::NOW_MS)
                        .is_valid()
                })
                .count();
            eprintln!("validate/{name}: {valid} of {loops} judged valid");
            std::process::exit(0);
        }
        return;
    }

    let mut group = c.benchmark_group("validate");
    group.throughput(Throughput::Elements(1));
    eprintln!("validate/{name}: average value size {avg} bytes");
    let mut i = 0usize;
    group.bench_function(name, |b| {
        b.iter(|| {
            i = (i + 1) % N;
            black_box(policy.judge(black_box(&recs[i]), common::NOW_MS))
        })
    });
    group.bench_function(format!("{name}/poison"), |b| {
        let r = record(&poison, 0);
        b.iter(|| black_box(policy.judge(black_box(&r), common::NOW_MS)))
    });
    group.finish();
}

/// `file`'s policy with `registry: true` in place of its `schema_ids`
/// block, and schema id 1 (`schema`, of registry type `kind`) cached.
fn registry_policy(file: &str, ids_block: &str, schema: &str, kind: &str) -> Arc<Policy> {
    registry_policy_with(file, ids_block, schema, kind, None)
}

/// A `ruleSet` of one domain rule of `mode` and `rule_type` (onFailure DLQ).
fn rule_set(mode: &str, rule_type: &str, expr: &str) -> serde_json::Value {
    serde_json::json!({ "domainRules": [{
        "name": "bench", "kind": "CONDITION", "mode": mode,
        "type": rule_type, "expr": expr, "onFailure": "DLQ",
    }]})
}

/// [`registry_policy`], schema id 1 carrying the data-contract rules of
/// `rules` (a registry's `ruleSet`), if any.
fn registry_policy_with(
    file: &str,
    ids_block: &str,
    schema: &str,
    kind: &str,
    rules: Option<serde_json::Value>,
) -> Arc<Policy> {
    let dir = common::root().join("policies");
    let text = std::fs::read_to_string(dir.join(file)).expect("reference policy");
    assert!(text.contains(ids_block), "{file}: no {ids_block:?}");
    let mut text = text.replace(ids_block, "      registry: true\n");
    if kind == "PROTOBUF" {
        text = text.replace("      schema: schemas/trigger.proto\n", "");
    }
    let schema = std::fs::read_to_string(dir.join("schemas").join(schema)).expect("schema");
    let cache = SchemaCache::new();
    let contract = rules.map(|set| {
        compile_contract("geofence.triggers.avro-value", &set, kind, &schema)
            .expect("the bench's data-contract rule compiles")
            .expect("a rule that runs on reads or writes")
    });
    cache.put_schema_with(1, compile(Some(kind), &schema, &[]), contract);
    let set = PolicySet::parse_with(&text, &dir.join(file), &cache)
        .unwrap_or_else(|e| panic!("{file} with registry: {e:?}"));
    set.policies()[0].clone()
}

/// A record at (`lat`, `lon`), which only the data-contract rule refuses,
/// is refused by it when the rule runs on reads, and valid otherwise.
fn assert_contract_runs(name: &str, policy: &Policy, (lat, lon): (f64, f64), runs: bool) {
    let t = common::Trigger {
        lat,
        lon,
        ..common::trigger(3, false)
    };
    let o = Owned {
        key: Bytes::from_static(b"device-00000003"),
        value: common::avro_value(&t),
        hkey: b"idempotency-key",
        hval: Bytes::from_static(b"k-000000000003"),
    };
    match policy.judge(&record(&o, 3), common::NOW_MS) {
        Verdict::Invalid(i) if runs && i.contract.is_some() => {}
        Verdict::Valid if !runs => {}
        v => panic!("{name}: ({lat}, {lon}), the rule run {runs}: {v:?}"),
    }
}

/// Ten clauses, each true of every benchmark record, of every kind a
/// condition over a flat record uses.
const CEL_TEN: &str = r#"      - cel: 'message.lat > message.lon && message.transition != "X" && message.speed_mps >= 0.0 && message.accuracy_m <= 100.0 && message.event_time_ms > 0 && message.transition in ["ENTER", "EXIT", "DWELL"] && message.lat < 90.0 && size(message.device_id) < 64 && message.device_id.startsWith("device-") && message.event_time_ms + 1 > message.event_time_ms'
"#;

/// avro_registry with a data-contract rule on schema id 1: `CEL` comparing
/// two fields, `CEL_FIELD` checking the `DOUBLE` fields, and a `WRITE`
/// rule (not run on reads: the cost of the decoded value alone).
fn bench_contracts(c: &mut Criterion) {
    const TWO: &str = "message.lat > message.lon";
    for (name, mode, rule_type, expr, breaks) in [
        ("avro_registry_contract", "READ", "CEL", TWO, (1.0, 2.0)),
        (
            "avro_registry_contract_field",
            "READ",
            "CEL_FIELD",
            "typeName == 'DOUBLE' ; value < 100.0",
            (48.0, 150.0),
        ),
        (
            "avro_registry_contract_write",
            "WRITE",
            "CEL",
            TWO,
            (1.0, 2.0),
        ),
    ] {
        let policy = registry_policy_with(
            "geofence-avro.yaml",
            "      schema_ids:\n        1: schemas/trigger.avsc\n",
            "trigger.avsc",
            "AVRO",
            Some(rule_set(mode, rule_type, expr)),
        );
        assert_contract_runs(name, &policy, breaks, mode == "READ");
        bench_one(c, name, policy, common::avro_value);
    }
}

fn bench_validate(c: &mut Criterion) {
    bench_one(
        c,
        "json_rules",
        common::json_rules_policy(),
        common::json_value,
    );
    bench_one(
        c,
        "json_cel",
        common::json_rules_policy_with("      - cel: 'message.lat > message.lon'\n"),
        common::json_value,
    );
    bench_one(
        c,
        "json_cel_ten",
        common::json_rules_policy_with(CEL_TEN),
        common::json_value,
    );
    bench_one(
        c,
        "json_schema",
        common::load_policy("geofence.yaml"),
        common::json_value,
    );
    bench_one(
        c,
        "json_schema_gaps",
        common::load_policy("geofence.yaml"),
        common::json_value_gaps,
    );
    bench_one(
        c,
        "avro",
        common::load_policy("geofence-avro.yaml"),
        common::avro_value,
    );
    bench_one(
        c,
        "protobuf",
        common::load_policy("geofence-protobuf.yaml"),
        common::protobuf_value,
    );
    bench_one(
        c,
        "avro_registry",
        registry_policy(
            "geofence-avro.yaml",
            "      schema_ids:\n        1: schemas/trigger.avsc\n",
            "trigger.avsc",
            "AVRO",
        ),
        common::avro_value,
    );
    bench_contracts(c);
    bench_one(
        c,
        "protobuf_registry",
        registry_policy(
            "geofence-protobuf.yaml",
            "      schema_ids:\n        1: schemas/trigger.proto\n",
            "trigger.proto",
            "PROTOBUF",
        ),
        common::protobuf_value,
    );
}

criterion_group!(benches, bench_validate);
criterion_main!(benches);
