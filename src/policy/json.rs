//! Strict RFC 8259 JSON decoding of record values.
//!
//! Poison, never a crash: `NaN`, `Infinity`, numbers that overflow to
//! infinity, trailing bytes, invalid UTF-8, lone surrogates, and nesting
//! deeper than the policy's `max_depth`. Depth is checked by a linear scan
//! before parsing, so hostile input never reaches serde_json's recursion
//! (whose own limit is 128, above any `max_depth` we accept).

use serde_json::Value;

/// Default and largest allowed `value.max_depth`.
pub(crate) const DEFAULT_MAX_DEPTH: usize = 64;
pub(crate) const MAX_MAX_DEPTH: usize = 127;

/// Decode `bytes` as one strict JSON value no deeper than `max_depth`.
/// The error is a reason sentence, e.g. `value is not valid JSON: NaN at byte 8`.
pub(crate) fn decode(bytes: &[u8], max_depth: usize) -> Result<Value, String> {
    check_depth(bytes, max_depth)?;
    serde_json::from_slice(bytes).map_err(|e| describe(bytes, &e))
}

/// Reject nesting deeper than `max` (arrays and objects), ignoring brackets
/// inside strings. Malformed input is left for the parser to reject.
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
