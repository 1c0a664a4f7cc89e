//! Tests of the policy engine as the proxy uses it: load (with exact error
//! positions), topic matching, and judging JSON, Avro and Protobuf records.

use std::path::{Path, PathBuf};

use prost::Message as _;
use prost_reflect::{DynamicMessage, Value as PValue};

use super::*;
use crate::kafka::record::{Header, Record};

const NOW: i64 = 1_764_460_000_000;

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies")
}

fn reference() -> PolicySet {
    match PolicySet::load(&[policies_dir()]) {
        Ok(s) => s,
        Err(errs) => panic!("reference policies do not load: {errs:#?}"),
    }
}

fn record<'a>(value: Option<&'a [u8]>) -> Record<'a> {
    Record {
        offset: 7,
        timestamp: NOW,
        key: Some(b"dev-1"),
        value,
        headers: vec![Header {
            key: b"idempotency-key",
            value: Some(b"k-1"),
        }],
    }
}

fn trigger_json() -> serde_json::Value {
    serde_json::json!({
        "device_id": "dev-1",
        "geofence_id": "fence-42",
        "lat": 52.37,
        "lon": 4.89,
        "transition": "ENTER",
        "speed_mps": 3.2,
        "event_time_ms": NOW - 1_000,
        "accuracy_m": 12.0
    })
}

fn judge_json(text: &[u8]) -> Verdict {
    let set = reference();
    let p = set.for_topic("geofence.triggers").expect("policy");
    p.judge(&record(Some(text)), NOW)
}

fn judge_value(v: &serde_json::Value) -> Verdict {
    judge_json(&serde_json::to_vec(v).expect("json"))
}

#[track_caller]
fn invalid(v: Verdict) -> Invalid {
    match v {
        Verdict::Invalid(i) => i,
        Verdict::Valid => panic!("expected invalid, got valid"),
    }
}

#[track_caller]
fn poison(v: Verdict, rule: &str, reason_has: &str) {
    let i = invalid(v);
    assert_eq!(i.class, Class::Poison, "{i:?}");
    assert_eq!(i.rule, rule, "{i:?}");
    assert!(i.reason.contains(reason_has), "{i:?}");
}

fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
    let mut v = trigger_json();
    v[field] = value;
    v
}

// ------------------------------------------------------------- loading

#[test]
fn every_reference_policy_loads() {
    let set = reference();
    assert_eq!(set.len(), 3);
    for t in [
        "geofence.triggers",
        "geofence.triggers.avro",
        "geofence.triggers.proto",
    ] {
        assert!(set.for_topic(t).is_some(), "{t}");
    }
    assert!(set.for_topic("geofence.other").is_none());
    let p = set.for_topic("geofence.triggers").expect("policy");
    assert_eq!(p.name, "geofence-triggers");
    assert_eq!(p.on_invalid, Action::Divert);
    assert_eq!(
        p.dead_letter_topic("geofence.triggers", Class::Poison),
        "geofence.triggers.dlt"
    );
    assert_eq!(set.dead_letter_templates().len(), 1);
    assert!(set.is_dead_letter_topic("geofence.triggers.dlt"));
}

/// Write `text` as `p.yaml` in a temp dir and load it; return the errors.
fn load_errors(text: &str) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("p.yaml"), text).expect("write");
    let errs = match PolicySet::load(&[dir.path().to_path_buf()]) {
        Ok(_) => panic!("expected errors loading:\n{text}"),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    };
    (dir, errs)
}

#[track_caller]
fn assert_error(text: &str, pos: &str, has: &str) {
    let (dir, errs) = load_errors(text);
    let want = format!("{}:{pos}: ", dir.path().join("p.yaml").display());
    // Messages name the full key path, e.g. `policies[0].value.schema: ...`.
    assert!(
        errs.iter().any(|e| e.starts_with(&want) && e.contains(has)),
        "wanted {want}...{has}, got {errs:#?}"
    );
}

const BASE: &str = "policies:\n  - name: t\n    topics: [a.b]\n";

#[test]
fn a_breaker_out_of_range_or_with_unknown_keys_is_an_error_at_its_position() {
    let ok = format!("{BASE}    breaker: {{ max_ratio: 0.05, over: 1000, min_diverted: 50 }}\n");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("p.yaml"), &ok).expect("write");
    let set = PolicySet::load(&[dir.path().to_path_buf()]).expect("loads");
    let b = set
        .for_topic("a.b")
        .and_then(|p| p.breaker)
        .expect("breaker");
    assert_eq!((b.max_ratio, b.over, b.min_diverted), (0.05, 1000, 50));
    assert_error(
        &format!("{BASE}    breaker: {{ max_ratio: 1.5, over: 1000, min_diverted: 50 }}\n"),
        "4:14",
        "breaker: max_ratio must be above 0 and below 1",
    );
    assert_error(
        &format!("{BASE}    breaker: {{ max_ratio: 0.1, over: 10, min_diverted: 50 }}\n"),
        "4:14",
        "min_diverted from 1 to over",
    );
    assert_error(
        &format!("{BASE}    breaker: {{ max_ratio: 0.1, over: 10, min: 5 }}\n"),
        "4:42",
        "unknown field `min`",
    );
}

