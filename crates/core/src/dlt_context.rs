//! The frame around antidote's own headers on every record it writes
//! (diversions, markers, records written back by replay and re-drive), and
//! the one check every reader of such a record goes through.
//!
//! A record antidote writes carries the original record's headers first,
//! verbatim (order, duplicates, null values), then antidote's context
//! headers, then a trailer:
//!
//! ```text
//! <original headers...> <context headers, n of them> x-antidote-context: "2 <n>" [x-antidote-signature: <base64>]
//! ```
//!
//! Readers take the frame from the end, so nothing a producer put in its
//! own headers (an `x-original-offset`, or even a whole fake trailer) can be
//! taken for antidote's: it is always inside the original section. Framing
//! was chosen over escaping reserved names because the original headers then
//! need no rewriting at all, and `dlt replay` restores them byte for byte.
//!
//! With signing keys, the signature is an HMAC-SHA256 over the context
//! headers, the topic and partition the record is written to, and a digest
//! of the original key, value and headers: a copy of the record in another
//! partition, or with other contents, does not verify.
//!
//! Records written before this frame existed (format 1: context headers
//! appended with no trailer) are still read, without keys or when the
//! operator accepts unsigned records, but refused when a reserved name
//! appears twice or one appears that format 1 never wrote.
//!
//! Owns the reserved names, the frame's writing ([`Seal`]) and reading
//! ([`open`]); must never let a header outside the context section decide
//! anything.

use base64::Engine as _;
use bytes::Bytes;
use ring::{digest, hmac};

use crate::kafka::builder::NewRecord;
use crate::kafka::record::{Header, Record};

/// The trailer: `"<version> <n>"`, n the number of context headers before it.
pub const H_CONTEXT: &str = "x-antidote-context";
/// The HMAC-SHA256 of the record's frame, base64, after the trailer.
pub const H_SIGNATURE: &str = "x-antidote-signature";
/// The frame's version.
pub const FORMAT: u32 = 2;
/// More context headers than this in one frame is not antidote's.
const MAX_CONTEXT_HEADERS: usize = 32;

/// Name prefixes antidote reserves.
const RESERVED_PREFIXES: &[&str] = &["x-original-", "x-error", "x-antidote-", "x-marker-"];
/// Names antidote reserves besides the prefixes.
const RESERVED_NAMES: &[&str] = &[
    "x-policy",
    "x-attempt",
    "x-failed-at",
    "x-blocked-by",
    "x-released-through",
    "x-replayed-from-dlt",
    "x-redacted",
];

/// The headers Confluent's DLQ action writes for a failed data-contract
/// rule. Not reserved (a record a Confluent client dead-lettered keeps
/// them among its own headers), but allowed in the context section, where
/// the signature covers them.
pub const RULE_HEADERS: &[&str] = &[
    H_RULE_NAME,
    H_RULE_MODE,
    H_RULE_SUBJECT,
    H_RULE_TOPIC,
    H_RULE_EXCEPTION,
];
pub const H_RULE_NAME: &str = "__rule.name";
/// `READ` (diverted on fetch) or `WRITE`.
pub const H_RULE_MODE: &str = "__rule.mode";
pub const H_RULE_SUBJECT: &str = "__rule.subject";
pub const H_RULE_TOPIC: &str = "__rule.topic";
/// Why the rule failed (the record's `x-error`).
pub const H_RULE_EXCEPTION: &str = "__rule.exception";

/// Whether `key` may be a context header: a reserved name, or one of
/// [`RULE_HEADERS`].
fn is_context_name(key: &[u8]) -> bool {
    is_reserved(key) || RULE_HEADERS.iter().any(|n| key == n.as_bytes())
}

/// Whether antidote reserves the header name `key` for its own context.
pub fn is_reserved(key: &[u8]) -> bool {
    RESERVED_NAMES.iter().any(|n| key == n.as_bytes())
        || RESERVED_PREFIXES
            .iter()
            .any(|p| key.starts_with(p.as_bytes()))
}

/// Names a format-1 record (no trailer) could carry: what antidote wrote
/// before the frame. Any other reserved name in such a record is refused.
const FORMAT1_NAMES: &[&str] = &[
    "x-original-topic",
    "x-original-topic-id",
    "x-original-partition",
    "x-original-offset",
    "x-original-timestamp",
    "x-original-last-offset",
    "x-error-class",
    "x-error",
    "x-error-rule",
    "x-policy",
    "x-failed-at",
    "x-replayed-from-dlt",
    "x-attempt",
    "x-redacted",
    "x-blocked-by",
    "x-released-through",
    "x-antidote-marker",
    "x-marker-topic",
    "x-marker-partition",
    "x-marker-through",
    "x-marker-of",
    "x-marker-attempt",
    "x-marker-outcome",
    "x-marker-reason",
];

