//! `PolicySet::parse` on arbitrary text, as if it were a file in
//! `policies/` (so the reference schemas resolve). Never panics: every input
//! either loads or yields errors that carry a file, a line and a column.
#![no_main]

use antidote::policy::PolicySet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Policy files are trusted config that may name schema files anywhere;
    // keep the fuzzer off device files (/dev/zero would be read forever).
    if text.contains("/dev") || text.contains("/proc") || text.contains("/sys") {
        return;
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/fuzz-input.yaml");
    match PolicySet::parse(text, &path) {
        Ok(set) => {
            for p in set.policies() {
                let _ = set.for_topic(&p.topics.first().cloned().unwrap_or_default());
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "Err with no errors");
            for e in errors {
                assert!(e.line >= 1 && e.column >= 1, "{e}");
            }
        }
    }
});
