//! Judge arbitrary value bytes under the reference avro policy
//! (`policies/geofence-avro.yaml`): decode, schema and rules must never panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use antidote::kafka::record::{Header, Record};
use antidote::policy::{Policy, PolicySet, Verdict};
use libfuzzer_sys::fuzz_target;

fn policy() -> &'static Arc<Policy> {
    static P: OnceLock<Arc<Policy>> = OnceLock::new();
    P.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/geofence-avro.yaml");
        PolicySet::load(&[path]).expect("reference policy").policies()[0].clone()
    })
}

fuzz_target!(|data: &[u8]| {
    let record = Record {
        offset: 0,
        timestamp: 1_780_000_000_000,
        key: None,
        value: Some(data),
        headers: vec![Header { key: b"idempotency-key", value: Some(&b"k"[..]) }],
    };
    if let Verdict::Invalid(inv) = policy().judge(&record, 1_780_000_000_000) {
        assert!(!inv.rule.is_empty());
    }
});
