#!/usr/bin/env python3
"""Cycles between sibling modules of each crate, against a recorded list.

Two modules that share a parent form an edge A -> B when code under A names
an item under B (`use crate::…`, `super::…`, or a path written inline). A
strongly connected set of siblings is a cycle: neither can be understood,
tested or moved without the other. The cycles that exist are recorded in
scripts/module-cycles.txt; this check fails on a cycle that is not recorded
(a new one) and on a recorded one that is gone (so the list only shrinks,
and says what is left to untangle).

    scripts/check-module-cycles.py            # check
    scripts/check-module-cycles.py --print    # the cycles as they are now
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "scripts" / "module-cycles.txt"
CRATES = ["attestation", "enclave", "host", "client-sdk", "wire", "tls-pq", "tests"]


def module_of(src: Path, file: Path) -> tuple[str, ...]:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"'(?:\\.|[^'\\])'", "' '", text)


def use_paths(tree: str, prefix: str = "") -> list[str]:
    """Every path a `use` tree names: `a::{b, c::{d, e}}` gives a::b, a::c::d, a::c::e."""
    tree = tree.strip()
    if not tree:
        return []
    m = re.match(r"^([\w:]*?)(?:::)?\{(.*)\}$", tree, re.S)
    if m:
        head = m.group(1)
        inner, depth, parts, cur = m.group(2), 0, [], ""
        for ch in inner:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        base = f"{prefix}::{head}" if prefix and head else (head or prefix)
        return [p for part in parts for p in use_paths(part, base)]
    tree = re.split(r"\s+as\s+", tree)[0]
    return [f"{prefix}::{tree}" if prefix else tree]


def without_test_modules(code: str) -> str:
    """The code without its inline `#[cfg(test)] mod … { … }` blocks (unit
    tests look down into what they test; they are not the module's design)."""
    out, pos = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", code):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        out.append(code[pos:m.start()])
        pos = i
    out.append(code[pos:])
    return "".join(out)


def references(text: str) -> list[str]:
    code = without_test_modules(strip_comments(text))
    out = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        out.extend(use_paths(m.group(1)))
    out.extend(m.group(0) for m in re.finditer(r"\b(?:crate|super)(?:::\w+)+", code))
    return out


def resolve(path: str, here: tuple[str, ...]) -> tuple[str, ...] | None:
    parts = [p for p in path.split("::") if p]
    if not parts:
        return None
    if parts[0] == "crate":
        return tuple(parts[1:])
    if parts[0] in ("super", "self"):
        base = list(here)
        while parts and parts[0] in ("super", "self"):
            if parts.pop(0) == "super" and base:
                base.pop()
        return tuple(base + parts)
    return None


def cycles(crate: str) -> list[str]:
    src = ROOT / crate / "src"
    if not src.is_dir():
        return []
    files = sorted(src.rglob("*.rs"))
    modules = {module_of(src, f) for f in files}
    edges: dict[tuple[str, ...], dict[str, set[str]]] = {}
    for f in files:
        if f.name.endswith("_tests.rs") or f.name == "tests.rs":
            continue  # unit tests look down into what they test
        here = module_of(src, f)
        # `super` of x/a.rs (module x::a) is x, and of x/mod.rs (module x)
        # is x's parent: popping one name from the module does both.
        for ref in references(f.read_text(encoding="utf-8")):
            target = resolve(ref, here)
            if target is None:
                continue
            # The longest prefix that is a module.
            while target and target not in modules:
                target = target[:-1]
            common = 0
            while common < min(len(here), len(target)) and here[common] == target[common]:
                common += 1
            if common == len(here) or common == len(target):
                continue  # an ancestor or a descendant: not between siblings
            parent = here[:common]
            edges.setdefault(parent, {}).setdefault(here[common], set()).add(target[common])
    found = []
    for parent, graph in edges.items():
        for scc in strongly_connected(graph):
            if len(scc) > 1:
                where = "::".join(("crate",) + parent)
                found.append(f"{crate}: {where}: {', '.join(sorted(scc))}")
    return sorted(found)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    nodes = set(graph) | {t for ts in graph.values() for t in ts}

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            out.append(scc)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    now = [c for crate in CRATES for c in cycles(crate)]
    if "--print" in sys.argv:
        print("\n".join(now))
        return 0
    recorded = [l.strip() for l in RECORD.read_text().splitlines() if l.strip() and not l.startswith("#")]
    new = [c for c in now if c not in recorded]
    gone = [c for c in recorded if c not in now]
    for c in new:
        print(f"new module cycle: {c}")
    for c in gone:
        print(f"recorded cycle no longer there (remove it from {RECORD.relative_to(ROOT)}): {c}")
    print(f"check-module-cycles: {len(now)} cycle(s), all recorded" if not (new or gone) else "check-module-cycles: FAIL")
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
