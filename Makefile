# The commands the README shows. Each target sets up what it needs from a clean clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lint typecheck test demo serve bench clean

# One virtualenv with the server, torch (pinned in constraints.txt) and the dev tools.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[server,torch,dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

demo: $(STAMP)
	$(BIN)/curvecast demo

serve: demo

# Each benchmark writes its own section of BENCHMARKS.md (several minutes each).
bench: $(STAMP)
	$(BIN)/python -m bench.ingest
	$(BIN)/python -m bench.forecast_latency
	$(BIN)/python -m bench.forecast_backtest
	$(BIN)/python -m bench.optimizer
	$(BIN)/python -m bench.client_overhead
	$(BIN)/python -m bench.dashboard --postgres

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache artifacts *.egg-info
