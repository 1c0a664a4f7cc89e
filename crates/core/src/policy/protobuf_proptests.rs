//! Property tests: the Protobuf fast path (fields read straight from the
//! message into the rules' captures) gives exactly the verdict of the full
//! decoder (`DynamicMessage`, converted to a `serde_json::Value`, then the
//! rules): same class, rule and reason, on messages prost-reflect encoded,
//! on two encodings concatenated (which Protobuf merges: last value wins,
//! nested messages merge), with unknown fields, and with bytes replaced,
//! inserted, removed or cut off.

use proptest::prelude::*;
use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, Value as P};

use super::byte_edits::{self, apply, edit, record};
use super::*;

const NOW: i64 = 1_764_460_000_000;

const PROTO: &str = r#"syntax = "proto3";
package t;
enum Tr { TR_UNSPECIFIED = 0; ENTER = 1; EXIT = 2; }
message T {
  string id = 1;
  double lat = 2;
  float lon = 3;
  Tr transition = 4;
  optional double speed = 5;
  int32 n = 6;
  int64 t = 7;
  bool flag = 8;
  uint32 u = 9;
  uint64 big = 10;
  sint32 s = 11;
  fixed32 f32 = 12;
  sfixed64 sf64 = 13;
  bytes b = 14;
  Inner r = 15;
  optional Tr maybe = 16;
}
message Inner { int32 x = 1; optional string y = 2; sint64 z = 3; }
"#;

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
      - field: /u
        max: 10
      - field: /big
        max: 1000000
      - field: /s
        min: -3
      - field: /f32
        max: 100
      - field: /sf64
        min: -100
      - field: /b
        one_of: ["", "AQID"]
      - field: /r/x
        min: 0
        optional: true
      - field: /r/y
        one_of: [ok]
        optional: true
      - field: /r/z
        max: 5
        optional: true
      - field: /maybe
        one_of: [EXIT, TR_UNSPECIFIED, 7]
        optional: true
      - field: /t
        max_age: 15m
        unit: ms
"#;

fn policies() -> &'static PolicySet {
    static SET: std::sync::OnceLock<PolicySet> = std::sync::OnceLock::new();
    SET.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("t.proto"), PROTO).expect("write schema");
        let policies = format!(
            "policies:\n  - name: raw\n    topics: [raw]\n    \
             value: {{format: protobuf, wire: raw, schema: t.proto, message: t.T}}\n    \
             rules:{RULES}  - name: confluent\n    topics: [confluent]\n    \
             value: {{format: protobuf, wire: confluent, message: t.T, schema_ids: {{7: t.proto}}}}\n    \
             rules:{RULES}"
        );
        match PolicySet::parse(&policies, &dir.path().join("proto.yaml")) {
            Ok(s) => s,
            Err(e) => panic!("{e:#?}"),
        }
    })
}

fn descriptor(name: &str) -> MessageDescriptor {
    static POOL: std::sync::OnceLock<prost_reflect::DescriptorPool> = std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.proto");
        std::fs::write(&path, PROTO).expect("write schema");
        super::protobuf::load_file(&path).expect("compiles").0
    });
    pool.get_message_by_name(name).expect("message")
}

/// Both policies (raw, and Confluent-framed with id 7 and message index 0)
/// judge `msg` as the full decoder does.
fn agree(msg: &[u8]) -> Result<(), TestCaseError> {
    byte_edits::agree(policies(), msg, &[0, 0, 0, 0, 7, 0], NOW)
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        -200.0f64..200.0,
        Just(0.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
    ]
}

