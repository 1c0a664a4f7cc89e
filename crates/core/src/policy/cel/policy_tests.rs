//! `- cel:` rules in policies: loaded (errors at the rule's place, with
//! the column within the expression), judged on JSON (captured and
//! decoded whole alike) and Avro records, with key, headers and
//! timestamp, named and classed like the other rules.

use std::path::Path;

use serde_json::json;

use crate::kafka::record::{Header, Record};
use crate::policy::{Class, Invalid, PolicySet, Verdict};

const NOW: i64 = 1_764_460_000_000;

fn record(value: &[u8]) -> Record<'_> {
    Record {
        offset: 7,
        timestamp: NOW,
        key: Some(b"dev-1"),
        value: Some(value),
        headers: vec![Header {
            key: b"idempotency-key",
            value: Some(b"k-1"),
        }],
    }
}

/// A JSON policy on topic `t` with `rules` (YAML list items), and `value`
/// keys after `format: json`.
fn policy(value: &str, rules: &str) -> PolicySet {
    let text = format!(
        "policies:\n  - name: p\n    topics: [t]\n    value: {{format: json{value}}}\n    rules:\n{rules}"
    );
    match PolicySet::parse(&text, Path::new("p.yaml")) {
        Ok(s) => s,
        Err(e) => panic!("{text}\n{e:#?}"),
    }
}

fn verdict(set: &PolicySet, v: &serde_json::Value) -> Verdict {
    let bytes = serde_json::to_vec(v).expect("json");
    let p = set.for_topic("t").expect("policy");
    let fast = p.judge(&record(&bytes), NOW);
    let full = p.inner.judge_reference(&record(&bytes), NOW);
    assert_eq!(
        fast,
        full.map_or_else(Verdict::Invalid, |()| Verdict::Valid),
        "{v}"
    );
    fast
}

#[track_caller]
fn invalid(v: Verdict) -> Invalid {
    match v {
        Verdict::Invalid(i) => i,
        Verdict::Valid => panic!("expected invalid"),
    }
}

const DWELL: &str = "      - cel: 'message.transition != \"DWELL\" || message.dwell_seconds > 0'\n        name: dwell-has-seconds\n      - cel: \"message.exit_time > message.enter_time\"\n";

fn trigger(transition: &str, dwell: i64, enter: i64, exit: i64) -> serde_json::Value {
    json!({"transition": transition, "dwell_seconds": dwell, "enter_time": enter, "exit_time": exit})
}

#[test]
fn conditions_judge_json_captured_and_decoded_alike() {
    // No schema: the fast path's captures. A schema with `pattern` (not
    // in the streaming subset): the decoded value.
    let schema = tempfile::tempdir().expect("dir");
    let file = schema.path().join("s.json");
    std::fs::write(&file, r#"{"type": "object", "properties": {"transition": {"type": "string", "pattern": "^[A-Z]+$"}}}"#)
        .expect("write");
    let with_schema = format!(", schema: \"{}\"", file.display());
    for set in [policy("", DWELL), policy(&with_schema, DWELL)] {
        assert_eq!(verdict(&set, &trigger("DWELL", 5, 1, 2)), Verdict::Valid);
        assert_eq!(verdict(&set, &trigger("ENTER", 0, 1, 2)), Verdict::Valid);
        let i = invalid(verdict(&set, &trigger("DWELL", 0, 1, 2)));
        assert_eq!(
            (i.class, i.rule.as_str()),
            (Class::Poison, "cel:dwell-has-seconds")
        );
        assert!(
            i.reason
                .contains("is false (message.transition = \"DWELL\", message.dwell_seconds = 0)"),
            "{i:?}"
        );
        let i = invalid(verdict(&set, &trigger("EXIT", 0, 5, 2)));
        assert_eq!(
            i.rule, "cel:message.exit_time > message.enter_time",
            "{i:?}"
        );
        let i = invalid(verdict(
            &set,
            &json!({"transition": "DWELL", "enter_time": 1, "exit_time": 2}),
        ));
        assert!(
            i.reason
                .contains("column 34: no such field message.dwell_seconds"),
            "{i:?}"
        );
    }
}

#[test]
fn field_rules_first_then_conditions_then_age() {
    let rules = format!(
        "      - field: /transition\n        one_of: [ENTER, DWELL]\n      - field: /exit_time\n        max_age: 1m\n{DWELL}"
    );
    let set = policy("", &rules);
    let old = NOW - 3_600_000;
    let i = invalid(verdict(&set, &trigger("EXIT", 0, 5, old)));
    assert_eq!(i.rule, "one_of:/transition");
    let i = invalid(verdict(&set, &trigger("DWELL", 0, 5, old)));
    assert_eq!(i.rule, "cel:dwell-has-seconds");
    let i = invalid(verdict(&set, &trigger("DWELL", 1, 5, old)));
    assert_eq!(
        (i.class, i.rule.as_str()),
        (Class::Stale, "max_age:/exit_time")
    );
    assert_eq!(verdict(&set, &trigger("DWELL", 1, 5, NOW)), Verdict::Valid);
}

#[test]
fn key_headers_timestamp_and_class() {
    let set = policy(
        "",
        "      - cel: 'headers[\"idempotency-key\"] == b\"k-1\" && key == b\"dev-1\" && timestamp > message.t'\n        class: redact\n",
    );
    assert_eq!(verdict(&set, &json!({"t": NOW - 1})), Verdict::Valid);
    let i = invalid(verdict(&set, &json!({"t": NOW + 1})));
    assert_eq!(i.class, Class::Redact);
    assert!(i.reason.contains("message.t = "), "{i:?}");
}

#[test]
fn conditions_read_avro_records() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/schemas/trigger.avsc");
    let text = format!(
        "policies:\n  - name: a\n    topics: [t]\n    value: {{format: avro, wire: raw, schema: \"{}\"}}\n    rules:\n      - cel: 'message.transition != \"EXIT\" || message.speed_mps > 1.0'\n",
        dir.display()
    );
    let set = PolicySet::parse(&text, Path::new("p.yaml")).expect("loads");
    let p = set.for_topic("t").expect("policy");
    let schema = apache_avro::Schema::parse_str(&std::fs::read_to_string(&dir).expect("avsc"))
        .expect("avsc");
    let datum = |transition: &str, idx: u32, speed: f64| {
        use apache_avro::types::Value as A;
        let v = A::Record(vec![
            ("device_id".into(), A::String("dev-1".into())),
            ("geofence_id".into(), A::String("fence-42".into())),
            ("lat".into(), A::Double(52.0)),
            ("lon".into(), A::Double(4.0)),
            ("transition".into(), A::Enum(idx, transition.into())),
            ("speed_mps".into(), A::Union(1, Box::new(A::Double(speed)))),
            ("event_time_ms".into(), A::Long(NOW)),
            ("accuracy_m".into(), A::Union(0, Box::new(A::Null))),
        ]);
        apache_avro::to_avro_datum(&schema, v).expect("encode")
    };
    assert!(p.judge(&record(&datum("EXIT", 1, 3.0)), NOW).is_valid());
    assert!(p.judge(&record(&datum("ENTER", 0, 0.0)), NOW).is_valid());
    let bad = datum("EXIT", 1, 0.5);
    let i = invalid(p.judge(&record(&bad), NOW));
    assert!(i.reason.contains("message.speed_mps = 0.5"), "{i:?}");
    assert_eq!(p.inner.judge_reference(&record(&bad), NOW), Err(i));
}

