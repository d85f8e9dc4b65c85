# omnivoice_export. `make demo` and `make test` create .venv when it is missing and refresh it
# when requirements.txt changes. Each pipeline stage is a file target, so a re-run of `make demo`
# only redoes what changed (sherpa-onnx run.sh style).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL ?= tiny
export OMNIVOICE_MODEL := $(MODEL)

.PHONY: demo test venv clean bench
.DEFAULT_GOAL := demo

venv: $(STAMP)

$(STAMP): requirements.txt
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 12) else f"Python 3.10-3.12 needed, {sys.executable} is {v[0]}.{v[1]}: make PYTHON=python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-deps -r requirements.txt
	$(PY) -m omnivoice_export.torchaudio_cpu
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(PY) -m omnivoice_export.demo --model $(MODEL)

clean:
	rm -rf capture onnx checkpoints
