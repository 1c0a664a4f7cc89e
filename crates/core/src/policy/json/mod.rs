//! Strict RFC 8259 JSON decoding of record values.
//!
//! Poison, never a crash: `NaN`, `Infinity`, numbers that overflow to
//! infinity, trailing bytes, invalid UTF-8, lone surrogates, and nesting
//! deeper than the policy's `max_depth`.
//!
//! Two paths, both driven by serde_json's strict parser through our own
//! visitors (never `IgnoredAny`: serde_json's skipping of ignored values
//! does not check UTF-8, surrogates or number overflow):
//!
//! - [`capture`], the fast path, for JSON policies without a JSON Schema:
//!   the whole document is parsed and validated, but no DOM is built. A
//!   [`Plan`] (a trie of the rules' pointers, compiled at load) says which
//!   values to keep; they land in [`Captures`] (strings borrowed from the
//!   input unless escaped, numbers as `serde_json::Number`), which the rules
//!   read by slot. Everything else is visited and dropped without
//!   allocating. Building and freeing a `serde_json::Value` was ~75 % of the
//!   cost of judging a 200-byte record (measured when the scanner was built; see git history of BENCHMARKS.md).
//! - [`decode`], for JSON Schema policies (the validator takes a `Value`):
//!   builds the `Value` with a visitor that counts depth as it goes.
//!
//! Depth is counted in the visitors, so hostile input never nests deeper
//! than `max_depth` + 1 (≤ 128, also serde_json's own recursion limit) and
//! there is no separate pre-scan on the valid path. Errors are rare, so on
//! error only the old linear bracket scan ([`check_depth`]) runs to report
//! exactly what the scan-then-parse decoder reported: a document nested too
//! deep anywhere is a depth error even if a syntax error comes first.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

mod capture;
mod format;

use capture::run;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use capture::scanner_agrees;
#[cfg(test)]
pub(crate) use capture::template_takes;
pub(crate) use capture::{capture_shaped, Captured, Captures, Plan};
pub(crate) use format::JsonFormat;

/// Default and largest allowed `value.max_depth`.
pub(crate) const DEFAULT_MAX_DEPTH: usize = 64;
pub(crate) const MAX_MAX_DEPTH: usize = 127;

/// Decode `bytes` as one strict JSON value no deeper than `max_depth`.
/// The error is a reason sentence, e.g. `value is not valid JSON: NaN at byte 8`.
pub(crate) fn decode(bytes: &[u8], max_depth: usize) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = BuildValue {
        depth: 0,
        max: max_depth,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    parsed.map_err(|e| explain(bytes, max_depth, &e))
}

/// Validate `bytes` as one strict JSON value no deeper than `max_depth`, and
/// capture the values `plan` names into the fresh `caps`. Same errors as
/// [`decode`].
pub(crate) fn capture<'de>(
    bytes: &'de [u8],
    max_depth: usize,
    plan: &Plan,
    caps: &mut Captures<'de>,
) -> Result<(), String> {
    run(bytes, max_depth, plan, caps).map_err(|e| explain(bytes, max_depth, &e))
}

/// The reason for a parse error, as the scan-then-parse decoder gave it.
fn explain(bytes: &[u8], max_depth: usize, e: &serde_json::Error) -> String {
    match check_depth(bytes, max_depth) {
        Err(deep) => deep,
        Ok(()) => describe(bytes, e),
    }
}

/// The custom error a visitor raises past `max_depth`; on that path
/// [`check_depth`] always fails too and words the reason.
pub(super) fn too_deep<E: de::Error>(max: usize) -> E {
    E::custom(format_args!("nesting deeper than {max} levels"))
}

// ------------------------------------------------------------ Value builder

/// Builds a `serde_json::Value` exactly as serde_json's own `Deserialize`
/// does, refusing containers deeper than `max`.
#[derive(Clone, Copy)]
pub(super) struct BuildValue {
    /// Containers already open around this value.
    pub(super) depth: usize,
    pub(super) max: usize,
}

