# Developer and CI entry points. Every recipe runs with the shell's -e, so any failing step fails make.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Re-installs when a requirements file changes (make compares mtimes with the stamp's).
STAMP := $(VENV)/.requirements.stamp
# maturin installs into the venv named by VIRTUAL_ENV; no activation needed.
VENV_ENV := VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(CURDIR)/$(BIN):$$PATH

.PHONY: help venv build nccl-plugin wheel tools demo test test-busy test-rust test-python docs clean

help:
	@echo "make venv    create .venv with the pinned requirements, torch included (idempotent)"
	@echo "make build   build the Rust extension into .venv (maturin develop --release) and the NCCL plugin"
	@echo "make wheel   a wheel with both, in target/wheels"
	@echo "make demo    venv + build + 'inalab demo'"
	@echo "make tools   install Debian's tshark if missing (the capture tests decode with it; needs root)"
	@echo "make test    venv + build + tools + cargo test + pytest"
	@echo "make test-busy  the same beside BUSY=2 CPU-bound processes (the suite must hold under load)"
	@echo "make docs    regenerate docs/config.md (the config schema) and docs/results.md (the result columns)"

venv: $(STAMP)

$(STAMP): requirements.txt requirements-torch.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-torch.txt
	touch $@

# The NCCL plugin is a cdylib of its own, copied (stripped: 26 MB of debug info otherwise)
# into the package, where inalab.nccl_plugin_path() finds it and a wheel ships it.
NCCL_PLUGIN := python/inalab/libnccl-net-inalab.so
build: venv
	$(VENV_ENV) $(BIN)/maturin develop --release
	$(MAKE) --no-print-directory nccl-plugin

nccl-plugin:
	cargo build --release -p inalab-nccl
	strip -o $(NCCL_PLUGIN) target/release/libnccl_net_inalab.so

# A wheel with the extension and the NCCL plugin, in target/wheels; stripped (33 MB of the
# extension is debug info, which `make build` keeps for perf profiles).
wheel: venv nccl-plugin
	$(VENV_ENV) $(BIN)/maturin build --release --strip

demo: build
	$(BIN)/inalab demo

# tshark (Debian's package) decodes the captures in the tests. Installed when missing and this
# is a Debian machine run as root; otherwise a message says what to install (CI fails then).
tools:
	@command -v tshark >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing tshark (Debian's package)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q tshark >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q tshark >/dev/null; }; \
	  else echo "tshark is missing: install Debian's tshark package (the capture tests need it)"; fi; }

test: build tools test-rust test-python

# The suite beside BUSY (default 2) CPU-bound processes, as a user runs it next to a build
# (issue #41): correctness is asserted in tests, timing only within sanity bounds, so it must
# pass like this too. The hogs end with the recipe, whether the suite passes or not.
BUSY ?= 2
test-busy: build tools
	hogs=(); for i in $$(seq $(BUSY)); do (while :; do :; done) & hogs+=($$!); done; \
	trap 'kill $${hogs[@]} 2>/dev/null' EXIT; \
	echo "$(BUSY) CPU-bound processes beside the suite: $${hogs[*]}"; \
	$(MAKE) --no-print-directory test-rust test-python

test-rust:
	cargo test --workspace

test-python: venv
	$(BIN)/python -m pytest python/tests -q

docs: venv
	$(BIN)/python -m inalab.config --markdown > docs/config.md
	$(BIN)/python -m inalab.columns --markdown > docs/results.md

clean:
	rm -rf $(VENV) target/wheels
