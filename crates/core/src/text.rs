//! Text formats shared by the config and policy files: where a YAML error
//! is (`file:line:column`, printed up front) and the duration syntax
//! (`500ms`, `10s`, `15m`, `1h`, `1d`).

use std::path::Path;
use std::time::Duration;

/// Parse `500ms`, `10s`, `15m`, `1h`, `2d` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 500ms, 10s, 15m or 1h"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        other => return Err(format!("`{other}` is not a duration unit (ms, s, m, h, d)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}` is not a duration"));
    }
    // Finite but past what a Duration holds (1e20 days): an error, not
    // the panic from_secs_f64 would raise.
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is too long a duration"))
}

/// Format a serde_yaml error as `file:line:column: message`.
pub fn yaml_error(path: &Path, err: &serde_yaml::Error) -> String {
    match err.location() {
        Some(loc) => format!(
            "{}:{}:{}: {}",
            path.display(),
            loc.line(),
            loc.column(),
            strip_location(&err.to_string())
        ),
        None => format!("{}: {}", path.display(), err),
    }
}

/// serde_yaml appends " at line L column C" to its messages; we print the
/// position up front instead, so drop the tail.
fn strip_location(msg: &str) -> &str {
    match msg.rfind(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_too_long_to_hold_is_an_error_not_a_panic() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("99999999999999999999d").is_err());
        assert!(parse_duration("1e300h").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("NaNs").is_err());
    }
}
