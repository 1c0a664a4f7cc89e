//! The [`Plan`]: which values a policy's rules read, compiled at load from
//! their pointers into a trie, with the schema's shape and the layouts
//! the readers learn; walked by every format's fast path.

#[cfg(test)]
use serde_json::Value;

#[cfg(test)]
use super::Captures;
use super::{flat, layout};
use crate::policy::rules::Pointer;
use crate::policy::shape::{same_key, Shape};

/// Which values the rules need, compiled at load from their pointers: a
/// trie of reference tokens. Node 0 is the document itself.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(super) nodes: Vec<Node>,
    pub(super) slots: usize,
    /// One pointer per slot, for resolving pointers below a captured
    /// array or object.
    pub(super) pointers: Vec<Pointer>,
    /// The policy's JSON Schema, when it compiles to the fast subset.
    pub(super) shape: Option<Shape>,
    /// The root's members for the flat reader, once the root has a layout
    /// (`None` inside when that layout is not flat).
    pub(super) flat: std::sync::OnceLock<Option<flat::Flat>>,
}

#[derive(Debug, Default)]
pub(super) struct Node {
    /// The slot of the pointer that ends here, if one does.
    pub(super) slot: Option<usize>,
    /// Tokens consumed to reach this node.
    pub(super) level: usize,
    /// Object key (and array index, when the token is one) → node.
    pub(super) children: Vec<(String, Option<usize>, usize)>,
    /// Slots of every pointer ending at or below this node.
    pub(super) below: Vec<usize>,
    /// The members of the first object the scanner read in full here.
    pub(super) layout: std::sync::OnceLock<layout::Layout>,
}

impl Plan {
    /// `pointers[i]` must have slot `i` (see `rules::assign_slots`).
    pub(crate) fn new(pointers: Vec<Pointer>, shape: Option<Shape>) -> Plan {
        let mut nodes = vec![Node::default()];
        for (slot, p) in pointers.iter().enumerate() {
            let mut cur = 0usize;
            nodes[0].below.push(slot);
            for (level, t) in p.tokens().iter().enumerate() {
                let found = nodes[cur]
                    .children
                    .iter()
                    .find(|(k, _, _)| *k == t.key)
                    .map(|c| c.2);
                cur = match found {
                    Some(n) => n,
                    None => {
                        nodes.push(Node {
                            level: level + 1,
                            ..Node::default()
                        });
                        let n = nodes.len() - 1;
                        nodes[cur].children.push((t.key.clone(), t.index, n));
                        n
                    }
                };
                nodes[cur].below.push(slot);
            }
            nodes[cur].slot = Some(slot);
        }
        Plan {
            nodes,
            slots: pointers.len(),
            pointers,
            shape,
            flat: std::sync::OnceLock::new(),
        }
    }

    /// The flat members of the root's learned layout, once there is one.
    pub(super) fn flat(&self) -> Option<&flat::Flat> {
        if let Some(f) = self.flat.get() {
            return f.as_ref();
        }
        let layout = self.nodes.first()?.layout.get()?;
        self.flat
            .get_or_init(|| flat::Flat::build(self, layout))
            .as_ref()
    }
}

/// Walking a [`Plan`] from decoders of other formats (Avro): trie node 0 is
/// the value itself.
impl Plan {
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// The slot of the pointer that ends at `node`, if one does.
    pub(crate) fn slot(&self, node: usize) -> Option<usize> {
        self.nodes.get(node).and_then(|n| n.slot)
    }

    /// The node below `node` for object key `key`.
    pub(crate) fn key_child(&self, node: usize, key: &str) -> Option<usize> {
        let n = self.nodes.get(node)?;
        n.children.iter().find(|c| same_key(&c.0, key)).map(|c| c.2)
    }

    /// The nodes below `node`: object key, array index (when the key is
    /// one), node.
    pub(crate) fn children(&self, node: usize) -> &[(String, Option<usize>, usize)] {
        self.nodes.get(node).map_or(&[], |n| &n.children)
    }

    /// Slots of every pointer ending at or below `node`.
    pub(crate) fn below(&self, node: usize) -> &[usize] {
        self.nodes.get(node).map_or(&[], |n| &n.below)
    }

    /// Whether `caps` holds, for every pointer, what the pointer finds in
    /// the fully decoded `value` (`Err` naming the first that differs).
    #[cfg(test)]
    pub(crate) fn same_fields(&self, caps: &Captures<'_>, value: &Value) -> Result<(), String> {
        use crate::policy::rules::Doc;
        for p in &self.pointers {
            let (fast, full) = (caps.field(p), value.field(p));
            if fast != full {
                return Err(format!("{p:?}: captured {fast:?}, decoded {full:?}"));
            }
        }
        Ok(())
    }
}
