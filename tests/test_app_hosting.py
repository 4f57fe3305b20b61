"""On a public Space visitors may name only the registry's models; locally any hub id or path stays available."""
from __future__ import annotations

import pytest

from app.tabs.generate import handlers

from app.shared import hosting

from app.tabs.race import runs as race
from decoders.options import OptionsError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

HUB_ID = "SomeOrg/some-model-7b"


@pytest.fixture
def on_a_space(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/speclab")
    monkeypatch.delenv(hosting.REGISTRY_ONLY_SETTING, raising=False)


@pytest.fixture
def local(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv(hosting.REGISTRY_ONLY_SETTING, raising=False)


def options_for(**values):
    return handlers.options_from({"method": "baseline", **values})


def test_a_space_accepts_only_registry_names(on_a_space):
    assert hosting.registry_only()
    with pytest.raises(OptionsError, match="only runs the listed models.*smollm2-135m"):
        options_for(model=HUB_ID)
    with pytest.raises(OptionsError, match="draft model"):
        options_for(model="qwen2.5-coder-1.5b", method="speculative", drafter="draft-model",
                    draft_model="/etc/some-local-folder")
    assert options_for(model="SmolLM2-135M").model == "SmolLM2-135M"  # registry names, any case


def test_local_use_keeps_free_ids(local):
    assert not hosting.registry_only()
    assert options_for(model=HUB_ID).model == HUB_ID


@pytest.mark.parametrize("space, setting, expected", [(None, "1", True), ("a/b", "0", False), ("a/b", "", True),
                                                      (None, "", False)])
def test_the_setting_overrides_the_default(monkeypatch, space, setting, expected):
    if space:
        monkeypatch.setenv("SPACE_ID", space)
    else:
        monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setenv(hosting.REGISTRY_ONLY_SETTING, setting)
    assert hosting.registry_only() is expected


def test_the_run_and_the_race_refuse_with_a_message(on_a_space):
    values = dict(zip(handlers.RUN_INPUTS, [None] * len(handlers.RUN_INPUTS)))
    values.update(prompt="hi", model=HUB_ID, method="baseline", max_new_tokens=8)  # an empty box is refused
    last = list(handlers.run(*[values[n] for n in handlers.RUN_INPUTS], progress=lambda *a, **k: None))[-1]
    assert "only runs the listed models" in last["error"] and "Traceback" not in last["error"]
    raced = {"prompt": "hi", "model": HUB_ID, "dtype": "float32", "draft_model": None,
             "methods": ["prompt lookup · static γ=4"], "max_new_tokens": 8, "temperature": 0.0, "seed": 0}
    last = list(race.race(*[raced[n] for n in race.RACE_INPUTS], progress=lambda *a, **k: None))[-1]
    assert "only runs the listed models" in last["race_error"]


def test_the_model_boxes_take_no_free_text_on_a_space(on_a_space):
    from app.page import build_demo

    config = build_demo().get_config_file()
    boxes = [c["props"] for c in config["components"]
             if c.get("type") == "dropdown" and "model" in c.get("props", {}).get("label", "").lower()]
    labels = {box["label"] for box in boxes}
    assert {"Target model", "Draft model", "Draft model (DSBD)"} <= labels  # every tab's model boxes, not the first
    assert [box["label"] for box in boxes if box["allow_custom_value"]] == []


def test_the_model_boxes_take_free_text_locally(local):
    from app.page import build_demo

    config = build_demo().get_config_file()
    target = next(c["props"] for c in config["components"] if c.get("props", {}).get("label") == "Target model")
    assert target["allow_custom_value"] is True
