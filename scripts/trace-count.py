#!/usr/bin/env python3
"""Count the files, hops and re-entries of the traces in docs/traces/.

Each trace (docs/traces/*.txt: fetch, sharefetch, produce) is one
request's path through the code, from the client's frame read to the
frame written back, as a list of calls in execution order written by
reading the source (release build); its scenario is at its top. One line
per call:

    <indent>path/to/file.rs: function_name    # optional note

The indentation (two spaces a level) is the call depth: a line's caller is
the nearest line above it with less indentation; the first line is the
root (the connection's pumps, `relay.rs: relay_halves`). Blank lines and
lines starting with `#` are ignored.

The rule a list follows, so that two readers write the same list:
- A line is a call from a function in one source file into a function in
  another source file of the workspace (src/, crates/core/src/), once per
  call site, in the order the calls start. Calls within a file are not
  listed, but what the callee calls in other files is (under the caller
  shown). A call site in a loop is listed once (its first run).
- Not listed: std, tokio, kafka-protocol and other crates; calls made in
  tracing macros' arguments; Drop, Deref, derived traits (Default, Clone,
  PartialEq) and formatting (Display); per-connection set-up.
- A closure belongs to the function that defines it: calls it makes are
  that function's. It gets a line of its own (named after that function)
  only when code in another file calls it and it calls into the workspace
  in turn (a callback such as the `timed` closure or the per-record judge).
- Entered but not followed: the byte readers and writers of
  crates/core/src/kafka/ (cursor, batch, decoded, splice, marker, builder;
  the calls one function makes into one such file are one line, the
  first), network I/O (transport/frame.rs reads and writes, src/client/),
  the ledger's catch-up (dlt/ledger/tail.rs), the JSON readers
  (policy/json/) and the compiled rule checks (policy/checks.rs).
- Metrics calls are listed like any other (`metrics::global()` is a call
  into src/metrics/mod.rs).
- Work another task does for the request (the DLT writer's task) is listed
  under the call that hands it over (`submit`), before the wait for it.

Checked: every named function has a `fn name` definition in the named file
(so a rename or a move fails CI until the list follows), and every line's
file differs from its caller's. A stale entry is reported as
list-file:line and the exit status is 1.

Printed per trace:
  files       distinct source files entered (the root's included);
  hops        calls listed (every line but the root): each is a transition
              from the caller's file into another file;
  re-entries  hops into a file already entered earlier in the trace;
  most        the files entered most often.

`--max files,hops,reentries` (repeatable; `trace=f,h,r` for one trace)
fails when a trace is over budget. `--tree` prints the lists.

Usage: python3 scripts/trace-count.py [--max fetch=25,60,15] [--tree] [trace.txt ...]
Run by scripts/test.sh (stage "module layers and file sizes").
"""
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "docs" / "traces"
LINE = re.compile(r"^(?P<indent> *)(?P<path>[\w./-]+\.rs): (?P<fn>[A-Za-z_][A-Za-z0-9_]*)\s*(#.*)?$")

_defs: dict[Path, set[str]] = {}


def defined(path: Path) -> set[str]:
    if path not in _defs:
        text = path.read_text(encoding="utf-8")
        _defs[path] = set(re.findall(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", text))
    return _defs[path]


def shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def read(list_file: Path) -> tuple[list[tuple[int, int, str, str]], list[str]]:
    """(line number, depth, file, function) per entry, and the errors."""
    entries, errors = [], []
    stack: list[tuple[int, str]] = []  # (indent, file) of the open callers
    for n, raw in enumerate(list_file.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        where = f"{shown(list_file)}:{n}"
        m = LINE.match(raw.rstrip())
        if not m:
            errors.append(f"{where}: not `path/to/file.rs: function_name`: {raw.strip()}")
            continue
        indent, path, fn = len(m["indent"]), m["path"], m["fn"]
        if indent % 2:
            errors.append(f"{where}: indentation must be a multiple of two spaces")
        src = ROOT / path
        if not src.is_file():
            errors.append(f"{where}: no file {path}")
        elif fn not in defined(src):
            errors.append(f"{where}: no `fn {fn}` in {path}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if entries and not stack:
            errors.append(f"{where}: a second root (only the first line may be unindented)")
        elif stack and stack[-1][0] + 2 != indent:
            errors.append(f"{where}: indented more than one level below its caller")
        if stack and stack[-1][1] == path:
            errors.append(f"{where}: a call within {path} (only calls into another file are listed)")
        stack.append((indent, path))
        entries.append((n, indent // 2, path, fn))
    return entries, errors


def count(entries) -> dict:
    seen, reentries = set(), 0
    entered = Counter()
    for i, (_, _, path, _) in enumerate(entries):
        entered[path] += 1
        if i and path in seen:
            reentries += 1
        seen.add(path)
    return {
        "files": len(seen),
        "hops": max(len(entries) - 1, 0),
        "reentries": reentries,
        "entered": entered,
    }


def budgets(args: list[str], names: list[str]) -> dict[str, tuple[int, int, int]]:
    out = {}
    for a in args:
        name, _, spec = a.rpartition("=")
        f, h, r = (int(x) for x in spec.split(","))
        for t in [name] if name else names:
            out[t] = (f, h, r)
    return out


def main() -> int:
    argv = sys.argv[1:]
    tree = "--tree" in argv
    argv = [a for a in argv if a != "--tree"]
    maxes, files = [], []
    while argv:
        a = argv.pop(0)
        if a == "--max":
            maxes.append(argv.pop(0))
        elif a.startswith("--max="):
            maxes.append(a.split("=", 1)[1])
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            files.append(Path(a).resolve())
    files = files or sorted(TRACES.glob("*.txt"))
    if not files:
        print(f"trace-count: no traces in {TRACES}", file=sys.stderr)
        return 1
    limit = budgets(maxes, [f.stem for f in files])
    failed = False
    for f in files:
        entries, errors = read(f)
        for e in errors:
            print(f"trace-count: {e}", file=sys.stderr)
        failed |= bool(errors)
        c = count(entries)
        top = ", ".join(f"{p} {k}" for p, k in c["entered"].most_common(5))
        print(f"{f.stem}: {c['files']} files, {c['hops']} hops, {c['reentries']} re-entries")
        print(f"  most entered: {top}")
        if tree:
            for _, depth, path, fn in entries:
                print(f"    {'  ' * depth}{path}: {fn}")
        if f.stem in limit:
            lf, lh, lr = limit[f.stem]
            over = [
                f"{what} {got} > {most}"
                for what, got, most in (("files", c["files"], lf), ("hops", c["hops"], lh), ("re-entries", c["reentries"], lr))
                if got > most
            ]
            if over:
                print(f"trace-count: {f.stem} over budget: {', '.join(over)}", file=sys.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
