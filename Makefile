# Two commands for a fresh machine: `make demo` (the main job) and `make test` (the test suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench diagram clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: 2.13.0 is a local CPU wheel here (fast); pyproject admits a range.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,plot]'
	# Mooncake Store (L3 tests): best effort, as its wheels exist for some platforms only;
	# without it (or without the system library libibverbs1) those tests skip and say why.
	$(BIN)/pip install -q -e '.[mooncake]' || echo "mooncake extra not installable here"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stagefate replay

# A fixed hash seed: Hypothesis's stateful swarm flags iterate a frozenset of rule names, so
# even derandomized runs differ between hash seeds without it.
test: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict -p stagefate

bench: $(STAMP)
	$(BIN)/stagefate bench

diagram: $(STAMP)
	$(BIN)/stagefate diagram

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
