#!/usr/bin/env bash
# Checks that deploy/cvm/build-ovmf.sh reproduces the published firmware from
# any path: it builds the firmware in N work directories of different depths
# and name lengths (default 2; about 3 minutes each on 2 cores) and compares
# every build's SHA-256 with the one deploy/README.md publishes (step 2,
# "Firmware"). Prints one line per build and exits 1 on any difference.
#
#   scripts/check-ovmf.sh [--builds N] [--keep FILE]
#     --keep FILE  copy the first build's OVMF.fd there (for `veil measure`)
# Needs what build-ovmf.sh needs (see its --help) and deb.debian.org.
set -euo pipefail
cd "$(dirname "$0")/.."
builds=2 keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --builds) builds="${2:?--builds needs a number}"; shift 2 ;;
    --keep) keep="${2:?--keep needs a file}"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-ovmf.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$builds" =~ ^[1-9][0-9]?$ ]] || { echo "check-ovmf.sh: --builds is 1 to 99" >&2; exit 2; }
published="$(sed -n 's/^ *`\([0-9a-f]\{64\}\)`\.$/\1/p' deploy/README.md | head -n 1)"
[ -n "$published" ] || { echo "check-ovmf.sh: deploy/README.md publishes no firmware SHA-256" >&2; exit 1; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
status=0
for i in $(seq 1 "$builds"); do
  # Paths of different lengths: the build must not depend on them.
  work="$scratch/b$i/$(printf 'w%.0s' $(seq 1 $((i * 7))))"
  started=$SECONDS
  deploy/cvm/build-ovmf.sh --out "$scratch/OVMF-$i.fd" --work "$work" > "$scratch/build-$i.log" 2>&1 ||
    { tail -n 30 "$scratch/build-$i.log" >&2; echo "check-ovmf.sh: build $i failed" >&2; exit 1; }
  got="$(sha256sum "$scratch/OVMF-$i.fd" | cut -d' ' -f1)"
  verdict=same; [ "$got" = "$published" ] || { verdict=DIFFERENT; status=1; }
  echo "ovmf build $i: $got ($verdict as published) in $((SECONDS - started)) s, work dir ${#work} characters long"
  rm -rf "$work"
done
[ -z "$keep" ] || cp "$scratch/OVMF-1.fd" "$keep"
[ "$status" = 0 ] && echo "ovmf: $builds builds at different paths equal the published $published"
exit "$status"
