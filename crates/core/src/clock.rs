//! Wall-clock time in the unit Kafka uses (milliseconds since the epoch):
//! record timestamps, staleness and `x-failed-at`.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
