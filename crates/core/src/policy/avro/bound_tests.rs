//! Bounded Avro decoding: hostile block counts of zero-byte items are
//! refused (poison, rule `limits`) with bounded memory, valid records with
//! arrays and maps still decode, and the walk reads datums exactly as
//! apache-avro does.

use std::path::Path;
use std::time::{Duration, Instant};

use apache_avro::types::Value as A;
use apache_avro::Schema;
use proptest::prelude::*;

use super::super::{decode_datum, decode_datum_with, limit_allocations};
use super::*;
use crate::policy::byte_edits::{apply, edit, record};
use crate::policy::{Class, PolicySet, Verdict};

const NOW: i64 = 1_764_460_000_000;

use super::counting;

/// The zigzag varint of `n`, as Avro writes longs and block counts.
fn zz(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return out;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

const HOSTILE_SCHEMA: &str = r#"{"type": "record", "name": "H", "namespace": "h", "fields": [
    {"name": "id", "type": "string"},
    {"name": "a", "type": {"type": "array", "items": "null"}},
    {"name": "m", "type": {"type": "map", "values": "null"}}]}"#;

fn hostile_schema() -> Schema {
    Schema::parse_str(HOSTILE_SCHEMA).expect("schema")
}

const FIFTY_M: i64 = 50_000_000;

/// `id` of 53 characters, then `a` and `m` as given: 60 bytes for the
/// hostile values.
fn with_id(rest: &[&[u8]]) -> Vec<u8> {
    let mut d = zz(53);
    d.extend_from_slice(&[b'x'; 53]);
    for r in rest {
        d.extend_from_slice(r);
    }
    d
}

/// 60 bytes: an array block of 50 M nulls.
fn hostile_array() -> Vec<u8> {
    with_id(&[&zz(FIFTY_M), &[0], &[0]])
}

/// 60 bytes: a map block of 50 M entries (one written: key "", null).
fn hostile_map() -> Vec<u8> {
    with_id(&[&[0], &zz(FIFTY_M), &[0]])
}

fn limits(r: Result<serde_json::Value, Invalid>) -> Invalid {
    let e = r.expect_err("refused");
    assert_eq!(
        (e.class, e.rule.as_str()),
        (Class::Poison, "limits"),
        "{e:?}"
    );
    e
}

#[test]
fn a_60_byte_value_declaring_50m_nulls_is_poison_limits_in_bounded_memory() {
    let schema = hostile_schema();
    for datum in [hostile_array(), hostile_map()] {
        assert_eq!(datum.len(), 60);
        let started = Instant::now();
        let (r, peak) = counting::peak_during(|| decode_datum(&schema, None, &datum));
        let e = limits(r);
        assert!(
            e.reason.contains("over the 4156 its 60 bytes allow"),
            "{e:?}"
        );
        assert!(peak < 16 << 10, "peak {peak} bytes judging 60 bytes");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}

/// A raw Avro policy on [`HOSTILE_SCHEMA`] with a rule on `/id` (so the
/// fast path is compiled), for topic `h`.
fn hostile_policy() -> PolicySet {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("h.avsc"), HOSTILE_SCHEMA).expect("write");
    let text = format!(
        "policies:\n  - name: h\n    topics: [h]\n    value: {{format: avro, wire: raw, \
         schema: \"{}\"}}\n    rules:\n      - field: /id\n        one_of: [ok]\n",
        dir.path().join("h.avsc").display()
    );
    PolicySet::parse(&text, Path::new("p.yaml")).expect("loads")
}

fn judged_limits(v: Verdict) {
    match v {
        Verdict::Invalid(i) => {
            assert_eq!(
                (i.class, i.rule.as_str()),
                (Class::Poison, "limits"),
                "{i:?}"
            )
        }
        v => panic!("{v:?}"),
    }
}

#[test]
fn hostile_values_are_judged_poison_limits_through_a_policy() {
    let set = hostile_policy();
    let p = set.for_topic("h").expect("policy");
    for datum in [hostile_array(), hostile_map()] {
        let (v, peak) = counting::peak_during(|| p.judge(&record(&datum, NOW), NOW));
        judged_limits(v);
        assert!(peak < 64 << 10, "peak {peak} bytes");
    }
}

