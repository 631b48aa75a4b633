# Two commands on a fresh machine:
#   make demo   - create .venv, install evenflow with TensorFlow, run `evenflow demo`
#   make test   - create .venv, install everything (TensorFlow, PyTorch, test tools), run the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Bytecode: where PYTHONDONTWRITEBYTECODE is set, pip writes no .pyc and every process would compile
# TensorFlow's and torch's sources again at each start (about half of a short run's time), so the
# install compiles site-packages once. A few files of the installed packages are test fixtures for newer
# Pythons and do not compile; they are never imported, so compileall's exit status is not checked.
COMPILE := $(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
# Stamps are keyed on pyproject.toml, so editing its dependencies reinstalls. The test install is a
# superset of the demo install and marks both done; the demo install alone skips PyTorch (torch==2.13.0).
SUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DEMO_STAMP := $(VENV)/.installed-demo-$(SUM)
STAMP := $(VENV)/.installed-test-$(SUM)

.PHONY: demo test venv bench clean

$(DEMO_STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tf]'
	$(COMPILE)
	rm -f $(VENV)/.installed-demo-*
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tf,torch,dev]'
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
