# Set-up and entry points. `make demo` and `make test` install what they need first (the package and
# its tested requirements, then the data).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
FMNIST_DEBIAN := /usr/share/datasets/fashion-mnist
FMNIST_LOCAL := data/fashion-mnist

.PHONY: install data demo test clean

$(STAMP): setup.py requirements/constraints.txt
	@test -x $(PY) || { echo ">> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo ">> installing ifnd and the tested versions of its requirements into $(VENV)"
	$(PY) -m pip install --disable-pip-version-check -q -c requirements/constraints.txt -e '.[tests]'
	@touch $(STAMP)

install: $(STAMP)

# The data the demo trains on and the tests read: Debian's dataset-fashion-mnist where apt can
# install it, else torchvision's downloader into data/fashion-mnist.
data: install
	@if [ -f $(FMNIST_DEBIAN)/train-images-idx3-ubyte.gz ]; then \
	    echo ">> Fashion-MNIST found in $(FMNIST_DEBIAN)"; \
	elif [ -f $(FMNIST_LOCAL)/FashionMNIST/raw/train-images-idx3-ubyte ]; then \
	    echo ">> Fashion-MNIST found in $(FMNIST_LOCAL)"; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    { echo ">> installing Debian's dataset-fashion-mnist into $(FMNIST_DEBIAN)"; \
	      apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; }; }; then \
	    echo ">> installed $(FMNIST_DEBIAN)"; \
	else \
	    echo ">> downloading Fashion-MNIST with torchvision into $(FMNIST_LOCAL)"; \
	    $(PY) -c "import torchvision; torchvision.datasets.FashionMNIST('$(FMNIST_LOCAL)', download=True)"; \
	fi

demo: data
	$(PY) tools/demo.py

# mmengine imported once first: yapf, its config formatter, writes a grammar cache at its first import
# on a machine, and test workers starting together would read each other's half-written file.
test: data
	$(PY) -c 'import mmengine.config'
	$(PY) -m pytest tests -q -n auto --dist loadfile

clean:
	rm -rf work_dirs .pytest_cache
