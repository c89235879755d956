# Two entry points on a fresh machine: `make demo` and `make test`. Both build .venv first.
# Torch: reuse an importable one (via system site-packages), else the pinned CPU wheel.
# Never pull the CUDA build here.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.brrr-installed
OUTDIR ?= brrr-report

.PHONY: demo test venv clean

$(STAMP): pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "using the torch already importable by $(PYTHON)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	    $(PYTHON) -m venv $(VENV); \
	    $(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@mkdir -p $(OUTDIR)
	$(VENV)/bin/brrr analyze --example mlp --json $(OUTDIR)/mlp.json --png $(OUTDIR)/mlp.png --html $(OUTDIR)/mlp.html
	-$(VENV)/bin/brrr explain --example mlp
	@echo "report: $(OUTDIR)/mlp.html  $(OUTDIR)/mlp.png  $(OUTDIR)/mlp.json"

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -n 2 --durations=15 tests

clean:
	rm -rf $(VENV) $(OUTDIR) .pytest_cache
