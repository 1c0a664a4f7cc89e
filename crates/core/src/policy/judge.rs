//! The compiled form of a policy and the hot path that judges one record
//! with it: size and header checks, then the value's format (`format.rs`)
//! captures the rules' fields or decodes the value, then schema validation,
//! field rules and CEL conditions. No allocation for a valid JSON record whose schema
//! compiles to a shape.

use super::cel::CelRule;
use super::checks::Checks;
use super::contract::Side;
use super::dlt_topic::DeadLetterTemplate;
use super::format::{Cx, Verdict};
use super::formats::Decoder;
#[cfg(any(test, feature = "fuzzing"))]
use super::json;
use super::json::Captures;
use super::rules::{Doc, MaxAge, Rule};
use super::shape::same_bytes;
use super::{Class, Invalid};
use crate::kafka::record::Record;

/// A required header missing, or present with a null value.
#[cold]
#[inline(never)]
fn missing_header(name: &str, present: bool) -> Invalid {
    let reason = if present {
        format!("required header {name} is present but null")
    } else {
        format!("missing required header {name}")
    };
    Invalid::poison("headers.required", reason)
}

#[cold]
#[inline(never)]
fn too_big(len: usize, max: usize) -> Invalid {
    Invalid::poison(
        "max_bytes",
        format!("value is {len} bytes, over max_bytes {max}"),
    )
}

/// A rule's failure with the rule's own `class:`, when it sets one.
fn reclass(mut e: Invalid, class: Option<&Option<Class>>) -> Invalid {
    if let Some(Some(c)) = class {
        e.class = *c;
    }
    e
}

/// The data-contract rules of the registered schema `bytes` name, judged
/// on their decoded `value`; first, a rule whose `dlq.topic` is not this
/// policy's DLT makes the schema unusable here (`unknown`).
fn contract(
    decoder: &Decoder,
    bytes: &[u8],
    value: &serde_json::Value,
    r: &Record<'_>,
    cx: &Cx<'_>,
    dead_letter: &DeadLetterTemplate,
) -> Result<(), Invalid> {
    let Some(c) = decoder.contract(bytes, cx) else {
        return Ok(());
    };
    if c.names_dlq() {
        let dlt = dead_letter.render(cx.topic, Class::Poison);
        if let Some(e) = c.dlq_mismatch(&dlt) {
            return Err(e);
        }
    }
    c.check(value, r, cx.side)
}

/// The `key:` section: keys are decoded and checked against their schema
/// (rules apply to values only). Failures are named `key.<rule>`.
#[derive(Debug)]
pub(crate) struct KeyCheck {
    pub(super) decoder: Decoder,
    pub(super) schema: Option<jsonschema::Validator>,
    pub(super) allow_null: bool,
    pub(super) max_bytes: Option<usize>,
}

impl KeyCheck {
    pub(super) fn is_registry(&self) -> bool {
        matches!(self.decoder, Decoder::Registry(_))
    }

    fn check(
        &self,
        r: &Record<'_>,
        cx: &Cx<'_>,
        dead_letter: &DeadLetterTemplate,
    ) -> Result<(), Invalid> {
        let key = r.key;
        let named = |mut e: Invalid| {
            e.rule = format!("key.{}", e.rule);
            e
        };
        let Some(bytes) = key else {
            return if self.allow_null {
                Ok(())
            } else {
                Err(Invalid::poison(
                    "key.allow_null",
                    "key is null and this policy sets key.allow_null: false",
                ))
            };
        };
        if let Some(max) = self.max_bytes.filter(|m| bytes.len() > *m) {
            return Err(Invalid::poison(
                "key.max_bytes",
                format!("key is {} bytes, over key.max_bytes {max}", bytes.len()),
            ));
        }
        let value = self.decoder.decode(bytes, cx).map_err(named)?;
        if let Some(v) = &value {
            contract(&self.decoder, bytes, v, r, cx, dead_letter).map_err(named)?;
        }
        if let (Some(schema), Some(v)) = (&self.schema, &value) {
            if !schema.is_valid(v) {
                let reason = match schema.validate(v) {
                    Err(e) => format!("key{}: {e}", e.instance_path()),
                    Ok(()) => "key does not match the JSON Schema".into(),
                };
                return Err(Invalid::poison("key.schema", reason));
            }
        }
        Ok(())
    }
}

