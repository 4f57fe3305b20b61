"""python -m bench.whisper on one short clip (greedy and beam), and the run plan; the fine-tuning script's LoRA."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("whisper")

from bench import whisper as bench_whisper  # noqa: E402
from decoders.whisper.wer import corpus_wer, wer  # noqa: E402

TABLE_COLUMNS = "| model | set | decoder | clips | WER % | Δ vs beam (points) | RTF |"


def test_plan_runs_english_only_models_on_english_sets_only():
    pairs = bench_whisper.plan(["whisper-tiny.en", "whisper-base"], ["cards", "espeak-vi", "espeak-en"])
    assert pairs == [("whisper-tiny.en", "cards"), ("whisper-tiny.en", "espeak-en"),
                     ("whisper-base", "cards"), ("whisper-base", "espeak-vi"), ("whisper-base", "espeak-en")]
    assert bench_whisper.plan(["whisper-tiny.en"], None) == [("whisper-tiny.en", "librivox"),
                                                             ("whisper-tiny.en", "cards")]


def test_clip_cap_keeps_the_shortest_clips(tmp_path):
    clips = bench_whisper.clip_sets(["librivox"], tmp_path, clips=2)["librivox"]
    assert [c["path"].rsplit("-", 1)[1] for c in clips] == ["0880.wav", "0930.wav"]  # 2.99 s and 3.29 s of five
    assert clips[0]["reference"] == "he was not an ill disposed young man"


@pytest.mark.slow
def test_tiny_run_writes_a_table_whose_wer_matches_the_transcripts(tmp_path):
    bench_whisper.main(["--models", "whisper-tiny.en", "--sets", "cards", "--clips", "1", "--decoders", "greedy",
                        "beam", "--threads", "1", "--out", str(tmp_path), "--name", "tiny"])
    result = json.loads((tmp_path / "tiny.json").read_text())
    rows, table = result["rows"], result["table"]
    assert [r["decoder"] for r in rows] == ["greedy", "beam"] and {r["clip"] for r in rows} == {"001.wav"}
    for row in rows:
        assert row["text"] and row["wer"] == wer(row["reference"], row["text"])
        assert row["seconds"] > 0 and row["audio_seconds"] == pytest.approx(1.095, abs=0.01)
    assert [t["decoder"] for t in table] == ["greedy", "beam"]
    for t, row in zip(table, rows):
        assert t["wer"] == corpus_wer([(row["reference"], row["text"])])
        assert t["rtf"] == pytest.approx(row["seconds"] / row["audio_seconds"])
    assert table[1]["delta_vs_beam"] == 0 and table[0]["delta_vs_beam"] == table[0]["wer"] - table[1]["wer"]
    markdown = (tmp_path / "tiny.md").read_text()
    assert TABLE_COLUMNS in markdown
    assert f"| whisper-tiny.en | cards | beam | 1 | {100 * table[1]['wer']:.2f} |  | " in markdown
    assert "Clips per set: 1" in markdown and "reconstructions" in markdown


def test_clips_below_one_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        bench_whisper.main(["--clips", "0"])
    assert "--clips must be at least 1" in capsys.readouterr().err


def tiny_whisper():
    """A random-init Whisper small enough to train in a second: 16 mel frames, 64-token vocabulary."""
    import whisper.model

    torch.manual_seed(0)
    dims = whisper.model.ModelDimensions(n_mels=80, n_audio_ctx=8, n_audio_state=32, n_audio_head=2,
                                         n_audio_layer=1, n_vocab=64, n_text_ctx=16, n_text_state=32,
                                         n_text_head=2, n_text_layer=2)
    model = whisper.model.Whisper(dims).float()
    with torch.no_grad():  # whisper leaves the decoder's positions as torch.empty (a checkpoint fills them)
        model.decoder.positional_embedding.normal_(0, 0.02)
    return model


def tiny_examples(model, count=4):
    from decoders.whisper.finetune import Example, encode

    generator = torch.Generator().manual_seed(1)
    return [Example(encode(model, torch.randn(80, 16, generator=generator)),
                    tuple([60, 61] + torch.randint(0, 50, (6,), generator=generator).tolist() + [62]))
            for _ in range(count)]


def test_lora_steps_lower_the_loss_and_leave_the_base_weights_unchanged():
    from peft.tuners.lora import LoraLayer

    from decoders.whisper.finetune import add_lora, loss_on, train

    model = tiny_whisper()
    examples = tiny_examples(model)
    before = {name: value.clone() for name, value in model.decoder.state_dict().items()}
    with torch.no_grad():
        loss_before = loss_on(model, examples, prompt_len=2).item()
    params = add_lora(model, rank=4, alpha=8)
    with torch.no_grad():  # B starts at zero: wrapping alone changes nothing
        assert loss_on(model, examples, prompt_len=2).item() == pytest.approx(loss_before, abs=1e-6)
    assert len(params) == 2 * 2 * 2 * 2  # 2 layers x (self + cross attention) x (query, value) x (A, B)
    base = model.decoder.get_base_model()
    assert all(isinstance(m, LoraLayer) for m in (base.blocks[0].attn.query, base.blocks[1].cross_attn.value))
    assert not isinstance(base.blocks[0].attn.key, LoraLayer)
    losses = train(model, params, examples, prompt_len=2, steps=15, lr=1e-2, batch_size=4)
    assert losses[-1] < 0.8 * losses[0]
    after = {name.replace(".base_layer.", "."): value for name, value in base.state_dict().items() if "lora_" not in name}
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert not any(p.requires_grad for name, p in model.named_parameters() if "lora_" not in name)


def test_merged_lora_gives_the_same_logits_as_the_wrapped_model():
    from peft.tuners.lora import LoraLayer

    from decoders.whisper.finetune import add_lora, batch, merge_lora, train

    model = tiny_whisper()
    examples = tiny_examples(model)
    train(model, add_lora(model, rank=4, alpha=8), examples, prompt_len=2, steps=3, lr=1e-2, batch_size=4)
    features, inputs, _ = batch(examples, prompt_len=2)
    with torch.no_grad():
        wrapped = model.decoder(inputs, features)  # (B, T, V)
        merge_lora(model)
        merged = model.decoder(inputs, features)
    assert not any(isinstance(m, LoraLayer) for m in model.modules())
    assert type(model.decoder).__name__ == "TextDecoder"  # whisper's own decoder is back for decoding
    assert torch.allclose(wrapped, merged, atol=1e-5) and not torch.equal(wrapped, torch.zeros_like(wrapped))


def test_batch_learns_the_text_and_eot_not_the_prompt():
    from decoders.whisper.finetune import IGNORE, Example, batch

    examples = [Example(torch.zeros(8, 32), (60, 61, 5, 6, 62)), Example(torch.zeros(8, 32), (60, 61, 7, 62))]
    _, inputs, targets = batch(examples, prompt_len=2)
    assert inputs.tolist() == [[60, 61, 5, 6], [60, 61, 7, 0]]
    assert targets.tolist() == [[IGNORE, 5, 6, 62], [IGNORE, 7, 62, IGNORE]]


def test_vietnamese_split_is_by_sentence():
    from bench.whisper_finetune import SENTENCES, split

    train_sentences, held_out = split()
    assert not set(train_sentences) & set(held_out) and len(held_out) == len(SENTENCES) // 4
    assert sorted(train_sentences + held_out) == sorted(SENTENCES)


def test_finetune_table_puts_the_paper_claims_beside_the_measured_differences():
    from bench.whisper_finetune import markdown

    meta = {"date": "d", "model": "whisper-base", "machine": "m", "torch": "t", "threads": 2, "train_sentences": 30,
            "held_out_sentences": 10, "train_clips": 60, "steps": 30, "batch_size": 8, "rank": 8, "alpha": 16.0,
            "data_seconds": 1.0}
    trained = {"trainable": 10, "lr": 1e-3, "train_seconds": 5.0, "first_loss": 2.0, "last_loss": 0.5}
    results = [{"arm": "zero-shot", "wer": 0.9, "held_out_loss": 2.0},
               {"arm": "full", "wer": 0.6, "held_out_loss": 1.5, **trained},
               {"arm": "lora", "wer": 0.5, "held_out_loss": 1.6, **trained}]
    text = markdown(results, meta)
    assert "| zero-shot | 0 | | 0 | 0 | | 2.000 | 90.00 |" in text
    assert "| lora | 10 | 0.001 | 30 | 5 | 2.00 → 0.50 | 1.600 | 50.00 |" in text
    assert "| -38.49 | -1.45 |" in text and "| -40.00 | -10.00 |" in text


def test_rescore_recomputes_wer_from_the_recorded_transcripts_and_keeps_the_old_figure(tmp_path):
    rows = [{"model": "whisper-base", "set": "espeak-fr", "clip": "a.wav", "decoder": "beam",
             "reference": "Il fait beau.", "text": "et l'on voit.", "wer": 1.0, "seconds": 1.0, "audio_seconds": 1.0},
            {"model": "whisper-base", "set": "librivox", "clip": "b.wav", "decoder": "beam",
             "reference": "he was not an ill disposed young man", "text": "He was not an ill-disposed young man.",
             "wer": 0.0, "seconds": 1.0, "audio_seconds": 1.0}]
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"meta": {"date": "2026-11-23", "machine": "m", "torch": "t", "threads": 2,
                                         "beam_size": 5, "clips_per_set": 1}, "table": [], "rows": rows}))
    text = bench_whisper.rescore_file(path)
    fr, en = json.loads(path.read_text())["rows"]
    assert fr["language"] == "fr" and fr["wer_before"] == 1.0 and fr["wer"] == pytest.approx(4 / 3)  # "l on": 4 words
    assert en["language"] == "en" and en["wer"] == 0.0 and "wer_before" not in en
    assert "rescored" in text and "EnglishTextNormalizer" in text and "| whisper-base | espeak-fr | beam | 1 | 133.33 |" in text
