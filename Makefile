# Two commands on a fresh machine:
#   make demo   - create .venv, install evenflow with TensorFlow, run `evenflow demo`
#   make test   - create .venv, install everything (TensorFlow, PyTorch, test tools), run the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Both installs take the CPU builds the tests run on, pinned in ci/constraints.txt: the `tf-cpu` extra
# (tensorflow-cpu on x86-64) and PyTorch from its CPU index, which the test install asks for torch
# alone first (no CUDA libraries; a torch already there that matches the pin is kept; `make test
# TORCH_INDEX=` leaves that index out where it cannot be reached). Stamps are
# keyed on pyproject.toml and the constraints, so editing either reinstalls. The test install is a
# superset of the demo install and marks both done; the demo install alone skips PyTorch.
CONSTRAINTS := ci/constraints.txt
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
SUM := $(shell cat pyproject.toml $(CONSTRAINTS) | cksum | cut -d' ' -f1)
DEMO_STAMP := $(VENV)/.installed-demo-$(SUM)
STAMP := $(VENV)/.installed-test-$(SUM)

.PHONY: demo test venv bench clean

$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS)
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[tf-cpu,demo]'
	rm -f $(VENV)/.installed-demo-*
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[tf-cpu,torch,demo,report,dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP) $(DEMO_STAMP)

venv: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/evenflow demo

# Two passes (see tests/conftest.py): the tests that may share the cores on two workers, then
# the serial ones (several cooperating processes under deadlines, or measured speeds) alone. Each
# pass ends with its 15 slowest tests.
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not serial" -n 2 --dist loadfile --durations 15
	$(BIN)/python -m pytest -q -p no:cacheprovider -m serial --durations 15

clean:
	rm -rf $(VENV) build src/*.egg-info
