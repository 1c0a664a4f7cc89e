//! The door with a registry-backed policy: a missing schema waits, a batch
//! refused only for earlier registry answers names the ids to ask again.

use std::path::Path;
use std::sync::Arc;

use crate::policy::formats::compile_schema as compile;
use crate::policy::{Class, PolicySet, SchemaCache, Want};

const NOW: i64 = 1_764_460_000_000;

const TRIGGER_AVSC: &str = r#"{"type":"record","name":"Trigger","namespace":"geo","fields":[
  {"name":"lat","type":"double"},{"name":"lon","type":"double"},
  {"name":"ssn","type":["null","string"],"default":null}]}"#;

fn set(cache: &Arc<SchemaCache>) -> PolicySet {
    let yaml = r#"
policies:
  - name: reg
    topics: ["geo.avro"]
    value: { format: avro, wire: confluent, registry: true, subject: "{topic}-value" }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
    on_produce: reject
"#;
    PolicySet::parse_with(yaml, Path::new("/tmp/door-registry.yaml"), cache).expect("policy")
}

fn framed(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn avro_datum(lat: f64, _ssn: Option<&str>) -> Vec<u8> {
    use apache_avro::types::Value as A;
    let schema = apache_avro::Schema::parse_str(TRIGGER_AVSC).expect("schema");
    let v = A::Record(vec![
        ("lat".into(), A::Double(lat)),
        ("lon".into(), A::Double(4.0)),
        ("ssn".into(), A::Union(0, Box::new(A::Null))),
    ]);
    apache_avro::to_avro_datum(&schema, v).expect("encodes")
}

/// The door's verdicts under a registry policy: a missing schema waits, a
/// batch refused only for earlier registry answers names the ids to ask
/// again, and a definite poison record refuses the batch whatever else.
#[test]
fn the_door_waits_for_the_registry_and_names_ids_to_ask_again() {
    use crate::kafka::compression::Compression;
    use crate::kafka::testutil::{RawBatch, RawRecord};
    use crate::plan::budget::DecodeBudget;
    use crate::plan::produce::{judge_produce, DoorVerdict};
    let cache = SchemaCache::new();
    let s = set(&cache);
    let p = s.for_topic("geo.avro").expect("policy");
    let section = |values: Vec<Vec<u8>>| {
        let mut b = RawBatch::compacted_five(Compression::None, 0);
        b.records = values
            .into_iter()
            .enumerate()
            .map(|(i, v)| RawRecord {
                value: Some(v),
                ..RawRecord::simple(i as i32, "")
            })
            .collect();
        b.last_offset_delta = None;
        b.encode()
    };
    let judge = |b: &bytes::Bytes| judge_produce(p, "geo.avro", b, &DecodeBudget::unlimited(), NOW);
    let good = framed(5, &avro_datum(1.0, None));
    let batch = section(vec![good.clone(), framed(7, &avro_datum(2.0, None))]);
    // Nothing cached: wait, and one round of wants covers both ids.
    assert!(matches!(
        judge(&batch),
        DoorVerdict::Wait { records: 2, .. }
    ));
    let mut wants = cache.take_wants();
    wants.sort();
    assert_eq!(
        wants,
        vec![
            Want::Schema(5),
            Want::Schema(7),
            Want::Subjects(5),
            Want::Subjects(7)
        ]
    );
    // Id 5 is fine; id 7 is not in the registry: refused, and 7 named.
    cache.put_schema(5, compile(None, TRIGGER_AVSC, &[]));
    cache.put_subjects(5, vec!["geo.avro-value".into()], NOW);
    cache.put_not_found(7, NOW);
    cache.put_subjects(7, vec![], NOW);
    let DoorVerdict::Reject(r) = judge(&batch) else {
        panic!("expected a rejection");
    };
    assert_eq!(r.recheck, vec![7]);
    assert_eq!(r.tally[0].0, Class::Unknown);
    // Asked again past the negative cache, only once the answer is old enough.
    assert!(!cache.recheck(7, NOW + 500, 1_000));
    assert!(cache.recheck(7, NOW + 1_000, 1_000));
    let mut wants = cache.take_wants();
    wants.sort();
    assert_eq!(wants, vec![Want::Schema(7), Want::Subjects(7)]);
    // A record that is poison for its own sake: refused, nothing to recheck.
    cache.put_not_found(7, NOW);
    let far = framed(5, &avro_datum(95.0, None));
    let DoorVerdict::Reject(r) = judge(&section(vec![far, framed(7, &[])])) else {
        panic!("expected a rejection");
    };
    assert!(r.recheck.is_empty(), "{:?}", r.recheck);
    // Poison wins over waiting: the batch is refused either way.
    let DoorVerdict::Reject(_) = judge(&section(vec![
        framed(5, &avro_datum(95.0, None)),
        framed(8, &avro_datum(1.0, None)),
    ])) else {
        panic!("expected a rejection");
    };
    // Known and valid: accepted.
    assert_eq!(
        judge(&section(vec![good])),
        DoorVerdict::Accept { records: 1 }
    );
}
