# Set-up and checks. `make install` then `make test` is all a fresh clone needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install test test-slow test-all lint proto testdata bench fuzz clean

install:  ## create .venv and install baechi with the dev extra (TensorFlow, pytest, ruff, ...)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'

test:  ## the default suite (well under 10 minutes)
	$(BIN)/python -m pytest -q -m "not slow" -n 2

test-slow:  ## heavy cases only (real model graphs, big synthetic graphs); none selected is fine
	$(BIN)/python -m pytest -q -m slow -n 2 || [ $$? -eq 5 ]

test-all: test test-slow

lint:
	$(BIN)/ruff check baechi_cli tests testdata bench proto
	$(BIN)/ruff format --check baechi_cli tests testdata bench proto
	$(BIN)/lint-imports  ## the import contract in pyproject.toml (tests/test_architecture.py runs it too)

proto:  ## regenerate baechi_cli/proto_gen from proto/ (committed; see proto/README.md)
	$(BIN)/python proto/build.py

testdata:  ## regenerate all test graphs: TensorFlow ones (committed in testdata/, large ones in testdata/cache/) and ONNX models (testdata/*.onnx; the torch ones need torch, else skipped)
	$(BIN)/python testdata/generate.py
	$(BIN)/python testdata/generate_onnx.py

bench:  ## benchmarks; results are committed under bench/
	$(BIN)/python bench/run.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/passes.py
	$(BIN)/python bench/profile_costs.py
	$(BIN)/python bench/onnx_place.py
	$(BIN)/python bench/framework.py  # needs pip install -e '.[bench]'; without it, says so and exits 0
	$(BIN)/python bench/h100.py  # likewise; the H100 measurements are the reference's, no GPU needed
	$(BIN)/python bench/zoo.py  # likewise (and onnxscript): 34 transformers architectures, both ONNX exporters
	$(BIN)/python bench/pt2_speed.py  # likewise: GPT-2 124M's training step read and planned from its .pt2 and its ONNX export (issue 38: within 2x)
	$(BIN)/python bench/torch_runs.py  # likewise: every pipeline and makespan plan trained in PyTorch on gloo ranks
	$(BIN)/python bench/torch_runs.py --measure  # the same on each model's measured step (baechi profile --measure)
	$(BIN)/python bench/torch_accuracy.py  # likewise, on an idle machine: 2-stage plans timed and measured on one-thread ranks
	$(BIN)/python bench/torch_accuracy.py --measure  # the same planned on measured costs
	$(BIN)/python bench/real_models.py  # likewise: 4 real-size models (25-86M) placed on too-small devices and trained as placed
	$(BIN)/python bench/search.py  # after framework.py: it places the ONNX exports that leaves in bench/cache
	$(BIN)/python bench/pipeline.py > bench/pipeline.md
	$(BIN)/python bench/latency.py > bench/latency.md

FUZZ_CASES ?= 100000
FUZZ_SEED  ?= 0
fuzz:  ## fuzz every reader and the CLI (FUZZ_CASES reader cases, FUZZ_SEED; failing inputs in build/fuzz-failures; tests/fuzz/)
	PYTHONPATH=tests $(BIN)/python -m fuzz --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --out build/fuzz-failures

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
