# kvlab: `make run` executes every notebook, `make test` runs the whole suite. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
# CPU torch by default. GPU users choose their build, e.g.
#   make run TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvlab-installed
export PYTHONHASHSEED := 0

.PHONY: setup run test lab bench notebooks clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[notebooks,hf,dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name kvlab --display-name "kvlab (Python)" >/dev/null
	touch $(STAMP)

run: setup
	$(BIN)/kvlab run

test: setup
	$(BIN)/python -m pytest

lab: setup
	$(BIN)/jupyter lab notebooks/

bench: setup
	$(BIN)/python -m benchmarks

# Re-execute the committed notebooks in place (their stored outputs are what nbval compares).
notebooks: setup
	for nb in notebooks/[0-9][0-9]_*.ipynb; do \
	  $(BIN)/papermill -k kvlab --cwd notebooks "$$nb" "$$nb" || exit 1; \
	  $(BIN)/python -m kvlab.nb.nbclean "$$nb"; done

clean:
	rm -rf $(VENV) runs