impl BuildValue {
    fn inner<E: de::Error>(self) -> Result<BuildValue, E> {
        if self.depth >= self.max {
            return Err(too_deep(self.max));
        }
        Ok(BuildValue {
            depth: self.depth + 1,
            max: self.max,
        })
    }
}

impl<'de> DeserializeSeed<'de> for BuildValue {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BuildValue {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.inner()?;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(inner)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.inner()?;
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(inner)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// The decoder before the fast path: scan for depth, then let serde_json
/// build the `Value`. Tests compare the fast path against it.
#[cfg(test)]
pub(crate) fn decode_reference(bytes: &[u8], max_depth: usize) -> Result<Value, String> {
    check_depth(bytes, max_depth)?;
    serde_json::from_slice(bytes).map_err(|e| describe(bytes, &e))
}

/// Reject nesting deeper than `max` (arrays and objects), ignoring brackets
/// inside strings. Malformed input is left for the parser to reject. Runs on
/// the error path only.
fn check_depth(bytes: &[u8], max: usize) -> Result<(), String> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(format!(
                        "value is not valid JSON: nesting deeper than {max} levels at byte {i}"
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Turn a serde_json error into a sentence with a byte offset.
fn describe(bytes: &[u8], e: &serde_json::Error) -> String {
    let at = byte_offset(bytes, e.line(), e.column());
    // Name the well-known non-JSON tokens instead of "expected value".
    let tail = bytes.get(at.saturating_sub(1)..).unwrap_or(&[]);
    let start = at.saturating_sub(1);
    for (token, name) in [
        (&b"NaN"[..], "NaN"),
        (b"-Infinity", "-Infinity"),
        (b"Infinity", "Infinity"),
    ] {
        if tail.starts_with(token) {
            return format!("value is not valid JSON: {name} at byte {start}");
        }
    }
    let msg = e.to_string();
    let msg = match msg.rfind(" at line ") {
        Some(i) => &msg[..i],
        None => msg.as_str(),
    };
    format!("value is not valid JSON: {msg} at byte {start}")
}

/// serde_json reports 1-based line and column (column counts bytes); turn
/// that into an offset just past the offending byte.
fn byte_offset(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut line_start = 0usize;
    if line > 1 {
        let mut seen = 1usize;
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' {
                seen += 1;
                if seen == line {
                    line_start = i + 1;
                    break;
                }
            }
        }
    }
    (line_start + column).min(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &[u8]) -> String {
        decode(s, DEFAULT_MAX_DEPTH).unwrap_err()
    }

    #[test]
    fn strictness() {
        assert!(decode(br#"{"a": [1, 2.5, "x", null, true]}"#, 64).is_ok());
        assert_eq!(
            err(br#"{"lat": NaN}"#),
            "value is not valid JSON: NaN at byte 8"
        );
        assert!(err(br#"{"lat": Infinity}"#).contains("Infinity at byte 8"));
        assert!(err(br#"{"lat": -Infinity}"#).contains("Infinity"));
        assert!(err(br#"{"lat": 1e400}"#).contains("number out of range"));
        assert!(err(br#"{"a": 1} x"#).contains("trailing characters"));
        assert!(err(b"{\"a\": \"\xff\"}").contains("invalid unicode"));
        assert!(err(br#"{"a": "\ud800"}"#).contains("escape"));
        assert!(err(br#"{"a": "\udc00"}"#).contains("surrogate"));
        assert!(err(b"").contains("EOF"));
    }

    #[test]
    fn depth_limit() {
        let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(decode(ok.as_bytes(), 64).is_ok());
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert!(err(deep.as_bytes()).contains("nesting deeper than 64"));
        let huge = "[".repeat(100_000);
        assert!(err(huge.as_bytes()).contains("nesting deeper than 64"));
        // Brackets in strings do not count.
        let s = format!("[\"{}\"]", "[".repeat(200));
        assert!(decode(s.as_bytes(), 64).is_ok());
    }
}
