# omnivoice_export. `make demo` and `make test` create .venv when it is missing and refresh it
# when requirements.txt changes. Each pipeline stage is a file target (sherpa-onnx run.sh style),
# so re-running `make demo` redoes only what changed: a new model, an edited script or package.
#
#   make demo                 steps 0-4 on the tiny checkpoint: a summary per step (all output in demo.log);
#                             a second run with nothing changed does nothing
#   make demo MODEL=full-random   the same at the real dims (minutes; ~10 GB RAM)
#   make test                 the whole pytest suite on two workers (tiny checkpoint, CPU; minutes)
#   make test-fast            the quick subset: skips tests marked slow (pytest.ini), i.e. all that need steps 0-2
#   make test-container       the container test alone (podman, runc and container/make_base.sh's base image)
#   make typecheck            mypy strict on the runtime, the toolchain, the step scripts and bench (pyproject.toml [tool.mypy]); .ci/run runs it
#   make format               ruff format over the repo (.ci/run checks it with ruff format --check)
#   make bench                PyTorch vs ONNX Runtime benchmark of the demo's export (README: Performance)
#   make quality MODEL=PATH   quantized variants of the transformer and their quality table (steps 5-6)
#   make venv-gpu             .venv for an NVIDIA machine (requirements-gpu.txt)
#   make gpu-check            the CUDA checks (torch CUDA capture vs CPU; ORT CUDA parity if onnxruntime-gpu)

PYTHON ?= python3
# PyTorch's CPU wheel index (PyTorch's install instructions); a mirror of it works too.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# PyTorch's CUDA 13.2 wheel index, for make venv-gpu's torch.
TORCH_GPU_INDEX ?= https://download.pytorch.org/whl/cu132
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL ?= tiny
PROVIDER ?= cpu
CAPTURE := capture
ONNX := onnx
MODEL_MARK := checkpoints/.demo-model
PACKAGE := $(wildcard omnivoice_export/*.py omnivoice_onnx/*.py omnivoice_onnx/*/*.py)
# make demo's whole output; the terminal gets each step's summary (scripts/demo_step.sh).
DEMO_LOG := demo.log
STEP := scripts/demo_step.sh $(DEMO_LOG)
# Steps 3-4 write their verdicts into the export report; this marker, touched after them, is what
# makes a second `make demo` with nothing changed do nothing (a new export, script or package
# file, or another PROVIDER, re-runs them).
DEMO_DONE := $(CAPTURE)/.demo-$(PROVIDER).done

.PHONY: demo test test-fast test-container typecheck format venv venv-gpu bench quality clean gpu-check FORCE
# A step that fails must not leave a target that looks up to date: make deletes a target its
# failed recipe changed, so the next `make demo` re-runs the step instead of going on with it.
.DELETE_ON_ERROR:
.DEFAULT_GOAL := demo

venv: $(STAMP)

# torch comes first, from PyTorch's CPU index (TORCH_INDEX, given to that one install only); then
# the pinned rest; then `install verify` imports everything or stops with one line naming the fix.
# The stamp is written only after the venv is proven.
$(STAMP): requirements.txt requirements-torch.txt omnivoice_export/install.py
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 12) else f"Python 3.10-3.12 needed, {sys.executable} is {v[0]}.{v[1]}: make PYTHON=python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m omnivoice_export.install torch --index-url $(TORCH_INDEX)
	$(PY) -m pip install --quiet --no-deps -r requirements.txt
	$(PY) -m omnivoice_export.install verify
	touch $(STAMP)

venv-gpu: requirements-gpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-deps --extra-index-url $(TORCH_GPU_INDEX) -c requirements-gpu.txt torch
	$(PY) -m pip install --quiet -r requirements-gpu.txt
	$(PY) -m pip install --quiet --no-deps omnivoice==0.2.1 torchaudio==2.11.1
	touch $(STAMP)

# Two workers by default (CI has 2 cores); one file's tests stay in one worker (--dist loadfile),
# files handed out in the order tests/conftest.py sets (--no-loadscope-reorder: xdist would
# otherwise sort them by test count). TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not container" tests

# The first run checks the runtime and its imports (numpy, onnxruntime's absence of stubs, ...) from
# scratch, about a minute of CPU; later runs reuse .mypy_cache.
typecheck: $(STAMP)
	$(PY) -m mypy

format: $(STAMP)
	.venv/bin/ruff format .

test-container: $(STAMP)
	$(PY) -m pytest -q -m container tests/test_container.py

test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow and not container" tests

# The model marker changes only when MODEL does, so switching models re-runs every step.
$(MODEL_MARK): FORCE
	@mkdir -p $(dir $@)
	@echo "$(MODEL)" | cmp -s - $@ || echo "$(MODEL)" > $@

$(CAPTURE)/ref_voice.wav: $(STAMP) $(MODEL_MARK) make_reference.py $(PACKAGE)
	@$(STEP) "step 0: reference voice ($(MODEL))" $(PY) make_reference.py --model $(MODEL)

$(CAPTURE)/manifest.json: $(CAPTURE)/ref_voice.wav capture_reference.py
	@$(STEP) "step 1: capture PyTorch generate() I/O" $(PY) capture_reference.py --model $(MODEL)

$(ONNX)/export-report.json: $(CAPTURE)/manifest.json export_omnivoice.py
	@$(STEP) "step 2: export the three graphs" $(PY) export_omnivoice.py --model $(MODEL)

$(DEMO_DONE): $(ONNX)/export-report.json parity_check.py infer_onnx.py $(PACKAGE)
	@$(STEP) "step 3: parity, provider $(PROVIDER)" $(PY) parity_check.py --provider $(PROVIDER)
	@$(STEP) "step 4: end to end, provider $(PROVIDER)" $(PY) infer_onnx.py --provider $(PROVIDER)
	@touch $@

demo: $(DEMO_DONE)
	@echo "demo: steps 0-4 up to date for $(MODEL) on $(PROVIDER); verdicts in $(ONNX)/export-report.json, whole output in $(DEMO_LOG)"

bench: $(ONNX)/export-report.json
	$(PY) bench/bench_omnivoice.py --model $(MODEL) --onnx-dir $(ONNX) --capture-dir $(CAPTURE)

# Steps 5-6 on the export of MODEL: every recipe, then the table (fp32 measured in the same run).
quality: $(ONNX)/export-report.json
	$(PY) quantize_omnivoice.py --onnx-dir $(ONNX)
	$(PY) quality_omnivoice.py --onnx-dir $(ONNX) --capture-dir $(CAPTURE)

# The checks that need an NVIDIA GPU, on tiny, in under 8 minutes (scripts/gpu_check.sh says what
# each shows). No venv prerequisite: a GPU machine's image may bring its own CUDA torch (PY=python).
gpu-check:
	PY=$(PY) scripts/gpu_check.sh

clean:
	rm -rf $(CAPTURE) $(ONNX) $(MODEL_MARK) $(DEMO_LOG)