#[test]
fn every_zero_byte_item_type_is_charged_by_the_values_it_builds() {
    let schema = Schema::parse_str(
        r#"{"type": "record", "name": "Z", "fields": [
            {"name": "e", "type": {"type": "array", "items": {"type": "record", "name": "E", "fields": []}}},
            {"name": "f", "type": {"type": "array", "items": {"type": "fixed", "name": "F", "size": 0}}},
            {"name": "p", "type": {"type": "array", "items": {"type": "record", "name": "P", "fields": [
                {"name": "x", "type": "null"}, {"name": "y", "type": "E"}]}}}]}"#,
    )
    .expect("schema");
    let block = |field: usize, n: i64| {
        let mut d = Vec::new();
        for i in 0..3 {
            if i == field {
                d.extend(zz(n));
            }
            d.push(0);
        }
        d
    };
    for field in 0..3 {
        let (r, peak) =
            counting::peak_during(|| decode_datum(&schema, None, &block(field, FIFTY_M)));
        limits(r);
        assert!(peak < 16 << 10, "peak {peak} bytes");
    }
    // A pair of a null and an empty record builds 3 values: 4096 / 3 items
    // fit beside the datum's 6 bytes, one more does not.
    let fits = (4096 + 6) / 3;
    assert!(decode_datum(&schema, None, &block(2, fits)).is_ok());
    limits(decode_datum(&schema, None, &block(2, fits + 1)));
}

#[test]
fn zero_byte_items_decode_up_to_the_bound_and_one_more_is_refused() {
    let schema = hostile_schema();
    // `id` "", a block of n nulls (2 bytes for n < 8192), two terminators:
    // 5 bytes, so the bound is 5 + 4096 items.
    let datum = |n: i64| [&[0u8][..], &zz(n), &[0, 0]].concat();
    assert_eq!(datum(4101).len(), 5);
    let v = decode_datum(&schema, None, &datum(4101)).expect("at the bound");
    assert_eq!(v["a"].as_array().map(Vec::len), Some(4101));
    let e = limits(decode_datum(&schema, None, &datum(4102)));
    assert!(e.reason.contains("4102 or more"), "{e:?}");
}

#[test]
fn named_zero_byte_items_from_registry_references_are_charged() {
    let empty =
        Schema::parse_str(r#"{"type": "record", "name": "Empty", "namespace": "n", "fields": []}"#)
            .expect("schema");
    let writer = r#"{"type": "record", "name": "W", "namespace": "n", "fields": [
        {"name": "e", "type": {"type": "array", "items": "Empty"}}]}"#;
    let (writer, named) =
        Schema::parse_str_with_list(writer, [empty.canonical_form().as_str()]).expect("schema");
    assert!(has_ref(&writer, 0), "the items are a named reference");
    let mut datum = zz(FIFTY_M);
    datum.push(0);
    let (r, peak) = counting::peak_during(|| decode_datum_with(&writer, &named, None, &datum));
    limits(r);
    assert!(peak < 64 << 10, "peak {peak} bytes");
    let ok = [&zz(3)[..], &[0]].concat();
    let v = decode_datum_with(&writer, &named, None, &ok).expect("three empty records");
    assert_eq!(v["e"], serde_json::json!([{}, {}, {}]));
}

/// `id` "ok", `blocks` blocks of 100 nulls, then a map of `entries`
/// entries (key "", null): every block has more than 100 bytes left when
/// `entries` is large enough, so only the total charge stops the fast path.
fn blocks_of_nulls(blocks: usize, entries: usize) -> Vec<u8> {
    let mut d = vec![zz(2)[0], b'o', b'k'];
    for _ in 0..blocks {
        d.extend(zz(100));
    }
    d.push(0);
    d.extend(zz(entries as i64));
    d.extend(std::iter::repeat_n(0u8, entries));
    d.push(0);
    d
}

