//! Data-contract rules: what compiles, what is refused (naming subject and
//! rule), and their verdicts on each side through a registry policy.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::policy::formats::compile_schema;
use crate::policy::registry_tests::{avro_datum, invalid, set, NOW, TRIGGER_AVSC};
use crate::policy::{SchemaCache, Verdict};

fn rule(name: &str, rule_type: &str, mode: &str, expr: &str, on_failure: &str) -> Value {
    json!({"name": name, "kind": "CONDITION", "type": rule_type, "mode": mode,
           "expr": expr, "onFailure": on_failure})
}

fn compiled(rules: Vec<Value>) -> Result<Option<Contract>, String> {
    compile_contract(
        "geo.avro-value",
        &json!({ "domainRules": rules }),
        "AVRO",
        TRIGGER_AVSC,
    )
}

fn refusal(rules: Vec<Value>) -> String {
    match compiled(rules) {
        Err(e) => e,
        Ok(c) => panic!("compiled: {c:?}"),
    }
}

#[test]
fn rules_antidote_cannot_honour_are_refused_naming_subject_and_rule() {
    let e = refusal(vec![
        json!({"name": "fix", "kind": "TRANSFORM", "type": "JSONATA",
                                 "mode": "WRITE", "expr": "$"}),
    ]);
    assert!(
        e.starts_with("subject geo.avro-value, data-contract rule fix: TRANSFORM"),
        "{e}"
    );
    let e = refusal(vec![rule("j", "JSONATA", "READ", "true", "ERROR")]);
    assert!(
        e.contains("rule j: rules of type JSONATA are not supported"),
        "{e}"
    );
    let e = refusal(vec![rule("enc", "ENCRYPT", "WRITEREAD", "", "ERROR")]);
    assert!(e.contains("rule enc: rules of type ENCRYPT"), "{e}");
    let e = refusal(vec![rule("bad", "CEL", "READ", "message.lat >", "ERROR")]);
    assert!(e.contains("rule bad: `message.lat >`: column"), "{e}");
    let e = refusal(vec![rule("x", "CEL", "READ", "true", "RETRY")]);
    assert!(
        e.contains("rule x: onFailure `RETRY` is not supported"),
        "{e}"
    );
    let e = refusal(vec![rule(
        "g",
        "CEL_FIELD",
        "READ",
        "value > 0 ; value < 9",
        "ERROR",
    )]);
    assert!(
        e.contains("rule g: the guard `value > 0` of a CEL_FIELD rule"),
        "{e}"
    );
    let e = refusal(vec![rule(
        "t",
        "CEL_FIELD",
        "READ",
        "'PII' in tags ; true",
        "ERROR",
    )]);
    assert!(
        e.contains("rule t:") && e.contains("`tags` is not supported"),
        "{e}"
    );
    let e = compile_contract(
        "s",
        &json!({"domainRules": [rule("p", "CEL_FIELD", "READ", "true", "ERROR")]}),
        "PROTOBUF",
        "syntax = \"proto3\"; message T { int32 a = 1; }",
    )
    .expect_err("protobuf fields");
    assert!(
        e.contains("rule p: CEL_FIELD rules are supported on Avro and JSON Schema"),
        "{e}"
    );
    let e = compile_contract(
        "s",
        &json!({"encodingRules": [rule("e", "ENCRYPT_PAYLOAD", "WRITEREAD", "", "ERROR")]}),
        "AVRO",
        TRIGGER_AVSC,
    )
    .expect_err("encoding rules");
    assert!(e.contains("rule e: encoding rules"), "{e}");
}

#[test]
fn disabled_rules_and_migration_modes_never_run() {
    let mut off = rule("off", "JSONATA", "READ", "false", "ERROR");
    off["disabled"] = json!(true);
    let up = rule("up", "CEL", "UPGRADE", "false", "ERROR");
    assert!(compiled(vec![off, up]).expect("compiles").is_none());
}

#[test]
fn a_split_on_failure_is_write_then_read() {
    assert_eq!(action("DLQ,NONE", Side::Write), Ok(Action::Refuse));
    assert_eq!(action("DLQ,NONE", Side::Read), Ok(Action::Count));
    assert_eq!(action("NONE", Side::Write), Ok(Action::Count));
    assert_eq!(action("ERROR", Side::Read), Ok(Action::Refuse));
}

const POLICY: &str = r#"
policies:
  - name: reg
    topics: ["geo.avro"]
    value: { format: avro, wire: confluent, registry: true }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
"#;

fn framed(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn rec(value: &[u8]) -> Record<'_> {
    Record {
        offset: 1,
        timestamp: NOW,
        key: None,
        value: Some(value),
        headers: vec![],
    }
}

