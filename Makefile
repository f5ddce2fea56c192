# Two entry points on a fresh machine: `make study` (set up + run the default embedded study and its report)
# and `make test` (set up + run the test suite). Both bootstrap .venv from the pinned requirements.
SHELL := /bin/bash
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE := 1
export PYTHONPATH := $(abspath .)
# SGLang 0.5.23 without its GPU dependencies, beside .venv (whose torch etc. it sees through a .pth): enough to import
# sglang.srt.server_args and its adaptive rule on CPU, so that tests check our command lines and rule against SGLang's own
SGVENV := .sgvenv
SGLANG_CPU_PINS := sglang==0.5.23 triton==3.9.0 orjson==3.13.0 pybase64==1.5.1 pillow==13.0.0 msgspec==0.23.0 ipython==9.18.1
STUDY ?= embedded-cpu
CORES ?= 4

.PHONY: study report test test-cluster test-fast system-deps lint clean-venv

$(STAMP): requirements.txt constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first, from the CPU build pinned in constraints.txt: a bare `torch` would pull a multi-GB CUDA build
	$(VENV)/bin/pip install -q -c constraints.txt torch==2.13.0
	$(VENV)/bin/pip install -q -c constraints.txt -r requirements.txt
	touch $@

$(SGVENV)/.installed: $(STAMP)
	python3 -m venv $(SGVENV)
	$(SGVENV)/bin/pip install -q --no-deps $(SGLANG_CPU_PINS)
	$(VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(SGVENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/specstudy-venv.pth"
	$(SGVENV)/bin/python -c "import sglang.srt.server_args, sglang.srt.speculative.adaptive_spec_params"
	touch $@

$(SGVENV): $(SGVENV)/.installed

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
# the 15 slowest tests are listed, to see where the time goes on a slower machine. The study on a one-node Slurm
# (the `cluster` tier, ~7 min, mostly waiting on the Slurm plugin's status checks) is test-cluster's.
test: export SPECSTUDY_SGLANG_PYTHON := $(abspath $(SGVENV))/bin/python
test: $(STAMP) $(SGVENV)/.installed system-deps
	pytest -q -n auto --dist loadfile --durations=15 -m "not cluster" tests

# the smoke study through `--executor slurm` on a private one-node Slurm (tests/slurm/test_slurm_study.py)
test-cluster: $(STAMP) system-deps
	pytest -q --durations=5 -m cluster tests

# the tests without the integration tier (tests/conftest.py INTEGRATION): no Snakemake, Slurm, Chromium or cohort
test-fast: $(STAMP)
	pytest -q -n auto --dist loadfile --durations=10 -m "not integration" tests

lint: $(STAMP)
	snakefmt --check Snakefile rules/
	snakemake --lint
	python -m tools.check_diary

clean-venv:
	rm -rf $(VENV) $(SGVENV)
