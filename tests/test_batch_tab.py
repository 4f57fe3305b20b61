"""The Batch tab's handlers and figures without a browser, on tiny random models: a batch streams lanes, a lane
click opens that row's rounds, Stop ends it, bad input is one line, and the throughput panel explains itself."""
from __future__ import annotations

import pytest

from app.figures import batch as figures
from app.shared import loading
from app.shared.session import RunSession
from app.tabs.batch import handlers
from decoders.batch import BatchTrace

PROMPTS = "abc\nabab abab abab abab\nq\na much longer prompt than the others, so the rows are ragged"


@pytest.fixture
def tiny_models(monkeypatch, tiny, drafts):
    monkeypatch.setattr(loading, "load", lambda name, options, report=None: drafts["noisy"] if name == "d" else tiny)
    monkeypatch.setattr(loading, "load_draft", lambda name, options, report=None: drafts["noisy"])
    monkeypatch.setattr(loading, "check_loadable", lambda name: None)  # the tiny drafts' names are no models
    monkeypatch.setattr(loading, "draft_name", lambda o: "d" if o.method == "speculative" and
                        o.drafter == "draft-model" else None)
    monkeypatch.setattr(handlers, "STREAM_EVERY", 0.0)


def run(prompts=PROMPTS, method="batched speculative", drafter="draft-model", max_tokens=12, temperature=0.0,
        seeds="", session=None):
    return handlers.run_batch(prompts, "tiny", method, drafter, max_tokens, temperature, seeds, session=session)


@pytest.mark.parametrize("drafter", ["draft-model", "prompt-lookup", "layer-skip"])
def test_a_batch_streams_lanes_and_every_row_finishes(tiny_models, drafter):
    results = [r for r in run(drafter=drafter) if isinstance(r.get("state"), dict) and r["state"].get("kind")]
    assert len(results) >= 2, "expected the lanes drawn more than once while the batch streamed"
    final = BatchTrace.from_dict(results[-1]["state"])
    assert len(final) == 4 and all(row.stop_reason == "max_new_tokens" for row in final)
    lanes = results[-1]["lanes"]
    assert lanes.count('<button class="bt-lane') == 4 and 'data-row="3"' in lanes
    assert "bt-pad" in lanes  # ragged prompts and drafts leave padding, drawn as padding
    assert "total tokens/s" in results[-1]["stats"] and "τ per row" in results[-1]["stats"]
    assert results[-1]["error"] == ""


def test_a_lane_click_opens_that_rows_rounds(tiny_models):
    final = [r for r in run() if isinstance(r.get("state"), dict) and r["state"].get("kind")][-1]
    batch = BatchTrace.from_dict(final["state"])
    opened = handlers.open_row(final["state"], 2)
    assert opened["row"] == 2 and "Row 3" in opened["row_title"]
    assert 'bt-lane bt-selected" data-row="2"' in opened["lanes"]
    assert opened["tree"].layout.title.text and opened["slider"]["maximum"] == max(len(batch[2].rounds), 2)
    first = handlers.show_round(final["state"], 2, 1)
    assert "round 1" in first["tree"].layout.title.text.lower()


def test_per_row_seeds_reach_the_rows(tiny_models):
    final = [r for r in run(temperature=1.0, seeds="1, 2, 3, 4") if isinstance(r.get("state"), dict)
             and r["state"].get("kind")][-1]
    batch = BatchTrace.from_dict(final["state"])
    assert [row.options["seed"] for row in batch] == [1, 2, 3, 4]


def test_stop_ends_a_running_batch(tiny_models):
    session = RunSession()
    results = run(max_tokens=150, session=session)
    for result in results:
        if isinstance(result.get("state"), dict) and result["state"].get("kind"):
            session.request_stop()
            break
    rest = list(results)
    assert rest and rest[-1]["status"].startswith("Stopped")
    final = BatchTrace.from_dict(rest[-1]["state"])
    assert all(len(row.output_ids) < 150 for row in final)


@pytest.mark.parametrize("prompts, seeds, message", [
    ("", "", "at least one prompt"),
    ("\n".join("p" for _ in range(9)), "", "at most 8 rows"),
    ("a\nb", "1, 2, 3", "one seed, or one per prompt"),
    ("a\nb", "x", "whole numbers"),
])
def test_bad_input_is_one_line(tiny_models, prompts, seeds, message):
    results = list(run(prompts=prompts, seeds=seeds))
    assert len(results) == 1 and message in results[0]["error"] and "Traceback" not in results[0]["error"]


def test_lane_cells_draw_kept_rejected_and_padding():
    from decoders.batch.trace import BatchRound

    batch = BatchTrace([], {}, "x")
    batch.extend([type("T", (), {"output_ids": [1] * 5, "totals": {"tau": 2.5}, "stop_reason": "eos"})(),
                  type("T", (), {"output_ids": [1] * 2, "totals": {"tau": 1.0}, "stop_reason": "max_new_tokens"})()])
    batch.rounds = [BatchRound(0, [0, 1], [4, 0], [4, 0], [5, 1]), BatchRound(1, [1], [2], [0], [1])]
    cells = figures.lane_cells(batch)
    assert cells[0] == [{"kept": 4, "own": 1, "rejected": 0, "pad": 0, "width": 5}, None]  # row 0 left the batch
    assert cells[1][0] == {"kept": 0, "own": 1, "rejected": 0, "pad": 4, "width": 5}  # 4 slots of padding
    assert cells[1][1] == {"kept": 0, "own": 1, "rejected": 2, "pad": 0, "width": 3}
    html = figures.lanes_html(batch, 1)
    assert html.count("bt-pad") == 4 + 1  # four padding slots + the key
    assert 'title="' in html and "left the batch" in html


def test_throughput_sentences_say_why_each_b_wins_or_loses():
    rows = [{"batch": 1, "method": "baseline", "tokens_per_second": 10.0, "tau": [1.0]},
            {"batch": 1, "method": "prompt-lookup", "tokens_per_second": 15.0, "tau": [2.0]},
            {"batch": 4, "method": "baseline", "tokens_per_second": 30.0, "tau": [1.0] * 4},
            {"batch": 4, "method": "prompt-lookup", "tokens_per_second": 24.0, "tau": [1.5] * 4}]
    grid = [{"batch": 4, "n": 1, "seconds": 0.01}, {"batch": 4, "n": 5, "seconds": 0.03}]
    lines = figures.why_sentences(rows, grid)
    assert lines[0].startswith("B = 1:") and "wins (1.50×" in lines[0]
    assert "loses (0.80×" in lines[1] and "3.00× a 1-token one" in lines[1]
    fig = figures.throughput_figure(rows)
    assert len(fig.data) == 2 and all("tokens/s" in t.hovertemplate for t in fig.data)


def test_measure_here_times_both_methods_at_each_b(tiny_models):
    results = list(handlers.measure_here("abc\nabab abab abab", "tiny", "prompt-lookup", 8))
    final = results[-1]
    assert len(final["throughput"].data) == 2  # batched baseline and batched speculative
    assert [list(t.x) for t in final["throughput"].data] == [[1, 2, 4], [1, 2, 4]]
    assert final["why"].count("<li>B = ") == 3 and "measured here" in final["why"]


def test_recorded_throughput_says_when_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(handlers, "RESULTS", tmp_path)
    rows, grid, where = handlers.recorded_throughput("nothing-here")
    assert rows == [] and "python -m bench.batch --target nothing-here" in where
    views = handlers.throughput_views(rows, grid, where)
    assert "No throughput figures yet" in views["throughput"].layout.annotations[0].text.replace("<br>", " ")
