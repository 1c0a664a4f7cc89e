//! Property tests: the JSON fast path (no `serde_json::Value`, used by
//! policies without a JSON Schema or with one in the shape subset) gives
//! exactly the verdict of the decoder it replaced (scan for depth, build a
//! `Value`, the `jsonschema` validator and the rules on the `Value`): same
//! class, rule and reason, on generated and mutated documents.

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::kafka::record::{Header, Record};

const NOW: i64 = 1_764_460_000_000;

/// Policies whose pointers cover: top-level fields, nested objects, array
/// indexes, a pointer below another pointer, escaped tokens, the whole
/// document, composite `one_of` values, and small and large `max_depth`.
const POLICIES: &str = r#"
policies:
  - name: geofence-rules-only
    topics: [a]
    value: {format: json, max_bytes: 65536}
    rules:
      - coordinates: { lat: /lat, lon: /lon, reject_null_island: true }
      - field: /transition
        one_of: [ENTER, EXIT, DWELL]
      - field: /speed_mps
        min: 0
        max: 150
        optional: true
      - field: /event_time_ms
        max_age: 15m
        unit: ms
    headers:
      required: [idempotency-key]
  - name: nested
    topics: [b]
    value: {format: json, max_depth: 4}
    rules:
      - field: /p
        one_of: [{lat: 1, lon: 2}, [1, 2], 5, "x", null, true]
        optional: true
      - coordinates: { lat: /p/lat, lon: /p/lon, bbox: [-10, -10, 10, 10] }
      - field: /a/0
        one_of: [1, 2.0, "ENTER", "é\n"]
        optional: true
      - field: /a/1/k
        min: 0
        optional: true
      - field: /a~1b/~0
        max: 3
        optional: true
      - field: /t
        max_age: 60s
        unit: s
  - name: whole
    topics: [c]
    value: {format: json, max_depth: 127}
    rules:
      - field: ""
        one_of: [[1, 2], {lat: 1}, 3, "lat"]
        optional: true
      - field: /0
        min: 0
        optional: true
      - field: /lat
        max: 0
        optional: true
  - name: decode-only
    topics: [d]
    value: {format: json, max_depth: 2}
"#;

fn policies() -> PolicySet {
    match PolicySet::parse(POLICIES, Path::new("json_proptests.yaml")) {
        Ok(s) => s,
        Err(e) => panic!("{e:#?}"),
    }
}

/// Policies with JSON Schemas in the fast subset (and one outside it),
/// over the same keys as [`POLICIES`]: types, integer vs float, bounds of
/// both kinds, lengths in code points, enums, required, additional
/// properties, item counts, boolean schemas, and a rule reading a whole
/// object the schema also constrains.
const SCHEMA_POLICIES: &str = r#"
policies:
  - name: reference-schema
    topics: [s1]
    value: {format: json, schema: trigger.schema.json}
    rules:
      - coordinates: { lat: /lat, lon: /lon, reject_null_island: true }
      - field: /transition
        one_of: [ENTER, EXIT, DWELL]
  - name: loose-schema
    topics: [s2]
    value: {format: json, schema: loose.schema.json, max_depth: 5}
    rules:
      - coordinates: { lat: /lat, lon: /lon }
      - field: /p
        one_of: [{lat: 1, lon: 2}, {lat: 1}]
        optional: true
      - field: /a/0
        min: 0
        optional: true
  - name: array-schema
    topics: [s3]
    value: {format: json, schema: array.schema.json}
    rules:
      - field: /0
        min: 0
        optional: true
  - name: outside-the-subset
    topics: [s4]
    value: {format: json, schema: pattern.schema.json}
"#;

const SCHEMAS: &[(&str, &str)] = &[
    (
        "loose.schema.json",
        r#"{
          "type": "object",
          "required": ["lat", "lon"],
          "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": ["number", "null"], "exclusiveMinimum": -180, "exclusiveMaximum": 180.5},
            "transition": {"enum": ["ENTER", "EXIT", "DWELL", null]},
            "p": {"type": "object", "properties": {"lat": {"type": "integer"}},
                  "additionalProperties": {"type": "integer", "maximum": 3}},
            "a": {"type": "array", "items": {"type": ["integer", "string", "object"], "maxLength": 1},
                  "minItems": 1, "maxItems": 3},
            "x": {"type": "string", "minLength": 1, "maxLength": 2},
            "t": {"const": true},
            "0": false,
            "k": {"type": "null"},
            "event_time_ms": {"type": "integer", "minimum": 1764459000000}
          }
        }"#,
    ),
    (
        "array.schema.json",
        r#"{"type": "array", "items": {"type": "number", "maximum": 1e300}, "maxItems": 4}"#,
    ),
    (
        "pattern.schema.json",
        r#"{"type": "object", "properties": {"x": {"type": "string", "pattern": "^E"}}}"#,
    ),
];