/// Each field set or left out; values near the rules' bounds.
fn message() -> impl Strategy<Value = Vec<u8>> {
    let a = (
        prop::option::of("[a-z]{0,4}"),
        prop::option::of(float()),
        prop::option::of(float()),
        prop::option::of(prop_oneof![Just(0i32), Just(1), Just(2), Just(7), Just(-1)]),
        prop::option::of(float()),
        prop::option::of(prop_oneof![Just(i32::MIN), -10i32..10]),
        prop::option::of(prop_oneof![
            Just(NOW - 1_000),
            Just(NOW - 3_600_000),
            any::<i64>()
        ]),
        prop::option::of(any::<bool>()),
    );
    let b = (
        prop::option::of(prop_oneof![0u32..20, Just(u32::MAX)]),
        prop::option::of(prop_oneof![0u64..2_000_000, Just(u64::MAX)]),
        prop::option::of(-6i32..6),
        prop::option::of(prop_oneof![0u32..200, Just(u32::MAX)]),
        prop::option::of(prop_oneof![-200i64..10, Just(i64::MIN)]),
        prop::option::of(prop_oneof![
            Just(vec![]),
            Just(vec![1u8, 2, 3]),
            Just(vec![9u8])
        ]),
        prop::option::of((
            prop::option::of(-3i32..3),
            prop::option::of(prop_oneof![Just("ok".to_string()), Just("no".to_string())]),
            prop::option::of(-8i64..8),
        )),
        prop::option::of(prop_oneof![Just(0i32), Just(2), Just(1), Just(7)]),
    );
    (a, b).prop_map(
        |((id, lat, lon, tr, speed, n, t, flag), (u, big, s, f32v, sf64, bytes, r, maybe))| {
            let mut m = DynamicMessage::new(descriptor("t.T"));
            let mut set = |name: &str, v: Option<P>| {
                if let Some(v) = v {
                    m.set_field_by_name(name, v);
                }
            };
            set("id", id.map(P::String));
            set("lat", lat.map(P::F64));
            set("lon", lon.map(|x| P::F32(x as f32)));
            set("transition", tr.map(P::EnumNumber));
            set("speed", speed.map(P::F64));
            set("n", n.map(P::I32));
            set("t", t.map(P::I64));
            set("flag", flag.map(P::Bool));
            set("u", u.map(P::U32));
            set("big", big.map(P::U64));
            set("s", s.map(P::I32));
            set("f32", f32v.map(P::U32));
            set("sf64", sf64.map(P::I64));
            set("b", bytes.map(|b| P::Bytes(b.into())));
            set("maybe", maybe.map(P::EnumNumber));
            set(
                "r",
                r.map(|(x, y, z)| {
                    let mut inner = DynamicMessage::new(descriptor("t.Inner"));
                    if let Some(x) = x {
                        inner.set_field_by_name("x", P::I32(x));
                    }
                    if let Some(y) = y {
                        inner.set_field_by_name("y", P::String(y));
                    }
                    if let Some(z) = z {
                        inner.set_field_by_name("z", P::I64(z));
                    }
                    P::Message(inner)
                }),
            );
            m.encode_to_vec()
        },
    )
}

/// Unknown fields of every wire type Protobuf skips.
fn unknown() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(vec![0xf8, 0x06, 0x05]),                   // 111: varint 5
        Just(vec![0xf9, 0x06, 1, 2, 3, 4, 5, 6, 7, 8]), // 111: fixed64
        Just(vec![0xfa, 0x06, 2, b'h', b'i']),          // 111: 2 bytes
        Just(vec![0xfd, 0x06, 1, 2, 3, 4]),             // 111: fixed32
        Just(vec![0xfb, 0x06, 0xfc, 0x06]),             // 111: an empty group
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn encoded_messages_agree(m in message()) {
        agree(&m)?;
    }

    #[test]
    fn merged_messages_with_unknown_fields_agree(
        a in message(),
        b in message(),
        extra in prop::collection::vec(unknown(), 0..3),
    ) {
        let mut m = a;
        for u in &extra {
            m.extend_from_slice(u);
        }
        m.extend_from_slice(&b);
        agree(&m)?;
    }

    #[test]
    fn mutated_messages_agree(m in message(), edits in prop::collection::vec(edit(), 1..4)) {
        agree(&apply(m, &edits))?;
    }

    /// Message-index arrays other than `[0]` (another message, a nested
    /// one, out of range, negative, truncated, arbitrary bytes): the fast
    /// path resolves them as the full decoder does.
    #[test]
    fn index_arrays_agree(m in message(), indexes in index_array()) {
        let mut frame = vec![0, 0, 0, 0, 7];
        frame.extend_from_slice(&indexes);
        byte_edits::agree(policies(), &m, &frame, NOW)?;
    }
}

/// An encoded index array: zigzag varints, the count then the indexes
/// (no count at all, or a bad one, among the arbitrary bytes).
fn index_array() -> impl Strategy<Value = Vec<u8>> {
    fn zigzag(n: i64, out: &mut Vec<u8>) {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }
    prop_oneof![
        prop::collection::vec(-2i64..4, 0..4).prop_map(|ix| {
            let mut out = Vec::new();
            zigzag(ix.len() as i64, &mut out);
            ix.iter().for_each(|&i| zigzag(i, &mut out));
            out
        }),
        prop::collection::vec(any::<u8>(), 0..4),
    ]
}

