# The README's two commands: `make demo` (whole pipeline on the embedded demo) and `make test`.
# Both create the virtual environment .venv from envs/requirements-cpu.txt when it is missing.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
SNAKEMAKE_ARGS ?=

.PHONY: demo test lint venv clean-demo profiles faults

venv: $(VENV)/.installed

$(VENV)/.installed: envs/requirements-cpu.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r envs/requirements-cpu.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

DEMO := --configfile examples/demo/config.yaml --replace-workflow-config

demo: venv
	PATH=$(abspath $(BIN)):$$PATH snakemake --profile profiles/local $(DEMO) $(SNAKEMAKE_ARGS)
	@echo "demo: tables and figures in results/demo/report/, all on one page: results/demo/report/report.html"

# two workers, a test file at a time (module fixtures built once), the tests with wall-clock chunk chains
# one after another on one worker, first (tests/conftest.py)
PYTEST_ARGS ?= -n 2 --dist loadgroup --no-loadscope-reorder

test: venv
	PATH=$(abspath $(BIN)):$$PATH python -m pytest -q $(PYTEST_ARGS)

# the long fault-injection run (tests/faults.py; docs/reliability.md): FAULT_ARGS picks the schedules, e.g.
# `make faults FAULT_ARGS="--seed 7 --schedules 1"` runs schedule 7 again; `--slurm` through the CI's cluster
FAULT_ARGS ?= --seed 1 --schedules 25 --faults 4 --json results/faults.json

faults: venv
	mkdir -p results
	PATH=$(abspath $(BIN)):$$PATH python tests/faults.py $(FAULT_ARGS)

# no finding of ruff (pyproject: line length, pycodestyle, pyflakes), snakefmt --check or snakemake --lint
lint: venv
	$(BIN)/ruff check --no-cache src tests benchmarks
	$(BIN)/python -m snakefmt --check workflow
	@if grep -nE '^.{121,}' workflow/Snakefile workflow/rules/*.smk; then echo "lint: over 120 characters" >&2; exit 1; fi
	PATH=$(abspath $(BIN)):$$PATH snakemake --lint $(DEMO)

# `--profile slurm` / `--profile pbs` by bare name: links profiles/slurm and profiles/pbs into
# ~/.config/snakemake (a profile of your own of that name is left alone). Needs no environment.
profiles:
	PYTHONPATH=src $(PYTHON) -m tacl.cluster.profiles

clean-demo:
	rm -rf results/demo