#[test]
fn unknown_key_is_an_error_at_its_position() {
    assert_error(
        &format!("{BASE}    on_invalidd: drop\n"),
        "4:5",
        "unknown field `on_invalidd`",
    );
    assert_error(
        &format!("{BASE}    value:\n      format: json\n      max_byte: 5\n"),
        "6:7",
        "unknown field `max_byte`",
    );
}

#[test]
fn unknown_format_is_an_error() {
    assert_error(
        &format!("{BASE}    value:\n      format: xml\n"),
        "5:15",
        "value.format: unknown format `xml` (formats: json, avro, protobuf, bytes)",
    );
}

#[test]
fn missing_schema_file_names_key_and_position() {
    assert_error(
        &format!("{BASE}    value:\n      format: json\n      schema: nope.json\n"),
        "6:15",
        "policies[0].value.schema: schema file",
    );
}

#[test]
fn schema_that_does_not_compile_reports_key_and_schema_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bad.json"), r#"{"type": 12}"#).expect("write");
    std::fs::write(dir.path().join("bad.avsc"), r#"{"type": "recrd"}"#).expect("write");
    std::fs::write(
        dir.path().join("bad.proto"),
        "syntax = \"proto3\";\nmessage X { strin a = 1; }\n",
    )
    .expect("write");
    let text = "policies:\n  - name: j\n    topics: [j]\n    value: {format: json, schema: bad.json}\n  - name: a\n    topics: [a]\n    value: {format: avro, schema: bad.avsc}\n  - name: p\n    topics: [p]\n    value: {format: protobuf, schema: bad.proto, message: X}\n";
    std::fs::write(dir.path().join("p.yaml"), text).expect("write");
    let errs: Vec<String> = PolicySet::load(&[dir.path().to_path_buf()])
        .expect_err("errors")
        .iter()
        .map(ToString::to_string)
        .collect();
    let f = dir.path().join("p.yaml").display().to_string();
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(
        errs[0].starts_with(&format!("{f}:4:35: policies[0].value.schema: ")),
        "{errs:#?}"
    );
    assert!(
        errs[0].contains("not a valid JSON Schema at `/type`"),
        "{errs:#?}"
    );
    assert!(
        errs[1].starts_with(&format!("{f}:7:35: policies[1].value.schema: ")),
        "{errs:#?}"
    );
    assert!(errs[1].contains("not an Avro schema"), "{errs:#?}");
    assert!(
        errs[2].starts_with(&format!("{f}:10:39: policies[2].value.schema: ")),
        "{errs:#?}"
    );
    assert!(
        errs[2].contains("bad.proto:2:13: does not compile"),
        "{errs:#?}"
    );
}

#[test]
fn bad_glob_is_an_error() {
    let text = "policies:\n  - name: t\n    topics: [ok, \"geo.[ab]\"]\n";
    assert_error(
        text,
        "3:18",
        "topics: `geo.[ab]` is not a topic name or glob",
    );
}

#[test]
fn bad_max_age_min_max_and_pointer_are_errors() {
    let rules = "    value: {format: json}\n    rules:\n      - field: /t\n        max_age: 15 parsecs\n      - field: /s\n        min: 5\n        max: 1\n      - field: lat\n        one_of: [a]\n";
    let (dir, errs) = load_errors(&format!("{BASE}{rules}"));
    let f = dir.path().join("p.yaml").display().to_string();
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert_eq!(
        errs[0],
        format!("{f}:7:18: policies[0].rules[0].max_age: `parsecs` is not a duration unit (ms, s, m, h, d)")
    );
    assert_eq!(
        errs[1],
        format!("{f}:10:14: policies[0].rules[1].max: 1 is below min 5")
    );
    assert!(
        errs[2].starts_with(&format!(
            "{f}:11:16: policies[0].rules[2].field: `lat` is not a JSON pointer"
        )),
        "{errs:#?}"
    );
}

#[test]
fn errors_are_collected_across_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("a.yaml"),
        "policies:\n  - name: a\n    topics: []\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("b.yml"), "policies:\n  - nme: b\n").expect("write");
    std::fs::write(dir.path().join("ignored.txt"), "not yaml").expect("write");
    let errs = PolicySet::load(&[dir.path().to_path_buf()]).expect_err("errors");
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(
        errs[0].file.ends_with("a.yaml") && errs[0].line == 3,
        "{errs:#?}"
    );
    assert!(errs[0].message.contains("at least one topic"), "{errs:#?}");
    assert!(
        errs[1].file.ends_with("b.yml") && errs[1].line == 2,
        "{errs:#?}"
    );
}

