# The two set-up commands of the README. Each creates .venv on a fresh machine first.
# make test-fast: the unit tests alone (no vLLM engine, no Ray, no C++ build in-process), for
# the edit-test loop; make test (what CI runs) is the whole suite.
.PHONY: demo test test-fast setup

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/omni-ray sweep configs/smoke.yaml

# --durations: the 25 slowest tests close every run's output, so a run on a machine slower than
# the one the suite was timed on shows where its time goes.
test: setup
	.venv/bin/python -m pytest -q --durations=25 tests

test-fast: setup
	.venv/bin/python -m pytest -q tests/unit -m "not native" --timeout 120
