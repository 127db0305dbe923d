#!/bin/sh
# Installs what slurm-ft's lab, demo and tests need on a Debian 12/13 machine, as root.
# Run by `make setup` (and so by `make demo` / `make test`). Idempotent: installs only what is missing.
set -eu
# lua5.1: the interpreter tests run job_submit.lua in (Debian's job_submit_lua.so links liblua5.1).
# slurmdbd + MariaDB's server and client cores: the lab's accounting, so `sacct` works (submitit
# polls it); the lab runs its own mariadbd, no system service is started (slurm_ft/lab/accounting.py).
PKGS="slurmctld slurmd slurm-client munge libslurm-dev gcc make python3 python3-venv procps iproute2 util-linux lua5.1
      slurmdbd mariadb-server-core mariadb-client-core"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# Debian's emulator build breaks multi-node steps (see docs/lab.md): refuse to run with it.
if dpkg-query -W -f='${Status}' slurm-wlm-emulator 2>/dev/null | grep -q "install ok installed"; then
    echo "setup: slurm-wlm-emulator is installed; remove it: apt-get remove slurm-wlm-emulator slurm-client-emulator" >&2
    exit 1
fi
