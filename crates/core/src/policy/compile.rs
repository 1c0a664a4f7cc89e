//! Compiling the parts of a policy document: a `value:` or `key:` section
//! through its format ([`format`]), schema file paths, and the field rules.
//! Errors carry the position of the value at fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::document::*;
use super::format::OwnSchema;
use super::formats::{self, Decoder};
use super::located::not_for;
use super::located::{at, At, Located};
use super::registry::SchemaCache;
use super::rules::Pointer;

pub(super) fn ext(p: &Path) -> &str {
    p.extension().and_then(|e| e.to_str()).unwrap_or("")
}

/// Check a schema file's extension against the format, then resolve it.
pub(super) fn schema_path(
    base: &Path,
    l: &Located<PathBuf>,
    key: &str,
    want: &str,
) -> Result<PathBuf, At> {
    let full = base.join(&l.v);
    if ext(&l.v) != want {
        return Err(at(
            l,
            format!(
                "{key}: `{}` should be a .{want} file for this format",
                l.v.display()
            ),
        ));
    }
    if !full.is_file() {
        return Err(at(
            l,
            format!("{key}: schema file {} does not exist", full.display()),
        ));
    }
    Ok(full)
}

/// Compile a `value:` (or `key:`) section through its format's entry in
/// the format table.
pub(super) fn compile_value(
    v: &ValueDoc,
    base: &Path,
    cache: &Arc<SchemaCache>,
) -> Result<(Decoder, OwnSchema), Vec<At>> {
    if !v.registry.as_ref().is_some_and(|r| r.v) {
        let mut errs = Vec::new();
        not_for(
            &mut errs,
            &v.subject,
            "value.subject: needs `registry: true`",
        );
        not_for(
            &mut errs,
            &v.id,
            "value.id: needs `registry: true` and an Apicurio wire",
        );
        not_for(
            &mut errs,
            &v.id_header,
            "value.id_header: needs `registry: true` and `wire: apicurio-headers`",
        );
        if !errs.is_empty() {
            return Err(errs);
        }
    }
    formats::compile(&v.format.v, v, base, cache).unwrap_or_else(|| {
        Err(vec![at(
            &v.format,
            format!(
                "value.format: unknown format `{}` (formats: {})",
                v.format.v,
                formats::NAMES.join(", ")
            ),
        )])
    })
}

pub(super) fn pointer(l: &Located<String>, key: &str) -> Result<Pointer, At> {
    Pointer::parse(&l.v).map_err(|m| at(l, format!("{key}: {m}")))
}

mod rule;
pub(super) use rule::compile_rule;