/// A cache holding schema 5 (the trigger schema) with `rules`.
fn cache_with(rules: Vec<Value>) -> Arc<SchemaCache> {
    let cache = SchemaCache::new();
    let contract = compiled(rules).expect("compiles");
    cache.put_schema_with(5, compile_schema(None, TRIGGER_AVSC, &[]), contract);
    cache
}

fn judge(cache: &Arc<SchemaCache>, lat: f64, side: Side) -> Verdict {
    let s = set(POLICY, cache);
    let p = s.for_topic("geo.avro").expect("policy");
    let value = framed(5, &avro_datum(lat, None));
    p.judge_at("geo.avro", &rec(&value), NOW, side)
}

#[test]
fn a_read_rule_fails_fetched_records_and_names_itself() {
    let mut off = rule("always-false", "CEL", "READ", "false", "ERROR");
    off["disabled"] = json!(true);
    let cache = cache_with(vec![
        rule("north-of-60", "CEL", "READ", "message.lat < 60", "DLQ"),
        off,
    ]);
    assert!(judge(&cache, 52.0, Side::Read).is_valid());
    let v = invalid(judge(&cache, 61.5, Side::Read));
    assert_eq!(
        (v.class, v.rule.as_str()),
        (Class::Poison, "rule:north-of-60")
    );
    assert!(
        v.reason.starts_with(
            "subject geo.avro-value, data-contract rule north-of-60: `message.lat < 60` is false"
        ),
        "{}",
        v.reason
    );
    let c = v.contract.as_deref().expect("contract failure");
    assert_eq!(
        (c.name.as_str(), c.mode, c.subject.as_str()),
        ("north-of-60", "READ", "geo.avro-value")
    );
    // A READ rule does not run at the door.
    assert!(judge(&cache, 61.5, Side::Write).is_valid());
    // The policy's own rules still apply.
    assert_eq!(
        invalid(judge(&cache, -95.0, Side::Read)).rule,
        "coordinates"
    );
}

#[test]
fn a_write_rule_fails_at_the_door_only_and_writeread_on_both() {
    let cache = cache_with(vec![
        rule("w", "CEL", "WRITE", "message.lat < 60", "ERROR"),
        rule("wr", "CEL", "WRITEREAD", "message.lat > -60", "DLQ,ERROR"),
    ]);
    assert!(judge(&cache, 61.5, Side::Read).is_valid());
    let v = invalid(judge(&cache, 61.5, Side::Write));
    assert_eq!(
        (v.rule.as_str(), v.contract.map(|c| c.mode)),
        ("rule:w", Some("WRITE"))
    );
    assert_eq!(invalid(judge(&cache, -61.5, Side::Read)).rule, "rule:wr");
    assert_eq!(invalid(judge(&cache, -61.5, Side::Write)).rule, "rule:wr");
}

#[test]
fn a_none_rule_is_counted_and_the_record_passes() {
    let cache = SchemaCache::new();
    let contract = compile_contract(
        "none-test-value",
        &json!({"domainRules": [rule("count-only", "CEL", "READ", "message.lat < 10", "NONE")]}),
        "AVRO",
        TRIGGER_AVSC,
    )
    .expect("compiles");
    cache.put_schema_with(5, compile_schema(None, TRIGGER_AVSC, &[]), contract);
    let counted = || {
        none_counts()
            .into_iter()
            .find(|(s, r, d, _)| s == "none-test-value" && r == "count-only" && *d == Side::Read)
            .map_or(0, |c| c.3)
    };
    let before = counted();
    assert!(judge(&cache, 52.0, Side::Read).is_valid());
    assert!(judge(&cache, 52.0, Side::Read).is_valid());
    assert!(judge(&cache, 5.0, Side::Read).is_valid());
    assert_eq!(counted() - before, 2);
}

#[test]
fn cel_field_rules_run_on_the_fields_their_guard_selects() {
    let cache = cache_with(vec![
        rule(
            "lat-bound",
            "CEL_FIELD",
            "READ",
            "name == 'lat' ; value < 60.0",
            "ERROR",
        ),
        rule(
            "doubles-finite",
            "CEL_FIELD",
            "READ",
            "typeName == 'DOUBLE' ; value > -1000.0",
            "ERROR",
        ),
    ]);
    assert!(judge(&cache, 52.0, Side::Read).is_valid());
    let v = invalid(judge(&cache, 61.0, Side::Read));
    assert_eq!(v.rule, "rule:lat-bound");
    assert!(v.reason.starts_with("subject geo.avro-value, data-contract rule lat-bound: field lat: `value < 60.0` is false"), "{}", v.reason);
    // lon is 4.0 in every datum: only lat can fail the typeName guard.
    assert_eq!(
        invalid(judge(&cache, -1500.0, Side::Read)).rule,
        "rule:doubles-finite"
    );
    // A guard that selects no field: the rule never fails.
    let none = cache_with(vec![rule(
        "nothing",
        "CEL_FIELD",
        "READ",
        "name == 'zzz' ; false",
        "ERROR",
    )]);
    assert!(judge(&none, 61.0, Side::Read).is_valid());
}

