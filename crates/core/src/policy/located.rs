//! Where a policy file's problems are: `file:line:column` for every error.
//!
//! serde_yaml reports positions for shape errors (unknown key, wrong type).
//! Semantic errors (a schema that does not compile, a bad glob, `min > max`,
//! ...) are found after parsing, on plain values; each such value is a
//! [`Located`] that got a pre-order ordinal while parsing. To place an
//! error, the file is parsed again with "fail at ordinal N" set, so
//! serde_yaml itself reports the position of exactly that node. Only the
//! error path parses twice; every semantic error in a file is reported.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::path::Path;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::PolicyError;

thread_local! {
    static NEXT_ID: Cell<u32> = const { Cell::new(0) };
    static FAIL_AT: Cell<Option<u32>> = const { Cell::new(None) };
    static FAIL_MSG: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A value whose position in the YAML file can be recovered for an error.
#[derive(Debug, Clone)]
pub(super) struct Located<T> {
    pub(super) v: T,
    pub(super) id: u32,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let id = NEXT_ID.with(|n| {
            let i = n.get();
            n.set(i.wrapping_add(1));
            i
        });
        if FAIL_AT.with(Cell::get) == Some(id) {
            let msg = FAIL_MSG.with(|m| m.borrow().clone());
            // Fail *inside* this node's deserialize call, so serde_yaml marks
            // the error with this node's own position.
            return Err(d
                .deserialize_any(Fail(msg))
                .err()
                .unwrap_or_else(|| de::Error::custom("internal: position probe did not fail")));
        }
        Ok(Located {
            v: T::deserialize(d)?,
            id,
        })
    }
}

/// A visitor that fails on whatever it is shown.
pub(super) struct Fail(String);

impl<'de> Visitor<'de> for Fail {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("anything")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_some<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }
}

/// A semantic error at a [`Located`] node.
pub(super) struct At {
    pub(super) id: u32,
    pub(super) msg: String,
}

pub(super) fn at<T>(l: &Located<T>, msg: impl Into<String>) -> At {
    At {
        id: l.id,
        msg: msg.into(),
    }
}

/// Parse `text` as a `D` whose `Located` nodes are numbered in document
/// order; with `fail`, the node with that number fails with its message
/// (how [`place`] finds a semantic error's line and column).
pub(super) fn parse_doc<D: serde::de::DeserializeOwned>(
    text: &str,
    fail: Option<(u32, &str)>,
) -> Result<D, serde_yaml::Error> {
    NEXT_ID.with(|n| n.set(0));
    FAIL_AT.with(|f| f.set(fail.map(|(id, _)| id)));
    FAIL_MSG.with(|m| *m.borrow_mut() = fail.map(|(_, s)| s.to_string()).unwrap_or_default());
    let out = serde_yaml::from_str(text);
    FAIL_AT.with(|f| f.set(None));
    out
}

pub(super) fn from_yaml(path: &Path, e: &serde_yaml::Error) -> PolicyError {
    let full = crate::text::yaml_error(path, e);
    match e.location() {
        Some(loc) => {
            let prefix = format!("{}:{}:{}: ", path.display(), loc.line(), loc.column());
            PolicyError {
                file: path.to_path_buf(),
                line: loc.line(),
                column: loc.column(),
                message: full.strip_prefix(&prefix).unwrap_or(&full).to_string(),
            }
        }
        None => PolicyError::whole_file(path, e.to_string()),
    }
}

/// Place a semantic error by re-parsing `text` as a `D` with a probe at
/// its node.
pub(super) fn place<D: serde::de::DeserializeOwned>(
    text: &str,
    path: &Path,
    err: At,
) -> PolicyError {
    match parse_doc::<D>(text, Some((err.id, &err.msg))) {
        Err(e) if e.location().is_some() => {
            let mut pe = from_yaml(path, &e);
            // serde_yaml prefixes the full key path (`policies[0].value.schema: `);
            // drop our own shorter key (`value.schema: `) when it is a suffix of it.
            if let Some(yaml_path) = pe
                .message
                .strip_suffix(err.msg.as_str())
                .and_then(|p| p.strip_suffix(": "))
            {
                if let Some((key, rest)) = err.msg.split_once(": ") {
                    if yaml_path.ends_with(key) {
                        pe.message = format!("{yaml_path}: {rest}");
                    }
                }
            }
            pe
        }
        _ => PolicyError::whole_file(path, err.msg),
    }
}

/// A key this format does not take, if written.
pub(super) fn not_for<T>(errs: &mut Vec<At>, l: &Option<Located<T>>, msg: &str) {
    if let Some(l) = l {
        errs.push(at(l, msg));
    }
}

/// `ok` when no error was found.
pub(super) fn errors_or<T>(errs: Vec<At>, ok: T) -> Result<T, Vec<At>> {
    if errs.is_empty() {
        Ok(ok)
    } else {
        Err(errs)
    }
}
