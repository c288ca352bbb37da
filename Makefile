# Two entry points; both set up what they need first (see scripts/setup.sh).
.PHONY: plan test lint golden readme setup setup-full

plan: setup
	.venv/bin/dsv4ctl plan

test: setup-full
	scripts/run-tests.sh

lint: setup
	.venv/bin/ruff check .

# Regenerate golden files after an intended change; review the diff like code.
golden: setup-full
	.venv/bin/python -m pytest tests -q --update-golden -k golden

# Regenerate the README's command and exit-code tables from the CLI.
readme: setup
	.venv/bin/python scripts/gen_readme.py

setup:
	scripts/setup.sh base

setup-full:
	scripts/setup.sh full