/// Write `text` as `p.yaml` and load it: every error, as displayed.
fn errors(text: &str) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("p.yaml"), text).expect("write");
    match PolicySet::load(&[dir.path().to_path_buf()]) {
        Ok(_) => panic!("loaded:\n{text}"),
        Err(e) => {
            let errs = e.iter().map(ToString::to_string).collect();
            (dir, errs)
        }
    }
}

#[test]
fn load_errors_name_the_rule_and_the_column_in_the_expression() {
    let head = "policies:\n  - name: p\n    topics: [t]\n    value: {format: json}\n    rules:\n";
    let cases = [
        (
            "      - cel: 'message.a > 1 && message.b.exists(x, x > 1)'\n",
            "6:14",
            "cel: column 28: `exists`: comprehension macros",
        ),
        (
            "      - field: /a\n        min: 0\n      - cel: \"'a' < 1\"\n",
            "8:14",
            "cel: column 5: no overload of `<` for string and int",
        ),
        (
            "      - cel: 'frob(message.a)'\n        name: x\n",
            "6:14",
            "cel: column 1: unknown function `frob`",
        ),
        (
            "      - cel: 'foo.a == 1'\n",
            "6:14",
            "undeclared reference to `foo`",
        ),
        (
            "      - cel: 'headers == 1'\n",
            "6:14",
            "`headers` is read by name only",
        ),
        (
            "      - cel: 'message.a == 1'\n        field: /a\n",
            "6:9",
            "a `cel` rule takes `name` and `class` only",
        ),
        (
            "      - field: /a\n        min: 0\n        name: x\n",
            "8:15",
            "name: only a `cel` rule takes a name",
        ),
    ];
    for (rules, pos, has) in cases {
        let (dir, errs) = errors(&format!("{head}{rules}"));
        let want = format!("{}:{pos}: ", dir.path().join("p.yaml").display());
        assert!(
            errs.iter().any(|e| e.starts_with(&want) && e.contains(has)),
            "wanted {want}...{has}, got {errs:#?}"
        );
    }
}

/// Two fields ordered are judged straight from the fields when both are
/// numbers (`CelRule::holds`); the evaluator answers every other pair.
/// Both agree with the evaluator's own answer (the same comparison under
/// `== true`, which the shortcut does not take) on every pair of edge
/// values, missing ones included, for each ordering.
#[test]
fn two_fields_shortcut_agrees_with_the_evaluator() {
    let mut values = crate::policy::rules_testutil::edge_values();
    values.extend([
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(9.223372036854776e18),
    ]);
    let mut seen = [0usize; 2];
    for op in ["<", "<=", ">", ">="] {
        let short = policy("", &format!("      - cel: 'message.x {op} message.y'\n"));
        let long = policy(
            "",
            &format!("      - cel: '(message.x {op} message.y) == true'\n"),
        );
        for x in values.iter().map(Some).chain([None]) {
            for y in values.iter().map(Some).chain([None]) {
                let mut doc = serde_json::Map::new();
                doc.extend(x.map(|v| ("x".to_string(), v.clone())));
                doc.extend(y.map(|v| ("y".to_string(), v.clone())));
                let doc = serde_json::Value::Object(doc);
                let (a, b) = (
                    verdict(&short, &doc).is_valid(),
                    verdict(&long, &doc).is_valid(),
                );
                assert_eq!(a, b, "{op} on {doc}");
                seen[usize::from(a)] += 1;
            }
        }
    }
    assert!(seen[0] > 500 && seen[1] > 500, "{seen:?}");
}
