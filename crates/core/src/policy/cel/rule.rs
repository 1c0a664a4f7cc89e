//! A `- cel: "<expr>"` policy rule: the condition compiled against a
//! policy's names (`message` the decoded value, `key` the record key's
//! bytes, `headers` the record headers by name, `timestamp` the record's
//! time in ms) and judged on a record through the same [`Doc`] the field
//! rules read, captured or decoded whole. A record for which the condition
//! is false, or raises an error, fails the rule.

use super::compile::render;
use super::value::order;
use super::{compile, CompileError, EvalError, Program, Resolver, Slots, Step, Type, Val};
use crate::kafka::record::Record;
use crate::policy::rules::{Doc, Field, Pointer};
use crate::policy::Invalid;

/// What a slot of a CEL rule reads.
#[derive(Debug)]
pub(crate) enum Source {
    /// A field of the decoded value (its pointer's slot is the captures').
    Message(Pointer),
    /// The first header of this name (`null` when its value is null).
    Header(Box<[u8]>),
    Key,
    Timestamp,
    /// A constant of a CEL_FIELD rule (`name`, `typeName` of the field it
    /// is judged on), as UTF-8.
    Text(Box<[u8]>),
}

/// The field a data contract's CEL_FIELD rule is judged on: `value` is
/// `message.<name>`, and `name` and `typeName` are constants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FieldScope<'a> {
    pub(crate) name: &'a str,
    pub(crate) type_name: &'a str,
}

/// One compiled `cel` rule.
#[derive(Debug)]
pub(crate) struct CelRule {
    /// `cel:<name>`, or `cel:<expression>` for a rule without a name.
    pub(crate) id: String,
    program: Program,
    sources: Box<[Source]>,
    /// Two fields ordered (`message.exit > message.enter`, the commonest
    /// condition): their pointers and the orderings that hold, judged
    /// straight from the fields when both are numbers (the evaluator's
    /// frames and value copies were ~150 instructions of its ~230).
    two: Option<(Pointer, Pointer, [bool; 3])>,
}

/// The policy's names, as [`Resolver`] for the compiler.
#[derive(Default)]
struct Names<'a> {
    sources: Vec<Source>,
    /// A CEL_FIELD rule's field: adds `value`, `name` and `typeName`.
    field: Option<FieldScope<'a>>,
}

impl Names<'_> {
    fn slot(&mut self, source: Source) -> u32 {
        let same = |s: &Source| match (s, &source) {
            (Source::Message(a), Source::Message(b)) => a.as_str() == b.as_str(),
            (Source::Header(a), Source::Header(b)) => a == b,
            (Source::Key, Source::Key) | (Source::Timestamp, Source::Timestamp) => true,
            (Source::Text(a), Source::Text(b)) => a == b,
            _ => false,
        };
        match self.sources.iter().position(same) {
            Some(i) => i as u32,
            None => {
                self.sources.push(source);
                (self.sources.len() - 1) as u32
            }
        }
    }
}

impl Names<'_> {
    /// `value`, `name` and `typeName` of a CEL_FIELD rule; `None` for
    /// other names.
    fn field_name(&self, variable: &str, steps: &[Step]) -> Option<Result<(Source, Type), String>> {
        let f = self.field?;
        Some(match (variable, steps) {
            ("value", _) => {
                let mut path = vec![Step::Key(f.name.to_string())];
                path.extend_from_slice(steps);
                pointer(&path).map(|p| (Source::Message(p), Type::Dyn))
            }
            ("name", []) => Ok((Source::Text(f.name.as_bytes().into()), Type::String)),
            ("typeName", []) => Ok((Source::Text(f.type_name.as_bytes().into()), Type::String)),
            ("name" | "typeName", _) => Err(format!("`{variable}` is a string, it has no fields")),
            ("tags" | "fullName", _) => Err(format!(
                "`{variable}` is not supported (the names are value, name, typeName and message)"
            )),
            _ => return None,
        })
    }
}

