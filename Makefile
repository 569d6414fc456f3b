VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo run test system-deps rules clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

system-deps:
	./scripts/install-system-deps.sh

# A simulated 8-GPU training node through the real exporter: open http://localhost:9495/ (DEMO_ARGS="--speed 10").
demo: $(STAMP)
	$(PY) -m exporter demo $(DEMO_ARGS)

run: $(STAMP)
	$(PY) -m exporter run

test: $(STAMP) system-deps
	$(PY) -m pytest -q

# Regenerate the Kubernetes PrometheusRule after editing alerts/*.yaml (a test fails while it drifts).
rules: $(STAMP)
	$(PY) scripts/gen-prometheusrule.py

clean:
	rm -rf $(VENV) build *.egg-info
