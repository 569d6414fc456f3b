VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo run test test-busy test-paging test-unit test-property lint golden soak bench bench-fleet bench-fleet-replay bench-global fleet system-deps rules clean gpu-check docs dist screenshot

# The daemon requires the client distribution (clients/python) at its own version: both come from this checkout,
# editable. The daemon's editable finder is read first (its .pth file sorts first), so mfu_exporter is this
# checkout's whole package.
$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ./clients/python -e '.[test]'
	touch $(STAMP)

system-deps:
	./scripts/install-system-deps.sh

# A simulated 8-GPU training node through the real exporter: open http://localhost:9495/ (DEMO_ARGS="--speed 10").
demo: $(STAMP)
	$(PY) -m mfu_exporter demo $(DEMO_ARGS)

run: $(STAMP)
	$(PY) -m mfu_exporter run

# The whole suite CI runs: code checks, then every test (unit and end-to-end), Debian tools installed when root.
# Test files run in TEST_WORKERS parallel workers (a file stays on one worker: its servers are started once); most of
# an end-to-end test's time is waiting, so three workers fit two cores. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 3
test: $(STAMP) system-deps lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The whole suite with one busy process per core beside it (scripts/busy.sh): a test whose pass depends on the machine's
# speed fails here rather than now and then in CI.
test-busy: $(STAMP) system-deps lint
	./scripts/busy.sh $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Time to page alone (tests/e2e/test_paging.py, docs/runbook.md "Time to page"), as make test runs it: the demo's
# rotation with each incident lasting until it pages, and the demo's own rotation (2-minute incidents) paging for
# nothing else, through Debian's Prometheus and Alertmanager at the demo's --speed 80: about 4 minutes, times printed.
test-paging: $(STAMP) system-deps
	$(PY) -m pytest -q -s -n 0 tests/e2e/test_paging.py

# Unit tests only: no root, no Debian tools, about a minute.
test-unit: $(STAMP) lint
	$(PY) -m pytest -q tests/unit

# ruff (lint and format, pyproject.toml), the import contracts of docs/architecture.md, and mypy on model/ and node/.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The property test of tests/unit/test_truth_property.py (the job model against its reference model of the truth) for
# longer: PROPERTY_EXAMPLES sequences (100,000; make test runs 2,000 derandomized) from seed PROPERTY_SEED (1), a line
# every 10,000. Figures in docs/benchmarks.md ("The job model against the truth").
test-property: $(STAMP)
	PROPERTY_EXAMPLES=$${PROPERTY_EXAMPLES:-100000} PROPERTY_SEED=$${PROPERTY_SEED:-1} PROPERTY_PROGRESS=$${PROPERTY_PROGRESS:-10000} \
		$(PY) -m pytest -q -s -p no:cacheprovider tests/unit/test_truth_property.py

# Rewrite tests/fixtures/e2e-output.txt (the golden exposition) after an intended change of the metrics; review its diff.
golden: $(STAMP)
	$(PY) -m pytest -q tests/unit/render/test_golden_exposition.py --update-golden

# The fault soak of tests/e2e/test_soak.py for longer: ten minutes unless SOAK_SECONDS says otherwise (make test: 50 s).
soak: $(STAMP)
	SOAK_SECONDS=$${SOAK_SECONDS:-600} $(PY) -m pytest -q -s tests/e2e/test_soak.py

# The benchmarks of docs/benchmarks.md on a simulated full node, against Debian's node_exporter (installed here when
# missing and root): about five minutes on 2 cores; exits 1 when a target is missed. Figures in bench/results/.
bench: $(STAMP)
	@command -v prometheus-node-exporter >/dev/null || [ "$$(id -u)" -ne 0 ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-node-exporter >/dev/null; }
	$(PY) -m bench.run --json bench/results/$$(date -u +%Y%m%dT%H%M%SZ).json

# The fleet's costs of docs/benchmarks.md ("Growth to 4,096 nodes"): 256 simulated nodes (demo --nodes,
# whole exporters), then 1,024, 2,048 and 4,096 from the target server of mfu_exporter/sim/targets.py, through two vmagent
# shards → VictoriaMetrics + vmalert, and up to 2,048 through Prometheus (below), each path
# in its own stack; the node tier of the rules centrally up to 1,024 nodes (a shard's size), above only the central
# tier; 15 s intervals; ~25 minutes and up to ~4 GiB of memory on 2 cores. FLEET_SIZES=256,1024 for less. Exits 1
# when a rule group takes over 10 % of its interval, a job's cluster MFU is off the truth by over 2 points, or the
# incident node is not named at 1,024 nodes or more. bench/results/. FLEET_LAYOUT=one puts one job on every node,
# FLEET_LAYOUT=mixed one on half of them and small jobs on the rest; BENCH_FLEET_ARGS="--partials-out f.json" keeps
# a shard's partials.
# The Prometheus path is one Prometheus scraping its nodes and evaluating, as a shard is deployed
# (deploy/fleet/prometheus-shard.yaml); BENCH_FLEET_ARGS="--prometheus-mode agent" for an agent and a receiver.
bench-fleet: $(STAMP) system-deps
	$(PY) -m bench.fleet --nodes $${FLEET_SIZES:-256,1024,2048,4096} --paths-apart --node-tier-up-to 1024 \
		--layout $${FLEET_LAYOUT:-small} $(BENCH_FLEET_ARGS) --json bench/results/fleet-$$(date -u +%Y%m%dT%H%M%SZ).json

