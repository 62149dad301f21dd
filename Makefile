# gpulease: two set-up commands.
#   make run   install into .venv and node_modules, then run the embedded hub
#   make test  the same install, then lint and the whole test suite
#   make screenshots  the pages' pictures in docs/images/ (README and docs show them)

# As root, the per-user accounts must be able to run the environment's
# interpreter: scripts/pick-python explains the choice.
PYTHON ?= $(shell scripts/pick-python)
VENV   ?= .venv
BIN     = $(VENV)/bin
# The official configurable-http-proxy is installed with npm inside the project.
export PATH := $(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: install run test lint bench bench-quick clean labextension cluster-tools screenshots

install: $(VENV)/.installed node_modules/.installed
	@if [ "$$(id -u)" = 0 ] && ! command -v nft >/dev/null 2>&1; then \
	  echo "note: nft is missing: as root, servers run without their sandbox (docs/admin.md," \
	       "\"The sandbox's network\"); Debian: apt-get install nftables"; fi

$(VENV)/.installed: pyproject.toml singleuser/labextension/prebuilt/package.json
	$(PYTHON) -c 'import sys; sys.exit("gpulease needs Python 3.11 or newer") if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,cluster]'
	$(BIN)/python -m gpulease.singleuser.install
	touch $@

node_modules/.installed: package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

run: install
	$(BIN)/gpulease up $(ARGS)

lint: install
	$(BIN)/ruff check .
	scripts/lint-imports

# The Kubernetes control plane of the cluster tests (tests/cluster/), built
# from Go modules and cached outside the clone: minutes cold, a second warm.
# Without Go it says so, and the cluster tests skip (under CI=true they fail).
cluster-tools:
	scripts/cluster-tools

# The cluster tests run beside the others (scripts/run-tests); a chosen test path or -k
# expression in PYTEST_ARGS runs just that, as one pytest run.
test: install lint cluster-tools
	PYTEST=$(BIN)/pytest scripts/run-tests $(PYTEST_ARGS)

# Every benchmark, one after another (bench/suite.py; bench/README.md says what each
# measures): about 25 minutes on 2 cores (22 in the last full run). bench-quick runs
# each in its quick mode, as CI
# does after the tests, to check that all still run and print their figures.
# ARGS="--only spawn" runs one.
bench: install cluster-tools
	$(BIN)/python bench/suite.py $(ARGS)

bench-quick: install cluster-tools
	$(BIN)/python bench/suite.py --quick $(ARGS)

# Screenshots of the hub's and the gpulease service's pages for the README and docs
# (docs/images/*.png, 1280x800), from a throwaway hub with a demo admin and researcher:
# scripts/screenshots.py (needs Chromium, as the browser tests do). ARGS="--out DIR"
# writes them elsewhere, ARGS="--only usage,lab" takes just those.
screenshots: install
	$(BIN)/python scripts/screenshots.py $(ARGS)

# Rebuild the committed prebuilt labextension after editing singleuser/labextension/src
# (needs Node and npm; installs never need it).
labextension: $(VENV)/.installed
	cd singleuser/labextension && npm ci --no-audit --no-fund --loglevel=error && \
		PYTHON=$(CURDIR)/$(BIN)/python npm run build
	$(BIN)/python -m gpulease.singleuser.install

clean:
	rm -rf $(VENV) node_modules
