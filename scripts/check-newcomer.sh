#!/usr/bin/env bash
# A newcomer's first hour, as the docs write it. Commands and code are read
# from docs/apps.md, so an edit there that breaks them fails here:
#  1. "Quickstart": `scripts/demo.sh --keep` on the documented address
#     (127.0.0.1:8080); the demo itself fails unless its answer names Paris;
#  2. "From Python": the install commands as written (a .venv in the
#     checkout, maturin, the wheel), then the example, against that cluster
#     with the documented URL and policy path; it must say SIMULATED (True)
#     and answer;
#  3. "From JavaScript": `npm install` of the built package into a new app
#     directory (the doc's /path/to/veil is this checkout), then its app.mjs
#     as written; its greedy answer must name Paris.
# The serving part runs in a new network namespace (loopback only), so the
# documented ports are free and nothing leaves the machine; PyPI installs
# happen before, outside it.
#
#   scripts/check-newcomer.sh [--fast]
#     --fast  (CI) what the test command built where the docs build with
#             --release: demo.sh runs target/debug's binaries
#             (VEIL_DEMO_BIN), and maturin builds the dev profile. The release
#             builds take about 10 minutes on 2 cores, more than CI's budget
#             has left. Said on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
case "${1:-}" in
  --fast) fast=1 ;;
  -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "check-newcomer.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
repo="$(pwd)"
say() { echo "newcomer: $*"; }

# The fenced blocks of one language under the docs/apps.md heading that
# starts with $1, up to the next heading of the same or a higher level.
blocks() {
  python3 - "$1" "$2" <<'PY'
import re, sys
title, lang = sys.argv[1], sys.argv[2]
lines = open("docs/apps.md", encoding="utf-8").read().split("\n")
level, out, fence = None, [], None
for line in lines:
    m = re.match(r"^(#+) (.*)", line) if fence is None else None
    if m:
        if level is not None and len(m.group(1)) <= level:
            break
        if level is None and m.group(2).startswith(title):
            level = len(m.group(1))
        continue
    if level is None:
        continue
    if fence is None and line.startswith("```"):
        fence = line[3:].strip()
        continue
    if fence is not None and line.startswith("```"):
        if fence == lang:
            out.append("\x00")
        fence = None
        continue
    if fence == lang:
        out.append(line)
if level is None:
    sys.exit(f"docs/apps.md: no heading {title!r}")
sys.stdout.write("\n".join(out))
PY
}
# The Nth (from 1) block of `blocks` output.
nth() { python3 -c 'import sys; print(sys.stdin.read().split("\x00")[int(sys.argv[1]) - 1].strip("\n"))' "$1"; }
# A command line without its trailing comment.
command_of() { sed 's/[[:space:]]*#.*$//'; }

quickstart="$(blocks "Quickstart" sh | nth 1)"
demo="$(grep -E '^scripts/demo\.sh --keep' <<< "$quickstart" | command_of)"
[ "$demo" = "scripts/demo.sh --keep" ] || { say "FAIL: the Quickstart no longer shows scripts/demo.sh --keep"; exit 1; }
py_install="$(blocks "From Python" sh | nth 1)"
py_example="$(blocks "From Python" python | nth 1)"
js_install="$(blocks "From JavaScript" sh | nth 1)"
js_app="$(blocks "From JavaScript" js | nth 1)"
for v in py_install py_example js_install js_app; do
  [ -n "${!v}" ] || { say "FAIL: docs/apps.md has no $v block"; exit 1; }
done

scratch="$(mktemp -d)"
venv_before=0; [ -e .venv ] && venv_before=1
cleanup() {
  rm -rf "$scratch"
  [ "$venv_before" = 1 ] || rm -rf .venv
}
trap cleanup EXIT

# 2a. The Python install, as written (PyPI: outside the namespace).
say "From Python: install, as docs/apps.md writes it"
while IFS= read -r line; do
  line="$(command_of <<< "$line")"
  [ -n "$line" ] || continue
  if [ "$fast" = 1 ] && [[ "$line" == *"maturin build --release"* ]]; then
    line="${line/ --release/}"
    say "--fast: dev profile instead of --release: $line"
  fi
  echo "+ $line"
  bash -c "$line"