#[test]
fn a_dlq_topic_that_is_not_the_policys_dlt_makes_the_schema_unknown() {
    let mut r = rule("r", "CEL", "READ", "message.lat < 60", "DLQ");
    r["params"] = json!({"dlq.topic": "elsewhere"});
    let v = invalid(judge(&cache_with(vec![r.clone()]), 10.0, Side::Read));
    assert_eq!((v.class, v.rule.as_str()), (Class::Unknown, "schema-id"));
    assert!(v.reason.contains("subject geo.avro-value, data-contract rule r: dlq.topic elsewhere is not a dead-letter topic of this policy (its DLT here is geo.avro.dlt)"), "{}", v.reason);
    r["params"] = json!({"dlq.topic": "geo.avro.dlt"});
    let cache = cache_with(vec![r]);
    assert!(judge(&cache, 10.0, Side::Read).is_valid());
    assert_eq!(invalid(judge(&cache, 61.0, Side::Read)).rule, "rule:r");
}

#[test]
fn a_key_schemas_rules_are_judged_on_the_key() {
    use apache_avro::types::Value as A;
    const KEY: &str = r#"{"type":"record","name":"DeviceKey","namespace":"geo","fields":[{"name":"device_id","type":"string"}]}"#;
    let cache = SchemaCache::new();
    let contract = compile_contract(
        "geo.keyed-key",
        &json!({"domainRules": [rule("device-prefix", "CEL", "WRITEREAD", "message.device_id.startsWith('d-')", "ERROR")]}),
        "AVRO",
        KEY,
    )
    .expect("compiles");
    cache.put_schema_with(9, compile_schema(None, KEY, &[]), contract);
    let s = set(
        r#"
policies:
  - name: keyed
    topics: ["geo.keyed"]
    key: { format: avro, wire: confluent, registry: true }
    value: { format: bytes }
"#,
        &cache,
    );
    let p = s.for_topic("geo.keyed").expect("policy");
    let schema = apache_avro::Schema::parse_str(KEY).expect("schema");
    let key = |id: &str| {
        let datum = A::Record(vec![("device_id".into(), A::String(id.into()))]);
        framed(
            9,
            &apache_avro::to_avro_datum(&schema, datum).expect("encodes"),
        )
    };
    let (good, bad) = (key("d-1"), key("x-1"));
    let with_key = |k: &[u8]| -> Verdict {
        let r = Record {
            key: Some(k),
            ..rec(b"v")
        };
        p.judge_at("geo.keyed", &r, NOW, Side::Write)
    };
    assert!(with_key(&good).is_valid());
    let v = invalid(with_key(&bad));
    assert_eq!(v.rule, "key.rule:device-prefix");
    assert_eq!(
        v.contract.map(|c| c.subject),
        Some("geo.keyed-key".to_string())
    );
}

/// A schema with rules is judged in one pass over the captured fields (the
/// policy's own and the rules'), not decoded whole, and each verdict is
/// the decoded value's: class, rule and reason, on both sides, for `CEL`
/// and `CEL_FIELD` rules, the policy's own rules after them.
#[test]
fn rules_are_judged_on_the_captured_fields_as_on_the_decoded_value() {
    let cache = cache_with(vec![
        rule("north-of-60", "CEL", "WRITEREAD", "message.lat < 60", "DLQ"),
        rule(
            "south",
            "CEL",
            "READ",
            "message.lat > -80.0 || message.lon == 3.0",
            "ERROR",
        ),
        rule(
            "f",
            "CEL_FIELD",
            "WRITE",
            "typeName == 'DOUBLE' ; value > -1000.0",
            "ERROR",
        ),
    ]);
    let s = set(POLICY, &cache);
    let p = s.for_topic("geo.avro").expect("policy");
    let mut fast_failures = 0;
    for lat in [52.0, 59.99, 60.0, 61.5, -79.0, -85.0, -95.0, -1500.0] {
        let value = framed(5, &avro_datum(lat, None));
        for side in [Side::Read, Side::Write] {
            let (fast, slow) = p.inner.both_ways("geo.avro", &rec(&value), NOW, side);
            let fast = fast.unwrap_or_else(|| panic!("lat {lat}: fast path not taken"));
            let key = |v: &Result<(), Invalid>| {
                v.as_ref().err().map(|e| {
                    (
                        e.class,
                        e.rule.clone(),
                        e.reason.clone(),
                        e.contract.clone(),
                    )
                })
            };
            assert_eq!(key(&fast), key(&slow), "lat {lat} {side:?}");
            fast_failures += usize::from(fast.is_err());
        }
    }
    assert!(
        fast_failures >= 6,
        "the rules failed records: {fast_failures}"
    );
}