/// Loaded once: the schemas are written to a temporary directory.
fn schema_policies() -> &'static PolicySet {
    static SET: std::sync::OnceLock<PolicySet> = std::sync::OnceLock::new();
    SET.get_or_init(load_schema_policies)
}

/// The schema policies, fresh (no layout learned yet).
fn load_schema_policies() -> PolicySet {
    {
        let dir = tempfile::tempdir().expect("tempdir");
        let reference = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../policies/schemas/trigger.schema.json");
        std::fs::copy(reference, dir.path().join("trigger.schema.json")).expect("copy schema");
        for (name, text) in SCHEMAS {
            std::fs::write(dir.path().join(name), text).expect("write schema");
        }
        match PolicySet::parse(SCHEMA_POLICIES, &dir.path().join("schemas.yaml")) {
            Ok(s) => s,
            Err(e) => panic!("{e:#?}"),
        }
    }
}

fn record(value: &[u8]) -> Record<'_> {
    Record {
        offset: 0,
        timestamp: NOW,
        key: None,
        value: Some(value),
        headers: vec![Header {
            key: b"idempotency-key",
            value: Some(b"k"),
        }],
    }
}

/// Fast path and reference agree on `doc` under every policy of `set` and
/// of the schema policies.
fn agree(set: &PolicySet, doc: &[u8]) -> Result<(), TestCaseError> {
    for p in set.policies().iter().chain(schema_policies().policies()) {
        let r = record(doc);
        let fast = p.inner.judge("", &r, NOW);
        let reference = p.inner.judge_reference(&r, NOW);
        if let Some(Err(e)) = p.inner.scanner_agrees(doc) {
            return Err(TestCaseError::fail(format!(
                "policy {}: {e} on {:?}",
                p.name,
                String::from_utf8_lossy(doc)
            )));
        }
        prop_assert_eq!(
            &fast,
            &reference,
            "policy {} on {:?}",
            p.name,
            String::from_utf8_lossy(doc)
        );
    }
    Ok(())
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("lat"),
        Just("lon"),
        Just("p"),
        Just("a"),
        Just("t"),
        Just("k"),
        Just("0"),
        Just("transition"),
        Just("speed_mps"),
        Just("event_time_ms"),
        Just("a/b"),
        Just("~"),
        Just("l\\u0061t"),
        Just("x"),
    ]
    .prop_map(String::from)
}

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        (-200.0f64..200.0).prop_map(|x| format!("{x}")),
        (-5i64..200).prop_map(|x| x.to_string()),
        Just("0".to_string()),
        Just("-0".to_string()),
        Just("1.0".to_string()),
        Just("2e0".to_string()),
        Just("1e400".to_string()),
        Just("-1e400".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-9223372036854775809".to_string()),
        Just(format!("{}", NOW - 1_000)),
        Just(format!("{}", (NOW - 30_000) / 1000)),
        Just("\"ENTER\"".to_string()),
        Just("\"EXIT\"".to_string()),
        Just("\"x\"".to_string()),
        Just("\"lat\"".to_string()),
        Just("\"\\u00e9\\n\"".to_string()),
        Just("\"\\ud83d\\ude00\"".to_string()),
        Just("\"\\ud800\"".to_string()),
        Just("NaN".to_string()),
        Just("Infinity".to_string()),
    ]
}

/// JSON text (possibly with duplicate keys and non-JSON tokens).
fn doc() -> impl Strategy<Value = String> {
    scalar().prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5)
                .prop_map(|items| format!("[{}]", items.join(","))),
            proptest::collection::vec((key(), inner), 0..6).prop_map(|members| {
                let body: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("\"{k}\": {v}"))
                    .collect();
                format!("{{{}}}", body.join(", "))
            }),
        ]
    })
}

/// A valid trigger, as the producer would write it.
fn trigger(lat: f64, lon: f64, speed: f64, age_ms: i64) -> String {
    format!(
        r#"{{"device_id": "dev-1", "geofence_id": "fence-42", "lat": {lat}, "lon": {lon}, "transition": "ENTER", "speed_mps": {speed}, "event_time_ms": {}, "p": {{"lat": 1, "lon": 2}}, "a": [1, {{"k": 3}}], "t": {}}}"#,
        NOW - age_ms,
        (NOW - age_ms) / 1000
    )
}