#[test]
fn blocks_each_within_the_bytes_left_are_charged_in_total_on_both_paths() {
    let set = hostile_policy();
    let p = set.for_topic("h").expect("policy");
    // 60 blocks: 6000 items in 327 bytes, over 327 + 4096.
    let over = blocks_of_nulls(60, 200);
    assert_eq!(over.len(), 327);
    limits(decode_datum(&hostile_schema(), None, &over));
    assert!(!p.inner.binary_fast_path_takes(&over), "fast path gives up");
    judged_limits(p.judge(&record(&over, NOW), NOW));
    // 10 blocks: 1000 items plus 200 entries, within: valid, fast.
    let within = blocks_of_nulls(10, 200);
    assert!(p.inner.binary_fast_path_takes(&within));
    assert!(p.judge(&record(&within, NOW), NOW).is_valid());
    assert!(p.inner.binary_captures_agree(&within).expect("agree"));
}

#[test]
fn valid_records_with_arrays_and_maps_still_decode() {
    let schema = Schema::parse_str(
        r#"{"type": "record", "name": "V", "fields": [
            {"name": "ints", "type": {"type": "array", "items": "int"}},
            {"name": "names", "type": {"type": "map", "values": "string"}},
            {"name": "nulls", "type": {"type": "array", "items": "null"}},
            {"name": "grid", "type": {"type": "array", "items": {"type": "array", "items": "long"}}},
            {"name": "flags", "type": {"type": "map", "values": "null"}}]}"#,
    )
    .expect("schema");
    let v = A::Record(vec![
        ("ints".into(), A::Array((0..20_000).map(A::Int).collect())),
        (
            "names".into(),
            A::Map(
                (0..500)
                    .map(|i| (format!("k{i}"), A::String("v".into())))
                    .collect(),
            ),
        ),
        ("nulls".into(), A::Array(vec![A::Null; 1000])),
        (
            "grid".into(),
            A::Array(
                (0..50)
                    .map(|_| A::Array((0..50).map(A::Long).collect()))
                    .collect(),
            ),
        ),
        (
            "flags".into(),
            A::Map((0..300).map(|i| (format!("f{i}"), A::Null)).collect()),
        ),
    ]);
    let datum = apache_avro::to_avro_datum(&schema, v).expect("encodes");
    let json = decode_datum(&schema, None, &datum).expect("valid");
    assert_eq!(json["ints"].as_array().map(Vec::len), Some(20_000));
    assert_eq!(json["nulls"].as_array().map(Vec::len), Some(1000));
    assert_eq!(json["flags"].as_object().map(|m| m.len()), Some(300));
    assert_eq!(walk_end(&schema, &[], &datum), Ok(datum.len()));
}

/// Every kind of schema apache-avro decodes that the walk reads without
/// checking contents (no uuid, no big-decimal), named references included.
const EVERY_KIND: &str = r#"{"type": "record", "name": "R", "namespace": "r", "fields": [
    {"name": "b", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "s", "type": "string"},
    {"name": "by", "type": "bytes"},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    {"name": "fx", "type": {"type": "fixed", "name": "F3", "size": 3}},
    {"name": "z", "type": {"type": "fixed", "name": "Z", "size": 0}},
    {"name": "dt", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "du", "type": {"type": "fixed", "name": "Du", "size": 12, "logicalType": "duration"}},
    {"name": "u", "type": ["null", "string", "E"]},
    {"name": "nulls", "type": {"type": "array", "items": "null"}},
    {"name": "empties", "type": {"type": "array", "items": {"type": "record", "name": "Empty", "fields": []}}},
    {"name": "again", "type": {"type": "array", "items": "Empty"}},
    {"name": "zs", "type": {"type": "array", "items": "Z"}},
    {"name": "ints", "type": {"type": "array", "items": "int"}},
    {"name": "nested", "type": {"type": "array", "items": {"type": "map", "values": ["null", "F3"]}}},
    {"name": "mn", "type": {"type": "map", "values": "null"}},
    {"name": "last", "type": "string"},
    {"name": "tail", "type": ["null", "boolean"]},
    {"name": "flag", "type": "boolean"}]}"#;