impl Resolver for Names<'_> {
    fn resolve(&mut self, variable: &str, steps: &[Step]) -> Result<(u32, Type), String> {
        if let Some(r) = self.field_name(variable, steps) {
            let (source, t) = r?;
            return Ok((self.slot(source), t));
        }
        let (source, t) = match (variable, steps) {
            ("message", _) => (Source::Message(pointer(steps)?), Type::Dyn),
            ("headers", [Step::Key(name)]) => {
                (Source::Header(name.as_bytes().into()), Type::Bytes)
            }
            ("headers", _) => {
                return Err(
                    "`headers` is read by name only: headers[\"name\"], \"name\" in headers".into(),
                )
            }
            ("key", []) => (Source::Key, Type::Dyn),
            ("timestamp", []) => (Source::Timestamp, Type::Int),
            ("key" | "timestamp", _) => {
                return Err(format!(
                    "`{}` has no fields ({variable} is a record's {})",
                    render(variable, steps),
                    if variable == "key" { "key bytes" } else { "time in ms" }
                ))
            }
            _ => {
                return Err(format!(
                    "undeclared reference to `{variable}` (the names are message, key, headers and timestamp)"
                ))
            }
        };
        Ok((self.slot(source), t))
    }
}

/// The JSON pointer of a path under `message`.
fn pointer(steps: &[Step]) -> Result<Pointer, String> {
    let mut text = String::new();
    for s in steps {
        text.push('/');
        match s {
            Step::Key(k) => text.push_str(&k.replace('~', "~0").replace('/', "~1")),
            Step::Index(i) => text.push_str(&i.to_string()),
        }
    }
    Pointer::parse(&text)
}

impl CelRule {
    pub(crate) fn new(name: Option<&str>, text: &str) -> Result<CelRule, CompileError> {
        let id = match name {
            Some(n) => format!("cel:{n}"),
            None => {
                let flat: Vec<&str> = text.split_whitespace().collect();
                let flat = flat.join(" ");
                match flat.char_indices().nth(80) {
                    Some((cut, _)) => format!("cel:{}...", &flat[..cut]),
                    None => format!("cel:{flat}"),
                }
            }
        };
        Self::named(id, text, None)
    }

    /// A condition whose failures are named `id`; with `field`, a data
    /// contract's CEL_FIELD rule on that field.
    pub(crate) fn named(
        id: String,
        text: &str,
        field: Option<FieldScope<'_>>,
    ) -> Result<CelRule, CompileError> {
        let mut names = Names {
            sources: Vec::new(),
            field,
        };
        let program = compile(text, &mut names)?;
        let two = program.two_fields().and_then(|(a, b, holds)| {
            match (
                names.sources.get(a as usize)?,
                names.sources.get(b as usize)?,
            ) {
                (Source::Message(a), Source::Message(b)) => Some((a.clone(), b.clone(), holds)),
                _ => None,
            }
        });
        Ok(CelRule {
            id,
            program,
            sources: names.sources.into_boxed_slice(),
            two,
        })
    }

    /// Whether it reads nothing of a record (a CEL_FIELD guard on `name`
    /// and `typeName` only).
    pub(crate) fn is_constant(&self) -> bool {
        self.sources.iter().all(|s| matches!(s, Source::Text(_)))
    }

    /// Its value when it reads nothing of a record ([`Self::is_constant`]).
    pub(crate) fn constant(&self) -> Result<bool, String> {
        let record = Record {
            offset: 0,
            timestamp: 0,
            key: None,
            value: None,
            headers: Vec::new(),
        };
        let slots = RecordSlots {
            doc: &serde_json::Value::Null,
            record: &record,
            sources: &self.sources,
        };
        match self.program.eval(&slots) {
            Ok(b) => Ok(b),
            Err(e) => Err(self.error(&e)),
        }
    }

    /// The pointers of the fields it reads, for the captures' slots.
    pub(crate) fn pointers_mut(&mut self) -> impl Iterator<Item = &mut Pointer> {
        let sources = self.sources.iter_mut().filter_map(|s| match s {
            Source::Message(p) => Some(p),
            _ => None,
        });
        let two = self.two.iter_mut().flat_map(|(a, b, _)| [a, b]);
        sources.chain(two)
    }