done <<< "$py_install"

# 3a. The JavaScript install: the package once, then into a new app.
say "From JavaScript: install, as docs/apps.md writes it"
mkdir -p "$scratch/my-app"
while IFS= read -r line; do
  line="$(command_of <<< "$line")"
  [ -n "$line" ] || continue
  line="${line//\/path\/to\/veil/$repo}"
  echo "+ $line"
  # Veil's own scripts run in the checkout; the rest where the app lives.
  if [[ "$line" == scripts/* ]]; then (cd "$repo" && bash -c "$line"); else (cd "$scratch" && bash -c "$line"); fi
done <<< "$js_install"
[ -d "$scratch/my-app/node_modules/veil-client" ] || { say "FAIL: npm did not install veil-client into the app"; exit 1; }
printf '%s\n' "$py_example" > "$scratch/example.py"
printf '%s\n' "$js_app" > "$scratch/my-app/app.mjs"

# What the demo downloads (crates for its release build, the model's wheel)
# comes before the namespace, which has no network.
if [ "$fast" = 0 ]; then
  say "fetching crates and the model (outside the namespace)"
  cargo fetch --locked
  scripts/fetch-model.sh > /dev/null
fi

# 1, 2b, 3b: serve and ask, in a network namespace of our own.
inner="$scratch/inner.sh"
cat > "$inner" <<'INNER'
set -euo pipefail
ip link set lo up
export CARGO_NET_OFFLINE=true
say() { echo "newcomer: $*"; }
say "Quickstart: $DEMO (in a network namespace)"
$DEMO < /dev/null | tee "$SCRATCH/demo.out"
pid="$(sed -n 's/^  stop: *kill \([0-9]*\)$/\1/p' "$SCRATCH/demo.out")"
[ -n "$pid" ] || { say "FAIL: demo.sh --keep printed no process to stop"; exit 1; }
trap 'kill -TERM "$pid" 2>/dev/null || true' EXIT
grep -q "^  URL: *http://127.0.0.1:8080$" "$SCRATCH/demo.out" || { say "FAIL: the demo is not on the documented URL"; exit 1; }

say "From Python: the example, as written"
.venv/bin/python "$SCRATCH/example.py" > "$SCRATCH/python.out"
cat "$SCRATCH/python.out"
# `print(route.checks, route.simulated, route.warnings)`: the tables, then
# " True [warnings]"; the three answers follow.
grep -q "^ True \[" "$SCRATCH/python.out" || { say "FAIL: the route is not reported simulated"; exit 1; }
answers="$(sed -n '/^ True \[/,$p' "$SCRATCH/python.out" | tail -n +2 | grep -c '[[:alnum:]]' || true)"
[ "$answers" -ge 2 ] || { say "FAIL: the Python example printed no answers"; exit 1; }

say "From JavaScript: app.mjs, as written"
node "$SCRATCH/my-app/app.mjs" > "$SCRATCH/js.out"
cat "$SCRATCH/js.out"
grep -q "SIMULATED" "$SCRATCH/js.out" || { say "FAIL: the JS verdict does not say SIMULATED"; exit 1; }
grep -qi "paris" "$SCRATCH/js.out" || { say "FAIL: the JS answer does not name Paris"; exit 1; }
INNER
demo_env=()
[ "$fast" = 1 ] && { demo_env=(VEIL_DEMO_BIN=target/debug); say "--fast: scripts/demo.sh with VEIL_DEMO_BIN=target/debug (the test command's build)"; }
ns=(unshare --net)
[ "$(id -u)" = 0 ] || ns=(unshare --net --map-root-user)
"${ns[@]}" true 2>/dev/null || { say "FAIL: cannot make a network namespace (${ns[*]})"; exit 1; }
env "${demo_env[@]}" DEMO="$demo" SCRATCH="$scratch" "${ns[@]}" bash "$inner"
say "PASS: quickstart, Python and JavaScript as docs/apps.md writes them"
