# The commands the README shows. Each target sets up what it needs from a clean clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lint typecheck test demo serve bench clean

# One virtualenv with the server, torch (pinned in constraints.txt) and the dev tools.
# pip is not --quiet: the first install downloads torch and about 100 other packages (about 2 GB
# installed; minutes), and pip's own lines are the progress a newcomer sees meanwhile.
$(STAMP): pyproject.toml constraints.txt
	@echo "[install 1/2] creating the virtualenv $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "[install 2/2] installing curvecast with the server, torch and the dev tools into $(VENV):"
	@echo "              the first time this downloads about 2 GB (mostly torch) and takes minutes"
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -c constraints.txt -e '.[server,torch,dev]'
	touch $(STAMP)
	@echo "[install] done: $(VENV) is ready"

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# One pytest worker per core, at most 4: most tests wait on real servers, workers and
# databases rather than compute, and each worker starts its own (session fixtures), so the
# tests do not share state across workers, and two workers take about half the time of one.
test: lint typecheck
	$(BIN)/pytest -n auto --maxprocesses=4

# Serves on http://127.0.0.1:8000 (a free port if 8000 is taken) and trains a small model for
# 2000 steps (a few minutes), printing its progress; its database and log go to curvecast-demo/
# (git-ignored).
demo: $(STAMP)
	$(BIN)/curvecast demo

serve: demo

# Each benchmark writes its own section of BENCHMARKS.md (several minutes each);
# `python -m bench list` shows them all.
bench: $(STAMP)
	$(BIN)/python -m bench run ingest
	$(BIN)/python -m bench run forecast_latency
	$(BIN)/python -m bench run forecast_backtest
	$(BIN)/python -m bench run held_band
	$(BIN)/python -m bench run optimizer
	$(BIN)/python -m bench run client_overhead
	$(BIN)/python -m bench run demo_run
	$(BIN)/python -m bench run dashboard --postgres
	$(BIN)/python -m bench run gc_pauses
	$(BIN)/python -m bench run partition
	$(BIN)/python -m bench run worker_rounds
	$(BIN)/python -m bench run read_series
	$(BIN)/python -m bench run request_cost
	$(BIN)/python -m bench run pruning

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache artifacts *.egg-info
