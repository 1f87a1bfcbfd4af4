#!/usr/bin/env python3
"""Every relative link in the repository's Markdown resolves.

For each tracked `*.md` file, every inline link or image `[text](target)`
outside code must name a file or folder that exists, relative to the file,
and a `#fragment` must name a heading of the target (GitHub's anchors:
lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats).
mdBook's `{{#include FILE}}` counts as the included file's headings. The
book's chapters (docs/SUMMARY.md) must exist, and a chapter must not link out
of docs/, where the rendered book would have no page for it.

    scripts/check-links.py        # exit 1 and one line per broken link
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")


def prose(text: str) -> str:
    """The text with fenced code blocks and inline code blanked out."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(out)


def expanded(path: Path, depth: int = 0) -> str:
    text = path.read_text(encoding="utf-8")
    if depth < 4:
        def include(m: re.Match) -> str:
            target = (path.parent / m.group(1)).resolve()
            return expanded(target, depth + 1) if target.is_file() else m.group(0)

        text = INCLUDE.sub(include, text)
    return text


def slug(heading: str) -> str:
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    heading = heading.strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def heading_texts(path: Path) -> list[str]:
    """Headings with their inline code kept (prose() blanks it)."""
    out, fence = [], False
    for line in expanded(path).split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            fence = not fence
        elif not fence:
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if m:
                out.append(m.group(2))
    return out


def anchor_set(path: Path, cache: dict) -> set[str]:
    if path not in cache:
        seen: dict[str, int] = {}
        out = set()
        for h in heading_texts(path):
            base = slug(h.replace("`", ""))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        cache[path] = out
    return cache[path]


def main() -> int:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    paths = [ROOT / p for p in files.stdout.split() if not p.startswith(("fuzz/corpus", "third_party/"))]
    chapters = set()
    summary = BOOK / "SUMMARY.md"
    errors = []
    if summary.exists():
        for target in LINK.findall(prose(summary.read_text(encoding="utf-8"))):
            chapter = (BOOK / target).resolve()
            chapters.add(chapter)
            if not chapter.is_file():
                errors.append(f"docs/SUMMARY.md: chapter {target} does not exist")
    cache: dict = {}
    checked = 0
    for path in paths:
        if not path.is_file():
            continue
        text = prose(path.read_text(encoding="utf-8"))
        rel = path.relative_to(ROOT)
        for lineno, line in enumerate(text.split("\n"), 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # http:, https:, mailto:
                checked += 1
                file_part, _, fragment = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                where = f"{rel}:{lineno}: {target}"
                if not dest.exists():
                    errors.append(f"{where}: no such file")
                    continue
                if path.resolve() in chapters and file_part and BOOK not in dest.parents and dest != BOOK:
                    errors.append(f"{where}: a book chapter links out of docs/ (no page for it in the book)")
                if fragment and dest.suffix == ".md" and fragment not in anchor_set(dest, cache):
                    errors.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    for e in errors:
        print(e)
    print(f"check-links: {checked} relative links in {len(paths)} Markdown files, {len(errors)} broken")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
