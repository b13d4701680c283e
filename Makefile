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
# the fast loop: tests/unit (no server, no network), under 3 minutes on 2 cores; sets up only on a fresh checkout
test-fast:
	@[ -x .venv/bin/pytest ] || scripts/setup.sh --test
	.venv/bin/python -m pytest tests/unit $(PYTEST_ARGS)
image:
	VARIANT=$(VARIANT) scripts/image.sh
