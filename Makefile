# Flux developer commands. Needs only GNU make and python3 (3.11+): the first
# target that needs it creates .venv and installs Flux with its dev extras, and
# reinstalls only when pyproject.toml changes.
#
#   make test PYTEST_ARGS="-k protocol -x"     make serve ARGS="--port 0 --shards 2"
#   make sim ARGS="--seeds 0:50"               make bench VS=all
#   make mutate ARGS="run --per-area 0"

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.flux-installed
# the mutation tool is not part of EXTRAS: only `make mutate` installs it
MUTATE_STAMP := $(VENV)/.flux-mutate-installed
# Everything the test suite exercises: the Spark source (pyspark builds a
# ~450 MB wheel locally the first time; pip's cache keeps later installs fast),
# the chaos report's plots and the benchmark peers' clients.
EXTRAS ?= dev,spark,chaos,bench

ARGS        ?=
PYTEST_ARGS ?=
VS          ?=

.DEFAULT_GOAL := help
.PHONY: help venv browser serve test lint sim chaos fuzz soak bench mutate clean distclean

help:
	@echo "make serve  [ARGS=...]        run a broker (.venv/bin/flux serve ARGS)"
	@echo "make test   [PYTEST_ARGS=...] run the test suite"
	@echo "make lint                     ruff and mypy"
	@echo "make browser                  install Chromium for the dashboard's browser tests"
	@echo "make sim    [ARGS=...]        simulate seeds 0:500"
	@echo "make chaos  [ARGS=...]        real processes under injected faults"
	@echo "make fuzz   [ARGS=...]        the wire fuzzer against a real broker (1M frames)"
	@echo "make soak   [ARGS=...]        10 minutes at 80 % load: memory, latency, nothing lost"
	@echo "make bench  [VS=nats|all]     benchmarks, optionally beside peer brokers"
	@echo "make mutate [ARGS=...]        mutation testing of the shard and client cores (ARGS: run|rerun|report ...)"
	@echo "make clean | distclean        remove caches and build output (distclean: and .venv)"

venv: $(STAMP)

# Without ensurepip (some distributions split it out) venv leaves a half-made
# directory behind: remove it so the next run tries again.
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
		"Flux needs Python 3.11 or newer; $(PYTHON) is " + sys.version.split()[0] + \
		" (run: make PYTHON=python3.11 ...)")'
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
		echo "could not create $(VENV): install your distribution's venv package (e.g. python3-venv)" >&2; \
		exit 1; }

$(STAMP): pyproject.toml setup.py flux/shard/_serial_probe.c flux/shard/_held_keys.c | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	@touch $@

serve: $(STAMP)
	$(BIN)/flux serve $(ARGS)

# The dashboard's browser tests drive the distribution's Chromium through Playwright
# (Playwright's own browser download is not used): install it when it is missing,
# with apt-get as root or through sudo (after finishing an install that was cut
# short, which apt-get refuses to go past). FLUX_CHROMIUM names another executable.
browser:
	@if [ -n "$$FLUX_CHROMIUM" ] || command -v chromium >/dev/null 2>&1 \
		|| command -v chromium-browser >/dev/null 2>&1; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "the browser tests need Chromium: install it, or set FLUX_CHROMIUM" >&2; exit 1; fi; \
	SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	echo "installing chromium for the browser tests (apt-get)"; \
	$$SUDO dpkg --configure -a >/dev/null 2>&1; \
	$$SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
		$$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null

test: $(STAMP) browser
	$(BIN)/pytest -q --durations=20 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check flux tests chaos fuzz examples mutation
	$(BIN)/mypy flux chaos fuzz mutation

sim: $(STAMP)
	$(BIN)/flux sim --seeds 0:500 $(ARGS)

chaos: $(STAMP)
	$(BIN)/python -m chaos $(ARGS)

fuzz: $(STAMP)
	$(BIN)/python -m fuzz $(ARGS)

soak: $(STAMP)
	$(BIN)/python -m flux.bench.soak $(ARGS)

bench: $(STAMP)
	$(BIN)/flux bench $(if $(VS),--vs $(VS)) $(ARGS)

$(MUTATE_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS),mutate]'
	@touch $@

# Not part of `make test`: a sample of mutants takes tens of minutes on two workers.
mutate: $(MUTATE_STAMP)
	nice -n 5 $(BIN)/python -m mutation $(or $(ARGS),run)

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache mutants
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
