//! The judge with schemas from a registry cache (`registry: true`), class
//! per rule, `absent` rules and key validation.

use std::path::Path;
use std::sync::Arc;

use super::formats::compile_schema as compile;
use super::registry::Reference;
use super::*;
use crate::kafka::record::Record;

pub(super) const NOW: i64 = 1_764_460_000_000;

pub(super) const TRIGGER_AVSC: &str = r#"{"type":"record","name":"Trigger","namespace":"geo","fields":[
  {"name":"lat","type":"double"},{"name":"lon","type":"double"},
  {"name":"ssn","type":["null","string"],"default":null}]}"#;

pub(super) fn set(yaml: &str, cache: &Arc<SchemaCache>) -> PolicySet {
    match PolicySet::parse_with(yaml, Path::new("/tmp/registry-test.yaml"), cache) {
        Ok(s) => s,
        Err(e) => panic!("{e:#?}"),
    }
}

fn avro_policy(extra: &str) -> String {
    format!(
        r#"
policies:
  - name: reg
    topics: ["geo.avro"]
    value: {{ format: avro, wire: confluent, registry: true{extra} }}
    rules:
      - coordinates: {{ lat: /lat, lon: /lon }}
      - field: /ssn
        absent: true
        class: redact
"#
    )
}

fn framed(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

pub(super) fn avro_datum(lat: f64, ssn: Option<&str>) -> Vec<u8> {
    use apache_avro::types::Value as A;
    let schema = apache_avro::Schema::parse_str(TRIGGER_AVSC).expect("schema");
    let ssn = match ssn {
        None => A::Union(0, Box::new(A::Null)),
        Some(s) => A::Union(1, Box::new(A::String(s.into()))),
    };
    let v = A::Record(vec![
        ("lat".into(), A::Double(lat)),
        ("lon".into(), A::Double(4.0)),
        ("ssn".into(), ssn),
    ]);
    apache_avro::to_avro_datum(&schema, v).expect("encodes")
}

fn rec<'a>(key: Option<&'a [u8]>, value: &'a [u8]) -> Record<'a> {
    Record {
        offset: 3,
        timestamp: NOW,
        key,
        value: Some(value),
        headers: vec![],
    }
}

pub(super) fn invalid(v: Verdict) -> Invalid {
    match v {
        Verdict::Invalid(i) => i,
        Verdict::Valid => panic!("expected invalid"),
    }
}

#[test]
fn an_id_not_cached_is_transient_until_the_registry_answers() {
    let cache = SchemaCache::new();
    let s = set(&avro_policy(""), &cache);
    let p = s.for_topic("geo.avro").expect("policy");
    let value = framed(5, &avro_datum(52.0, None));
    let v = invalid(p.judge_in("geo.avro", &rec(None, &value), NOW));
    assert_eq!(
        (v.class, v.rule.as_str()),
        (Class::Transient, "schema-registry")
    );
    assert_eq!(cache.take_wants(), vec![Want::Schema(5)]);
    cache.put_schema(5, compile(None, TRIGGER_AVSC, &[]));
    assert!(p.judge_in("geo.avro", &rec(None, &value), NOW).is_valid());
    // The rules apply to the registered schema's value.
    let far = framed(5, &avro_datum(95.0, None));
    assert_eq!(
        invalid(p.judge_in("geo.avro", &rec(None, &far), NOW)).rule,
        "coordinates"
    );
    // Not a datum of schema 5: poison.
    let junk = framed(5, &[0xff, 0xff, 0xff]);
    let v = invalid(p.judge_in("geo.avro", &rec(None, &junk), NOW));
    assert_eq!((v.class, v.rule.as_str()), (Class::Poison, "decode"));
}

#[test]
fn an_id_the_registry_does_not_have_is_unknown() {
    let cache = SchemaCache::new();
    let s = set(&avro_policy(""), &cache);
    let p = s.for_topic("geo.avro").expect("policy");
    cache.put_not_found(9, NOW);
    let value = framed(9, &avro_datum(1.0, None));
    let v = invalid(p.judge_in("geo.avro", &rec(None, &value), NOW));
    assert_eq!((v.class, v.rule.as_str()), (Class::Unknown, "schema-id"));
}

#[test]
fn an_id_under_another_subject_is_poison() {
    let cache = SchemaCache::new();
    let s = set(&avro_policy(r#", subject: "{topic}-value""#), &cache);
    let p = s.for_topic("geo.avro").expect("policy");
    cache.put_schema(5, compile(None, TRIGGER_AVSC, &[]));
    let value = framed(5, &avro_datum(1.0, None));
    let v = invalid(p.judge_in("geo.avro", &rec(None, &value), NOW));
    assert_eq!(v.class, Class::Transient, "subjects not known yet");
    assert_eq!(cache.take_wants(), vec![Want::Subjects(5)]);
    cache.put_subjects(5, vec!["other-value".into()], NOW);
    let v = invalid(p.judge_in("geo.avro", &rec(None, &value), NOW));
    assert_eq!((v.class, v.rule.as_str()), (Class::Poison, "subject"));
    assert!(v.reason.contains("geo.avro-value"), "{}", v.reason);
    cache.put_subjects(5, vec!["other-value".into(), "geo.avro-value".into()], NOW);
    assert!(p.judge_in("geo.avro", &rec(None, &value), NOW).is_valid());
}

#[test]
fn a_rule_with_class_redact_gives_its_class_and_never_logs_the_reason() {
    let cache = SchemaCache::new();
    let s = set(&avro_policy(""), &cache);
    let p = s.for_topic("geo.avro").expect("policy");
    cache.put_schema(5, compile(None, TRIGGER_AVSC, &[]));
    let value = framed(5, &avro_datum(1.0, Some("123-45-6789")));
    let v = invalid(p.judge_in("geo.avro", &rec(None, &value), NOW));
    assert_eq!((v.class, v.rule.as_str()), (Class::Redact, "absent:/ssn"));
    assert!(!v.reason.contains("123"), "{}", v.reason);
    set_log_record_contents(true);
    assert!(!v.log_reason().contains("ssn"), "{}", v.log_reason());
    set_log_record_contents(false);
}

#[test]
fn protobuf_by_registry_follows_the_message_indexes() {
    use prost::Message as _;
    let cache = SchemaCache::new();
    let yaml = r#"
policies:
  - name: regpb
    topics: ["geo.pb"]
    value: { format: protobuf, wire: confluent, registry: true, message: geo.T }
    rules:
      - field: /at/lat
        min: -90
        max: 90
"#;
    let s = set(yaml, &cache);
    let p = s.for_topic("geo.pb").expect("policy");
    let loc = "syntax = \"proto3\"; package geo; message Location { double lat = 1; }";
    let main = "syntax = \"proto3\"; package geo; import \"loc.proto\"; \
                message Other { int32 x = 1; } message T { Location at = 1; }";
    let refs = [Reference {
        name: "loc.proto".into(),
        schema: loc.into(),
    }];
    let Registered::Protobuf(indexed) = compile(Some("PROTOBUF"), main, &refs) else {
        panic!("compiles")
    };
    let file = indexed.file();
    let t = file.messages().nth(1).expect("T");
    let mut m = prost_reflect::DynamicMessage::new(t.clone());
    let loc_desc = file
        .parent_pool()
        .get_message_by_name("geo.Location")
        .expect("Location");
    let mut l = prost_reflect::DynamicMessage::new(loc_desc);
    l.set_field_by_name("lat", prost_reflect::Value::F64(95.0));
    m.set_field_by_name("at", prost_reflect::Value::Message(l));
    cache.put_schema(8, compile(Some("PROTOBUF"), main, &refs));
    // Message indexes [1] (zigzag: count 1 = 0x02, index 1 = 0x02).
    let mut v = framed(8, &[0x02, 0x02]);
    v.extend_from_slice(&m.encode_to_vec());
    assert_eq!(
        invalid(p.judge_in("geo.pb", &rec(None, &v), NOW)).rule,
        "range:/at/lat"
    );
    // Index [0] is geo.Other: not the expected type.
    let mut other = framed(8, &[0x00]);
    other.extend_from_slice(&[0x08, 0x01]);
    let e = invalid(p.judge_in("geo.pb", &rec(None, &other), NOW));
    assert_eq!((e.class, e.rule.as_str()), (Class::Poison, "schema"));
}

#[test]
fn json_schema_framing_is_validated_against_the_registered_schema() {
    let cache = SchemaCache::new();
    let yaml = r#"
policies:
  - name: regjson
    topics: ["geo.json"]
    value: { format: json, wire: confluent, registry: true }
"#;
    let s = set(yaml, &cache);
    let p = s.for_topic("geo.json").expect("policy");
    let schema = r#"{"type":"object","properties":{"lat":{"type":"number"}},"required":["lat"]}"#;
    cache.put_schema(2, compile(Some("JSON"), schema, &[]));
    let ok = framed(2, br#"{"lat": 1.5}"#);
    assert!(p.judge_in("geo.json", &rec(None, &ok), NOW).is_valid());
    let bad = framed(2, br#"{"lon": 1.5}"#);
    assert_eq!(
        invalid(p.judge_in("geo.json", &rec(None, &bad), NOW)).rule,
        "schema"
    );
    // An Avro id on a JSON topic is poison, not a crash.
    cache.put_schema(3, compile(None, TRIGGER_AVSC, &[]));
    let avro = framed(3, br#"{"lat": 1.5}"#);
    assert_eq!(
        invalid(p.judge_in("geo.json", &rec(None, &avro), NOW)).rule,
        "schema"
    );
}

#[test]
fn keys_are_validated_with_rules_named_key() {
    let cache = SchemaCache::new();
    let yaml = r#"
policies:
  - name: keyed
    topics: ["geo.keyed"]
    key: { format: avro, wire: confluent, registry: true, allow_null: false }
    value: { format: json }
"#;
    let s = set(yaml, &cache);
    let p = s.for_topic("geo.keyed").expect("policy");
    cache.put_schema(4, compile(None, r#""string""#, &[]));
    let key = framed(4, &[0x06, b'a', b'b', b'c']);
    assert!(p
        .judge_in("geo.keyed", &rec(Some(&key), b"{}"), NOW)
        .is_valid());
    let bad_key = framed(4, &[0x7f]);
    let v = invalid(p.judge_in("geo.keyed", &rec(Some(&bad_key), b"{}"), NOW));
    assert_eq!((v.class, v.rule.as_str()), (Class::Poison, "key.decode"));
    let v = invalid(p.judge_in("geo.keyed", &rec(None, b"{}"), NOW));
    assert_eq!(v.rule, "key.allow_null");
    let unknown_key = framed(6, &[0x00]);
    let v = invalid(p.judge_in("geo.keyed", &rec(Some(&unknown_key), b"{}"), NOW));
    assert_eq!(
        (v.class, v.rule.as_str()),
        (Class::Transient, "key.schema-registry")
    );
}

#[test]
fn stale_rules_may_take_another_class() {
    let cache = SchemaCache::new();
    let yaml = r#"
policies:
  - name: cls
    topics: ["t"]
    value: { format: json }
    rules:
      - field: /t
        max_age: 1m
        class: unknown
"#;
    let s = set(yaml, &cache);
    let p = s.for_topic("t").expect("policy");
    let old = format!(r#"{{"t": {}}}"#, NOW - 3_600_000);
    assert_eq!(
        invalid(p.judge(&rec(None, old.as_bytes()), NOW)).class,
        Class::Unknown
    );
}

#[test]
fn registry_keys_are_checked_with_positions() {
    let cache = SchemaCache::new();
    let bad = |yaml: &str| match PolicySet::parse_with(yaml, Path::new("p.yaml"), &cache) {
        Ok(_) => panic!("loads: {yaml}"),
        Err(e) => e[0].to_string(),
    };
    let e = bad("policies:\n  - name: a\n    topics: [t]\n    value: { format: avro, wire: raw, registry: true }\n");
    assert!(
        e.starts_with("p.yaml:4:") && e.contains("value.wire"),
        "{e}"
    );
    let e = bad("policies:\n  - name: a\n    topics: [t]\n    value: { format: avro, wire: confluent, registry: true, subject: \"{x}\" }\n");
    assert!(e.contains("value.subject"), "{e}");
    let e =
        bad("policies:\n  - name: a\n    topics: [t]\n    value: { format: json, subject: s }\n");
    assert!(e.contains("needs `registry: true`"), "{e}");
    let e = bad(
        "policies:\n  - name: a\n    topics: [t]\n    key: { format: bytes, registry: true }\n",
    );
    assert!(e.contains("key.registry"), "{e}");
    let e = bad("policies:\n  - name: a\n    topics: [t]\n    value: { format: json }\n    rules:\n      - field: /a\n        class: transient\n        absent: true\n");
    assert!(e.starts_with("p.yaml:7:"), "{e}");
}

#[test]
fn an_avro_record_using_a_referenced_named_type_decodes() {
    let cache = SchemaCache::new();
    let s = set(&avro_policy(""), &cache);
    let p = s.for_topic("geo.avro").expect("policy");
    let loc = r#"{"type":"record","name":"Location","namespace":"geo","fields":[{"name":"x","type":"double"}]}"#;
    let main = r#"{"type":"record","name":"T","namespace":"geo","fields":[
        {"name":"lat","type":"double"},{"name":"lon","type":"double"},
        {"name":"home","type":["null","geo.Location"],"default":null}]}"#;
    let refs = [Reference {
        name: "geo.Location".into(),
        schema: loc.into(),
    }];
    cache.put_schema(11, compile(None, main, &refs));
    // lat 1.0, lon 2.0, union branch 1 (zigzag 2), x 3.0
    let mut datum = Vec::new();
    datum.extend_from_slice(&1.0f64.to_le_bytes());
    datum.extend_from_slice(&2.0f64.to_le_bytes());
    datum.push(0x02);
    datum.extend_from_slice(&3.0f64.to_le_bytes());
    let value = framed(11, &datum);
    let verdict = p.judge_in("geo.avro", &rec(None, &value), NOW);
    assert!(verdict.is_valid(), "{verdict:?}");
}

/// The reference Avro policy with `registry: true` instead of `schema_ids`
/// (as `benches/validate.rs` builds it) judges like the file-schema one.
#[test]
fn the_reference_avro_policy_by_registry_judges_as_by_file() {
    use apache_avro::types::Value as A;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    let text = std::fs::read_to_string(dir.join("geofence-avro.yaml")).expect("policy");
    let reg_text = text.replace(
        "      schema_ids:\n        1: schemas/trigger.avsc\n",
        "      registry: true\n",
    );
    assert_ne!(text, reg_text);
    let avsc = std::fs::read_to_string(dir.join("schemas/trigger.avsc")).expect("schema");
    let cache = SchemaCache::new();
    cache.put_schema(1, compile(Some("AVRO"), &avsc, &[]));
    let by_reg =
        PolicySet::parse_with(&reg_text, &dir.join("geofence-avro.yaml"), &cache).expect("loads");
    let by_file =
        PolicySet::parse_with(&text, &dir.join("geofence-avro.yaml"), &cache).expect("loads");
    let schema = apache_avro::Schema::parse_str(&avsc).expect("avsc");
    let datum = |lat: f64| {
        let v = A::Record(vec![
            ("device_id".into(), A::String("d".into())),
            ("geofence_id".into(), A::String("g".into())),
            ("lat".into(), A::Double(lat)),
            ("lon".into(), A::Double(4.9)),
            ("transition".into(), A::Enum(0, "ENTER".into())),
            ("speed_mps".into(), A::Union(0, Box::new(A::Null))),
            ("event_time_ms".into(), A::Long(NOW - 1000)),
            ("accuracy_m".into(), A::Union(0, Box::new(A::Null))),
        ]);
        framed(1, &apache_avro::to_avro_datum(&schema, v).expect("encodes"))
    };
    // The registry's Avro fast path, on written and damaged datums, judges
    // as the full decoder does, and as the same schema from a file does.
    for lat in [52.0, 91.0, f64::NAN] {
        let value = datum(lat);
        for cut in 0..value.len() {
            for damaged in [value[..cut].to_vec(), {
                let mut v = value.clone();
                v[cut] ^= 0x41;
                v
            }] {
                let r = record_of(&damaged);
                let fast = by_reg.policies()[0].inner.judge("", &r, NOW);
                assert_eq!(
                    fast,
                    by_reg.policies()[0].inner.judge_reference(&r, NOW),
                    "{damaged:?}"
                );
                // A damaged schema id is transient by registry, unknown by file.
                if damaged.get(..5) == value.get(..5) {
                    assert_eq!(
                        fast,
                        by_file.policies()[0].inner.judge("", &r, NOW),
                        "{damaged:?}"
                    );
                }
            }
        }
    }
    for lat in [52.0, 91.0] {
        let value = datum(lat);
        let r = Record {
            offset: 1,
            timestamp: NOW,
            key: None,
            value: Some(&value),
            headers: vec![crate::kafka::record::Header {
                key: b"idempotency-key",
                value: Some(b"k"),
            }],
        };
        let a = by_reg.policies()[0].judge(&r, NOW);
        let b = by_file.policies()[0].judge(&r, NOW);
        assert_eq!(a, b, "lat {lat}");
        assert_eq!(a.is_valid(), lat < 90.0);
    }
}

/// The reference Protobuf policy with `registry: true`: its fast path, on
/// an encoded trigger and on every truncation and byte flip of it, judges
/// as the full decoder does, and as the same schema from a file does.
#[test]
fn the_reference_protobuf_policy_by_registry_judges_as_by_file() {
    use prost::Message;
    use prost_reflect::{DynamicMessage, Value as P};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    let text = std::fs::read_to_string(dir.join("geofence-protobuf.yaml")).expect("policy");
    let reg_text = text
        .replace(
            "      schema_ids:\n        1: schemas/trigger.proto\n",
            "      registry: true\n",
        )
        .replace("      schema: schemas/trigger.proto\n", "");
    assert_ne!(text, reg_text);
    let proto = std::fs::read_to_string(dir.join("schemas/trigger.proto")).expect("schema");
    let cache = SchemaCache::new();
    let registered = compile(Some("PROTOBUF"), &proto, &[]);
    let Registered::Protobuf(file) = &registered else {
        panic!("{registered:?}")
    };
    let desc = file.first().expect("Trigger").clone();
    cache.put_schema(1, compile(Some("PROTOBUF"), &proto, &[]));
    let path = dir.join("geofence-protobuf.yaml");
    let by_reg = PolicySet::parse_with(&reg_text, &path, &cache).expect("loads");
    let by_file = PolicySet::parse_with(&text, &path, &cache).expect("loads");
    for lat in [52.0, 91.0, f64::NAN] {
        let mut m = DynamicMessage::new(desc.clone());
        m.set_field_by_name("device_id", P::String("d".into()));
        m.set_field_by_name("lat", P::F64(lat));
        m.set_field_by_name("lon", P::F64(4.9));
        m.set_field_by_name("transition", P::EnumNumber(1));
        m.set_field_by_name("speed_mps", P::F64(3.0));
        m.set_field_by_name("event_time_ms", P::I64(NOW - 1000));
        let mut value = vec![0, 0, 0, 0, 1, 0];
        value.extend_from_slice(&m.encode_to_vec());
        for cut in 0..value.len() {
            let mut flipped = value.clone();
            flipped[cut] ^= 0x41;
            for damaged in [value[..cut].to_vec(), flipped, value.clone()] {
                let r = record_of(&damaged);
                let fast = by_reg.policies()[0].inner.judge("", &r, NOW);
                let full = by_reg.policies()[0].inner.judge_reference(&r, NOW);
                assert_eq!(fast, full, "{damaged:?}");
                if damaged.get(..5) == value.get(..5) {
                    let file = by_file.policies()[0].inner.judge("", &r, NOW);
                    assert_eq!(fast, file, "{damaged:?}");
                }
            }
        }
        let whole = by_reg.policies()[0]
            .inner
            .judge("", &record_of(&value), NOW);
        assert_eq!(whole.is_ok(), lat < 90.0, "lat {lat}");
    }
}

fn record_of(value: &[u8]) -> Record<'_> {
    Record {
        offset: 1,
        timestamp: NOW,
        key: None,
        value: Some(value),
        headers: vec![crate::kafka::record::Header {
            key: b"idempotency-key",
            value: Some(b"k"),
        }],
    }
}

/// The fast path's program is made per id from the schema cached for it;
/// a schema cached again for the id (the cache started afresh) is read
/// with its own program, not the one made from the schema before it.
#[test]
fn a_schema_cached_again_for_an_id_gets_its_own_program() {
    use apache_avro::types::Value as A;
    let cache = SchemaCache::new();
    let s = set(&avro_policy(""), &cache);
    let p = s.for_topic("geo.avro").expect("policy");
    cache.put_schema(9, compile(None, TRIGGER_AVSC, &[]));
    let ok = framed(9, &avro_datum(52.0, None));
    assert!(p.judge_in("geo.avro", &rec(None, &ok), NOW).is_valid());
    // The same fields, lon first: lat 95 is out of range. Read with the
    // first schema's program, 95 would be the lon and 4 the lat.
    let swapped = TRIGGER_AVSC.replace(
        r#"{"name":"lat","type":"double"},{"name":"lon","type":"double"}"#,
        r#"{"name":"lon","type":"double"},{"name":"lat","type":"double"}"#,
    );
    assert_ne!(swapped, TRIGGER_AVSC);
    cache.put_schema(9, compile(None, &swapped, &[]));
    let schema = apache_avro::Schema::parse_str(&swapped).expect("schema");
    let v = A::Record(vec![
        ("lon".into(), A::Double(4.0)),
        ("lat".into(), A::Double(95.0)),
        ("ssn".into(), A::Union(0, Box::new(A::Null))),
    ]);
    let bad = framed(9, &apache_avro::to_avro_datum(&schema, v).expect("encodes"));
    let i = invalid(p.judge_in("geo.avro", &rec(None, &bad), NOW));
    assert_eq!(i.rule, "coordinates", "{i:?}");
}
