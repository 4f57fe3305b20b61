"""bench/load.py without a server: how a request's answer is classified, the inputs each tab gets, the table."""
from __future__ import annotations

from types import SimpleNamespace

from bench import load


def test_a_traceback_in_any_output_is_a_failure_and_busy_is_told_apart():
    assert load.classify(["", "", "fine"]) == ("ok", "")
    assert load.classify(["", 'Traceback (most recent call last):\n  File "x.py", line 3'])[0] == "traceback"
    assert load.classify(["", '<div class="sl-error">The server is busy: try again</div>'])[0] == "busy"
    assert load.classify(["", '<div class="sl-error">The prompt is empty.</div>']) == ("message", "The prompt is empty.")


def test_arguments_follow_the_api_by_name_or_label_and_fill_audio_and_reference():
    run = [{"parameter_name": "prompt", "label": "Prompt", "component": "Textbox", "parameter_has_default": True,
            "parameter_default": "x"},
           {"parameter_name": "max_new_tokens", "label": "max new tokens", "component": "Slider",
            "parameter_has_default": True, "parameter_default": 64},
           {"parameter_name": "skip_layers", "label": "skip", "component": "Textbox", "parameter_has_default": False,
            "parameter_default": None}]
    generate = load.Endpoint("Generate", "/run", (("max_new_tokens", 8),))
    assert load.arguments(generate, run, "hello") == ["hello", 8, ""]
    whisper = [{"parameter_name": "param_0", "label": "Speech", "component": "Audio", "parameter_has_default": False},
               {"parameter_name": "param_1", "label": "Reference", "component": "Textbox",
                "parameter_has_default": False},
               {"parameter_name": "param_4", "label": "Decoders", "component": "Checkboxgroup",
                "parameter_has_default": True, "parameter_default": ["beam"]}]
    audio, reference, decoders = load.arguments(load.Endpoint("Whisper", "/w", (("Decoders", ["greedy"]),)), whisper, "p")
    assert str(load.CLIP) in str(audio) and reference == "he was not an ill disposed young man" and decoders == ["greedy"]


def test_summary_counts_failures_and_compares_the_peak_with_the_budget():
    log = [load.Request(0, "Generate", 0.0, 2.0, "ok"), load.Request(1, "Generate", 0.5, 4.0, "busy", "busy"),
           load.Request(2, "Race", 1.0, 9.0, "traceback", "Traceback")]
    args = SimpleNamespace(users=3, minutes=1.0, tokens=8)
    s = load.summary(log, [(0.0, 1.0), (1.0, 1.5)], 1.2, args, {"/beams_run"}, 70.0)
    assert s["tabs"]["Generate"]["ok"] == 1 and s["tabs"]["Generate"]["busy"] == 1 and s["tabs"]["Race"]["traceback"] == 1
    assert s["peak_rss_gb"] == 1.5 and not s["within_budget"] and not s["every_request_answered_clearly"]
    table = load.markdown(s)
    assert "| Race | 1 | 0 | 0 | 0 | 1 |" in table and "OVER the budget" in table and "/beams_run" in table
