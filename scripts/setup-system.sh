#!/bin/sh
# Installs what slurm-ft's lab, demo and tests need on a Debian 12/13 machine, as root.
# Run by `make setup` (and so by `make demo` / `make test`). Idempotent: installs only what is missing.
set -eu
# chromium: the drain report's browser test renders the HTML report headless (tests/test_report_browser.py).
# lua5.1: the interpreter tests run job_submit.lua in (Debian's job_submit_lua.so links liblua5.1).
# slurmdbd + MariaDB's server and client cores: the lab's accounting, so `sacct` works (submitit
# polls it); the lab runs its own mariadbd, no system service is started (slurm_ft/lab/accounting.py).
PKGS="slurmctld slurmd slurm-client munge libslurm-dev gcc make python3 python3-venv procps iproute2 util-linux lua5.1
      slurmdbd mariadb-server-core mariadb-client-core
      docker.io debootstrap
      chromium"
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
# Docker lab (slurm_ft/lab/docker_engine.py, docs/lab.md): docker.io + debootstrap build its images
# offline. Start dockerd if nothing answers, with explicit address pools so that its bridges never
# collide with a site network (docker0 172.30.0.1/24, user networks from 172.31.0.0/16; the lab's own
# network is 172.31.240.0/24).
if ! docker version >/dev/null 2>&1; then
    if [ -z "$(pidof dockerd 2>/dev/null || true)" ]; then
        echo "setup: starting dockerd (log /var/log/slurm-ft-dockerd.log)"
        mkdir -p /var/log
        nohup /usr/sbin/dockerd --bip 172.30.0.1/24 \
            --default-address-pool base=172.31.0.0/16,size=24 \
            >>/var/log/slurm-ft-dockerd.log 2>&1 </dev/null &
    fi
    i=0
    until docker version >/dev/null 2>&1; do
        i=$((i + 1))
        if [ "$i" -gt 60 ]; then echo "setup: dockerd did not answer in 30 s (see /var/log/slurm-ft-dockerd.log)" >&2; exit 1; fi
        sleep 0.5
    done
fi
# Debian's emulator build breaks multi-node steps (see docs/lab.md): refuse to run with it.
if dpkg-query -W -f='${Status}' slurm-wlm-emulator 2>/dev/null | grep -q "install ok installed"; then
    echo "setup: slurm-wlm-emulator is installed; remove it: apt-get remove slurm-wlm-emulator slurm-client-emulator" >&2
    exit 1
fi
