VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo run test system-deps bench soak lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

system-deps:
	./scripts/install-system-deps.sh

demo: $(STAMP)
	$(PY) -m exporter run --config examples/config.yaml

run: $(STAMP)
	$(PY) -m exporter run

test: $(STAMP) system-deps
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