/// Everything a policy needs to judge a record, compiled at load.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) dead_letter: DeadLetterTemplate,
    pub(super) headers_required: Vec<String>,
    pub(super) allow_null: bool,
    pub(super) max_bytes: Option<usize>,
    pub(super) decoder: Decoder,
    pub(super) schema: Option<jsonschema::Validator>,
    pub(super) rules: Vec<Rule>,
    pub(super) stale: Vec<MaxAge>,
    /// `rules` and `stale` compiled against the captures' slots, asked
    /// first for a record read through captures.
    pub(super) checks: Checks,
    /// The `class:` of each rule in `rules` and `stale` (same order), if set.
    pub(super) rule_class: Vec<Option<Class>>,
    pub(super) stale_class: Vec<Option<Class>>,
    /// The `cel` rules, judged after `rules` (and before `stale`), read
    /// through the same captures or value; each with its `class:`.
    pub(super) cel: Vec<CelRule>,
    pub(super) cel_class: Vec<Option<Class>>,
    pub(super) key: Option<KeyCheck>,
}

impl Compiled {
    /// [`Self::judge_on`] a fetched record.
    #[cfg(test)]
    pub(crate) fn judge(&self, topic: &str, r: &Record<'_>, now_ms: i64) -> Result<(), Invalid> {
        self.judge_on(topic, r, now_ms, Side::Read)
    }

    pub(crate) fn judge_on(
        &self,
        topic: &str,
        r: &Record<'_>,
        now_ms: i64,
        side: Side,
    ) -> Result<(), Invalid> {
        let cx = Cx::of_record(topic, r, now_ms, side);
        let Some(bytes) = self.before_decode(r)? else {
            return match &self.key {
                Some(k) => k.check(r, &cx, &self.dead_letter),
                None => Ok(()),
            };
        };
        if let Some(k) = &self.key {
            k.check(r, &cx, &self.dead_letter)?;
        }
        let fast = (self.decoder).capture(bytes, &cx, |caps| self.check_captured(caps, r, now_ms));
        match fast {
            Some(Ok(())) => Ok(()),
            Some(Err(invalid)) => Err(*invalid),
            None => self.judge_decoded(bytes, r, &cx),
        }
    }

    /// A value the fast path declined, decoded and judged in full (its
    /// data-contract rules, then the policy's). Out of line: most records
    /// never come here.
    #[inline(never)]
    fn judge_decoded(&self, bytes: &[u8], r: &Record<'_>, cx: &Cx<'_>) -> Result<(), Invalid> {
        match self.decoder.decode(bytes, cx)? {
            Some(value) => contract(&self.decoder, bytes, &value, r, cx, &self.dead_letter)
                .and_then(|()| self.check_value(&value, r, cx.now_ms)),
            None => Ok(()),
        }
    }

    /// A record's value judged both ways (no key, header or size checks):
    /// on the fast path's captures (`None`: not taken) and on the decoded
    /// value, for tests that the two agree.
    #[cfg(test)]
    #[allow(clippy::type_complexity)]
    pub(crate) fn both_ways(
        &self,
        topic: &str,
        r: &Record<'_>,
        now_ms: i64,
        side: Side,
    ) -> (Option<Result<(), Invalid>>, Result<(), Invalid>) {
        let cx = Cx::of_record(topic, r, now_ms, side);
        let bytes = r.value.unwrap_or_default();
        let fast = (self.decoder).capture(bytes, &cx, |caps| self.check_captured(caps, r, now_ms));
        let slow = self.judge_decoded(bytes, r, &cx);
        (fast.map(|v| v.map_err(|invalid| *invalid)), slow)
    }

