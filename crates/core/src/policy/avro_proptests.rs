//! Property tests: the Avro fast path (values read straight from the datum
//! into the rules' captures) gives exactly the verdict of the full decoder
//! (apache-avro's value, converted to a `serde_json::Value`, then the
//! rules): same class, rule and reason, on datums apache-avro wrote and on
//! the same datums with bytes replaced, inserted, removed or cut off.

use apache_avro::types::Value as A;
use apache_avro::Schema;
use proptest::prelude::*;

use super::byte_edits::{self, apply, edit, record};
use super::*;

const NOW: i64 = 1_764_460_000_000;

/// Every kind of schema the fast path reads, with rules reading a field of
/// each kind, through a union, a nested record, an array index and a map key.
const SCHEMA: &str = r#"{
  "type": "record", "name": "T", "namespace": "t",
  "fields": [
    {"name": "id", "type": "string"},
    {"name": "lat", "type": "double"},
    {"name": "lon", "type": "float"},
    {"name": "transition", "type": {"type": "enum", "name": "Tr", "symbols": ["ENTER", "EXIT", "DWELL"]}},
    {"name": "speed", "type": ["null", "double"]},
    {"name": "n", "type": "int"},
    {"name": "t", "type": "long"},
    {"name": "flag", "type": "boolean"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "m", "type": {"type": "map", "values": "long"}},
    {"name": "b", "type": "bytes"},
    {"name": "f", "type": {"type": "fixed", "name": "F", "size": 2}},
    {"name": "r", "type": ["null", {"type": "record", "name": "R", "fields": [
      {"name": "x", "type": "int"}, {"name": "y", "type": ["string", "null"]}]}]}
  ]
}"#;

const RULES: &str = r#"
      - coordinates: { lat: /lat, lon: /lon, reject_null_island: true }
      - field: /transition
        one_of: [ENTER, EXIT]
      - field: /speed
        min: 0
        max: 150
        optional: true
      - field: /n
        min: -5
      - field: /flag
        one_of: [true]
      - field: /tags/1
        one_of: [a, b]
        optional: true
      - field: /m/k
        max: 100
        optional: true
      - field: /b
        one_of: ["", "AQID"]
      - field: /f
        one_of: ["AAA=", "/wA="]
      - field: /r/x
        min: 0
        optional: true
      - field: /r/y
        one_of: [ok, null]
        optional: true
      - field: /t
        max_age: 15m
        unit: ms
"#;

fn policies() -> &'static PolicySet {
    static SET: std::sync::OnceLock<PolicySet> = std::sync::OnceLock::new();
    SET.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("t.avsc"), SCHEMA).expect("write schema");
        let policies = format!(
            "policies:\n  - name: raw\n    topics: [raw]\n    \
             value: {{format: avro, wire: raw, schema: t.avsc}}\n    rules:{RULES}  \
             - name: confluent\n    topics: [confluent]\n    \
             value: {{format: avro, wire: confluent, schema_ids: {{7: t.avsc}}}}\n    rules:{RULES}"
        );
        match PolicySet::parse(&policies, &dir.path().join("avro.yaml")) {
            Ok(s) => s,
            Err(e) => panic!("{e:#?}"),
        }
    })
}

fn schema() -> &'static Schema {
    static S: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    S.get_or_init(|| Schema::parse_str(SCHEMA).expect("schema"))
}

/// Both policies (raw datum, and Confluent-framed with id 7) judge `datum`
/// as the full decoder does.
fn agree(datum: &[u8]) -> Result<(), TestCaseError> {
    byte_edits::agree(policies(), datum, &[0, 0, 0, 0, 7], NOW)
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("ok".to_string()),
        Just("k".to_string()),
        Just(String::new()),
        "[a-zé]{0,6}",
    ]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        -200.0f64..200.0,
        Just(0.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-0.0),
    ]
}