/// The fleet's signing keys: the first signs, every one verifies.
#[derive(Clone, Default)]
pub struct Keys {
    keys: Vec<hmac::Key>,
    /// Trust records without a signature (format 1, or unsigned format 2)
    /// even though keys are set: only while a fleet moves to signing.
    pub accept_unsigned: bool,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("Keys")
            .field("keys", &self.keys.len())
            .field("accept_unsigned", &self.accept_unsigned)
            .finish()
    }
}

/// Shortest signing key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 16;

/// No keys, as a static (for defaults that hand out a reference).
pub static NO_KEYS: Keys = Keys {
    keys: Vec::new(),
    accept_unsigned: false,
};

impl Keys {
    /// No keys: records are written unsigned and read by their frame only.
    pub fn none() -> Self {
        Keys::default()
    }

    /// Keys from their secrets, the signing one first.
    pub fn new<S: AsRef<[u8]>>(secrets: &[S], accept_unsigned: bool) -> Self {
        Keys {
            keys: secrets
                .iter()
                .map(|s| hmac::Key::new(hmac::HMAC_SHA256, s.as_ref()))
                .collect(),
            accept_unsigned,
        }
    }

    /// Whether any key is set.
    pub fn signing(&self) -> bool {
        !self.keys.is_empty()
    }

    fn sign(&self, msg: &[u8]) -> Option<String> {
        let key = self.keys.first()?;
        Some(base64::engine::general_purpose::STANDARD.encode(hmac::sign(key, msg).as_ref()))
    }

    fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let Ok(tag) = base64::engine::general_purpose::STANDARD.decode(sig) else {
            return false;
        };
        self.keys.iter().any(|k| hmac::verify(k, msg, &tag).is_ok())
    }
}

/// Where a record is written: the frame is bound to it.
#[derive(Debug, Clone, Copy)]
pub struct Seal<'a> {
    pub keys: &'a Keys,
    pub topic: &'a str,
    pub partition: i32,
}

impl<'a> Seal<'a> {
    pub fn new(keys: &'a Keys, topic: &'a str, partition: i32) -> Self {
        Seal {
            keys,
            topic,
            partition,
        }
    }

    /// `originals` (the record's own headers, kept as they are) followed by
    /// `context` and the trailer (signed when keys are set).
    pub fn frame(
        &self,
        timestamp: i64,
        key: Option<Bytes>,
        value: Option<Bytes>,
        originals: Vec<(String, Option<Bytes>)>,
        context: Vec<(String, Option<Bytes>)>,
    ) -> NewRecord {
        let mut headers = originals;
        let from = headers.len();
        let n = context.len();
        headers.extend(context);
        headers.push((
            H_CONTEXT.to_string(),
            Some(Bytes::from(format!("{FORMAT} {n}"))),
        ));
        if self.keys.signing() {
            let view: Vec<Header<'_>> = headers
                .iter()
                .map(|(k, v)| Header {
                    key: k.as_bytes(),
                    value: v.as_deref(),
                })
                .collect();
            let msg = message(
                self.topic,
                self.partition,
                key.as_deref(),
                value.as_deref(),
                &view[..from],
                &view[from..from + n],
            );
            if let Some(sig) = self.keys.sign(&msg) {
                headers.push((H_SIGNATURE.to_string(), Some(Bytes::from(sig))));
            }
        }
        NewRecord {
            timestamp,
            key,
            value,
            headers,
        }
    }
}