/// A trigger exactly as the reference schema describes it.
fn reference_trigger(lat: f64, lon: f64, speed: f64, age_ms: i64, transition: &str) -> String {
    format!(
        r#"{{"device_id": "dev-1", "geofence_id": "fence-42", "lat": {lat}, "lon": {lon}, "transition": "{transition}", "speed_mps": {speed}, "event_time_ms": {}, "accuracy_m": 3}}"#,
        NOW - age_ms
    )
}

/// Byte edits that make near-miss documents.
#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, &'static str),
    Delete(usize),
    Replace(usize, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    let token = prop_oneof![
        Just("["),
        Just("]"),
        Just("{"),
        Just("}"),
        Just(","),
        Just(":"),
        Just("\""),
        Just("\\"),
        Just("NaN"),
        Just("1e400"),
        Just("\\ud800"),
        Just("\u{e9}"),
        Just("\"lat\": 95, "),
        Just("\"p\": 5, "),
        Just("[[[[["),
        Just(" "),
        Just("0"),
        Just("-"),
    ];
    prop_oneof![
        (any::<usize>(), token).prop_map(|(i, t)| Edit::Insert(i, t)),
        any::<usize>().prop_map(Edit::Delete),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Replace(i, b)),
    ]
}

fn apply(mut doc: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let at = |i: usize, n: usize| if n == 0 { 0 } else { i % n };
        match *e {
            Edit::Insert(i, t) => {
                let i = at(i, doc.len() + 1);
                doc.splice(i..i, t.bytes());
            }
            Edit::Delete(i) if !doc.is_empty() => {
                let i = at(i, doc.len());
                doc.remove(i);
            }
            Edit::Replace(i, b) if !doc.is_empty() => {
                let i = at(i, doc.len());
                doc[i] = b;
            }
            _ => {}
        }
    }
    doc
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn generated_documents_agree(d in doc()) {
        agree(&policies(), d.as_bytes())?;
    }

    #[test]
    fn mutated_triggers_agree(
        lat in -100.0f64..100.0,
        lon in -200.0f64..200.0,
        speed in -10.0f64..200.0,
        age in 0i64..2_000_000,
        edits in proptest::collection::vec(edit(), 0..4),
    ) {
        let doc = apply(trigger(lat, lon, speed, age).into_bytes(), &edits);
        agree(&policies(), &doc)?;
    }

    #[test]
    fn documents_with_the_required_keys_agree(
        lat in prop_oneof![scalar(), (-95.0f64..95.0).prop_map(|x| x.to_string())],
        lon in prop_oneof![scalar(), (-185i64..185).prop_map(|x| x.to_string())],
        members in proptest::collection::vec((key(), prop_oneof![3 => scalar(), 1 => doc()]), 0..3),
    ) {
        let rest: String = members.iter().map(|(k, v)| format!(", \"{k}\": {v}")).collect();
        let d = format!("{{\"lat\": {lat}, \"lon\": {lon}{rest}}}");
        agree(&policies(), d.as_bytes())?;
    }

    #[test]
    fn mutated_reference_triggers_agree(
        lat in -100.0f64..100.0,
        lon in -200.0f64..200.0,
        speed in -10.0f64..200.0,
        age in 0i64..2_000_000,
        transition in prop_oneof![Just("ENTER"), Just("EXIT"), Just("x")],
        edits in proptest::collection::vec(edit(), 0..3),
    ) {
        let doc = apply(reference_trigger(lat, lon, speed, age, transition).into_bytes(), &edits);
        agree(&policies(), &doc)?;
    }

    /// The scanner's learned layouts (`capture/layout.rs`): one fresh set
    /// of policies learns them from a document, then judges near misses of
    /// it, whose members match the layout's bytes, or nearly do.
    #[test]
    fn documents_after_a_learned_layout_agree(
        d in prop_oneof![
            doc(),
            (-100.0f64..100.0, -200.0f64..200.0).prop_map(|(a, o)| trigger(a, o, 3.0, 10)),
        ],
        edits in proptest::collection::vec(proptest::collection::vec(edit(), 1..3), 1..4),
    ) {
        let set = policies();
        agree(&set, d.as_bytes())?;
        for e in &edits {
            agree(&set, &apply(d.clone().into_bytes(), e))?;
        }
    }

    #[test]
    fn mutated_generated_documents_agree(
        d in doc(),
        edits in proptest::collection::vec(edit(), 1..3),
    ) {
        agree(&policies(), &apply(d.into_bytes(), &edits))?;
    }
}

