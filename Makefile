# The commands of README.md: `make serve`, `make test` (everything: what CI runs) and `make test-fast` (the unit tests).
PORT ?= 8080
HOST ?= 127.0.0.1
PYTEST_ARGS ?=

.PHONY: serve test test-fast setup setup-test
setup:
	scripts/setup.sh
setup-test:
	scripts/setup.sh --test
serve: setup
	.venv/bin/talkgate serve --host $(HOST) --port $(PORT)
test: setup-test
	.venv/bin/python -m pytest $(PYTEST_ARGS)
# the fast loop: tests/unit (no server, no network), under 3 minutes on 2 cores; sets up only on a fresh checkout
test-fast:
	@[ -x .venv/bin/pytest ] || scripts/setup.sh --test
	.venv/bin/python -m pytest tests/unit $(PYTEST_ARGS)
