# Two commands set everything up on a fresh machine:
#   make demo   -- create .venv, install tarproc, run a real pipeline on a generated dataset
#   make test   -- install the dev dependencies and run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo-data

.PHONY: demo test bench lint docs clean install install-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py tarproc/_speedups.c
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	@rm -rf $(DEMO) && mkdir -p $(DEMO)/shards
	@echo "== 1. generate 200 samples (jpg + cls + json) as files under $(DEMO)/src"
	$(BIN)/python -m tarproc.demo $(DEMO)/src
	@echo "== 2. GNU tar -> tarcat (renumber keys) -> tarsplit into shards of 50 samples"
	tar -cf - --sort=name -C $(DEMO)/src demo \
	  | $(BIN)/tarcat --rekey 'sample-%06d' --stats -q \
	  | $(BIN)/tarsplit -n 50 -o $(DEMO)/shards/demo-%06d.tar --manifest $(DEMO)/manifest.jsonl -v -q
	@echo "== 3. the manifest"
	@cat $(DEMO)/manifest.jsonl
	@echo "== 4. read the shards back: tarcat --stats over a brace list, first sample listed by GNU tar"
	$(BIN)/tarcat '$(DEMO)/shards/demo-{000000..000003}.tar' --stats -q -o $(DEMO)/all.tar.gz
	$(BIN)/tarcat $(DEMO)/all.tar.gz -c 1 | tar -tvf -

test: install-dev
	$(BIN)/python -m pytest

# BENCH_ARGS: e.g. --quick, or --out /dev/shm to keep the disk out of the pipeline measure
bench: install-dev
	$(BIN)/python bench/run.py $(BENCH_ARGS)

lint: install-dev
	$(BIN)/ruff check tarproc tests bench
	$(BIN)/mypy

docs: install
	$(BIN)/python -m tarproc.cli.docs > docs/commands.md

clean:
	rm -rf $(VENV) $(DEMO) bench-data build *.egg-info
