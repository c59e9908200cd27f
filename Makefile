VENV ?= .venv
# MLX backend on Linux: cpu (default), cuda (CUDA 12) or cuda13; ignored on macOS.
MLX_BACKEND ?= cpu
# Serving needs the package and MLX's backend only; the tests, lint and benches add `dev`.
BACKEND_EXTRA = $(if $(filter Linux,$(shell uname -s)),[$(MLX_BACKEND)])
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=

# On Linux, MLX's CPU wheel bundles a slow reference BLAS; Debian's OpenBLAS, preloaded,
# makes matmuls much faster. It is a speed-up only: everything works without it.
OPENBLAS = $(firstword $(wildcard /usr/lib/*-linux-gnu/libopenblas.so.0))
WITH_BLAS = $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS))

.PHONY: install install-dev browser speech fixtures run test test-fast lint format docs bench bench-structured bench-soak bench-kv bench-two-models bench-speculation bench-mtp bench-distributed bench-embedding-fairness bench-audio-fairness bench-image-fairness bench-vlm bench-load-gap bench-adapters bench-batch bench-keys bench-ollama bench-tool-guide bench-mcp-hang bench-responses-socket bench-realtime clean

# What `make run` needs: the package, its runtime dependencies and OpenBLAS.
install: $(VENV)/.installed

# What the tests, lint and benches add (pytest, ruff, mypy, the SDKs, Node, Playwright...).
install-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.$(BACKEND_EXTRA)'
	@if [ "$$(uname -s)" = Linux ] && ! ls /usr/lib/*-linux-gnu/libopenblas.so.0 >/dev/null 2>&1; then \
		echo "Installing OpenBLAS (optional speed-up for MLX on the CPU)..."; \
		(apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1)) || \
		echo "OpenBLAS not installed; continuing with MLX's bundled BLAS."; \
	fi
	touch $@

run: install
	$(WITH_BLAS) $(VENV)/bin/mlxserve --host $(HOST) --port $(PORT) $(ARGS)

# The models the tests build and train for themselves, before any test runs (with
# progress; cached, so a second run costs seconds). NAMES="tiny_model ..." builds some.
# A fixture that cannot learn stops the build, naming it; KEEP_GOING=1 builds the others.
fixtures: install-dev speech
	$(WITH_BLAS) KEEP_GOING=$(KEEP_GOING) $(PY) tests/fixtures/catalog.py $(NAMES)

# Two workers, each taking whole test modules (their servers are module fixtures): the
# suite waits on servers, clients and agent CLIs as much as it computes. TEST_WORKERS=0
# runs it in one process. The 30 slowest tests end every log: the run's long poles.
TEST_WORKERS ?= 2
test: install-dev browser speech fixtures
	$(WITH_BLAS) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations 30 $(ARGS)

# The engine's parts in this process on tiny models, and the parsers: a minute or two.
test-fast: install-dev
	$(WITH_BLAS) $(PY) tests/fixtures/catalog.py tiny_model wide_heads_model
	$(WITH_BLAS) $(PY) -m pytest -m unit $(ARGS)

# The audio tests speak with espeak-ng (and KittenTTS reads phonemes through it).
speech: install-dev
	@if [ "$$(uname -s)" = Linux ]; then \
		command -v espeak-ng >/dev/null 2>&1 || { \
			echo "Installing espeak-ng (for the audio tests)..."; \
			apt-get update -qq >/dev/null && apt-get install -y -qq espeak-ng >/dev/null; }; \
	else command -v espeak-ng >/dev/null 2>&1 || brew install espeak-ng; fi

# The web app's tests drive a headless chromium through Playwright: Debian's on Linux,
# Playwright's own elsewhere.
browser: install-dev
	@if [ "$$(uname -s)" = Linux ]; then \
		command -v chromium >/dev/null 2>&1 || { \
			echo "Installing chromium (for the web app's browser tests)..."; \
			apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; }; \
	else $(PY) -m playwright install chromium; fi

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# docs/cli.md is generated from the settings' declarations (a test fails when it is stale).
docs: install-dev
	$(PY) -m mlxserve.cli_docs

format: install-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install-dev
	$(WITH_BLAS) $(PY) bench/bench.py $(ARGS)

bench-structured: install-dev
	$(WITH_BLAS) $(PY) bench/structured.py $(ARGS)

bench-soak: install-dev
	$(WITH_BLAS) $(PY) bench/soak.py $(ARGS)

bench-kv: install-dev
	$(WITH_BLAS) $(PY) bench/kv_quantization.py $(ARGS)

bench-adapters: install-dev
	$(WITH_BLAS) $(PY) bench/adapters.py $(ARGS)

bench-batch: install-dev
	$(WITH_BLAS) $(PY) bench/batch.py $(ARGS)

bench-keys: install-dev
	$(WITH_BLAS) $(PY) bench/keys.py $(ARGS)

bench-ollama: install-dev
	$(WITH_BLAS) $(PY) bench/ollama.py $(ARGS)

bench-tool-guide: install-dev
	$(WITH_BLAS) $(PY) bench/tool_guide.py $(ARGS)

bench-mcp-hang: install-dev
	$(WITH_BLAS) $(PY) bench/mcp_hang.py $(ARGS)

bench-two-models: install-dev
	$(WITH_BLAS) $(PY) bench/two_models.py $(ARGS)

bench-speculation: install-dev
	$(WITH_BLAS) $(PY) bench/speculation.py $(ARGS)

bench-mtp: install-dev
	$(WITH_BLAS) $(PY) bench/mtp.py $(ARGS)

bench-distributed: install-dev
	$(WITH_BLAS) $(PY) bench/distributed.py $(ARGS)

bench-embedding-fairness: install-dev
	$(WITH_BLAS) $(PY) bench/embedding_fairness.py $(ARGS)

bench-load-gap: install-dev
	$(WITH_BLAS) $(PY) bench/load_gap.py $(ARGS)

bench-responses-socket: install-dev
	$(WITH_BLAS) $(PY) bench/responses_socket.py $(ARGS)

bench-realtime: install-dev speech
	$(WITH_BLAS) $(PY) bench/realtime.py $(ARGS)

bench-vlm: install-dev
	$(WITH_BLAS) $(PY) bench/vlm.py $(ARGS)

bench-audio-fairness: install-dev speech
	$(WITH_BLAS) $(PY) bench/audio_fairness.py $(ARGS)

bench-image-fairness: install-dev
	$(WITH_BLAS) $(PY) bench/image_fairness.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
