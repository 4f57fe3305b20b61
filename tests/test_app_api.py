"""The app through gradio_client against a launched demo: streaming, equality with decoders.generate, errors.

Uses the real embedded default (smollm2-135m) in float32 with greedy decoding and a few tokens, so it stays fast
once the converted weight cache exists.
"""
from __future__ import annotations


import pytest

from app.tabs.generate import handlers
from app.tabs.generate.controls import TREE_CONTROLS, opening_value

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]
from app_server import launched_demo  # noqa: E402

PROMPT = "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape."
TOKENS = 24


@pytest.fixture(scope="module")
def server():
    with launched_demo() as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client

    return Client(server, verbose=False)


def controls(**overrides) -> list:
    values = {"prompt": PROMPT, "model": "smollm2-135m", "dtype": "float32", "method": "speculative",
              "drafter": "layer-skip", "draft_model": handlers.DEFAULT_DRAFT, "rule": "adaedl", "controller": "off",
              "gamma": 4,
              "max_draft": 6, "lam": 0.5, "ngram": 3, "skip_layers": "", "max_new_tokens": TOKENS,
              "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "chat": True, "live": True}
    values.update({name: opening_value(name) for name in TREE_CONTROLS}, **overrides)  # the page's tree defaults
    return [values[name] for name in handlers.RUN_INPUTS]


def text_of(update) -> str | None:
    """The HighlightedText value inside one streamed update (outputs: status, error, text, ...)."""
    value = update[2] if isinstance(update, (list, tuple)) and len(update) > 2 else None
    if not isinstance(value, list) or not value:  # a skipped output arrives as {"__type__": "update"}
        return None
    return "".join(span.get("token", "") for span in value)


def test_api_lists_the_endpoints(client):
    api = client.view_api(print_info=False, return_format="dict")
    assert {"/run", "/race", "/load_trace", "/stop"} <= set(api["named_endpoints"])


@pytest.mark.slow
def test_run_streams_and_equals_generate(client):
    from decoders import DecodeOptions, generate

    job = client.submit(*controls(), api_name="/run")
    updates = list(job)
    texts = [t for t in (text_of(u) for u in updates) if t is not None]
    assert len(texts) >= 2, f"expected several streamed updates, got {len(texts)}"
    final = job.result()
    assert not final[1], f"unexpected error: {final[1]}"
    expected = generate(DecodeOptions(model="smollm2-135m", method="speculative", drafter="layer-skip",
                                      rule="adaedl", max_draft=6, lam=0.5, max_new_tokens=TOKENS, dtype="float32"),
                        PROMPT)
    assert text_of(final) == expected.output_text
    from app.tabs.generate.views import OUTPUTS

    download = final[OUTPUTS.index("download") - 1]  # "state" is server-side: not among the API's outputs
    assert download and str(download).endswith(".json")  # the trace download


def test_bad_input_comes_back_as_a_message(client):
    final = client.predict(*controls(prompt=""), api_name="/run")
    assert "prompt is empty" in final[1]
    final = client.predict(*controls(drafter="prompt-lookup", rule="adaedl"), api_name="/run")
    assert "prompt lookup" in final[1]


def test_bad_trace_upload_comes_back_as_a_message(client, tmp_path):
    from gradio_client import handle_file

    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    final = client.predict(handle_file(str(bad)), api_name="/load_trace")
    assert "not valid JSON" in final[1]
