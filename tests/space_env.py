"""A Hugging Face Space, offline: the venv a Space builds (requirements.txt alone), the hub cache it would download
into (written from the packaged weights: decoders/hub_cache.py), and app.py started as a Space starts it.

The venv is cached between runs under cache_dir()/space-venv/<the requirements' hash> (a few minutes to build; a
changed requirements.txt builds a new one); the hub cache under cache_dir()/space-hub. SPECLAB_CACHE is a fresh
folder for each start, so nothing converted by the local venv (which has the weight wheels) can stand in for what
the Space loads by hub id.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements.txt"
BUILD_SECONDS = 1800  # pip's worst case here: every wheel from the registry, torch from the local disk
START_SECONDS = 600  # app.py on a busy 2-core machine: imports, the page's figures, then Gradio's server


def _cache() -> Path:
    from decoders.runtime.model_files import cache_dir

    return cache_dir()


@contextlib.contextmanager
def _locked(path: Path):
    """One builder at a time (two test sessions on one machine would both pip into one folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def space_venv() -> Path:
    """The venv's folder: python3 -m venv, then pip install -r requirements.txt and nothing else."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = _cache() / "space-venv" / digest
    stamp = venv / ".speclab-complete"
    with _locked(venv.with_name(f".{digest}.lock")):
        if stamp.is_file():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a build that died half-way
        base = getattr(sys, "_base_executable", sys.executable)  # the interpreter under this venv: Python 3.11
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
                             capture_output=True, text=True, timeout=BUILD_SECONDS)
        if pip.returncode != 0:
            raise RuntimeError(f"pip install -r requirements.txt failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}")
        stamp.write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    return venv


def space_hub(names: list[str]) -> Path:
    """HF_HOME holding the hub repos of these registry models (written once, from the packaged weights)."""
    from decoders.hub_cache import write_hub_cache

    home = _cache() / "space-hub"
    with _locked(home.with_name(".space-hub.lock")):
        write_hub_cache(home, names, say=lambda message: print(message, flush=True))
    return home


def space_environment(hf_home: Path, speclab_cache: Path, port: int) -> dict:
    """What a Space's process sees (SPACE_ID, its hub cache) with no network: offline, nothing of ours inherited."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("SPECLAB_", "HF_", "GRADIO_"))}
    return {**env, "SPACE_ID": "speclab-tests/speclab", "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
            "SPECLAB_CACHE": str(speclab_cache), "GRADIO_SERVER_NAME": "127.0.0.1",
            "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def space_server(venv: Path, env: dict, log: Path):
    """`python app.py` in the repository with the Space's venv and environment; yields the local URL once Gradio
    says it is serving. The log (stdout and stderr) is kept at `log` for the test to read."""
    with open(log, "w") as out:
        process = subprocess.Popen([str(venv / "bin" / "python"), "app.py"], cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{env['GRADIO_SERVER_PORT']}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while "Running on local URL" not in log.read_text(errors="replace"):
            if process.poll() is not None:
                raise RuntimeError(f"app.py exited with {process.returncode} before serving:\n"
                                   f"{log.read_text(errors='replace')[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"app.py did not serve within {START_SECONDS} s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
