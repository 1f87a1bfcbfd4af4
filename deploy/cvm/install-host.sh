#!/usr/bin/env bash
# Installs the host side of a Veil shard machine (run as root on the SEV-SNP
# host): launch-snp.sh and qemu-ifup in /usr/local/lib/veil, the units in
# /etc/systemd/system, veil-host in /usr/local/bin (for the relay), and
# /etc/veil/cvm for the per-guest environment files.
set -euo pipefail
case "${1:-}" in
  -h|--help)
    echo "usage: install-host.sh [--veil-host BIN]   (as root; then write /etc/veil/cvm/stageN-R.env, see launch-snp.sh --help)"
    exit 0 ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"
veil_host=""
if [ "${1:-}" = --veil-host ]; then veil_host="${2:?--veil-host needs a file}"; fi
[ "$(id -u)" -eq 0 ] || { echo "install-host.sh: run as root" >&2; exit 2; }
install -d -m 0755 /usr/local/lib/veil /etc/veil/cvm /etc/veil/relay
install -m 0755 "$here/launch-snp.sh" "$here/qemu-ifup" /usr/local/lib/veil/
install -m 0644 "$here/veil-cvm@.service" "$here/veil-relay.service" /etc/systemd/system/
[ -z "$veil_host" ] || install -m 0755 "$veil_host" /usr/local/bin/veil-host
systemctl daemon-reload
echo "installed; next: /etc/veil/cvm/stage0-0.env (launch-snp.sh --help), systemctl enable --now veil-cvm@stage0-0"
