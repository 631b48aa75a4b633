# Two commands on a fresh machine:
#   make demo   - create .venv, install evenflow with TensorFlow, run `evenflow demo`
#   make test   - create .venv, install everything (TensorFlow, PyTorch, test tools), run the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Both installs take the CPU builds the tests run on, pinned in ci/constraints.txt: the `tf-cpu` extra
# (tensorflow-cpu on x86-64) and PyTorch from its CPU index, which the test install asks for torch
# alone first (no CUDA libraries; a torch already there that matches the pin is kept). The index is
# used where it answers (a 5-second probe, or set TORCH_INDEX=URL; TORCH_INDEX= leaves it out): pip
# would otherwise retry an unreachable index for every package. Stamps are keyed on pyproject.toml
# and the constraints, so editing either reinstalls. The test install is a superset of the demo
# install and marks both done; the demo install alone skips PyTorch.
#
# Bytecode: where PYTHONDONTWRITEBYTECODE is set, pip writes no .pyc and every process would compile
# TensorFlow's and torch's sources again at each start (about half of a short run's time), so the
# install compiles site-packages once. A few files of the installed packages are test fixtures for newer
# Pythons and do not compile; they are never imported, so compileall's exit status is not checked.
CONSTRAINTS := ci/constraints.txt
ifeq ($(origin TORCH_INDEX), undefined)
TORCH_INDEX := $(shell $(PY) -c "import urllib.request as u; u.urlopen('https://download.pytorch.org/whl/cpu/', timeout=5); print('https://download.pytorch.org/whl/cpu')" 2>/dev/null)
endif
COMPILE := $(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
SUM := $(shell cat pyproject.toml $(CONSTRAINTS) | cksum | cut -d' ' -f1)
DEMO_STAMP := $(VENV)/.installed-demo-$(SUM)
STAMP := $(VENV)/.installed-test-$(SUM)

.PHONY: demo test venv bench clean

$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS)
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[tf-cpu,demo,report]'
	$(COMPILE)
	rm -f $(VENV)/.installed-demo-*
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[tf-cpu,torch,demo,report,s3,dev,ray]'
	$(COMPILE)
	rm -f $(VENV)/.installed-*
	touch $(STAMP) $(DEMO_STAMP)

venv: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/evenflow demo

# Two passes (see tests/conftest.py): the tests that may share the cores on two workers, then
# the serial ones (several cooperating processes under deadlines, or measured speeds) alone. Each
# pass ends with its 15 slowest tests.
test: $(STAMP)
	$(BIN)/python -m compileall -q src tests > /dev/null
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not serial" -n 2 --dist loadfile --durations 15
	$(BIN)/python -m pytest -q -p no:cacheprovider -m serial --durations 15

clean:
	rm -rf $(VENV) build src/*.egg-info
