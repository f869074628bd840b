# The README's two commands: `make run` (the control plane with a seeded demo, embedded defaults)
# and `make test` (the whole suite). Everything else here serves those two.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install lint lock bench bench-quick clean

# Every third-party package comes at the version pinned in requirements.lock (a new release of a
# dependency cannot change what is installed); the SDK and the server themselves from this tree.
$(VENV)/.installed: pyproject.toml sdk/pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock -e './sdk[crypto,mcp,langgraph,openai-agents,otel]' -e '.[dev]'
	touch $@

install: $(VENV)/.installed

run: install
	bash infra/run-embedded.sh

test: install
	bash infra/test.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/vulture  # dead code: [tool.vulture] in pyproject.toml, framework entry points in vulture_whitelist.py

# After changing a dependency in pyproject.toml: re-pin (keeps every other pin where it is;
# `make lock UPGRADE=--upgrade` moves them all to the newest allowed).
lock: install
	$(BIN)/uv pip compile requirements.in --python-version 3.11 $(UPGRADE) --custom-compile-command 'make lock' \
	  --no-emit-package sagaplane --no-emit-package sagaplane-server -o requirements.lock

bench: install
	bash infra/bench.sh

bench-quick: install
	bash infra/bench.sh --quick

clean:
	rm -rf $(VENV) .sagaplane-data test-artifacts