/// The bytes a signature covers.
fn message(
    topic: &str,
    partition: i32,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    originals: &[Header<'_>],
    context: &[Header<'_>],
) -> Vec<u8> {
    fn bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
        match b {
            None => out.extend_from_slice(&(-1i64).to_be_bytes()),
            Some(b) => {
                out.extend_from_slice(&(b.len() as i64).to_be_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    fn headers(out: &mut Vec<u8>, hs: &[Header<'_>]) {
        out.extend_from_slice(&(hs.len() as u64).to_be_bytes());
        for h in hs {
            bytes(out, Some(h.key));
            bytes(out, h.value);
        }
    }
    let mut body = Vec::new();
    bytes(&mut body, key);
    bytes(&mut body, value);
    headers(&mut body, originals);
    let body_digest = digest::digest(&digest::SHA256, &body);

    let mut msg = Vec::with_capacity(64 + topic.len() + 64 * context.len());
    msg.extend_from_slice(b"antidote-dlt\0");
    msg.extend_from_slice(&FORMAT.to_be_bytes());
    bytes(&mut msg, Some(topic.as_bytes()));
    msg.extend_from_slice(&partition.to_be_bytes());
    headers(&mut msg, context);
    msg.extend_from_slice(body_digest.as_ref());
    msg
}

/// Why a reader refused a record as antidote's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The trailer is malformed (version, count) or names more headers
    /// than the record has.
    BadFrame,
    /// A reserved name appears twice in the context.
    Duplicate,
    /// A reserved name the format does not write, or a non-reserved one
    /// inside the context section.
    Unexpected,
    /// Keys are set and the record carries no signature.
    Unsigned,
    /// The signature does not verify with any key.
    BadSignature,
}

impl Refusal {
    /// Label value of `antidote_dlt_records_refused_total{reason}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::BadFrame => "bad_frame",
            Refusal::Duplicate => "duplicate_reserved_header",
            Refusal::Unexpected => "unexpected_reserved_header",
            Refusal::Unsigned => "unsigned",
            Refusal::BadSignature => "bad_signature",
        }
    }
}

/// A record's context, as a reader may trust it.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// antidote's context headers, each name at most once.
    context: Vec<Header<'a>>,
    /// The original record's headers, verbatim.
    pub originals: Vec<Header<'a>>,
    /// 1 (no trailer) or 2.
    pub format: u32,
    /// The record carried a signature that verified.
    pub signed: bool,
}

impl<'a> Context<'a> {
    /// The value of context header `name`: `Some(None)` for a null value.
    pub fn get(&self, name: &str) -> Option<Option<&'a [u8]>> {
        self.context
            .iter()
            .find(|h| h.key == name.as_bytes())
            .map(|h| h.value)
    }

    /// Context header `name` as UTF-8 text.
    pub fn text(&self, name: &str) -> Option<&'a str> {
        self.get(name)
            .flatten()
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Context header `name` as a number.
    pub fn num(&self, name: &str) -> Option<i64> {
        self.text(name).and_then(|t| t.trim().parse().ok())
    }

    /// Whether the record carries no context header at all (a plain record).
    pub fn is_empty(&self) -> bool {
        self.context.is_empty()
    }

    /// The context headers, in order.
    pub fn headers(&self) -> &[Header<'a>] {
        &self.context
    }
}

/// Read the frame of record `r` found in `topic`/`partition`: the context
/// headers a reader may act on, or why none may be trusted. A record with
/// no frame and no reserved name is a plain record: an empty context.
pub fn open<'a>(
    r: &Record<'a>,
    topic: &str,
    partition: i32,
    keys: &Keys,
) -> Result<Context<'a>, Refusal> {
    let hs = &r.headers;
    let (signature, rest) = match hs.split_last() {
        Some((last, rest)) if last.key == H_SIGNATURE.as_bytes() => (Some(last.value), rest),
        _ => (None, &hs[..]),
    };
    let Some((trailer, rest)) = rest
        .split_last()
        .filter(|(t, _)| t.key == H_CONTEXT.as_bytes())
    else {
        if signature.is_some() {
            return Err(Refusal::BadFrame);
        }
        return format1(r, keys);
    };
    let n = parse_trailer(trailer.value).ok_or(Refusal::BadFrame)?;
    if n > rest.len() {
        return Err(Refusal::BadFrame);
    }
    let (originals, context) = rest.split_at(rest.len() - n);
    for (i, h) in context.iter().enumerate() {
        if !is_context_name(h.key)
            || h.key == H_CONTEXT.as_bytes()
            || h.key == H_SIGNATURE.as_bytes()
        {
            return Err(Refusal::Unexpected);
        }
        if context[..i].iter().any(|o| o.key == h.key) {
            return Err(Refusal::Duplicate);
        }
    }
    let signed = match signature {
        Some(sig) if keys.signing() => {
            let msg = message(topic, partition, r.key, r.value, originals, context);
            if !keys.verify(&msg, sig.unwrap_or_default()) {
                return Err(Refusal::BadSignature);
            }
            true
        }
        _ => false,
    };
    if keys.signing() && !signed && !keys.accept_unsigned {
        return Err(Refusal::Unsigned);
    }
    Ok(Context {
        context: context.to_vec(),
        originals: originals.to_vec(),
        format: FORMAT,
        signed,
    })
}

fn parse_trailer(v: Option<&[u8]>) -> Option<usize> {
    let text = std::str::from_utf8(v?).ok()?;
    let (version, n) = text.split_once(' ')?;
    if version.parse::<u32>().ok()? != FORMAT {
        return None;
    }
    let n: usize = n.parse().ok()?;
    (n <= MAX_CONTEXT_HEADERS).then_some(n)
}

/// A record without a trailer: antidote's headers from before the frame
/// (format 1), or a plain record. Reserved names are its context, each at
/// most once and only those format 1 wrote.
fn format1<'a>(r: &Record<'a>, keys: &Keys) -> Result<Context<'a>, Refusal> {
    let mut context: Vec<Header<'a>> = Vec::new();
    let mut originals = Vec::with_capacity(r.headers.len());
    for h in &r.headers {
        if !is_reserved(h.key) {
            originals.push(*h);
            continue;
        }
        if !FORMAT1_NAMES.iter().any(|n| h.key == n.as_bytes()) {
            return Err(Refusal::Unexpected);
        }
        if context.iter().any(|o| o.key == h.key) {
            return Err(Refusal::Duplicate);
        }
        context.push(*h);
    }
    if !context.is_empty() && keys.signing() && !keys.accept_unsigned {
        return Err(Refusal::Unsigned);
    }
    Ok(Context {
        context,
        originals,
        format: 1,
        signed: false,
    })
}

#[cfg(test)]
mod tests;
