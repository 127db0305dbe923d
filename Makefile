# slurm-ft: the README's two commands are `make demo` and `make test` (as root, Debian 12/13).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LAB_DIR ?= /var/tmp/slurm-ft-lab

.PHONY: setup system venv demo test test-unit test-docker lab-up lab-down spank bench clean deb

setup: system venv spank

system:
	sh scripts/setup-system.sh

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

spank:
	@if [ -f spank/Makefile ]; then $(MAKE) -s -C spank; fi

demo: setup
	$(PY) -m slurm_ft.cli.main lab demo --dir $(LAB_DIR)

test: setup
	PY=$(PY) sh scripts/run-tests.sh

test-unit: venv
	$(PY) -m pytest -q -m "not lab and not docker"

# The Docker lab suite alone: make test-docker SLURM=22.05
SLURM ?= 24.11
test-docker: setup
	SLURM_FT_LAB_SLURM=$(SLURM) $(PY) -m pytest -q -ra -m docker

lab-up: setup
	$(PY) -m slurm_ft.cli.main lab up --dir $(LAB_DIR)

# One .deb per Debian release (packaging/deb/releases.toml) into build/deb/: make deb RELEASE=trixie
RELEASE ?=
deb: venv
	$(PY) packaging/deb/build.py $(if $(RELEASE),--release $(RELEASE)) --out build/deb

lab-down: venv
	$(PY) -m slurm_ft.cli.main lab down --dir $(LAB_DIR)

clean:
	rm -rf $(VENV) build *.egg-info
