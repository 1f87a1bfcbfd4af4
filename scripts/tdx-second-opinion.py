#!/usr/bin/env python3
"""Veil's TDX verdicts beside dcap-qvl's (Phala's verifier, PyPI `dcap-qvl`), on
the real samples in $VEIL_VECTORS/tdx-dcap-qvl and on edits of them: a flipped
bit in each signed region, a debuggable TD, expired collateral, another
platform's collateral. Prints a table; exits 1 if the two disagree on any
accept/refuse verdict (or on the TCB status of an accepted quote).

    python3 scripts/tdx-second-opinion.py [PATH/TO/veil]

Needs `pip install dcap-qvl==0.7.0`. Veil runs with --any-measurement (dcap-qvl
pins no MRTD); both refuse a debuggable TD and a TD without SEPT_VE_DISABLE by default.
"""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

import dcap_qvl

veil = sys.argv[1] if len(sys.argv) > 1 else "target/debug/veil"
vectors = os.environ.get("VEIL_VECTORS") or os.path.join(os.path.dirname(__file__), "../../shared/vectors")
d = os.path.join(vectors, "tdx-dcap-qvl")


def read(name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def later_issue_plus_hour(collateral):
    c = json.loads(collateral)
    t = max(json.loads(c[k])["issueDate"] for k in ("tcb_info", "qe_identity"))
    return int(datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()) + 3600


def iso(secs):
    return datetime.fromtimestamp(secs, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def theirs(quote, collateral, at):
    try:
        r = dcap_qvl.verify(quote, dcap_qvl.QuoteCollateralV3.from_json(collateral.decode()), at)
        return True, r.status
    except Exception as e:  # dcap-qvl raises ValueError with its reason
        return False, str(e).replace("Verification failed: ", "")[:60]


def ours(quote, collateral, at):
    with tempfile.TemporaryDirectory() as t:
        q, c = os.path.join(t, "quote"), os.path.join(t, "collateral.json")
        open(q, "wb").write(quote)
        open(c, "wb").write(collateral)
        out = subprocess.run(
            [veil, "attest", "verify", "--tdx", q, "--collateral", c, "--at", iso(at), "--any-measurement", "--json"],
            capture_output=True,
        )
    if out.returncode == 2:
        return False, "unreadable: " + out.stderr.decode().strip()[:50]
    v = json.loads(out.stdout)
    if v["accepted"]:
        return True, v["tcb_status"]
    first = next(r for r in v["checks"] if r["status"] == "failed")
    return False, first["check"]


def flip(b, at, mask=1):
    b = bytearray(b)
    b[at] ^= mask
    return bytes(b)


good, good_c = read("tdx_quote"), read("tdx_quote_collateral.json")
old, old_c = read("tdx_quote_outdated"), read("tdx_quote_outdated_collateral.json")
t_good, t_old = later_issue_plus_hour(good_c), later_issue_plus_hour(old_c)
body = 48
cases = [
    ("up-to-date sample", good, good_c, t_good),
    ("outdated sample", old, old_c, t_old),
    ("up-to-date sample, a year later", good, good_c, t_good + 365 * 86400),
    ("up-to-date sample, before its collateral", good, good_c, t_good - 7200),
    ("up-to-date quote, other FMSPC's collateral", good, old_c, t_old),
    ("flipped bit: header", flip(good, 30), good_c, t_good),
    ("flipped bit: TEE_TCB_SVN", flip(good, body + 2), good_c, t_good),
    ("flipped bit: MRTD", flip(good, body + 136), good_c, t_good),
    ("flipped bit: REPORTDATA", flip(good, body + 583), good_c, t_good),
    ("flipped bit: quote signature", flip(good, body + 584 + 4 + 5), good_c, t_good),
    ("flipped bit: attestation key", flip(good, body + 584 + 4 + 71), good_c, t_good),
    ("flipped bit: QE report", flip(good, body + 584 + 4 + 128 + 6 + 70), good_c, t_good),
    ("flipped bit: QE auth data", flip(good, body + 584 + 4 + 128 + 6 + 384 + 64 + 2 + 3), good_c, t_good),
    ("TD attributes: DEBUG set", flip(good, body + 120), good_c, t_good),
]
rows, disagree = [], 0
for name, q, c, at in cases:
    (a_ok, a_why), (b_ok, b_why) = ours(q, c, at), theirs(q, c, at)
    same = a_ok == b_ok and (not a_ok or a_why == b_why)
    disagree += not same
    rows.append((name, ("ACCEPT " if a_ok else "REFUSE ") + a_why, ("ACCEPT " if b_ok else "REFUSE ") + b_why, "yes" if same else "NO"))
w = [max(len(r[i]) for r in rows + [("case", "Veil", "dcap-qvl 0.7.0", "agree")]) for i in range(4)]
for r in [("case", "Veil", f"dcap-qvl {dcap_qvl.__version__}", "agree")] + rows:
    print("  ".join(x.ljust(w[i]) for i, x in enumerate(r)))
print(f"tdx-second-opinion: {len(rows) - disagree} of {len(rows)} cases agree")
sys.exit(1 if disagree else 0)
