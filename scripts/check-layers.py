#!/usr/bin/env python3
"""Check the shape of the code: every module depends only on modules below
it, and no source file is too long to read in one sitting.

The layers, lowest first, are listed in LAYERS; a module may use modules in
its own layer or lower ones, never higher ones, and the module graph must
have no cycle. Edges are read from the source: every `crate::m`,
`antidote_core::m` and `use crate::{m, ..}` in a file of top-level module
`M` is an edge M -> m (comments are skipped). Prints the edges with
--print. Exit status 1 on any violation.

Source files (their code before `#[cfg(test)]`) may have at most
MAX_FILE_LINES lines; test-only files (tests.rs, *proptests.rs,
testutil.rs, mock_broker.rs) are exempt.

Run by scripts/test.sh; the picture it enforces is drawn in src/lib.rs and
crates/core/src/lib.rs.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. One line per layer; modules on one line may not form a cycle.
LAYERS = [
    # antidote-core (crates/core): no I/O.
    ["clock", "text"],
    ["kafka"],
    ["policy"],
    ["dlt_context"],
    ["dlt_record"],
    ["dlt_marker"],
    ["replay", "plan"],
    # antidote (src): the binary crate.
    ["sasl", "envsubst"],
    ["config"],
    ["transport"],
    ["metrics"],
    ["client"],
    ["registry"],
    ["engine"],
    ["dlt"],
    ["service"],
    ["console"],
    ["intercept", "admin"],
    ["cli", "proxy"],
    ["main"],
]
MAX_FILE_LINES = 600
TEST_FILES = re.compile(r"(^|_)(tests|proptests|testutil|mock_broker)\.rs$")
CRATES = {"core": ROOT / "crates" / "core" / "src", "antidote": ROOT / "src"}
ROOT_FILES = {"lib.rs", "mod.rs"}

USE_GROUP = re.compile(r"\b(?:crate|antidote_core)::\{")
PATH = re.compile(r"\b(?:crate|antidote_core)::([a-z_][a-z0-9_]*)")


def module_of(crate_root: Path, f: Path) -> str | None:
    rel = f.relative_to(crate_root)
    if rel.parts == ("lib.rs",):
        return None  # the crate root only declares and re-exports modules
    return rel.parts[0].removesuffix(".rs")


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def group_heads(text: str, start: int) -> list[str]:
    """Top-level names in the `{...}` that opens at `start`."""
    depth, item, heads = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                heads.append(item)
                break
        if depth == 1 and ch == ",":
            heads.append(item)
            item = ""
        elif depth >= 1:
            item += ch
    names = []
    for h in heads:
        m = re.match(r"\s*([a-z_][a-z0-9_]*)", h)
        if m and m.group(1) != "self":
            names.append(m.group(1))
    return names


def edges() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for crate_root in CRATES.values():
        for f in sorted(crate_root.rglob("*.rs")):
            src = module_of(crate_root, f)
            if src is None:
                continue
            text = strip_comments(f.read_text())
            used = set(PATH.findall(text))
            for m in USE_GROUP.finditer(text):
                used.update(group_heads(text, m.end() - 1))
            used.discard(src)
            out.setdefault(src, set()).update(used)
    return out


def long_files() -> list[str]:
    out = []
    for crate_root in CRATES.values():
        for f in sorted(crate_root.rglob("*.rs")):
            if TEST_FILES.search(f.name):
                continue
            code = f.read_text().split("#[cfg(test)]\nmod tests", 1)[0]
            n = code.count("\n")
            if n > MAX_FILE_LINES:
                out.append(f"{f.relative_to(ROOT)} has {n} lines of code (at most {MAX_FILE_LINES}): split it")
    return out


def main() -> int:
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    graph = edges()
    bad = []
    for src, dsts in sorted(graph.items()):
        if src not in rank:
            bad.append(f"module `{src}` is not in a layer: add it to LAYERS")
            continue
        for d in sorted(dsts):
            if d not in rank:
                bad.append(f"`{src}` uses `{d}`, which is not in a layer")
            elif rank[d] > rank[src]:
                bad.append(f"`{src}` (layer {rank[src]}) uses `{d}` (layer {rank[d]}), a layer above it")
    # Same-layer edges are allowed only without a cycle.
    seen, stack = set(), []

    def visit(n: str) -> None:
        if n in stack:
            bad.append("cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            return
        if n in seen:
            return
        seen.add(n)
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            visit(d)
        stack.pop()

    for n in sorted(graph):
        visit(n)
    if "--print" in sys.argv:
        for src, dsts in sorted(graph.items(), key=lambda kv: rank.get(kv[0], 99)):
            print(f"{src:11} -> {', '.join(sorted(dsts, key=lambda d: rank.get(d, 99)))}")
    bad += long_files()
    for b in bad:
        print("check-layers:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