#[test]
fn fast_path_is_used_unless_the_schema_is_outside_the_subset() {
    for p in policies().policies() {
        assert!(p.inner.uses_fast_path(), "{}", p.name);
    }
    for p in schema_policies().policies() {
        assert_eq!(
            p.inner.uses_fast_path(),
            p.name != "outside-the-subset",
            "{}",
            p.name
        );
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    let reference = PolicySet::load(&[dir]).expect("reference policies load");
    let json = reference
        .for_topic("geofence.triggers")
        .expect("the JSON reference policy");
    assert!(json.inner.uses_fast_path());
    // A valid trigger is accepted by the shape, not only by the fallback.
    let doc = reference_trigger(52.1, 4.3, 3.5, 1_000, "ENTER");
    assert!(json.inner.shape_accepts(doc.as_bytes()));
    assert!(json.judge(&record(doc.as_bytes()), NOW).is_valid());
    let wrong_type = doc.replace("\"accuracy_m\": 3", "\"accuracy_m\": \"3\"");
    assert!(!json.inner.shape_accepts(wrong_type.as_bytes()));
}

/// The byte scanner takes the records producers usually write (no escapes,
/// short integers, fractions): they never reach serde_json's visitor.
#[test]
fn the_byte_scanner_accepts_plain_triggers() {
    let set = policies();
    let plain = [
        trigger(52.1, 4.3, 12.5, 1_000),
        reference_trigger(52.1, 4.3, 12.5, 1_000, "ENTER"),
    ];
    for (doc, name) in plain.iter().zip(["geofence-rules-only", "nested"]) {
        let p = set
            .policies()
            .iter()
            .find(|p| p.name == name)
            .expect("policy");
        assert_eq!(
            p.inner.scanner_agrees(doc.as_bytes()),
            Some(Ok(true)),
            "{name} on {doc}"
        );
    }
    let p = &schema_policies().policies()[0];
    let doc = reference_trigger(52.1, 4.3, 12.5, 1_000, "ENTER");
    assert_eq!(
        p.inner.scanner_agrees(doc.as_bytes()),
        Some(Ok(true)),
        "{doc}"
    );
}

/// After a layout is learned from a plain trigger, members that are
/// reordered, repeated, left out, added, spaced or nested differently are
/// still read as serde_json reads them.
#[test]
fn documents_unlike_the_learned_layout_agree() {
    let set = policies();
    let first = trigger(52.1, 4.3, 12.5, 1_000);
    agree(&set, first.as_bytes()).expect("the first trigger");
    let docs = [
        first.replace(r#""lat": 52.1, "lon": 4.3"#, r#""lon": 4.3, "lat": 52.1"#),
        first.replace(r#""lat": 52.1, "#, r#""lat": 52.1, "lat": 95, "#),
        first.replace(r#""lat": 52.1, "#, r#""lat": 95, "lat": 52.1, "#),
        first.replace(r#""speed_mps": 12.5, "#, ""),
        first.replace(
            r#""speed_mps": 12.5, "#,
            r#""speed_mps": 12.5, "x": {"lat": 95}, "#,
        ),
        first.replace(r#""lat": 52.1"#, r#""lat" : 52.1"#),
        first.replace(r#""lat": 52.1"#, r#""lat":52.1"#),
        first.replace(r#""lat": 52.1"#, r#""latitude": 52.1, "lat": 52.1"#),
        first.replace(r#""lat": 52.1"#, r#""la": 52.1"#),
        first.replace(
            r#""p": {"lat": 1, "lon": 2}"#,
            r#""p": {"lon": 2, "lat": 1}"#,
        ),
        first.replace(
            r#""p": {"lat": 1, "lon": 2}"#,
            r#""p": {"lat": 1, "lat": 200, "lon": 2}"#,
        ),
        first.replace(r#""p": {"lat": 1, "lon": 2}"#, r#""p": {"lat": 1}"#),
        first.replace(r#""p": {"lat": 1, "lon": 2}"#, r#""p": [1, 2]"#),
        first.replace(r#""a": [1, {"k": 3}]"#, r#""a": [1, {"k": -3, "k": 3}]"#),
        first.replace(r#""a": [1, {"k": 3}]"#, r#""a": [{"k": 3}, 1]"#),
        first.replace(r#""transition": "ENTER""#, r#""transition": "ENT\u0045R""#),
        first.replace(r#""transition""#, r#""tr\u0061nsition""#),
    ];
    for (i, d) in docs.iter().enumerate() {
        assert_ne!(d, &first, "replacement {i} applies");
        if let Err(e) = agree(&set, d.as_bytes()) {
            panic!("{e}");
        }
    }
}

/// The flat reader (`capture/flat.rs`) reads a compact record of the
/// root's learned layout in one pass. Records that leave members out
/// (required or not), break the schema, nest, respace, escape, repeat or
/// add members, or trail bytes are judged as serde_json and the JSON
/// Schema validator judge them.
#[test]
fn flat_records_after_a_learned_layout_agree() {
    let (set, fresh) = (policies(), load_schema_policies());
    let first = format!(
        r#"{{"device_id":"dev-1","geofence_id":"fence-42","lat":52.1,"lon":4.3,"transition":"ENTER","speed_mps":12.5,"event_time_ms":{},"accuracy_m":3}}"#,
        NOW - 1_000
    );
    for s in [&set, &fresh] {
        agree(s, first.as_bytes()).expect("the first record");
        for p in s.policies() {
            let agrees = p.inner.scanner_agrees(first.as_bytes());
            assert!(
                matches!(agrees, None | Some(Ok(_))),
                "{}: {agrees:?}",
                p.name
            );
        }
    }
    // Written exactly as the first, it is read by the template
    // (`capture/flat/template.rs`), under every policy that has a flat
    // reader; respaced or with a member left out, it is not.
    for s in [&set, &fresh] {
        let takes = |d: &str| {
            s.policies()
                .iter()
                .filter(|p| p.inner.template_takes(d.as_bytes()))
                .count()
        };
        assert!(takes(&first) > 0, "the template reads the first record");
        assert_eq!(takes(&format!("{first} ")), 0);
        assert_eq!(takes(&first.replace(r#""speed_mps":12.5,"#, "")), 0);
    }
    let docs = [
        first.replace(r#""geofence_id":"fence-42","#, ""),
        first.replace(r#""speed_mps":12.5,"#, ""),
        first
            .replace(r#""speed_mps":12.5,"#, "")
            .replace(r#""lon":4.3,"#, ""),
        first.replace(r#""accuracy_m":3"#, r#""accuracy_m":-1"#),
        first.replace(r#""transition":"ENTER""#, r#""transition":5"#),
        first.replace(r#""lat":52.1"#, r#""lat":95"#),
        first.replace(r#""lat":52.1"#, r#""lat":{"a":1}"#),
        first.replace(r#""lat":52.1"#, r#""lat":[52.1]"#),
        first.replace(r#""lat":52.1"#, r#""lat":null"#),
        first.replace(r#""lat":52.1"#, r#""lat":true"#),
        first.replace(r#""lat":52.1"#, r#""lat": 52.1 "#),
        first.replace(r#""lat":52.1,"#, r#""lat":52.1,"lat":95,"#),
        first.replace(r#""lon":4.3,"#, r#""lon":4.3,"lat":95,"#),
        first.replace(r#""accuracy_m":3"#, r#""accuracy_m":3,"x":1"#),
        first.replace(r#""dev-1""#, r#""dev\u002d1""#),
        first.replace(r#""dev-1""#, r#""""#),
        first.replace(r#""lat":52.1"#, r#""lat":52.1e400"#),
        first.replace(r#""lat":52.1"#, r#""lat":-0"#),
        first.replace(r#""lat":52.1"#, r#""lat":5210000000000000000000"#),
        format!("{first} "),
        format!(" {first}"),
        format!("{first}x"),
        format!("{first}}}"),
        first[..first.len() - 1].to_string(),
        first.replace('{', "[").replace('}', "]"),
        // The flat reader takes ASCII strings only, unchecked as UTF-8.
        first.replace("dev-1", "dév-1"),
        first.replace("ENTER", "ENTÉR"),
        first.replace("dev-1", "dev\u{1}1"),
        first.replace("dev-1", "dev\u{7f}1"),
        first.replace("dev-1", "dev-1\u{10348}"),
    ];
    for (i, d) in docs.iter().enumerate() {
        assert_ne!(d, &first, "replacement {i} applies");
        for s in [&set, &fresh] {
            if let Err(e) = agree(s, d.as_bytes()) {
                panic!("{i}: {e}");
            }
        }
    }
    // Bytes that are not UTF-8 inside a string, at every position of the
    // device id's word.
    for at in 0..5 {
        for byte in [0x80u8, 0xc3, 0xff] {
            let mut d = first.clone().into_bytes();
            let pos = first.find("dev-1").expect("the device") + at;
            d[pos] = byte;
            for s in [&set, &fresh] {
                if let Err(e) = agree(s, &d) {
                    panic!("{byte:#x} at {at}: {e}");
                }
            }
        }
    }
}

#[test]
fn edge_cases_agree() {
    let set = policies();
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let mut docs: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b" ".to_vec(),
        b"{}".to_vec(),
        b"[]".to_vec(),
        b"3".to_vec(),
        b"\"lat\"".to_vec(),
        b"[1, 2]".to_vec(),
        b"[-1]".to_vec(),
        br#"{"lat": 1}"#.to_vec(),
        br#"{"lat": 1, "lat": 2}"#.to_vec(),
        br#"{"p": {"lat": 1, "lon": 2}, "p": {"lat": 3}}"#.to_vec(),
        br#"{"p": {"lat": 1, "lon": 2}, "p": 5}"#.to_vec(),
        br#"{"p": 5, "p": {"lat": 1, "lon": 2}}"#.to_vec(),
        br#"{"p": {"lat": 1, "lon": 2}, "a": [1, {"k": -1}]}"#.to_vec(),
        br#"{"p": {"lat": 1, "lon": 2}, "a": ["\u00e9\n", {"k": 1}], "a/b": {"~": 4}}"#.to_vec(),
        br#"{"p": [1, 2], "a": "str"}"#.to_vec(),
        br#"{"l\u0061t": 52.1, "lon": 4.3, "transition": "ENTER", "event_time_ms": 1764459999000}"#
            .to_vec(),
        br#"{"lat": 52.1, "lon": 4.3, "transition": "ENT\u0045R", "event_time_ms": 1764459999000}"#
            .to_vec(),
        br#"{"lat": 0, "lon": -0.0, "transition": "ENTER", "event_time_ms": 1764459999000}"#
            .to_vec(),
        br#"{"lat": 1, "x": [[[[[1]]]]]}"#.to_vec(),
        br#"{"lat": NaN, "x": [[[[[[[[1]]]]]]]]}"#.to_vec(),
        br#"{"lat": 1} x"#.to_vec(),
        b"{\"lat\": \"\xff\"}".to_vec(),
        b"{\"x\": \"\xff\"}".to_vec(),
        br#"{"x": "\udc00"}"#.to_vec(),
        br#"{"x": 1e400}"#.to_vec(),
        br#"{"x": "a\u0000"}"#.to_vec(),
        b"{\"x\": \"tab\there\"}".to_vec(),
        deep(2).into_bytes(),
        deep(3).into_bytes(),
        deep(4).into_bytes(),
        deep(5).into_bytes(),
        deep(64).into_bytes(),
        deep(65).into_bytes(),
        deep(127).into_bytes(),
        deep(128).into_bytes(),
        deep(129).into_bytes(),
        "[".repeat(100_000).into_bytes(),
        "{\"a\":".repeat(100_000).into_bytes(),
        format!("[\"{}\"]", "[".repeat(200)).into_bytes(),
        format!("[{}", deep(200)).into_bytes(),
        // Numbers and separators at the byte scanner's edges.
        br#"{"lat": 1.5e1, "lon": -12, "x": 123456789012345678, "t": 1234567890123456789}"#
            .to_vec(),
        br#"{"lat": 0.1, "lon": 1E+2, "speed_mps": -0, "x": 1e-7}"#.to_vec(),
        b"[1.]".to_vec(),
        b"[.5]".to_vec(),
        b"[01]".to_vec(),
        b"[-]".to_vec(),
        b"[1,]".to_vec(),
        b"[1 2]".to_vec(),
        br#"{"lat": 1,}"#.to_vec(),
        br#"{"lat" 1}"#.to_vec(),
        br#"{"lat": 1 "lon": 2}"#.to_vec(),
        b" \t\n\r{\"lat\": 1, \"lon\": 2}\r\n ".to_vec(),
        b"[tru]".to_vec(),
        b"[nul".to_vec(),
        b"{\"lat\"".to_vec(),
    ];
    for n in [126, 127, 128, 129] {
        docs.push(format!("{}x{}", "[".repeat(n), "]".repeat(n)).into_bytes());
        docs.push(format!("{}1{}", "{\"p\":".repeat(n), "}".repeat(n)).into_bytes());
    }
    for d in &docs {
        if let Err(e) = agree(&set, d) {
            panic!("{e}");
        }
    }
}