fn every_kind() -> &'static Schema {
    static S: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    S.get_or_init(|| Schema::parse_str(EVERY_KIND).expect("schema"))
}

/// A datum of [`EVERY_KIND`] as apache-avro writes it.
fn every_kind_datum(n: usize, text: &str) -> Vec<u8> {
    let v = A::Record(vec![
        ("b".into(), A::Boolean(true)),
        ("i".into(), A::Int(-3)),
        ("l".into(), A::Long(1 << 40)),
        ("f".into(), A::Float(1.5)),
        ("d".into(), A::Double(-2.25)),
        ("s".into(), A::String(text.into())),
        ("by".into(), A::Bytes(vec![1, 2, 3])),
        ("e".into(), A::Enum(1, "B".into())),
        ("fx".into(), A::Fixed(3, vec![7, 8, 9])),
        ("z".into(), A::Fixed(0, vec![])),
        ("dt".into(), A::Date(19_000)),
        ("ts".into(), A::TimestampMillis(NOW)),
        (
            "dec".into(),
            A::Decimal(apache_avro::Decimal::from(vec![1u8, 0])),
        ),
        ("du".into(), A::Fixed(12, vec![1; 12])),
        ("u".into(), A::Union(1, Box::new(A::String("u".into())))),
        ("nulls".into(), A::Array(vec![A::Null; n])),
        ("empties".into(), A::Array(vec![A::Record(vec![]); n])),
        ("again".into(), A::Array(vec![A::Record(vec![]); n])),
        ("zs".into(), A::Array(vec![A::Fixed(0, vec![]); n])),
        ("ints".into(), A::Array((0..n as i32).map(A::Int).collect())),
        (
            "nested".into(),
            A::Array(vec![A::Map(
                [(
                    "k".to_string(),
                    A::Union(1, Box::new(A::Fixed(3, vec![1, 2, 3]))),
                )]
                .into(),
            )]),
        ),
        ("mn".into(), A::Map([("x".to_string(), A::Null)].into())),
        ("last".into(), A::String(text.into())),
        ("tail".into(), A::Union(1, Box::new(A::Boolean(false)))),
        ("flag".into(), A::Boolean(true)),
    ]);
    apache_avro::to_avro_datum(every_kind(), v).expect("encodes")
}

/// Nested blocks of zero-byte and one-byte items, and the values
/// apache-avro reads as null at the end of the input, in few bytes.
const SMALL: &str = r#"{"type": "record", "name": "S", "fields": [
    {"name": "a", "type": {"type": "array", "items": ["null", "boolean",
        {"type": "map", "values": {"type": "fixed", "name": "Z", "size": 0}}]}},
    {"name": "n", "type": {"type": "array", "items": {"type": "record", "name": "P", "fields": [
        {"name": "z", "type": "Z"}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}}]}}},
    {"name": "s", "type": "string"},
    {"name": "u", "type": ["null", "E"]},
    {"name": "b", "type": "boolean"}]}"#;

fn small() -> &'static Schema {
    static S: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    S.get_or_init(|| Schema::parse_str(SMALL).expect("schema"))
}

/// Where apache-avro's decoder stops in `datum`: `Some(bytes read)` when
/// it decodes a value.
fn apache_end(schema: &Schema, datum: &[u8]) -> Option<usize> {
    let mut rest = datum;
    apache_avro::from_avro_datum(schema, &mut rest, None).ok()?;
    Some(datum.len() - rest.len())
}

/// The walk ends where apache-avro does, and fails where it fails (unless
/// it refuses over the bound first, when apache-avro is not run).
fn walks_like_apache(schema: &Schema, datum: &[u8]) -> Result<(), TestCaseError> {
    limit_allocations();
    match walk_end(schema, &[], datum) {
        Err(Some(_)) => Ok(()),
        Err(None) => {
            prop_assert_eq!(apache_end(schema, datum), None);
            Ok(())
        }
        Ok(end) => {
            prop_assert_eq!(apache_end(schema, datum), Some(end));
            Ok(())
        }
    }
}

