"""Equal terms with transformers (issue 33 item 2): an HF assisted arm is handed the very draft object SpecLab's arm
with the same draft_quant decodes with, int8 or float32, and every record says which precision that was."""
from __future__ import annotations

import pytest

from bench import runner
from bench.common import Prompt
from bench.runner import hf, ours, run_draft, run_one

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_both_families_get_one_draft_per_draft_quant(monkeypatch):
    """Before, only SpecLab's arms went through the int8 loader; transformers got the float32 draft as loaded."""
    seen = []
    monkeypatch.setattr(runner, "quantized_draft", lambda quant, draft: seen.append(quant) or ("draft", quant))
    ours_arm = ours("ours/dm", "dm", "draft-model", draft_quant="int8")
    hf_arm = hf("hf/a", "a", "draft-model", kernels="packed", draft_quant="int8")
    assert run_draft(ours_arm, "f32") == run_draft(hf_arm, "f32") == ("draft", "int8")
    assert run_draft(hf("hf/a", "a", "draft-model", draft_quant="none"), "f32") == ("draft", "none")
    assert run_draft(ours("ours/b", "b", "baseline"), "f32") is None  # no draft, no precision to name
    assert run_draft(hf("hf/g", "g", "baseline"), "f32") is None
    assert seen == ["int8", "int8", "none"]
    assert ours("ours/x", "x", "draft-model").draft_quant == hf("hf/x", "x", "draft-model").draft_quant == "auto"


@pytest.mark.slow
@pytest.mark.parametrize("quant, precision", [("int8", "int8"), ("none", "float32")])
def test_transformers_decodes_with_the_very_draft_speclab_runs(quant, precision):
    """SmolLM2 drafting for itself: transformers' assisted generation runs the int8 module as well as the float32
    one (it only calls the draft's forward), and its greedy output still equals transformers' greedy."""
    from decoders.runtime.models import load_model

    target = load_model("smollm2-135m", dtype="float32")
    models = {"target": target, "draft": target}
    prompt = Prompt("p", "code-editing", "", target.encode_prompt(
        "Repeat exactly: alpha beta gamma delta epsilon zeta eta theta iota kappa", chat=True))
    ours_arm = ours("ours/dm", "dm", "draft-model", draft_model="smollm2-135m", rule="static", gamma=4,
                    draft_quant=quant)
    hf_arm = hf("hf/assisted", "a", "draft-model", kernels="packed", draft_quant=quant, num_assistant_tokens=4,
                assistant_confidence_threshold=0.0)
    assert run_draft(ours_arm, target) is run_draft(hf_arm, target)
    records = {m.key: run_one(m, models, prompt, 24) for m in (
        ours("ours/baseline", "b", "baseline"), hf("hf/greedy", "g", "baseline", kernels="packed"), ours_arm, hf_arm)}
    assert records["ours/dm"]["draft_precision"] == records["hf/assisted"]["draft_precision"] == precision
    assert records["hf/assisted"]["draft_quant"] == quant and records["hf/greedy"]["draft_precision"] is None
    assert records["hf/assisted"]["output_ids"] == records["hf/greedy"]["output_ids"]
    assert records["ours/dm"]["output_ids"] == records["ours/baseline"]["output_ids"]
    assert records["hf/assisted"]["draft_forwards"] > 0  # it drafted
