//! Shared by the judge_* targets: judge arbitrary value bytes under one
//! reference policy; decode, schema and rules must never panic, an
//! invalid verdict must name its rule, and a JSON policy's fast readers
//! must agree with serde_json on every value (`Policy::fast_paths_agree`).

use std::sync::{Arc, OnceLock};

use antidote::kafka::record::{Header, Record};
use antidote::policy::{Policy, PolicySet, Verdict};

/// Judge `data` as a record value under `policies/<file>` (loaded once,
/// then `warm` judged first: a JSON policy learns its layout, and so its
/// template, from the first record it reads in full, which should be a
/// reference record, whatever order the fuzzer runs its corpus in).
pub fn judge(cell: &'static OnceLock<Arc<Policy>>, file: &str, warm: &[u8], data: &[u8]) {
    let policy = cell.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies").join(file);
        let policy = PolicySet::load(&[path]).expect("reference policy").policies()[0].clone();
        if !warm.is_empty() {
            judge_with(&policy, warm);
        }
        policy
    });
    judge_with(policy, data);
}

fn judge_with(policy: &Policy, data: &[u8]) {
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
    if let Err(e) = policy.fast_paths_agree(data) {
        panic!("fast paths disagree: {e}");
    }
}
