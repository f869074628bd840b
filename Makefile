# The README's two commands: `make run` (the control plane with a seeded demo, embedded defaults)
# and `make test` (the whole suite). Everything else here serves those two.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install lint bench bench-quick clean

$(VENV)/.installed: pyproject.toml sdk/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e './sdk[crypto]' -e '.[dev]'
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

bench: install
	bash infra/bench.sh

bench-quick: install
	bash infra/bench.sh --quick

clean:
	rm -rf $(VENV) .sagaplane-data test-artifacts
