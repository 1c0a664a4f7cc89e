//! `transient` verdicts in the planner (schema registry not answered yet):
//! planned as diversions whatever `on_invalid` says (so the Fetch filter
//! sees their offsets and holds there), and never kept in the verdict cache.

use std::path::Path;

use super::verdicts::VerdictCache;
use super::*;
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::policy::formats::compile_schema as compile;
use crate::policy::{Class, PolicySet, SchemaCache};

fn policy(cache: &Arc<SchemaCache>, action: &str) -> Arc<Policy> {
    let text = format!(
        "policies:\n  - name: p\n    topics: [t]\n    value: {{ format: avro, wire: confluent, registry: true }}\n    on_invalid: {action}\n"
    );
    let set = PolicySet::parse_with(&text, Path::new("p.yaml"), cache).expect("policy");
    set.for_topic("t").expect("t").clone()
}

/// Two records framed with schema id 7 (an Avro string "ab").
fn records() -> Bytes {
    let value: Bytes = vec![0, 0, 0, 0, 7, 0x04, b'a', b'b'].into();
    let recs: Vec<NewRecord> = (0..2)
        .map(|i| NewRecord {
            timestamp: 1_000 + i,
            key: None,
            value: Some(value.clone()),
            headers: vec![],
        })
        .collect();
    build_batch(&recs, &BuildOptions::default()).expect("batch")
}

#[test]
fn a_transient_batch_is_judged_again_once_the_schema_is_cached() {
    for action in ["divert", "drop", "pass"] {
        let cache = SchemaCache::new();
        let p = policy(&cache, action);
        let (topic, vis) = (Arc::<str>::from("t"), Visibility::new(false, None));
        let records = records();
        let input = PartitionInput {
            policy: &p,
            topic: &topic,
            partition: 0,
            records: &records,
            visibility: &vis,
            now_ms: 0,
            deadline: None,
        };
        let verdicts = VerdictCache::new(100);
        let plan = plan_partition(&input, &verdicts);
        let classes: Vec<_> = plan.diversions.iter().map(|d| d.invalid.class).collect();
        assert_eq!(classes, vec![Class::Transient; 2], "{action}");
        assert!(
            plan.settled.is_empty(),
            "{action}: transient is never dropped or passed"
        );
        cache.put_schema(7, compile(None, r#""string""#, &[]));
        let plan = plan_partition(&input, &verdicts);
        assert!(
            plan.diversions.is_empty() && !plan.changes_anything(),
            "{action}: judged again"
        );
    }
}
