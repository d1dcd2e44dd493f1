# The two set-up commands of the README. Each creates .venv on a fresh machine first.
.PHONY: demo test setup

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/omni-ray sweep configs/smoke.yaml

test: setup
	.venv/bin/python -m pytest -q tests