    /// Its shortcut, when it orders two fields: their pointers and the
    /// orderings (less, equal, greater) for which it holds, judged by
    /// [`ordered`] when both fields are numbers.
    pub(crate) fn two(&self) -> Option<(&Pointer, &Pointer, [bool; 3])> {
        self.two.as_ref().map(|(a, b, holds)| (a, b, *holds))
    }

    /// Whether the condition is true for this record.
    #[inline]
    pub(crate) fn holds<D: Doc + ?Sized>(&self, doc: &D, record: &Record<'_>) -> bool {
        if let Some((a, b, holds)) = &self.two {
            if let (Some(Field::Number(x)), Some(Field::Number(y))) = (doc.field(a), doc.field(b)) {
                return ordered(x, y, holds);
            }
        }
        let slots = RecordSlots {
            doc,
            record,
            sources: &self.sources,
        };
        self.program.eval(&slots) == Ok(true)
    }

    /// [`Self::holds`], or the reason it does not (poison, this rule).
    #[cold]
    pub(crate) fn check<D: Doc + ?Sized>(
        &self,
        doc: &D,
        record: &Record<'_>,
    ) -> Result<(), Invalid> {
        let slots = RecordSlots {
            doc,
            record,
            sources: &self.sources,
        };
        let reason = match self.program.eval(&slots) {
            Ok(true) => return Ok(()),
            Ok(false) => format!("`{}` is false{}", self.program.text(), self.values(&slots)),
            Err(e) => self.error(&e),
        };
        Err(Invalid::poison(&self.id, reason))
    }

    fn error(&self, e: &EvalError) -> String {
        format!("`{}`: {}", self.program.text(), self.program.explain(e))
    }

    /// The fields the condition read, as the record has them: `(message.a
    /// = 1, message.b = "x")`, at most eight.
    fn values<D: Doc + ?Sized>(&self, slots: &RecordSlots<'_, D>) -> String {
        let shown: Vec<String> = self
            .program
            .paths()
            .iter()
            .take(8)
            .map(|(slot, path)| match slots.get(*slot) {
                Some(v) => format!("{path} = {}", super::value::show(v)),
                None => format!("{path} missing"),
            })
            .collect();
        if shown.is_empty() {
            String::new()
        } else {
            format!(" ({})", shown.join(", "))
        }
    }
}

/// Whether numbers `x` and `y` are ordered as `holds` (less, equal,
/// greater) allows, by CEL's order of numbers (`cel::value::order`): two
/// integers, or two doubles, compared directly.
#[inline(always)]
pub(crate) fn ordered(x: &serde_json::Number, y: &serde_json::Number, holds: &[bool; 3]) -> bool {
    let ord = match (x.as_i64(), y.as_i64()) {
        (Some(p), Some(q)) => Some(p.cmp(&q)),
        _ if x.is_f64() && y.is_f64() => x
            .as_f64()
            .zip(y.as_f64())
            .and_then(|(p, q)| p.partial_cmp(&q)),
        _ => order(Val::of_number(x), Val::of_number(y)).ok().flatten(),
    };
    ord.is_some_and(|o| holds[(o as i8 + 1) as usize])
}

/// A record's values by a CEL rule's slots.
struct RecordSlots<'r, D: ?Sized> {
    doc: &'r D,
    record: &'r Record<'r>,
    sources: &'r [Source],
}

impl<D: Doc + ?Sized> Slots for RecordSlots<'_, D> {
    /// Inlined into the operator reading it, so that the value is not
    /// returned through memory and matched twice.
    #[inline(always)]
    fn get(&self, slot: u32) -> Option<Val<'_>> {
        Some(match self.sources.get(slot as usize)? {
            Source::Message(p) => match self.doc.field(p)? {
                Field::Null => Val::Null,
                Field::Bool(b) => Val::Bool(b),
                Field::Number(n) => Val::of_number(n),
                Field::Str(s) => Val::Str(s),
                Field::Composite(v) => Val::of_json(v),
            },
            Source::Header(name) => {
                let h = self.record.headers.iter().find(|h| h.key == &name[..])?;
                h.value.map_or(Val::Null, Val::Bytes)
            }
            Source::Key => self.record.key.map_or(Val::Null, Val::Bytes),
            Source::Timestamp => Val::Int(self.record.timestamp),
            Source::Text(t) => Val::Str(t),
        })
    }
}
