# The two commands of README.md: `make serve` and `make test`. Each sets up what it needs first.
PORT ?= 8080
HOST ?= 127.0.0.1
PYTEST_ARGS ?=

.PHONY: serve test setup setup-test
setup:
	scripts/setup.sh
setup-test:
	scripts/setup.sh --test
serve: setup
	.venv/bin/talkgate serve --host $(HOST) --port $(PORT)
test: setup-test
	.venv/bin/python -m pytest $(PYTEST_ARGS)