#[test]
fn same_exact_topic_in_two_policies_is_an_error() {
    let text = "policies:\n  - name: a\n    topics: [x]\n  - name: b\n    topics: [y, x]\n";
    assert_error(text, "5:17", "`x` is already covered by policy `a`");
}

#[test]
fn exact_topic_beats_glob_and_globs_go_in_load_order() {
    let text = "policies:\n  - name: g1\n    topics: [\"geo.*\"]\n  - name: g2\n    topics: [\"ge?.x\", geo.y]\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    assert_eq!(set.for_topic("geo.y").map(|p| p.name.as_str()), Some("g2"));
    assert_eq!(set.for_topic("geo.x").map(|p| p.name.as_str()), Some("g1"));
    assert_eq!(set.for_topic("gex.x").map(|p| p.name.as_str()), Some("g2"));
    assert!(set.for_topic("other").is_none());
}

#[test]
fn a_glob_that_covers_a_dead_letter_topic_does_not_police_it() {
    let text = "policies:\n  - name: g\n    topics: [\"geo.*\"]\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let policing = |t: &str| set.policing(t).map(|p| p.name.as_str());
    assert_eq!(policing("geo.x"), Some("g"));
    assert!(set.for_topic("geo.x.dlt").is_some(), "the glob covers it");
    assert_eq!(policing("geo.x.dlt"), None, "a DLT is never judged again");
    assert_eq!(policing("other"), None);
}

#[test]
fn dead_letter_placeholders() {
    let text = "policies:\n  - name: a\n    topics: [x]\n    dead_letter: {topic: \"dlt.{class}.{topic}\"}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    assert_eq!(p.dead_letter_topic("x", Class::Stale), "dlt.stale.x");
    assert_eq!(p.dead_letter_template().as_str(), "dlt.{class}.{topic}");
    let bad = "policies:\n  - name: a\n    topics: [x]\n    dead_letter: {topic: \"{topc}.dlt\"}\n";
    assert_error(
        bad,
        "4:26",
        "dead_letter.topic: `{topc}` is not a placeholder",
    );
}

// ------------------------------------------------------------- JSON

#[test]
fn json_valid() {
    assert_eq!(judge_value(&trigger_json()), Verdict::Valid);
    let mut no_speed = trigger_json();
    no_speed.as_object_mut().map(|o| o.remove("speed_mps"));
    assert_eq!(judge_value(&no_speed), Verdict::Valid);
}

