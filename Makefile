# `make demo` and `make test` work on a fresh machine: they create .venv and install the
# pinned tree (requirements.lock) first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: venv demo demo-continue test test-fast lint bench soak soak-goodput clean

$(INSTALLED): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip==26.3"
	$(BIN)/python -m pip install -q -c requirements.lock -e ".[dev]"
	touch $@

venv: $(INSTALLED)

# `pretrain run` is `pyflyte run workflows/pretrain.py pretrain` (the same local execution) with every setting checked
# first; it ends with the run's summary, whose commands work as printed without activating the venv.
demo: venv
	$(BIN)/pretrain run

# Continue an imported open model: a tiny random Llama 3 built here (no download), imported, trained on.
TINY_LLAMA ?= $(or $(TMPDIR),/tmp)/pretrain-tiny-llama
demo-continue: venv
	$(BIN)/python -m hf_interop.tiny llama $(TINY_LLAMA)
	$(BIN)/pretrain registry import $(TINY_LLAMA) --name tiny-llama
	$(BIN)/pretrain run --config configs/continue-cpu.yaml
	$(BIN)/pretrain registry show tiny-llama-python:latest

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Three xdist workers on the two cores (the tests wait a quarter of the time: timeouts, pauses, servers
# starting), one module per worker at a time (a module's shared fixtures are built once), the longest
# modules first (tests/conftest.py orders them; xdist would reorder by test count): docs/testing.md.
XDIST := -n 3 --dist loadscope --no-loadscope-reorder

test: lint
	$(BIN)/python -m pytest $(XDIST)

test-fast: venv
	$(BIN)/python -m pytest $(XDIST) -m "not slow"

bench: venv
	$(BIN)/python -m pip install -q -c requirements.lock -e ".[dev,bench]"
	$(BIN)/python benchmarks/bench_tokenize.py
	$(BIN)/python benchmarks/bench_imported_tokenizers.py
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_kernels.py
	$(BIN)/python benchmarks/bench_observability.py
	$(BIN)/python benchmarks/bench_dataprep.py
	$(BIN)/python benchmarks/bench_node_checkpoints.py

# Kills and S3 outages in every stage, each rerun and checked (docs/soak.md); not part of bench or test.
soak: venv
	$(BIN)/python benchmarks/soak.py

# Goodput under kills (docs/soak.md): 1,600 steps, kills of one rank (restarted inside the job) and of the whole
# task (rerun) in training, in a checkpoint's save and in its upload; about an hour on 2 cores. Not in bench or test.
SOAK_GOODPUT_OUT ?= benchmarks/results/cpu-soak-goodput-$(shell date +%F).json
soak-goodput: venv
	$(BIN)/python benchmarks/soak.py --stages train,checkpoint,checkpoint-upload --per-stage 1 --rank-kills 3 \
		--outages 0 --steps 1600 --checkpoint-every 100 --local-checkpoint-every 25 --top-ups 3 --out $(SOAK_GOODPUT_OUT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
