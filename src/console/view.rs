//! What the console shows of a DLT record and of a replay outcome, as
//! JSON: the contents (key, value, header values, reasons, the decoded
//! value) only when `logging.record_contents` allows them and never for a
//! `redact` record; a value too large to show is cut, with its size.
//!
//! Everything here is attacker-controlled text (any producer wrote it):
//! it leaves as JSON strings, control characters escaped as `dlt inspect`
//! escapes them, and the page only ever sets it as text, never as markup.

use serde_json::{json, Value};

use crate::service::replay::Outcome;
use crate::service::DltRecord;

/// Characters of a key, value or decoded value shown at most.
pub const MAX_SHOWN: usize = 8 * 1024;

/// Why contents are not shown, if they are not.
pub fn withheld(r: &DltRecord, contents: bool) -> Option<&'static str> {
    if r.redacted || r.class == crate::policy::Class::Redact.as_str() {
        Some("class redact: contents never shown")
    } else if !contents {
        Some("withheld: logging.record_contents is off")
    } else {
        None
    }
}

/// `s` cut to [`MAX_SHOWN`] characters: (text, whether it was cut).
fn cut(s: &str) -> (String, bool) {
    match s.char_indices().nth(MAX_SHOWN) {
        Some((i, _)) => (format!("{}…", &s[..i]), true),
        None => (s.to_string(), false),
    }
}

/// One DLT record for the browser: `dlt inspect --json`'s shape, plus
/// `key_size`/`value_size` (bytes), `*_cut` when a text was cut, and
/// `withheld` naming why contents are missing. `decoded` is what
/// `dlt inspect --decode` adds (`{"value": ...}` or `{"error": ...}`).
pub fn record(r: &DltRecord, decoded: Option<Value>, contents: bool) -> Value {
    let mut j = crate::service::browse::record_json(r);
    j["key_size"] = json!(r.key.as_ref().map(|k| k.len()));
    j["value_size"] = json!(r.value.as_ref().map(|v| v.len()));
    if let Some(why) = withheld(r, contents) {
        for f in ["key", "value", "reason"] {
            j[f] = Value::Null;
        }
        if let Some(hs) = j["headers"].as_array_mut() {
            hs.iter_mut().for_each(|h| h["value"] = Value::Null);
        }
        if let Some(a) = j["redrive_attempts"].as_array_mut() {
            a.iter_mut().for_each(|x| x["reason"] = Value::Null);
        }
        // A data-contract rule's exception is the reason (it quotes fields).
        if let Some(c) = j["contract_rule"].as_object_mut() {
            c.insert("exception".into(), Value::Null);
        }
        j["withheld"] = json!(why);
        return j;
    }
    for f in ["key", "value"] {
        if let Some(s) = j[f].as_str() {
            let (text, was_cut) = cut(s);
            j[f] = json!(text);
            j[format!("{f}_cut")] = json!(was_cut);
        }
    }
    if let Some(d) = decoded {
        j["decoded"] = match d.get("value") {
            Some(v) => {
                // serde_json escapes controls inside strings; what is left
                // to escape (bidi overrides) is escaped line by line, so
                // the layout's newlines stay.
                let text = serde_json::to_string_pretty(v).unwrap_or_default();
                let text: Vec<_> = text.lines().map(crate::service::escape_controls).collect();
                let (text, was_cut) = cut(&text.join("\n"));
                json!({"text": text, "cut": was_cut})
            }
            None => d,
        };
    }
    j
}