#[test]
fn json_nan_infinity_overflow_are_poison() {
    let v = br#"{"device_id": "d", "lat": NaN}"#;
    poison(judge_json(v), "decode", "NaN at byte 26");
    poison(
        judge_json(br#"{"lat": Infinity}"#),
        "decode",
        "Infinity at byte 8",
    );
    poison(judge_json(br#"{"lat": -Infinity}"#), "decode", "Infinity");
    poison(
        judge_json(br#"{"lat": 1e400}"#),
        "decode",
        "number out of range",
    );
}

#[test]
fn json_trailing_bytes_bad_utf8_lone_surrogate_are_poison() {
    let mut text = serde_json::to_vec(&trigger_json()).expect("json");
    text.extend_from_slice(b" {}");
    poison(judge_json(&text), "decode", "trailing characters");
    poison(
        judge_json(b"{\"device_id\": \"\xc3\x28\"}"),
        "decode",
        "invalid unicode",
    );
    poison(
        judge_json(br#"{"device_id": "\udc00"}"#),
        "decode",
        "surrogate",
    );
    poison(judge_json(b""), "decode", "not valid JSON");
}

#[test]
fn json_depth_limits_never_overflow_the_stack() {
    let d65 = format!("{}{}", "[".repeat(65), "]".repeat(65));
    poison(
        judge_json(d65.as_bytes()),
        "decode",
        "nesting deeper than 64",
    );
    // The reference policy caps values at 64 KiB; use one without max_bytes.
    let text = "policies:\n  - name: a\n    topics: [x]\n    value: {format: json}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    let d100k = "[".repeat(100_000);
    poison(
        p.judge(&record(Some(d100k.as_bytes())), NOW),
        "decode",
        "deeper than 64",
    );
    let objs = "{\"a\":".repeat(100_000);
    poison(
        p.judge(&record(Some(objs.as_bytes())), NOW),
        "decode",
        "deeper than 64",
    );
    // Depth 64 parses (then fails the schema: it is not an object).
    let d64 = format!("{}{}", "[".repeat(64), "]".repeat(64));
    poison(judge_json(d64.as_bytes()), "schema", "");
}

#[test]
fn json_max_depth_is_configurable() {
    let text = "policies:\n  - name: a\n    topics: [x]\n    value: {format: json, max_depth: 3}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    assert!(p.judge(&record(Some(b"[[[1]]]")), NOW).is_valid());
    poison(
        p.judge(&record(Some(b"[[[[1]]]]")), NOW),
        "decode",
        "deeper than 3",
    );
    let bad =
        "policies:\n  - name: a\n    topics: [x]\n    value: {format: json, max_depth: 500}\n";
    assert_error(bad, "4:38", "value.max_depth: 500 is outside [1, 127]");
}

#[test]
fn json_schema_violation_is_poison() {
    poison(
        judge_value(&with("lat", serde_json::json!("52.3"))),
        "schema",
        "/lat",
    );
    poison(
        judge_value(&with("extra", serde_json::json!(1))),
        "schema",
        "extra",
    );
}

#[test]
fn coordinates_out_of_range() {
    let i = invalid(judge_value(&with("lat", serde_json::json!(91.5))));
    assert_eq!(i.rule, "coordinates");
    assert_eq!(i.reason, "/lat: 91.5 is outside [-90, 90]");
    poison(
        judge_value(&with("lon", serde_json::json!(-180.5))),
        "coordinates",
        "/lon: -180.5 is outside [-180, 180]",
    );
}

#[test]
fn coordinates_null_island() {
    let mut v = with("lat", serde_json::json!(0));
    v["lon"] = serde_json::json!(0.0);
    poison(judge_value(&v), "coordinates", "null island");
    let mut ok = with("lat", serde_json::json!(0));
    ok["lon"] = serde_json::json!(4.89);
    assert!(judge_value(&ok).is_valid());
}

#[test]
fn coordinates_bbox_and_missing() {
    let text = "policies:\n  - name: nl\n    topics: [x]\n    value: {format: json}\n    rules:\n      - coordinates: {lat: /p/lat, lon: /p/lon, bbox: [50.7, 3.3, 53.6, 7.3]}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    let j = |s: &str| p.judge(&record(Some(s.as_bytes())), NOW);
    assert!(j(r#"{"p": {"lat": 52.37, "lon": 4.89}}"#).is_valid());
    poison(
        j(r#"{"p": {"lat": 48.85, "lon": 2.35}}"#),
        "coordinates",
        "bounding box",
    );
    poison(
        j(r#"{"p": {"lat": 52.37}}"#),
        "coordinates",
        "/p/lon: missing",
    );
    poison(
        j(r#"{"p": {"lat": "52", "lon": 4}}"#),
        "coordinates",
        "expected a number",
    );
    let bad = "policies:\n  - name: nl\n    topics: [x]\n    value: {format: json}\n    rules:\n      - coordinates: {lat: /lat, lon: /lon, bbox: [53, 3, 50, 7]}\n";
    assert_error(
        bad,
        "6:51",
        "coordinates.bbox: min_lat must not exceed max_lat",
    );
}

#[test]
fn enum_violation() {
    let i = invalid(judge_value(&with("transition", serde_json::json!("LEAVE"))));
    assert_eq!(i.rule, "one_of:/transition");
    assert_eq!(
        i.reason,
        "/transition: \"LEAVE\" is not one of [ENTER, EXIT, DWELL]"
    );
}

#[test]
fn range_violation() {
    let i = invalid(judge_value(&with("speed_mps", serde_json::json!(151))));
    assert_eq!(i.rule, "range:/speed_mps");
    assert_eq!(i.reason, "/speed_mps: 151 is outside [0, 150]");
    poison(
        judge_value(&with("speed_mps", serde_json::json!(-1))),
        "range:/speed_mps",
        "",
    );
}

#[test]
fn stale_is_its_own_class_and_checked_last() {
    let old = with("event_time_ms", serde_json::json!(NOW - 16 * 60 * 1000));
    let i = invalid(judge_value(&old));
    assert_eq!(i.class, Class::Stale);
    assert_eq!(i.rule, "max_age:/event_time_ms");
    assert!(i.reason.contains("older than max_age 15m"), "{i:?}");
    // Old and broken: poison wins.
    let mut both = old.clone();
    both["lat"] = serde_json::json!(95);
    assert_eq!(invalid(judge_value(&both)).class, Class::Poison);
    // Just inside the window.
    let fresh = with("event_time_ms", serde_json::json!(NOW - 15 * 60 * 1000));
    assert!(judge_value(&fresh).is_valid());
}

#[test]
fn max_age_units() {
    let text = "policies:\n  - name: a\n    topics: [x]\n    value: {format: json}\n    rules:\n      - field: /t\n        max_age: 60s\n        unit: s\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    let secs = NOW / 1000;
    let ok = format!("{{\"t\": {}}}", secs - 30);
    let old = format!("{{\"t\": {}}}", secs - 90);
    assert!(p.judge(&record(Some(ok.as_bytes())), NOW).is_valid());
    assert_eq!(
        invalid(p.judge(&record(Some(old.as_bytes())), NOW)).class,
        Class::Stale
    );
}

#[test]
fn missing_or_null_required_header() {
    let set = reference();
    let p = set.for_topic("geofence.triggers").expect("policy");
    let body = serde_json::to_vec(&trigger_json()).expect("json");
    let mut r = record(Some(&body));
    r.headers.clear();
    let i = invalid(p.judge(&r, NOW));
    assert_eq!(i.rule, "headers.required");
    assert_eq!(i.reason, "missing required header idempotency-key");
    r.headers.push(Header {
        key: b"idempotency-key",
        value: None,
    });
    poison(p.judge(&r, NOW), "headers.required", "null");
}

#[test]
fn oversize_is_poison() {
    let mut v = trigger_json();
    v["device_id"] = serde_json::json!("x".repeat(70_000));
    poison(judge_value(&v), "max_bytes", "over max_bytes 65536");
}

#[test]
fn null_values() {
    let set = reference();
    let p = set.for_topic("geofence.triggers").expect("policy");
    assert!(p.judge(&record(None), NOW).is_valid());
    let text =
        "policies:\n  - name: a\n    topics: [x]\n    value: {format: json, allow_null: false}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    poison(p.judge(&record(None), NOW), "allow_null", "tombstone");
}

#[test]
fn a_decoding_policy_without_max_bytes_still_caps_values() {
    let text = "policies:\n  - name: a\n    topics: [x]\n    value: {format: json}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    let at_cap = format!("\"{}\"", "a".repeat(super::document::DEFAULT_MAX_BYTES - 2));
    assert!(p.judge(&record(Some(at_cap.as_bytes())), NOW).is_valid());
    let over = format!("\"{}\"", "a".repeat(super::document::DEFAULT_MAX_BYTES - 1));
    poison(
        p.judge(&record(Some(over.as_bytes())), NOW),
        "max_bytes",
        "over max_bytes",
    );
    // `bytes` policies decode nothing: no default cap.
    let text = "policies:\n  - name: a\n    topics: [x]\n    value: {format: bytes}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    assert!(p.judge(&record(Some(over.as_bytes())), NOW).is_valid());
}

#[test]
fn bytes_format_checks_size_null_and_headers_only() {
    let text = "policies:\n  - name: a\n    topics: [x]\n    value: {format: bytes, max_bytes: 4, allow_null: false}\n";
    let set = PolicySet::parse(text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    assert!(p.judge(&record(Some(b"\xff\x00ab")), NOW).is_valid());
    poison(
        p.judge(&record(Some(b"abcde")), NOW),
        "max_bytes",
        "5 bytes",
    );
    poison(p.judge(&record(None), NOW), "allow_null", "");
}

// ------------------------------------------------------------- Avro

fn avro_schema() -> apache_avro::Schema {
    let text = std::fs::read_to_string(policies_dir().join("schemas/trigger.avsc")).expect("avsc");
    apache_avro::Schema::parse_str(&text).expect("schema")
}

fn avro_trigger(lat: f64, transition: &str) -> Vec<u8> {
    use apache_avro::types::Value as A;
    let schema = avro_schema();
    let idx = ["ENTER", "EXIT", "DWELL"]
        .iter()
        .position(|s| *s == transition)
        .unwrap_or(0) as u32;
    let v = A::Record(vec![
        ("device_id".into(), A::String("dev-1".into())),
        ("geofence_id".into(), A::String("fence-42".into())),
        ("lat".into(), A::Double(lat)),
        ("lon".into(), A::Double(4.89)),
        ("transition".into(), A::Enum(idx, transition.into())),
        ("speed_mps".into(), A::Union(1, Box::new(A::Double(3.2)))),
        ("event_time_ms".into(), A::Long(NOW - 1000)),
        ("accuracy_m".into(), A::Union(0, Box::new(A::Null))),
    ]);
    apache_avro::to_avro_datum(&schema, v).expect("encode")
}

fn confluent(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(body);
    out
}

#[test]
fn avro_confluent_valid_poison_unknown() {
    let set = reference();
    let p = set.for_topic("geofence.triggers.avro").expect("policy");
    let ok = confluent(1, &avro_trigger(52.37, "ENTER"));
    assert_eq!(p.judge(&record(Some(&ok)), NOW), Verdict::Valid);

    let far = confluent(1, &avro_trigger(91.5, "ENTER"));
    poison(
        p.judge(&record(Some(&far)), NOW),
        "coordinates",
        "/lat: 91.5",
    );

    let truncated = &ok[..ok.len() - 3];
    poison(
        p.judge(&record(Some(truncated)), NOW),
        "decode",
        "not valid Avro",
    );

    let mut trailing = ok.clone();
    trailing.push(0);
    poison(p.judge(&record(Some(&trailing)), NOW), "decode", "trailing");

    let unknown = confluent(99, &avro_trigger(52.37, "ENTER"));
    let i = invalid(p.judge(&record(Some(&unknown)), NOW));
    assert_eq!((i.class, i.rule.as_str()), (Class::Unknown, "schema_id"));

    let mut magic = ok.clone();
    magic[0] = 1;
    poison(p.judge(&record(Some(&magic)), NOW), "decode", "magic byte");
}

#[test]
fn avro_raw() {
    let schema = policies_dir().join("schemas/trigger.avsc");
    let text = format!(
        "policies:\n  - name: a\n    topics: [x]\n    value: {{format: avro, wire: raw, schema: \"{}\"}}\n    rules:\n      - field: /transition\n        one_of: [ENTER]\n",
        schema.display()
    );
    let set = PolicySet::parse(&text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    assert!(p
        .judge(&record(Some(&avro_trigger(52.0, "ENTER"))), NOW)
        .is_valid());
    poison(
        p.judge(&record(Some(&avro_trigger(52.0, "EXIT"))), NOW),
        "one_of:/transition",
        "\"EXIT\"",
    );
    poison(
        p.judge(&record(Some(b"\x02")), NOW),
        "decode",
        "not valid Avro",
    );
}

// ------------------------------------------------------------- Protobuf

fn proto_trigger(lat: f64) -> Vec<u8> {
    let (pool, _) =
        protobuf::load_file(&policies_dir().join("schemas/trigger.proto")).expect("proto");
    let desc = pool
        .get_message_by_name("antidote.geofence.v1.Trigger")
        .expect("message");
    let mut m = DynamicMessage::new(desc);
    m.set_field_by_name("device_id", PValue::String("dev-1".into()));
    m.set_field_by_name("geofence_id", PValue::String("fence-42".into()));
    m.set_field_by_name("lat", PValue::F64(lat));
    m.set_field_by_name("lon", PValue::F64(4.89));
    m.set_field_by_name("transition", PValue::EnumNumber(1));
    m.set_field_by_name("speed_mps", PValue::F64(3.2));
    m.set_field_by_name("event_time_ms", PValue::I64(NOW - 1000));
    m.encode_to_vec()
}

/// Confluent framing with the single-0 message-index shortcut.
fn proto_confluent(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = confluent(id, &[0]);
    out.extend_from_slice(body);
    out
}

#[test]
fn protobuf_confluent_valid_poison_unknown() {
    let set = reference();
    let p = set.for_topic("geofence.triggers.proto").expect("policy");
    let ok = proto_confluent(1, &proto_trigger(52.37));
    assert_eq!(p.judge(&record(Some(&ok)), NOW), Verdict::Valid);

    // Explicit index array [0] (count 1, index 0) is the same message.
    let mut explicit = confluent(1, &[0x02, 0x00]);
    explicit.extend_from_slice(&proto_trigger(52.37));
    assert_eq!(p.judge(&record(Some(&explicit)), NOW), Verdict::Valid);

    let far = proto_confluent(1, &proto_trigger(-91.0));
    poison(
        p.judge(&record(Some(&far)), NOW),
        "coordinates",
        "/lat: -91 is outside",
    );

    let garbage = proto_confluent(1, &[0x1f, 0xff, 0xff]);
    poison(
        p.judge(&record(Some(&garbage)), NOW),
        "decode",
        "not valid Protobuf",
    );

    let unknown = proto_confluent(7, &proto_trigger(52.37));
    assert_eq!(
        invalid(p.judge(&record(Some(&unknown)), NOW)).class,
        Class::Unknown
    );
}

#[test]
fn protobuf_raw() {
    let schema = policies_dir().join("schemas/trigger.proto");
    let text = format!(
        "policies:\n  - name: p\n    topics: [x]\n    value: {{format: protobuf, schema: \"{}\", message: antidote.geofence.v1.Trigger}}\n    rules:\n      - coordinates: {{lat: /lat, lon: /lon, reject_null_island: true}}\n      - field: /transition\n        one_of: [ENTER, EXIT, DWELL]\n",
        schema.display()
    );
    let set = PolicySet::parse(&text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("x").expect("policy");
    assert!(p
        .judge(&record(Some(&proto_trigger(52.37))), NOW)
        .is_valid());
    poison(
        p.judge(&record(Some(&proto_trigger(95.0))), NOW),
        "coordinates",
        "/lat: 95",
    );
    poison(
        p.judge(&record(Some(b"\x0a\x05ab")), NOW),
        "decode",
        "not valid Protobuf",
    );
    // An empty message: proto3 lat/lon default to 0, 0: null island.
    poison(
        p.judge(&record(Some(b"")), NOW),
        "coordinates",
        "null island",
    );

    let bad = text.replace("antidote.geofence.v1.Trigger", "Trigger");
    assert_error_text(&bad, "4:", "value.message: no message `Trigger`");
}

#[track_caller]
fn assert_error_text(text: &str, pos: &str, has: &str) {
    let errs = PolicySet::parse(text, Path::new("p.yaml")).expect_err("errors");
    let want = format!("p.yaml:{pos}");
    assert!(
        errs.iter()
            .any(|e| e.to_string().starts_with(&want) && e.message.contains(has)),
        "wanted {want}...{has}, got {errs:#?}"
    );
}

#[test]
fn protobuf_non_finite_double_is_poison_naming_the_field() {
    let set = reference();
    let p = set.for_topic("geofence.triggers.proto").expect("policy");
    let nan = proto_confluent(1, &proto_trigger(f64::NAN));
    poison(
        p.judge(&record(Some(&nan)), NOW),
        "decode",
        "/lat: NaN is not a finite number",
    );
}

#[test]
fn avro_confluent_resolves_to_the_reader_schema() {
    // Writer v1 lacks `accuracy_m`; the reader schema (`schema`) adds it with a default.
    let dir = tempfile::tempdir().expect("tempdir");
    let writer =
        r#"{"type": "record", "name": "T", "fields": [{"name": "lat", "type": "double"}]}"#;
    let reader = r#"{"type": "record", "name": "T", "fields": [{"name": "lat", "type": "double"}, {"name": "accuracy_m", "type": "double", "default": 5.0}]}"#;
    std::fs::write(dir.path().join("v1.avsc"), writer).expect("write");
    std::fs::write(dir.path().join("v2.avsc"), reader).expect("write");
    let text = "policies:\n  - name: a\n    topics: [x]\n    value:\n      format: avro\n      wire: confluent\n      schema: v2.avsc\n      schema_ids: {3: v1.avsc}\n    rules:\n      - field: /accuracy_m\n        max: 10\n";
    std::fs::write(dir.path().join("p.yaml"), text).expect("write");
    let set = PolicySet::load(&[dir.path().join("p.yaml")]).expect("loads");
    let p = set.for_topic("x").expect("policy");
    let w = apache_avro::Schema::parse_str(writer).expect("schema");
    let body = apache_avro::to_avro_datum(
        &w,
        apache_avro::types::Value::Record(vec![(
            "lat".into(),
            apache_avro::types::Value::Double(1.0),
        )]),
    )
    .expect("encode");
    assert!(p.judge(&record(Some(&confluent(3, &body))), NOW).is_valid());
}

#[test]
fn confluent_wire_needs_schema_ids() {
    let text =
        "policies:\n  - name: a\n    topics: [x]\n    value: {format: avro, wire: confluent}\n";
    assert_error_text(text, "4:33", "`confluent` needs value.schema_ids");
    let text =
        "policies:\n  - name: a\n    topics: [x]\n    value: {format: json, wire: confluent}\n";
    assert_error_text(text, "4:33", "confluent framing only with `registry: true`");
}

#[test]
fn policies_are_shareable_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<PolicySet>();
    send_sync::<Arc<Policy>>();
}

/// Rough throughput of judge() on the reference JSON policy. Debug builds
/// are far slower than release; run with `--ignored --nocapture` to see it.
#[test]
#[ignore]
fn judge_throughput_rough() {
    let set = reference();
    let p = set.for_topic("geofence.triggers").expect("policy");
    let body = serde_json::to_vec(&trigger_json()).expect("json");
    let r = record(Some(&body));
    let n = 200_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        assert!(p.judge(&r, NOW).is_valid());
    }
    let per_sec = f64::from(n) / t.elapsed().as_secs_f64();
    println!(
        "{} bytes/record, {per_sec:.0} judge()/s (this build profile)",
        body.len()
    );
    let t = std::time::Instant::now();
    for _ in 0..n {
        assert!(json::decode(&body, 64).is_ok());
    }
    let per_sec = f64::from(n) / t.elapsed().as_secs_f64();
    println!("json::decode alone: {per_sec:.0}/s");
    let t = std::time::Instant::now();
    for _ in 0..n {
        assert!(set.for_topic("geofence.triggers").is_some());
    }
    let per_sec = f64::from(n) / t.elapsed().as_secs_f64();
    println!("for_topic (exact name): {per_sec:.0}/s");
}

#[test]
fn protobuf_deep_recursion_is_poison_not_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("n.proto"),
        "syntax = \"proto3\";\npackage t;\nmessage N { N child = 1; }\n",
    )
    .expect("write");
    let text = "policies:\n  - name: n\n    topics: [x]\n    value: {format: protobuf, schema: n.proto, message: t.N}\n";
    std::fs::write(dir.path().join("p.yaml"), text).expect("write");
    let set = PolicySet::load(&[dir.path().join("p.yaml")]).expect("loads");
    let p = set.for_topic("x").expect("policy");
    // 10,000 levels of `child`, built inside out.
    let mut body: Vec<u8> = Vec::new();
    for _ in 0..10_000 {
        let mut outer = vec![0x0a];
        let mut len = body.len();
        loop {
            let b = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                outer.push(b);
                break;
            }
            outer.push(b | 0x80);
        }
        outer.extend_from_slice(&body);
        body = outer;
    }
    poison(
        p.judge(&record(Some(&body)), NOW),
        "decode",
        "not valid Protobuf",
    );
}

/// The policy format exactly as specified (comments included) loads and judges.
#[test]
fn the_specified_example_loads_verbatim() {
    let text = r#"policies:
  - name: geofence-triggers
    topics: ["geofence.triggers", "geo.*"]     # exact names or globs (* and ?)
    value:
      format: json                             # json | avro | protobuf | bytes
      schema: schemas/trigger.schema.json      # relative to this file
      max_bytes: 65536
      allow_null: true                         # null values (tombstones) pass; default true
    rules:
      - coordinates: { lat: /lat, lon: /lon }  # both present, finite, lat in [-90,90], lon in [-180,180]
      - field: /transition
        one_of: [ENTER, EXIT, DWELL]
      - field: /speed_mps
        min: 0
        max: 150
      - field: /event_time_ms
        max_age: 15m                           # older than this: class stale
        unit: ms                               # s | ms | us | ns
    headers:
      required: [idempotency-key]
    on_invalid: divert                         # divert (default) | drop | pass
    dead_letter:
      topic: "{topic}.dlt"                     # default; placeholders {topic} and {class}
"#;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("schemas")).expect("mkdir");
    std::fs::copy(
        policies_dir().join("schemas/trigger.schema.json"),
        dir.path().join("schemas/trigger.schema.json"),
    )
    .expect("copy");
    std::fs::write(dir.path().join("example.yml"), text).expect("write");
    let set = PolicySet::load(&[dir.path().to_path_buf()]).expect("loads");
    let p = set.for_topic("geo.anything").expect("glob");
    assert_eq!(p.name, "geofence-triggers");
    let body = serde_json::to_vec(&trigger_json()).expect("json");
    assert!(p.judge(&record(Some(&body)), NOW).is_valid());
    assert_eq!(
        p.dead_letter_topic("geo.anything", Class::Poison),
        "geo.anything.dlt"
    );
}

#[test]
fn unknown_action_and_missing_path_are_errors() {
    assert_error(
        &format!("{BASE}    on_invalid: quarantine\n"),
        "4:17",
        "unknown variant `quarantine`",
    );
    let missing = PathBuf::from("/nonexistent/antidote/policy.yaml");
    let errs = PolicySet::load(std::slice::from_ref(&missing)).expect_err("missing");
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0]
            .to_string()
            .starts_with("/nonexistent/antidote/policy.yaml:1:1: cannot read"),
        "{errs:#?}"
    );
}

#[test]
fn files_and_directories_load_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("b.yaml"),
        "policies:\n  - name: b\n    topics: [\"t.*\"]\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("a.yml"),
        "policies:\n  - name: a\n    topics: [\"t*\"]\n",
    )
    .expect("write");
    let single = dir.path().join("single.policy");
    std::fs::write(&single, "policies:\n  - name: s\n    topics: [s]\n").expect("write");
    let set = PolicySet::load(&[dir.path().to_path_buf(), single]).expect("loads");
    let names: Vec<&str> = set.policies().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "s"]);
    // a.yml sorts first, so its glob wins for topics both cover.
    assert_eq!(set.for_topic("t.x").map(|p| p.name.as_str()), Some("a"));
    assert_eq!(set.for_topic("s").map(|p| p.name.as_str()), Some("s"));
}

#[test]
fn on_produce_defaults_to_pass_and_reject_is_read() {
    let set = PolicySet::parse(BASE, Path::new("/tmp/p.yaml")).expect("loads");
    assert_eq!(set.policies()[0].on_produce, OnProduce::Pass);
    assert!(!set.rejects_at_produce());
    let text = format!("{BASE}    on_produce: reject\n");
    let set = PolicySet::parse(&text, Path::new("/tmp/p.yaml")).expect("loads");
    assert_eq!(set.policies()[0].on_produce, OnProduce::Reject);
    assert!(set.rejects_at_produce());
}

#[test]
fn a_malformed_on_produce_is_an_error_at_its_position() {
    assert_error(
        &format!("{BASE}    on_produce: refuse\n"),
        "4:17",
        "unknown variant `refuse`",
    );
}
