# The commands of README.md: `make serve`, `make test` (everything: what CI runs) and `make test-fast` (the unit tests).
# `make image`: the container image with buildah (VARIANT=cpu or cuda; docs/deploy.md, "The image").
PORT ?= 8080
HOST ?= 127.0.0.1
PYTEST_ARGS ?=
VARIANT ?= cpu

.PHONY: serve test test-fast setup setup-test image
setup:
	scripts/setup.sh
setup-test:
	scripts/setup.sh --test
serve: setup
	.venv/bin/talkgate serve --host $(HOST) --port $(PORT)
test: setup-test
	.venv/bin/python -m pytest $(PYTEST_ARGS)
# the fast loop: tests/unit (no server, no network) in two processes, about 3 minutes on 2 cores (5.5 in one);
# the tests that need the CPU engine ahead of real time may skip there when the two contend (`make test` runs them
# one at a time); sets up where the test extras (pytest-xdist among them) are missing
test-fast:
	@.venv/bin/python -c "import xdist" 2>/dev/null || scripts/setup.sh --test
	.venv/bin/python -m pytest tests/unit -n 2 $(PYTEST_ARGS)
image:
	VARIANT=$(VARIANT) scripts/image.sh