    /// Headers, null and size: the value's bytes when they need decoding,
    /// `None` for a tombstone that passes.
    fn before_decode<'r>(&self, r: &Record<'r>) -> Result<Option<&'r [u8]>, Invalid> {
        for h in &self.headers_required {
            // The first header of that name, as `Record::header` finds it,
            // compared without a call to memcmp (issue 30).
            let found = r.headers.iter().find(|x| same_bytes(x.key, h.as_bytes()));
            if found.is_none_or(|x| x.value.is_none()) {
                return Err(missing_header(h, found.is_some()));
            }
        }
        let Some(bytes) = r.value else {
            return if self.allow_null {
                Ok(None)
            } else {
                Err(Invalid::poison(
                    "allow_null",
                    "value is null (a tombstone) and this policy sets allow_null: false",
                ))
            };
        };
        if let Some(max) = self.max_bytes {
            if bytes.len() > max {
                return Err(too_big(bytes.len(), max));
            }
        }
        Ok(Some(bytes))
    }

    /// JSON Schema, then the rules.
    fn check_value(
        &self,
        value: &serde_json::Value,
        r: &Record<'_>,
        now_ms: i64,
    ) -> Result<(), Invalid> {
        if let Some(schema) = &self.schema {
            if !schema.is_valid(value) {
                let reason = match schema.validate(value) {
                    Err(e) => {
                        let at = e.instance_path().to_string();
                        let at = if at.is_empty() {
                            "value".to_string()
                        } else {
                            at
                        };
                        format!("{at}: {e}")
                    }
                    Ok(()) => "value does not match the JSON Schema".to_string(),
                };
                return Err(Invalid::poison("schema", reason));
            }
        }
        self.check_rules(value, r, now_ms)
    }

    /// Rules in file order, CEL conditions, then `max_age` rules.
    #[inline]
    fn check_rules<D: Doc + ?Sized>(
        &self,
        value: &D,
        r: &Record<'_>,
        now_ms: i64,
    ) -> Result<(), Invalid> {
        if self.rules.iter().all(|rule| rule.holds(value))
            && self.cel.iter().all(|c| c.holds(value, r))
            && self.stale.iter().all(|s| s.holds(value, now_ms))
        {
            return Ok(());
        }
        self.explain_rules(value, r, now_ms)
    }

    /// [`Self::check_rules`] for captured values, through the compiled
    /// checks.
    #[inline]
    fn check_captured(&self, caps: &Captures<'_>, r: &Record<'_>, now_ms: i64) -> Verdict {
        if self.checks.hold(caps, &self.rules, now_ms) && self.cel.iter().all(|c| c.holds(caps, r))
        {
            return Ok(());
        }
        self.explain_rules(caps, r, now_ms).map_err(Box::new)
    }

    /// The first rule `value` fails, as [`Invalid`]: `check_rules` past
    /// its fast answer (`Ok` if none fails after all).
    #[cold]
    #[inline(never)]
    fn explain_rules<D: Doc + ?Sized>(
        &self,
        value: &D,
        r: &Record<'_>,
        now_ms: i64,
    ) -> Result<(), Invalid> {
        for (i, rule) in self.rules.iter().enumerate() {
            rule.check(value)
                .map_err(|e| reclass(e, self.rule_class.get(i)))?;
        }
        for (i, c) in self.cel.iter().enumerate() {
            c.check(value, r)
                .map_err(|e| reclass(e, self.cel_class.get(i)))?;
        }
        for (i, s) in self.stale.iter().enumerate() {
            s.check(value, now_ms)
                .map_err(|e| reclass(e, self.stale_class.get(i)))?;
        }
        Ok(())
    }

    /// The value decoded in full (no fast path), for `dlt inspect --decode`.
    pub(crate) fn decode_value(
        &self,
        topic: &str,
        bytes: &[u8],
        now_ms: i64,
    ) -> Result<Option<serde_json::Value>, Invalid> {
        // No headers here: a value framed with its id in a header is
        // `unknown` (the DLT record's headers are antidote's).
        let cx = Cx {
            topic,
            now_ms,
            headers: &[],
            side: Side::Read,
            record: None,
        };
        self.decoder.decode(bytes, &cx)
    }

    /// Whether the value or the key reads schemas from the registry.
    pub(crate) fn uses_registry(&self) -> bool {
        matches!(self.decoder, Decoder::Registry(_))
            || self.key.as_ref().is_some_and(KeyCheck::is_registry)
    }

    /// The JSON format's fast path, if this is a JSON policy with one.
    #[cfg(any(test, feature = "fuzzing"))]
    fn json_plan(&self) -> Option<(&json::Plan, usize)> {
        match &self.decoder {
            Decoder::Json(j) => j.fast.as_ref().map(|p| (p, j.max_depth)),
            _ => None,
        }
    }

    /// Whether records are judged without building a `serde_json::Value`.
    #[cfg(test)]
    pub(crate) fn uses_fast_path(&self) -> bool {
        self.json_plan().is_some()
    }

    /// Whether the fast path's shape alone accepts `bytes` (for tests that
    /// valid records do not fall back to the full path).
    #[cfg(test)]
    pub(crate) fn shape_accepts(&self, bytes: &[u8]) -> bool {
        self.json_plan().is_some_and(|(plan, max_depth)| {
            json::capture_shaped(bytes, max_depth, plan, &mut Captures::new(plan.slots()))
        })
    }

    /// For a JSON policy with a fast path: whether the byte scanner accepted
    /// `bytes`, after checking that the visitor path then captures the same
    /// values (`Err` with both when not). `None` for other policies.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn scanner_agrees(&self, bytes: &[u8]) -> Option<Result<bool, String>> {
        let (plan, max_depth) = self.json_plan()?;
        Some(json::scanner_agrees(bytes, max_depth, plan))
    }

    /// For a JSON policy: whether the flat reader's template reads `bytes`.
    #[cfg(test)]
    pub(crate) fn template_takes(&self, bytes: &[u8]) -> bool {
        self.json_plan()
            .is_some_and(|(p, _)| json::template_takes(bytes, p))
    }

    /// For an Avro or Protobuf policy: whether its fast path reads `bytes`.
    #[cfg(test)]
    pub(crate) fn binary_fast_path_takes(&self, bytes: &[u8]) -> bool {
        match &self.decoder {
            Decoder::Avro(d) => d.capture(bytes, &mut Captures::new(d.slot_count())),
            Decoder::Protobuf(d) => d.capture(bytes, &mut Captures::new(d.slot_count())),
            _ => false,
        }
    }

    /// For an Avro or Protobuf policy whose fast path reads `bytes`: the
    /// full decoder accepts them too and every rule pointer finds the same
    /// value in both (`Err` naming the first difference). `Ok(false)` when
    /// the fast path gives up.
    #[cfg(test)]
    pub(crate) fn binary_captures_agree(&self, bytes: &[u8]) -> Result<bool, String> {
        let slots = match &self.decoder {
            Decoder::Avro(d) => d.slot_count(),
            Decoder::Protobuf(d) => d.slot_count(),
            _ => return Ok(false),
        };
        let mut caps = Captures::new(slots);
        let (read, full, plan) = match &self.decoder {
            Decoder::Avro(d) => (
                d.capture(bytes, &mut caps),
                d.decode(bytes),
                d.plan.as_ref(),
            ),
            Decoder::Protobuf(d) => (d.capture(bytes, &mut caps), d.decode(bytes), d.plan()),
            _ => return Ok(false),
        };
        let (true, Some(plan)) = (read, plan) else {
            return Ok(false);
        };
        match full {
            Ok(v) => plan.same_fields(&caps, &v).map(|()| true),
            Err(e) => Err(format!(
                "the full decoder refuses what the fast path read: {e:?}"
            )),
        }
    }

    /// Judge as the code before the fast path did: a `serde_json::Value`
    /// from the scan-then-parse decoder, then the rules on it. For tests
    /// that the fast path agrees with it.
    #[cfg(test)]
    pub(crate) fn judge_reference(&self, r: &Record<'_>, now_ms: i64) -> Result<(), Invalid> {
        let Some(bytes) = self.before_decode(r)? else {
            return Ok(());
        };
        let value = match &self.decoder {
            Decoder::Json(j) => json::decode_reference(bytes, j.max_depth)
                .map_err(|r| Invalid::poison("decode", r))?,
            d => match d.decode(
                bytes,
                &Cx {
                    topic: "",
                    now_ms,
                    headers: &r.headers,
                    side: Side::Read,
                    record: None,
                },
            )? {
                Some(v) => v,
                None => return Ok(()),
            },
        };
        self.check_value(&value, r, now_ms)
    }
}
