# Two entry points on a fresh machine: `make study` (set up + run the default embedded study and its report)
# and `make test` (set up + run the test suite). Both bootstrap .venv from the pinned requirements.
SHELL := /bin/bash
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE := 1
export PYTHONPATH := $(abspath .)
STUDY ?= embedded-cpu
CORES ?= 4

.PHONY: study report test test-fast system-deps lint clean-venv

$(STAMP): requirements.txt constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first, from the CPU build pinned in constraints.txt: a bare `torch` would pull a multi-GB CUDA build
	$(VENV)/bin/pip install -q -c constraints.txt torch==2.13.0
	$(VENV)/bin/pip install -q -c constraints.txt -r requirements.txt
	touch $@

study: $(STAMP)
	snakemake --cores $(CORES)
	snakemake --report results/$(STUDY)/report.html

report: $(STAMP)
	snakemake --report results/$(STUDY)/report.html
	snakemake --report results/$(STUDY)/report.zip

# Debian packages the tests drive for real: headless Chromium (report check) and a one-node Slurm.
system-deps:
	@if ! command -v chromium >/dev/null || ! command -v slurmctld >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium munge slurmctld slurmd slurm-client >/dev/null; \
	fi

# one worker per core, each test file on one worker (its module fixtures, e.g. a whole smoke study, built once);
# the 15 slowest tests are listed, to see where the time goes on a slower machine
test: $(STAMP) system-deps
	pytest -q -n auto --dist loadfile --durations=15 tests

# the tests without the integration tier (tests/conftest.py INTEGRATION): no Snakemake, Slurm, Chromium or cohort
test-fast: $(STAMP)
	pytest -q -n auto --dist loadfile --durations=10 -m "not integration" tests

lint: $(STAMP)
	snakefmt --check Snakefile rules/
	snakemake --lint
	python -m tools.check_diary

clean-venv:
	rm -rf $(VENV)
