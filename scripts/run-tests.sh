#!/bin/sh
# `make test`: the unit + native lab suite, then the Docker lab suite on Slurm 24.11, 22.05 and
# 26.05 (docs/lab.md). Runs every part even when one fails, prints the time each took, and exits
# non-zero if any failed. SLURM_FT_DOCKER_VERSIONS="24.11" limits the Docker versions.
set -u
PY=${PY:-.venv/bin/python}
VERSIONS=${SLURM_FT_DOCKER_VERSIONS:-"24.11 22.05 26.05"}
failed=""
summary=""
part() {  # part NAME COMMAND...
    name=$1; shift
    t0=$(date +%s)
    echo "=== $name: $*"
    if "$@"; then st=ok; else st=FAILED; failed="$failed $name"; fi
    took=$(( $(date +%s) - t0 ))
    echo "=== $name: $st in ${took} s"
    summary="$summary
  $name: $st in ${took} s"
}
part unit+native-lab "$PY" -m pytest -q -ra
for v in $VERSIONS; do
    part "docker-image-$v" "$PY" -m slurm_ft.cli.main lab build-image --slurm "$v"
    part "docker-lab-$v" env SLURM_FT_LAB_SLURM="$v" "$PY" -m pytest -q -ra -m docker
    "$PY" -m slurm_ft.cli.main lab down --engine docker --slurm "$v" >/dev/null 2>&1 || true
done
echo "=== test summary:$summary"
[ -z "$failed" ] || { echo "=== failed:$failed" >&2; exit 1; }
