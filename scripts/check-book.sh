#!/usr/bin/env bash
# The book under docs/: every relative link in the repository's Markdown
# resolves (scripts/check-links.py), and mdBook renders it to target/book.
# mdBook is taken from PATH at the pinned version, else built once from
# crates.io into the cache (about 2 minutes on 2 cores; no server or watcher).
#
#   scripts/check-book.sh          # then open target/book/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
VERSION="0.5.4"

python3 scripts/check-links.py

mdbook=mdbook
if ! command -v mdbook >/dev/null || [ "$(mdbook --version)" != "mdbook v$VERSION" ]; then
  root="${VEIL_CACHE:-$HOME/.cache/veil}/tools/mdbook-$VERSION"
  mdbook="$root/bin/mdbook"
  if [ ! -x "$mdbook" ]; then
    echo "building mdBook $VERSION from crates.io into $root" >&2
    cargo install --quiet --locked --no-default-features --features search \
      --version "$VERSION" --root "$root" mdbook
  fi
fi
rm -rf target/book
out="$("$mdbook" build docs 2>&1)" || { echo "$out" >&2; echo "check-book.sh: mdbook build failed" >&2; exit 1; }
# mdBook warns (a missing file to include, say) and still succeeds: fail on it.
if grep -E 'WARN|ERROR' <<<"$out"; then echo "check-book.sh: mdbook warned" >&2; exit 1; fi
[ -f target/book/index.html ] || { echo "check-book.sh: mdbook wrote no target/book/index.html" >&2; exit 1; }
echo "the book: target/book/index.html ($(find target/book -name '*.html' | wc -l) pages)"
