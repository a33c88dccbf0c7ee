# Two commands set everything up on a fresh machine:
#   make demo   -- create .venv, install tarproc, run a real pipeline on a generated dataset
#   make test   -- install the dev dependencies and run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo-data

.PHONY: demo test test-fast test-sanitize bench lint docs clean install install-dev install-bench install-slurm install-browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel

# byte-compiled as a regular install is: an editable one is not, and where PYTHONDONTWRITEBYTECODE
# is set every command would compile its modules anew at each start (20-30 ms of tarcat's 70)
$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py tarproc/_speedups.c tarproc/_jpeg.c
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -m compileall -q tarproc
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[dev,torch]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# tarjob's Slurm tests start a real single-node cluster (tests/interop/test_slurm.py): as root with
# apt-get, install Debian's Slurm and munge when slurmctld is missing. Never fails the build: without
# them the tests are skipped, saying why.
SLURM_DEBS := slurmctld slurmd slurm-client munge
install-slurm:
	@if command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ]; then :; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: not root or no apt-get: the Slurm tests will be skipped"; \
	else \
	  echo "make: apt-get install $(SLURM_DEBS) (for the Slurm tests)"; \
	  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq \
	      --no-install-recommends $(SLURM_DEBS); } >/dev/null 2>&1 \
	    || echo "make: apt-get failed: the Slurm tests will be skipped"; \
	fi

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
	@echo "== 5. look inside: previews of 2 samples, a lint of the whole dataset, an HTML report"
	$(BIN)/tarshow $(DEMO)/all.tar.gz -c 2
	$(BIN)/tarshow '$(DEMO)/shards/demo-{000000..000003}.tar' --summary
	$(BIN)/tarshow '$(DEMO)/shards/demo-{000000..000003}.tar' --report $(DEMO)/report.html --sample 24 -q \
	  && echo "report (one self-contained HTML file; open it in a browser): $(DEMO)/report.html"
	@echo "== 6. a table out (tar2tsv), and a tar back from it (tarcreate): byte-identical"
	$(BIN)/tar2tsv $(DEMO)/shards/demo-000000.tar -f '__key__ cls json.label jpg:size jpg:sha256' -c 3
	$(BIN)/tar2tsv $(DEMO)/all.tar.gz -f '__key__ cls json' | $(BIN)/tarcreate -o $(DEMO)/labels.tar
	$(BIN)/tarcat $(DEMO)/all.tar.gz -f 'cls json' | cmp - $(DEMO)/labels.tar && echo "round trip: identical"
	@echo "== 7. a command on every sample, 2 at a time (tarproc), then sorted by class (tarsort)"
	$(BIN)/tarproc -p 2 -q -c 'wc -c < sample.jpg | tr -d " \\n" > sample.size.txt' $(DEMO)/all.tar.gz \
	  | $(BIN)/tarsort -k cls --numeric -q | $(BIN)/tar2tsv -f '__key__ cls size.txt' -c 4
	@echo "== 8. random access: an index per shard, then one sample by key"
	$(BIN)/tarindex -v '$(DEMO)/shards/demo-{000000..000003}.tar'
	$(BIN)/python -c 'import tarproc; s = tarproc.IndexedShard("$(DEMO)/shards/demo-000002.tar")["sample-000123"]; print(s["__key__"], s["json"].decode())'
	@echo "== 9. decode and crop the images into arrays (cpu backend), first one shown"
	$(BIN)/tardecode --device cpu --size 64 -q $(DEMO)/all.tar.gz -o $(DEMO)/decoded.tar
	$(BIN)/tarshow $(DEMO)/decoded.tar -c 1
	$(BIN)/tarshow $(DEMO)/all.tar.gz --grid $(DEMO)/sheet.png -c 16 && echo "contact sheet: $(DEMO)/sheet.png"
	@echo "== 10. decoded batches over ZeroMQ: 2 sender processes (tarserve) -> a receiver printing rates (tarrecv)"
	$(BIN)/tarrecv zpull+ipc://$(DEMO)/feed --interval 0.2 & \
	  $(BIN)/tarserve '$(DEMO)/shards/demo-{000000..000003}.tar' --to zpush+ipc://$(DEMO)/feed -p 2 \
	    --device cpu --size 64 --random-crop --flip 0.5 --label cls -b 32 -q; wait
	@echo "== 11. raw fields over ZeroMQ and back into a tar: byte-identical"
	$(BIN)/tarrecv zpull+ipc://$(DEMO)/feed -o $(DEMO)/copy.tar & \
	  $(BIN)/tarserve --raw $(DEMO)/shards/demo-000001.tar --to zpush+ipc://$(DEMO)/feed -q; wait
	cmp $(DEMO)/copy.tar $(DEMO)/shards/demo-000001.tar && echo "round trip over ZeroMQ: identical"
	@echo "== 12. one job per shard (tarjob), 2 at a time, journaled; the re-run skips what is done"
	$(BIN)/tarjob -s '{000000..000003}' -j 2 --journal $(DEMO)/tarjob.jsonl -- $(BIN)/tarproc -q \
	  -c 'wc -c < sample.jpg | tr -d " \\n" > sample.size.txt' $(DEMO)/shards/demo-{}.tar -o $(DEMO)/sized-{}.tar
	$(BIN)/tarjob -s '{000000..000003}' -j 2 --journal $(DEMO)/tarjob.jsonl -- $(BIN)/tarproc -q \
	  -c 'wc -c < sample.jpg | tr -d " \\n" > sample.size.txt' $(DEMO)/shards/demo-{}.tar -o $(DEMO)/sized-{}.tar
	$(BIN)/tar2tsv '$(DEMO)/sized-{000000..000003}.tar' -f '__key__ size.txt' -c 3
	@echo "== 13. training batches (tarproc.Dataset): 2 epochs, shuffled, augmented; numpy here, torch tensors when torch is installed"
	$(BIN)/python -c 'import tarproc; from tarproc.decode import AugmentSpec; \
	  ds = tarproc.Dataset("$(DEMO)/shards/demo-{000000..000003}.tar", shuffle=100, batch_size=64, to_tuple=("__key__", "jpg", "cls"), \
	                       decode=AugmentSpec(size=64, random_crop=True, flip=0.5, rotate=10, brightness=0.4, layout="CHW")); \
	  show = lambda b: print("batches:", [tuple(x[1].shape) for x in b], "labels:", b[0][2][:8], \
	                         "every key once:", len({k for x in b for k in x[0]}) == sum(len(x[0]) for x in b) == 200); \
	  [show(list(ds)) for epoch in range(2)]'

