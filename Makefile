# Two entry points for a fresh machine (see README): `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install run test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch is installed first at the pinned CPU version: an open requirement pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/frenzy plan --model llama-2-7b --batch 64 --seq 4096 --gpus A100-80G,H100-80G,A100-40G

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
