//! Shared by the judge_* targets: judge arbitrary value bytes under one
//! reference policy; decode, schema and rules must never panic, and an
//! invalid verdict must name its rule.

use std::sync::{Arc, OnceLock};

use antidote::kafka::record::{Header, Record};
use antidote::policy::{Policy, PolicySet, Verdict};

/// Judge `data` as a record value under `policies/<file>` (loaded once).
pub fn judge(cell: &'static OnceLock<Arc<Policy>>, file: &str, data: &[u8]) {
    let policy = cell.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies").join(file);
        PolicySet::load(&[path]).expect("reference policy").policies()[0].clone()
    });
    let record = Record {
        offset: 0,
        timestamp: 1_780_000_000_000,
        key: None,
        value: Some(data),
        headers: vec![Header { key: b"idempotency-key", value: Some(&b"k"[..]) }],
    };
    if let Verdict::Invalid(inv) = policy.judge(&record, 1_780_000_000_000) {
        assert!(!inv.rule.is_empty());
    }
}
