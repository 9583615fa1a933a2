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

# The main job on the embedded default: SQLite + an emulated Ray cluster of the Frenzy paper's
# testbed. Shows the ranked plans of an example job, starts the service (API and dashboard on
# http://127.0.0.1:8000), submits a tiny GPT-2 that really trains, and keeps serving (Ctrl-C).
run: install
	$(BIN)/frenzy plan --model llama-2-7b --batch 64 --seq 4096 --cluster frenzy-testbed --top 5
	@$(BIN)/frenzy serve & pid=$$!; trap 'kill $$pid 2>/dev/null; wait $$pid' INT TERM; \
	until $(BIN)/python -c "import httpx; httpx.get('http://127.0.0.1:8000/healthz').raise_for_status()" 2>/dev/null; do \
	  kill -0 $$pid 2>/dev/null || exit 1; sleep 1; done; \
	$(BIN)/frenzy submit examples/gpt2-tiny.yaml && $(BIN)/frenzy jobs; \
	echo "dashboard: http://127.0.0.1:8000/#token=$$(cat $${FRENZY_TOKEN_FILE:-$$HOME/.config/frenzy/token})"; \
	wait $$pid

# ruff + the whole suite; installs PostgreSQL and Chromium from Debian when run as root and
# they are missing (see scripts/test.sh), so the PostgreSQL and browser tests run too.
test: install
	bash scripts/test.sh

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