# tarshow --report/--serve are tested in a real browser (tests/view/): as root with apt-get, install
# Debian's chromium and chromium-driver when missing. Never fails the build: without them those tests
# are skipped, saying why.
BROWSER_DEBS := chromium chromium-driver
install-browser:
	@if [ -x /usr/bin/chromedriver ] && { [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; }; then :; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: not root or no apt-get: the browser tests will be skipped"; \
	else \
	  echo "make: apt-get install $(BROWSER_DEBS) (for the browser tests)"; \
	  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq \
	      --no-install-recommends $(BROWSER_DEBS); } >/dev/null 2>&1 \
	    || echo "make: apt-get failed: the browser tests will be skipped"; \
	fi

test: install-dev install-slurm install-browser
	$(BIN)/python -m pytest

# the fast tier (docs/development.md): only the light test dependencies, never torch, DALI, Slurm or
# a browser; the tests marked slow, torch, browser, slurm or gpu are left out
FAST_MARKERS := not slow and not torch and not browser and not slurm and not gpu
$(VENV)/.installed-fast-test: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[fast-test]'
	touch $@

test-fast: $(VENV)/.installed-fast-test
	$(BIN)/python -m pytest -m "$(FAST_MARKERS)"

# The C extensions built with ASan and UBSan into build-sanitize/ (beside a copy of the Python
# package, never into tarproc/), and the C tests run against them; any report fails the run
# (docs/development.md, "Sanitizer build"). PYTHONMALLOC=malloc lets ASan see Python objects freed
# too early. $(BIN)/pytest, not python -m pytest, which would put the checkout first on sys.path;
# --capture=sys, so that a sanitizer's report (written to fd 2 as the process aborts) is seen.
SANITIZE_DIR   := build-sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g
SANITIZE_TESTS := tests/core/test_c_arguments.py tests/core/test_parity.py tests/core/test_writer_parity.py \
                  tests/core/test_index_parity.py tests/core/test_grouper_parity.py tests/core/test_jpeg_fastpath.py \
                  tests/core/test_imaging.py tests/core/test_index_fuzz.py tests/core/test_tario_damage.py \
                  tests/core/test_relayout.py tests/core/test_jpeg_entropy.py
SANITIZE_ENV    = PYTHONPATH=$(SANITIZE_DIR) TARPROC_SANITIZED_BUILD=$(SANITIZE_DIR) PYTHONMALLOC=malloc \
                  LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \
                  UBSAN_OPTIONS=print_stacktrace=1
test-sanitize: install-dev
	rm -rf $(SANITIZE_DIR)
	$(BIN)/python -c 'import shutil; shutil.copytree("tarproc", "$(SANITIZE_DIR)/tarproc", \
	  ignore=shutil.ignore_patterns("*.so", "__pycache__"))'
	CFLAGS="$(SANITIZE_FLAGS)" LDFLAGS="$(SANITIZE_FLAGS)" \
	  $(BIN)/python setup.py -q build_ext --build-lib $(SANITIZE_DIR) --build-temp $(SANITIZE_DIR)/tmp
	$(SANITIZE_ENV) $(BIN)/python -c 'import sys; sys.path.remove(""); import tarproc._speedups as s; \
	  assert "/$(SANITIZE_DIR)/" in s.__file__, s'
	$(SANITIZE_ENV) $(BIN)/pytest -p no:cacheprovider --capture=sys $(SANITIZE_TESTS)

# MosaicML Streaming, the baseline of the bench's streaming section: installed by `make bench` only,
# never by `make test`. --no-deps: its own pins would move numpy below 2.2 and bring the Azure, OCI and
# GCS clients; the modules it imports are listed here instead. Never fails the build: without it the
# section is skipped, saying why.
STREAMING      := mosaicml-streaming==0.13.0
STREAMING_DEPS := 'xxhash>=3,<4' 'zstd>=1.5.2.5,<2' 'python-snappy>=0.6.1,<1' 'Brotli>=1.0.9' 'catalogue>=2,<3' \
                  'transformers>=4.21.3,<5'
$(VENV)/.installed-bench: $(VENV)/.installed-dev
	@{ $(BIN)/python -m pip install -q $(STREAMING_DEPS) && $(BIN)/python -m pip install -q --no-deps '$(STREAMING)' \
	   && touch $@; } || echo "make: pip could not install $(STREAMING): the bench's streaming section will be skipped"

install-bench: $(VENV)/.installed-bench

# BENCH_ARGS: e.g. --quick, or --out /dev/shm to keep the disk out of the pipeline measure
bench: install-dev install-bench
	$(BIN)/python -m compileall -q tarproc
	$(BIN)/python bench/run.py $(BENCH_ARGS)

lint: install-dev
	$(BIN)/ruff check tarproc tests bench
	$(BIN)/mypy

docs: install
	$(BIN)/python -m tarproc.cli.docs > docs/commands.md

clean:
	rm -rf $(VENV) $(DEMO) bench-data build *.egg-info
