"""The app loads a draft the way the API does (issue 33 item 2): the same draft_quant gives the same draft object, so
the Race races the draft the API, the CLI and bench would run, and its row says which draft that was."""
from __future__ import annotations

import pytest

from app.figures.race import draft_description, method_cell, race_table_html
from app.shared import loading
from decoders import api
from decoders.runtime import kernels
from decoders.options import DecodeOptions


def _options(quant: str) -> DecodeOptions:
    # SmolLM2 drafting for itself: the smallest registry model that can be a draft (it has no pairing of its own)
    return DecodeOptions(model="smollm2-135m", method="speculative", drafter="draft-model",
                         draft_model="smollm2-135m", draft_quant=quant, dtype="float32")


@pytest.mark.slow
@pytest.mark.parametrize("quant, kind", [("int8", kernels.INT8), ("none", kernels.PACKED)])
def test_the_app_loads_the_same_draft_as_the_api(quant, kind):
    options = _options(quant)
    _, app_draft = loading.load_models(options)
    api_draft = api.load_draft("smollm2-135m", options)
    assert kernels.kernels_of(app_draft.model) == kernels.kernels_of(api_draft.model) == kind
    assert app_draft is api_draft  # one resident copy per (name, dtype, quantization): the very same module


@pytest.mark.slow
def test_auto_asks_the_same_question_in_the_app_as_in_the_api(monkeypatch):
    """draft_quant "auto": both go through decoders/quantize.py's decision (here: int8 pays on this machine)."""
    from decoders import quantize

    asked = []
    monkeypatch.setattr(quantize, "resolve", lambda draft_quant, name, device, load: asked.append(draft_quant)
                        or kernels.INT8)
    _, app_draft = loading.load_models(_options("auto"))
    assert asked == ["auto"] and kernels.kernels_of(app_draft.model) == kernels.INT8
    assert app_draft is api.load_draft("smollm2-135m", _options("auto"))


class _Trace:
    def __init__(self, draft):
        self.models = {"target": {"name": "t"}, "draft": draft}


def test_the_race_row_names_the_draft_that_raced():
    int8 = {"name": "qwen2.5-coder-0.5b", "dtype": "float32", "kernels": "int8"}
    packed = {"name": "qwen2.5-coder-0.5b", "dtype": "float32", "kernels": "packed"}
    assert draft_description(_Trace(int8)) == "qwen2.5-coder-0.5b, int8 linears"
    assert draft_description(_Trace(packed)) == "qwen2.5-coder-0.5b, float32, packed"
    assert draft_description(_Trace({"name": "d", "dtype": "bfloat16", "kernels": "stock"})) == "d, bfloat16"
    assert draft_description(_Trace(None)) is None
    row = {"label": "speculative · draft model · AdaEDL", "draft": "qwen2.5-coder-0.5b, int8 linears"}
    cell = method_cell(row)
    assert "draft: qwen2.5-coder-0.5b, int8 linears" in cell and 'title="draft model: ' in cell
    assert method_cell({"label": "autoregressive baseline", "draft": None}) == "<td>autoregressive baseline</td>"
    table = race_table_html([{**row, "method": "speculative", "tokens_per_second": 10.0, "speedup": 2.0,
                              "tau": 3.0, "acceptance_rate": 0.5, "gamma": 4.0, "c": 0.2, "identical": True}])
    assert "int8 linears" in table