# The growth table's replayed rows (docs/benchmarks.md, "A real node replayed"): a real node's exposition served on
# every node of 256, 1,024 and 2,048 (FLEET_SIZES), every job on every node, every rule file of alerts/ on vmalert over
# VictoriaMetrics and on a Prometheus scraping the nodes, each path in its own stack; per group its mean and share of
# its interval, each engine's slowest group, the machine's busy share; 120 s measured, so that the groups run once a
# minute finish twice. FLEET_EXPOSITION: `demo` (the default: a demo started and captured twice, 420 s and 480 s in,
# kept beside the JSON), two captured files, or a node's /metrics URL. ~40 minutes and up to ~4 GiB on 2 cores, on a
# quiet machine; exits 1 when a group takes over 10 % of its interval.
FLEET_EXPOSITION ?= demo
bench-fleet-replay: $(STAMP) system-deps
	$(PY) -m bench.fleet --nodes $${FLEET_SIZES:-256,1024,2048} --paths-apart --seconds 120 \
		$(foreach e,$(FLEET_EXPOSITION),--exposition $(e)) $(BENCH_FLEET_ARGS) \
		--json bench/results/fleet-replay-$$(date -u +%Y%m%dT%H%M%SZ).json

# The global tier of the rules fed S shards' partial aggregates (bench/global_tier.py; docs/scaling.md "Rules in
# three tiers"): PARTIALS from `make bench-fleet FLEET_SIZES=2048 FLEET_LAYOUT=one BENCH_FLEET_ARGS="--partials-out ..."`,
# replayed as 2, 4 and 8 shards of 2,048 nodes, on VictoriaMetrics and Prometheus; ~10 minutes.
bench-global: $(STAMP) system-deps
	$(PY) -m bench.global_tier --partials $(PARTIALS) --json bench/results/global-$$(date -u +%Y%m%dT%H%M%SZ).json

# A simulated fleet (FLEET_NODES, default 64) on both distributed paths, the UIs printed (VictoriaMetrics,
# vmalert, the Prometheus receiver's alerts), until Ctrl-C: docs/scaling.md "A fleet of 10,000 nodes".
fleet: $(STAMP) system-deps
	$(PY) -m tests.support.fleet_harness --nodes $${FLEET_NODES:-64} $(FLEET_ARGS)

# A GPU node's acceptance run (scripts/gpu-truth.py): real NVML through the GPU source, a bf16 GEMM of known FLOP/s and a
# small transformers Trainer through a real daemon, nvidia-smi beside it; a summary with each verdict and a JSON report
# in bench/results/. Needs PyTorch with CUDA (not a dependency): GPU_PYTHON=python3 for a system one (with the
# exporter's dependencies importable there). GPU_CHECK_ARGS=--fake runs it on the fake NVML, as make test does.
GPU_PYTHON ?= $(PY)
gpu-check: $(STAMP)
	$(GPU_PYTHON) scripts/gpu-truth.py --json bench/results/gpu-truth-$$(date -u +%Y%m%dT%H%M%SZ).json $(GPU_CHECK_ARGS)

# The documentation site (mkdocs.yml: the guides of docs/, docs/index.md its home page) into site/, in strict mode:
# a broken link, a missing page or an unknown anchor fails it. make test builds it too (tests/unit/test_docs_site.py).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

# Retake docs/img/status-page.png, the README's picture of the status page, from the demo in Chromium (Debian's,
# installed by system-deps) after a change of the page; review it before committing.
screenshot: $(STAMP) system-deps
	$(PY) -m pytest -q tests/e2e/test_screenshot.py --update-screenshot

# The two distributions, wheel and sdist each, into dist/, checked by twine: mfu-exporter-client (clients/python, the
# training-side client, standard library only) and mfu-exporter (the daemon, which requires the client at its
# version). make test builds, checks and installs them too (tests/e2e/test_packaging.py).
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist clients/python
	$(PY) -m build --no-isolation --outdir dist .
	rm -rf build clients/python/build *.egg-info clients/python/*.egg-info  # setuptools' leftovers in the tree
	$(PY) -m twine check --strict dist/*

# Regenerate the Kubernetes PrometheusRule after editing alerts/*.yaml (a test fails while it drifts), and point every
# runbook_url in alerts/ and the PrometheusRule at RUNBOOK_BASE/runbook.md#<alert> (default: the repository's docs;
# a site with its own copy of the runbook: make rules RUNBOOK_BASE=https://wiki.example.org/mfu).
rules: $(STAMP)
	$(PY) scripts/gen-prometheusrule.py $(if $(RUNBOOK_BASE),--runbook-base '$(RUNBOOK_BASE)')

clean:
	rm -rf $(VENV) build dist site *.egg-info clients/python/build clients/python/*.egg-info