/// The fast path reads what serializers write, valid or not by the rules,
/// including absent fields (defaults) and unknown enum numbers.
#[test]
fn the_fast_path_reads_encoded_messages() {
    let p = &policies().policies()[0];
    let write = |lat: f64| {
        let mut m = DynamicMessage::new(descriptor("t.T"));
        m.set_field_by_name("lat", P::F64(lat));
        m.set_field_by_name("lon", P::F32(4.5));
        m.set_field_by_name("transition", P::EnumNumber(1));
        m.set_field_by_name("n", P::I32(1));
        m.set_field_by_name("t", P::I64(NOW));
        m.set_field_by_name("flag", P::Bool(true));
        m.set_field_by_name("maybe", P::EnumNumber(7));
        m.encode_to_vec()
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
    let mut framed = vec![0, 0, 0, 0, 7, 0];
    framed.extend_from_slice(&valid);
    assert!(policies().policies()[1]
        .inner
        .binary_fast_path_takes(&framed));
}

/// A topic whose records must be the file's second message: a record
/// framed `[0]` (the first) is not read by the fast path, whose name check
/// is skipped only when the first message is the one expected, and is
/// poison as the full decoder says; one framed `[1]` is read.
#[test]
fn index_zero_of_another_type_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("t.proto"), PROTO).expect("write schema");
    let text = "policies:\n  - name: inner\n    topics: [inner]\n    \
        value: {format: protobuf, wire: confluent, message: t.Inner, schema_ids: {7: t.proto}}\n    \
        rules:\n      - field: /x\n        min: 0\n";
    let set = PolicySet::parse(text, &dir.path().join("p.yaml")).expect("parses");
    let p = &set.policies()[0];
    let mut t = DynamicMessage::new(descriptor("t.T"));
    t.set_field_by_name("n", P::I32(1));
    let mut first = vec![0, 0, 0, 0, 7, 0];
    first.extend_from_slice(&t.encode_to_vec());
    assert!(!p.inner.binary_fast_path_takes(&first));
    let verdict = p.inner.judge("", &record(&first, NOW), NOW);
    assert_eq!(verdict, p.inner.judge_reference(&record(&first, NOW), NOW));
    assert!(
        format!("{verdict:?}").contains("this topic expects t.Inner"),
        "{verdict:?}"
    );
    let mut inner = DynamicMessage::new(descriptor("t.Inner"));
    inner.set_field_by_name("x", P::I32(3));
    let mut second = vec![0, 0, 0, 0, 7, 2, 2];
    second.extend_from_slice(&inner.encode_to_vec());
    assert!(p.inner.binary_fast_path_takes(&second));
    assert_eq!(p.inner.judge("", &record(&second, NOW), NOW), Ok(()));
}

/// A message type with more fields than the reader tracks as read (64)
/// gets its defaults before its fields, and still judges as the full
/// decoder does: fields absent (defaults), present, and given twice.
#[test]
fn a_message_of_more_than_64_fields_judges_as_the_full_decoder() {
    let fields: String = (1..=70).map(|i| format!("int32 f{i} = {i}; ")).collect();
    let proto = format!("syntax = \"proto3\"; package w; message W {{ {fields}}}");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("w.proto"), &proto).expect("write schema");
    let policies = "policies:\n  - name: wide\n    topics: [wide]\n    \
         value: {format: protobuf, wire: raw, schema: w.proto, message: w.W}\n    \
         rules:\n      - field: /f70\n        min: 1\n      - field: /f2\n        max: 5\n";
    let set = PolicySet::parse(policies, &dir.path().join("w.yaml")).expect("loads");
    let p = &set.policies()[0];
    let pool = super::protobuf::load_file(&dir.path().join("w.proto"))
        .expect("compiles")
        .0;
    let write = |set: &[(&str, i32)]| {
        let mut m = DynamicMessage::new(pool.get_message_by_name("w.W").expect("W"));
        for (name, v) in set {
            m.set_field_by_name(name, P::I32(*v));
        }
        m.encode_to_vec()
    };
    let mut twice = write(&[("f70", 3), ("f2", 1)]);
    twice.extend(write(&[("f2", 9)]));
    let cases: [(Vec<u8>, bool); 5] = [
        (write(&[("f70", 3)]), true),
        (write(&[("f70", 3), ("f2", 6)]), false),
        (write(&[("f2", 1)]), false), // f70 absent: 0
        (write(&[("f70", 3), ("f40", 8)]), true),
        (twice, false), // the last f2 (9) wins
    ];
    for (bytes, valid) in &cases {
        assert!(p.inner.binary_fast_path_takes(bytes));
        let r = record(bytes, NOW);
        assert_eq!(p.inner.judge("", &r, NOW).is_ok(), *valid, "{bytes:?}");
        assert_eq!(p.inner.judge("", &r, NOW), p.inner.judge_reference(&r, NOW));
    }
}