/// One replay outcome for the preview: its kind, DLT coordinate, the
/// line `dlt replay` prints for it, and its fields. A still-invalid
/// record's reason quotes its contents, and a blocked key is a record's
/// key: withheld like them (a `redact` record's reason always).
pub fn outcome(o: &Outcome, contents: bool) -> Value {
    const WITHHELD: &str = "(withheld: logging.record_contents is off)";
    let mut shown = o.clone();
    match &mut shown {
        Outcome::StillInvalid { reason, class, .. } => {
            if class.as_str() == crate::policy::Class::Redact.as_str() {
                *reason = "(class redact: never shown)".into();
            } else if !contents {
                *reason = WITHHELD.into();
            }
        }
        Outcome::HeldBack { key, .. } | Outcome::Released { key, .. } if !contents => {
            *key = WITHHELD.into();
        }
        _ => {}
    }
    let mut j = json!({
        "kind": o.kind(),
        "coordinate": o.coordinate(),
        "line": crate::service::escape_controls(&shown.line()),
    });
    match &shown {
        Outcome::WouldReplay {
            topic,
            partition,
            origin,
            attempt,
            ..
        } => {
            j["target"] = json!(format!("{topic}-{partition}"));
            j["origin"] = json!(origin);
            j["attempt"] = json!(attempt);
            j["verdict"] = json!("valid");
        }
        Outcome::Replayed {
            topic,
            partition,
            offset,
            origin,
            attempt,
            ..
        } => {
            j["target"] = json!(format!("{topic}-{partition}@{offset}"));
            j["origin"] = json!(origin);
            j["attempt"] = json!(attempt);
            j["verdict"] = json!("valid");
        }
        Outcome::StillInvalid {
            class,
            rule,
            reason,
            ..
        } => {
            j["verdict"] = json!(format!("{class} ({rule})"));
            j["reason"] = json!(crate::service::escape_controls(reason));
        }
        Outcome::AlreadyReplayed { topic, .. } => j["target"] = json!(topic),
        Outcome::Refused { why, .. } => j["reason"] = json!(why),
        Outcome::HeldBack { blocker, why, .. } => j["reason"] = json!(format!("{blocker}: {why}")),
        Outcome::Failed { error, .. } => j["reason"] = json!(error),
        Outcome::Released { .. } => {}
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(class: &str, value: &[u8]) -> DltRecord {
        DltRecord {
            dlt_topic: "geo.dlt".into(),
            dlt_partition: 0,
            dlt_offset: 3,
            timestamp: 0,
            origin_topic: Some("geo".into()),
            origin_partition: Some(1),
            origin_offset: Some(30),
            origin_timestamp: Some(0),
            class: class.into(),
            rule: "coordinates".into(),
            reason: "/lat: 91 is outside [-90, 90]".into(),
            policy: "p".into(),
            failed_at: Some(1),
            attempt: 0,
            redacted: false,
            key: Some(Bytes::from_static(b"k<script>")),
            value: Some(Bytes::copy_from_slice(value)),
            headers: vec![("trace".into(), Some(Bytes::from_static(b"secret")))],
            redrive: Vec::new(),
            contract_rule: None,
        }
    }

    #[test]
    fn contents_only_when_allowed() {
        let r = rec("poison", b"{\"lat\":91}");
        let off = record(&r, Some(json!({"value": {"lat": 91}})), false);
        assert_eq!(off["value"], Value::Null);
        assert_eq!(off["key"], Value::Null);
        assert_eq!(off["reason"], Value::Null);
        assert_eq!(off["headers"][0]["value"], Value::Null);
        assert_eq!(off["headers"][0]["key"], "trace");
        assert!(off.get("decoded").is_none());
        assert_eq!(off["value_size"], 10);
        assert!(off["withheld"]
            .as_str()
            .unwrap()
            .contains("record_contents"));
        let on = record(&r, Some(json!({"value": {"lat": 91}})), true);
        assert_eq!(on["value"], "{\"lat\":91}");
        assert_eq!(on["key"], "k<script>");
        assert_eq!(on["decoded"]["text"], "{\n  \"lat\": 91\n}");
        let redact = record(&rec("redact", b"x"), None, true);
        assert_eq!(redact["value"], Value::Null);
        assert!(redact["withheld"].as_str().unwrap().contains("redact"));
    }

    #[test]
    fn a_contract_rule_is_shown_its_exception_withheld_with_the_contents() {
        let mut r = rec("poison", b"{\"lat\":61.5}");
        r.contract_rule = Some(crate::replay::ContractRule {
            name: "north-of-60".into(),
            mode: "READ".into(),
            subject: "geo-value".into(),
            topic: "geo".into(),
            exception: "message.lat = 61.5".into(),
        });
        let on = record(&r, None, true);
        assert_eq!(on["contract_rule"]["name"], "north-of-60");
        assert_eq!(on["contract_rule"]["exception"], "message.lat = 61.5");
        let off = record(&r, None, false);
        assert_eq!(off["contract_rule"]["name"], "north-of-60");
        assert_eq!(off["contract_rule"]["mode"], "READ");
        assert_eq!(off["contract_rule"]["exception"], Value::Null);
        assert!(!off.to_string().contains("61.5"), "{off}");
        assert_eq!(
            record(&rec("poison", b"x"), None, true)["contract_rule"],
            Value::Null
        );
    }

    #[test]
    fn a_large_value_is_cut_with_its_size() {
        let big = vec![b'a'; MAX_SHOWN * 3];
        let j = record(&rec("poison", &big), None, true);
        assert_eq!(j["value_size"], MAX_SHOWN * 3);
        assert_eq!(j["value_cut"], true);
        assert_eq!(j["value"].as_str().unwrap().chars().count(), MAX_SHOWN + 1);
    }

    #[test]
    fn a_still_invalid_reason_is_withheld_when_contents_are() {
        let o = Outcome::StillInvalid {
            coord: "geo.dlt/0/3".into(),
            class: "poison".into(),
            rule: "coordinates".into(),
            reason: "/lat: 91\u{1b}[2J".into(),
        };
        let off = outcome(&o, false);
        assert!(!off.to_string().contains("91"), "{off}");
        let on = outcome(&o, true);
        assert_eq!(on["kind"], "still_invalid");
        assert!(on["line"].as_str().unwrap().contains("\\u{1b}"), "{on}");
    }

    #[test]
    fn blocked_keys_and_redact_reasons_are_withheld_from_the_preview() {
        let held = Outcome::HeldBack {
            coord: "geo.dlt/0/3".into(),
            key: "user-4711".into(),
            topic: "geo".into(),
            partition: 0,
            blocker: "geo.dlt/0/2".into(),
            why: "still invalid",
        };
        let released = Outcome::Released {
            key: "user-4711".into(),
            topic: "geo".into(),
            partition: 0,
            through: 9,
        };
        for o in [&held, &released] {
            let off = outcome(o, false);
            assert!(!off.to_string().contains("4711"), "{off}");
            assert!(outcome(o, true).to_string().contains("4711"));
        }
        let redact = Outcome::StillInvalid {
            coord: "geo.dlt/0/3".into(),
            class: "redact".into(),
            rule: "schema".into(),
            reason: "/ssn: 123-45-6789 is not allowed".into(),
        };
        assert!(!outcome(&redact, true).to_string().contains("6789"));
    }
}
