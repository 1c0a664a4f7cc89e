//! The DLT record format: the one place that names the context headers a
//! dead-letter record carries, writes them (`Diversion::to_record`) and
//! parses them back (`Origin::of`, and `crate::dlt::DltRecord`, which
//! uses these names).
//!
//! Must never let one record's context grow without bound: `x-error` is cut
//! to [`MAX_ERROR_BYTES`], so a reason that quotes a huge value can never
//! make a DLT record too large for its topic.

use std::borrow::Cow;
use std::sync::Arc;

use uuid::Uuid;

use crate::kafka::record::Record;

pub const H_TOPIC: &str = "x-original-topic";
/// The origin topic's id (UUID text) when metadata knew it at write time:
/// tells a record of a deleted and recreated topic from one of the current.
pub const H_TOPIC_ID: &str = "x-original-topic-id";
pub const H_PARTITION: &str = "x-original-partition";
pub const H_OFFSET: &str = "x-original-offset";
pub const H_TIMESTAMP: &str = "x-original-timestamp";
pub const H_CLASS: &str = "x-error-class";
pub const H_ERROR: &str = "x-error";
pub const H_RULE: &str = "x-error-rule";
pub const H_POLICY: &str = "x-policy";
pub const H_FAILED_AT: &str = "x-failed-at";
/// The last offset of a whole batch diverted as one record (rule `batch`);
/// `x-original-offset` is its first.
pub const H_LAST_OFFSET: &str = "x-original-last-offset";
/// `x-error-rule` of a whole batch diverted because it cannot be decoded.
pub const RULE_WHOLE_BATCH: &str = "batch";
/// `<dlt-topic>/<partition>/<offset>` of the DLT record a replay came from.
pub const H_REPLAYED_FROM: &str = "x-replayed-from-dlt";
/// How many times this record has been replayed (1 on the first replay).
pub const H_ATTEMPT: &str = "x-attempt";

/// Context headers the proxy adds to a DLT record (plus the replay headers);
/// replay strips exactly these, and keeps every other header, `x-` or not.
pub const CONTEXT_HEADERS: &[&str] = &[
    H_TOPIC,
    H_TOPIC_ID,
    H_PARTITION,
    H_OFFSET,
    H_TIMESTAMP,
    H_CLASS,
    H_ERROR,
    H_RULE,
    H_POLICY,
    H_FAILED_AT,
    H_LAST_OFFSET,
    H_REPLAYED_FROM,
    H_ATTEMPT,
];

/// Longest `x-error` value written, in bytes.
pub const MAX_ERROR_BYTES: usize = 1024;
/// Appended to a cut `x-error` so a reader knows the text is incomplete.
const CUT_MARK: &str = "…[truncated]";

/// `reason` as written to `x-error`: at most [`MAX_ERROR_BYTES`] bytes, cut
/// on a UTF-8 boundary and marked when cut.
pub fn bound_reason(reason: &str) -> Cow<'_, str> {
    if reason.len() <= MAX_ERROR_BYTES {
        return Cow::Borrowed(reason);
    }
    let mut end = MAX_ERROR_BYTES - CUT_MARK.len();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{CUT_MARK}", &reason[..end]))
}

/// The origin a DLT record names: where the diverted record came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    /// `None` for records written before the header existed, or when the
    /// id was unknown at write time.
    pub topic_id: Option<Uuid>,
}

impl Origin {
    /// The origin named by `r`'s context headers, if it names a whole one.
    pub fn of(r: &Record<'_>) -> Option<Origin> {
        let text = |k| {
            r.header(k)
                .flatten()
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        Some(Origin {
            topic: Arc::from(text(H_TOPIC)?),
            partition: text(H_PARTITION)?.trim().parse().ok()?,
            offset: text(H_OFFSET)?.trim().parse().ok()?,
            topic_id: text(H_TOPIC_ID).and_then(|t| Uuid::parse_str(t.trim()).ok()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_reason_is_kept_whole() {
        assert_eq!(bound_reason("/lat: 91 is outside"), "/lat: 91 is outside");
        let exact = "a".repeat(MAX_ERROR_BYTES);
        assert_eq!(bound_reason(&exact), exact);
    }

    #[test]
    fn a_long_reason_is_cut_on_a_char_boundary_and_marked() {
        // 3-byte characters, so the cut point falls inside one.
        let long = "€".repeat(5000);
        let cut = bound_reason(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES, "{}", cut.len());
        assert!(cut.ends_with(CUT_MARK));
        assert!(cut.trim_end_matches(CUT_MARK).chars().all(|c| c == '€'));
        assert!(cut.len() > MAX_ERROR_BYTES - 16);
    }
}