#[test]
fn the_walk_reads_written_datums_to_their_end() {
    for n in [0, 1, 7, 300] {
        let d = every_kind_datum(n, "text");
        assert_eq!(walk_end(every_kind(), &[], &d), Ok(d.len()));
        assert_eq!(apache_end(every_kind(), &d), Some(d.len()));
        // Cut inside `last`: apache-avro reads it, `tail` and `flag` as
        // nulls, and so does the walk.
        let cut = &d[..d.len() - 3];
        assert_eq!(walk_end(every_kind(), &[], cut), Ok(cut.len()));
        assert_eq!(apache_end(every_kind(), cut), Some(cut.len()));
    }
}

#[test]
fn the_walk_reads_hand_written_datums_as_apache_avro_does() {
    let cases: [&[u8]; 10] = [
        &[0, 0, 0, 2, 4, 1],                // enum C, flag true
        &[0, 0, 0, 2, 6, 1],                // enum index 3 of 3
        &[0, 0, 0, 2, 4, 2],                // a boolean of 2
        &[0, 0, 0, 2, 4],                   // flag cut off: null
        &[0, 0, 0, 2],                      // enum cut off
        &[0, 0, 0],                         // union cut off: null
        &[0, 0, 8, b'a'],                   // string cut off: null
        &[0, 0, 4, 0xc3, 0x28, 0, 1],       // not UTF-8
        &[1, 2, 0, 0, 0, 0, 0, 0],          // a block of -1 with its size
        &[6, 2, 4, 0, 2, 0, 0, 0, 0, 0, 0], // null, boolean, empty map
    ];
    for d in cases {
        walks_like_apache(small(), d).unwrap_or_else(|e| panic!("{d:?}: {e}"));
    }
}

fn small_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![4 => 0u8..8, 1 => any::<u8>(), 1 => Just(0x80u8)],
        0..64,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_walk_reads_edited_datums_as_apache_avro_does(
        n in 0usize..5,
        text in "[a-zé]{0,3}",
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        walks_like_apache(every_kind(), &apply(every_kind_datum(n, &text), &edits))?;
    }

    #[test]
    fn the_walk_reads_arbitrary_bytes_as_apache_avro_does(d in small_bytes()) {
        walks_like_apache(every_kind(), &d)?;
        walks_like_apache(small(), &d)?;
    }
}

/// Peak RSS (VmHWM, KiB) of this process so far.
fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    (status.lines())
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// Before: the hostile values given to apache-avro alone, as the full
/// decoder did. Run alone: `cargo test -p antidote-core --lib -- --ignored
/// --exact policy::avro::bound::tests::peak_rss_hostile_values_apache_avro_alone --nocapture`.
#[test]
#[ignore = "measures this process's peak RSS: run alone"]
fn peak_rss_hostile_values_apache_avro_alone() {
    limit_allocations();
    let schema = hostile_schema();
    let before = vm_hwm_kib();
    for datum in [hostile_array(), hostile_map()] {
        let mut rest = &datum[..];
        let r = apache_avro::from_avro_datum(&schema, &mut rest, None);
        println!(
            "apache-avro alone: {} bytes -> ok: {}",
            datum.len(),
            r.is_ok()
        );
    }
    println!("VmHWM before {before} KiB, after {} KiB", vm_hwm_kib());
}

/// After: the same values decoded as the full decoder does now.
#[test]
#[ignore = "measures this process's peak RSS: run alone"]
fn peak_rss_hostile_values_decoded() {
    let schema = hostile_schema();
    let before = vm_hwm_kib();
    for datum in [hostile_array(), hostile_map()] {
        let r = decode_datum(&schema, None, &datum);
        println!("decode_datum: {} bytes -> {:?}", datum.len(), r.map(drop));
    }
    println!("VmHWM before {before} KiB, after {} KiB", vm_hwm_kib());
}