/// A datum as a producer's serializer would write it.
fn datum() -> impl Strategy<Value = Vec<u8>> {
    let scalars = (
        text(),
        float(),
        float(),
        0u32..3,
        prop::option::of(float()),
        prop_oneof![Just(i32::MIN), Just(i32::MAX), -10i32..10],
        prop_oneof![Just(NOW - 1_000), Just(NOW - 3_600_000), any::<i64>()],
        any::<bool>(),
    );
    let containers = (
        prop::collection::vec(text(), 0..4),
        prop::collection::vec((text(), -5i64..500), 0..4),
        prop_oneof![
            Just(vec![]),
            Just(vec![1u8, 2, 3]),
            prop::collection::vec(any::<u8>(), 0..4)
        ],
        prop_oneof![Just([0u8, 0]), Just([255u8, 0]), any::<[u8; 2]>()],
        prop::option::of((-3i32..3, prop::option::of(text()))),
    );
    (scalars, containers).prop_map(
        |((id, lat, lon, tr, speed, n, t, flag), (tags, m, b, f, r))| {
            let symbols = ["ENTER", "EXIT", "DWELL"];
            let v = A::Record(vec![
                ("id".into(), A::String(id)),
                ("lat".into(), A::Double(lat)),
                ("lon".into(), A::Float(lon as f32)),
                (
                    "transition".into(),
                    A::Enum(tr, symbols[tr as usize].into()),
                ),
                (
                    "speed".into(),
                    match speed {
                        None => A::Union(0, Box::new(A::Null)),
                        Some(s) => A::Union(1, Box::new(A::Double(s))),
                    },
                ),
                ("n".into(), A::Int(n)),
                ("t".into(), A::Long(t)),
                ("flag".into(), A::Boolean(flag)),
                (
                    "tags".into(),
                    A::Array(tags.into_iter().map(A::String).collect()),
                ),
                (
                    "m".into(),
                    A::Map(m.into_iter().map(|(k, v)| (k, A::Long(v))).collect()),
                ),
                ("b".into(), A::Bytes(b)),
                ("f".into(), A::Fixed(2, f.to_vec())),
                (
                    "r".into(),
                    match r {
                        None => A::Union(0, Box::new(A::Null)),
                        Some((x, y)) => A::Union(
                            1,
                            Box::new(A::Record(vec![
                                ("x".into(), A::Int(x)),
                                (
                                    "y".into(),
                                    match y {
                                        Some(s) => A::Union(0, Box::new(A::String(s))),
                                        None => A::Union(1, Box::new(A::Null)),
                                    },
                                ),
                            ])),
                        ),
                    },
                ),
            ]);
            apache_avro::to_avro_datum(schema(), v).expect("encodes")
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn written_datums_agree(d in datum()) {
        agree(&d)?;
    }

    #[test]
    fn mutated_datums_agree(d in datum(), edits in prop::collection::vec(edit(), 1..4)) {
        agree(&apply(d, &edits))?;
    }
}

/// The fast path reads what serializers write, valid or not by the rules,
/// and leaves NaN (which the full path cannot judge) to the full decoder.
#[test]
fn the_fast_path_reads_written_datums() {
    let p = &policies().policies()[0];
    let write = |lat: f64| {
        apache_avro::to_avro_datum(
            schema(),
            A::Record(vec![
                ("id".into(), A::String("d".into())),
                ("lat".into(), A::Double(lat)),
                ("lon".into(), A::Float(4.5)),
                ("transition".into(), A::Enum(1, "EXIT".into())),
                ("speed".into(), A::Union(1, Box::new(A::Double(3.0)))),
                ("n".into(), A::Int(1)),
                ("t".into(), A::Long(NOW)),
                ("flag".into(), A::Boolean(true)),
                (
                    "tags".into(),
                    A::Array(vec![A::String("x".into()), A::String("a".into())]),
                ),
                ("m".into(), A::Map([("k".to_string(), A::Long(5))].into())),
                ("b".into(), A::Bytes(vec![1, 2, 3])),
                ("f".into(), A::Fixed(2, vec![255, 0])),
                ("r".into(), A::Union(0, Box::new(A::Null))),
            ]),
        )
        .expect("encodes")
    };
    let valid = write(52.0);
    assert!(p.inner.binary_fast_path_takes(&valid));
    assert_eq!(p.inner.judge("", &record(&valid, NOW), NOW), Ok(()));
    let poison = write(95.0);
    assert!(p.inner.binary_fast_path_takes(&poison));
    assert!(p.inner.judge("", &record(&poison, NOW), NOW).is_err());
    let nan = write(f64::NAN);
    assert!(!p.inner.binary_fast_path_takes(&nan));
    assert_eq!(
        p.inner.judge("", &record(&nan, NOW), NOW),
        p.inner.judge_reference(&record(&nan, NOW), NOW)
    );
    let mut trailing = valid.clone();
    trailing.push(0);
    assert!(!p.inner.binary_fast_path_takes(&trailing));
}