/// A registry answer is input: a rule set that would compile to more than
/// MAX_CHECKS checks (run on every record) is refused, naming the subject
/// and the rule that crossed it; one at the bound compiles.
#[test]
fn a_rule_set_past_the_check_bound_is_refused() {
    let many = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| {
                rule(
                    &format!("r{i}"),
                    "CEL",
                    "READ",
                    "message.lat < 90.0",
                    "ERROR",
                )
            })
            .collect()
    };
    assert!(compiled(many(MAX_CHECKS)).expect("at the bound").is_some());
    let e = refusal(many(MAX_CHECKS + 1));
    let last = format!("rule r{MAX_CHECKS}: more than {MAX_CHECKS} checks");
    assert!(e.contains(&last), "{e}");
    // CEL_FIELD counts one check per selected field: the trigger schema's
    // fields times enough rules crosses the bound inside a rule.
    let field = |i: usize| {
        rule(
            &format!("f{i}"),
            "CEL_FIELD",
            "READ",
            "value != null",
            "ERROR",
        )
    };
    let e = refusal((0..MAX_CHECKS).map(field).collect());
    assert!(e.contains(&format!("more than {MAX_CHECKS} checks")), "{e}");
}

/// Rules that each order two fields are passed on the fast path without
/// judging when every one holds on two captured numbers
/// (`Contract::pairs`); any other outcome is judged, so each verdict is
/// the decoded value's, with a `NONE` rule's failures still counted.
#[test]
fn two_field_rules_are_judged_on_the_captured_numbers_as_on_the_decoded_value() {
    let two = vec![
        rule("over", "CEL", "READ", "message.lat > message.lon", "DLQ"),
        rule(
            "wr",
            "CEL",
            "WRITEREAD",
            "message.lon <= message.lat",
            "ERROR",
        ),
    ];
    let c = compiled(two.clone()).expect("compiles").expect("rules");
    let read = c.pairs(Side::Read).expect("two-field checks only");
    assert_eq!(read.len(), 2);
    // Reversed on reads: wr (lon <= lat: less or equal) first, then over.
    assert_eq!(
        (read[0].2, read[1].2),
        ([true, true, false], [false, false, true])
    );
    assert_eq!(c.pairs(Side::Write).map(|p| p.len()), Some(1));
    let mixed = compiled(vec![
        two[0].clone(),
        rule("n", "CEL", "READ", "message.lat < 60", "ERROR"),
    ]);
    assert!(mixed
        .expect("compiles")
        .expect("rules")
        .pairs(Side::Read)
        .is_none());
    let not_numbers = rule("ssn", "CEL", "READ", "message.lat > message.ssn", "ERROR");
    let none = rule("under", "CEL", "READ", "message.lat < message.lon", "NONE");
    for rules in [two, vec![not_numbers], vec![none]] {
        let cache = cache_with(rules);
        let s = set(POLICY, &cache);
        let p = s.for_topic("geo.avro").expect("policy");
        for lat in [-95.0, 3.0, 4.0, 5.0, 52.0] {
            let value = framed(5, &avro_datum(lat, None));
            for side in [Side::Read, Side::Write] {
                let (fast, slow) = p.inner.both_ways("geo.avro", &rec(&value), NOW, side);
                let fast = fast.unwrap_or_else(|| panic!("lat {lat}: fast path not taken"));
                let key = |v: &Result<(), Invalid>| {
                    v.as_ref()
                        .err()
                        .map(|e| (e.class, e.rule.clone(), e.reason.clone()))
                };
                assert_eq!(key(&fast), key(&slow), "lat {lat} {side:?}");
            }
        }
    }
    let counted = || {
        none_counts()
            .into_iter()
            .find(|(s, r, d, _)| s == "geo.avro-value" && r == "under" && *d == Side::Read)
            .map_or(0, |c| c.3)
    };
    let cache = cache_with(vec![rule(
        "under",
        "CEL",
        "READ",
        "message.lat < message.lon",
        "NONE",
    )]);
    let before = counted();
    assert!(judge(&cache, 52.0, Side::Read).is_valid());
    assert!(judge(&cache, 3.0, Side::Read).is_valid());
    assert_eq!(counted() - before, 1, "only the failing record is counted");
}
