# Two commands do all the set-up on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PEERS := $(VENV)/.peers
TORCH_VERSION := 2.13.0

.PHONY: install train test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The suite also runs the peers a user could install instead (torchft); training never needs them.
$(PEERS): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,peers]'
	touch $(PEERS)

install: $(STAMP)

# The default job: two local workers train a small ResNet on the bundled digits with the
# large-minibatch recipe: 4x the base batch, so 4x the base rate reached by gradual warmup.
train: $(STAMP)
	$(PY) -m scalesgd train --workers 2 --dataset digits --model resnet8 --batch-size 256 --base-batch 64 --epochs 30

test: $(PEERS)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
