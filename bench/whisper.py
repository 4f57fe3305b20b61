"""python -m bench.whisper: WER and real-time factor per Whisper decoder, against the paper's claim.

Sets (all offline): Debian pocketsphinx-testdata (CMU, BSD-2) LibriVox clips and "cards" commands (real speech,
16 kHz, with transcripts), and espeak-ng speech in en/vi/fr/de (synthesised here from fixed sentences).
Models: whisper-tiny.en (English sets) and whisper-base (all sets). Decoders: greedy, standard beam (B=5),
Filter-Ends, Min Lookahead, both (SpecLab's reconstructions; see decoders/whisper/search.py).
Results: bench/results/whisper.{json,md}; the markdown table is printed last.

  python -m bench.whisper                       # the plan below (about 40 minutes on 2 CPU threads)
  python -m bench.whisper --models whisper-tiny.en --sets librivox --clips 2   # a quick look
  python -m bench.whisper --rescore             # WER of the recorded transcripts again (no decoding)

Default plan: tiny.en on librivox + cards (English only); base on librivox + espeak en/vi/fr/de. --sets
replaces a model's sets with the given ones (English-only models skip the non-English ones). The JSON is
rewritten after every (model, set), so an interrupted run keeps what it finished.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from decoders.whisper.audio import load_file
from decoders.whisper.models import entry
from decoders.whisper.options import DECODERS, WhisperOptions
from decoders.whisper.task import transcribe
from decoders.whisper.wer import NORMALIZER, corpus_wer, wer

RESULTS = Path(__file__).resolve().parent / "results"
POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")
PAPER_CLAIM = -2.26  # arXiv 2309.10299 abstract: Filter-Ends + Min Lookahead vs standard beam, mean WER change
SENTENCES = {  # short everyday sentences; the references are exactly what espeak-ng is asked to say
    "en": ["The quick brown fox jumps over the lazy dog.", "Please call Stella and ask her to bring these things.",
           "She sells sea shells by the sea shore.", "We need six spoons of fresh snow peas."],
    "vi": ["Xin chào, tôi tên là Nam.", "Hôm nay trời đẹp quá.", "Tôi thích ăn phở vào buổi sáng.",
           "Chúng tôi đi học bằng xe đạp."],
    "fr": ["Bonjour, comment allez-vous aujourd'hui ?", "Le chat dort sur le canapé.",
           "Nous allons au marché demain matin.", "Il fait très beau ce week-end."],
    "de": ["Guten Morgen, wie geht es Ihnen?", "Der Hund spielt im Garten.", "Wir fahren morgen nach Berlin.",
           "Das Wetter ist heute sehr schön."],
}
ALL_SETS = ("librivox", "cards", "espeak-en", "espeak-vi", "espeak-fr", "espeak-de")
DEFAULT_PLAN = {"whisper-tiny.en": ("librivox", "cards"),
                "whisper-base": ("librivox", "espeak-en", "espeak-vi", "espeak-fr", "espeak-de")}


def pocketsphinx_set(name: str) -> list[dict]:
    """[{path, reference, language}] from a pocketsphinx-testdata folder and its transcription file."""
    folder = POCKETSPHINX / name
    transcription = folder / ("transcription" if name == "librivox" else "cards.transcription")
    if not transcription.is_file():
        raise SystemExit(f"{transcription} missing: run `make speech` (Debian pocketsphinx-testdata)")
    clips = []
    for line in transcription.read_text().splitlines():
        text, _, clip_id = line.rpartition("(")
        text = text.replace("<s>", "").replace("</s>", "").strip()
        stem = clip_id.strip(") ")
        path = next(folder.glob(f"*{stem}.wav"))
        clips.append({"path": str(path), "reference": text, "language": "en"})
    return clips


def espeak_set(language: str, folder: Path) -> list[dict]:
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng missing: run `make speech`")
    clips = []
    for i, sentence in enumerate(SENTENCES[language]):
        path = folder / f"espeak-{language}-{i}.wav"
        subprocess.run(["espeak-ng", "-v", language, "-w", str(path), sentence], check=True, capture_output=True)
        clips.append({"path": str(path), "reference": sentence, "language": language})
    return clips


def clip_sets(names: list[str], folder: Path, clips: int | None = None) -> dict[str, list[dict]]:
    """Each named set's clips; with `clips`, the shortest that many of each (decode time grows with length)."""
    sets = {name: pocketsphinx_set(name) if name in ("librivox", "cards") else espeak_set(name.split("-")[1], folder)
            for name in dict.fromkeys(names)}
    if clips is None:
        return sets
    return {name: sorted(items, key=lambda item: load_file(item["path"]).seconds)[:clips] for name, items in sets.items()}


def plan(models: list[str], sets: list[str] | None) -> list[tuple[str, str]]:
    """(model, set) pairs in run order: the default plan per model, or the given sets for every model."""
    pairs = []
    for model in models:
        entry(model)  # unknown names fail here with the registry's message
        for set_name in (sets if sets is not None else DEFAULT_PLAN.get(model, ALL_SETS)):
            if set_name.startswith("espeak-") and set_name != "espeak-en" and not entry(model).multilingual:
                continue  # an English-only model has nothing to say about Vietnamese
            pairs.append((model, set_name))
    return pairs


def decode_clip(model: str, set_name: str, item: dict, decoder: str, beam_size: int) -> dict:
    clip = load_file(item["path"])
    options = WhisperOptions(model=model, decoder=decoder, language=item["language"], beam_size=beam_size)
    trace = transcribe(clip, options)
    return {"model": model, "set": set_name, "clip": Path(item["path"]).name, "decoder": decoder,
            "language": item["language"], "reference": item["reference"], "text": trace.output_text,
            "wer": wer(item["reference"], trace.output_text, item["language"]),
            "seconds": trace.seconds, "audio_seconds": clip.seconds, "steps": len(trace.steps),
            "rollout_forwards": trace.rollout_forwards}


def run(pairs: list[tuple[str, str]], decoders: list[str], sets: dict[str, list[dict]], beam_size: int,
        after_set=lambda rows: None) -> list[dict]:
    """Every clip of every (model, set) through every decoder; after_set(rows) is called as each pair finishes."""
    rows = []
    for model, set_name in pairs:
        for item in sets[set_name]:
            for decoder in decoders:
                row = decode_clip(model, set_name, item, decoder, beam_size)
                rows.append(row)
                print(f"{model:16s} {set_name:10s} {row['clip'][-12:]:>12s} {decoder:26s} "
                      f"WER {row['wer']:.2f}  {row['seconds']:5.1f} s  {row['text'][:50]}", flush=True)
        after_set(rows)
    return rows


def language_of(row: dict) -> str:
    """A row's language (rows recorded before it was stored: from the set's name, espeak-<code> or English)."""
    return row.get("language") or (row["set"].removeprefix("espeak-") if row["set"].startswith("espeak-") else "en")


def rescore(rows: list[dict]) -> list[dict]:
    """The recorded transcripts scored again with today's WER (the old figure kept as wer_before when it differs)."""
    out = []
    for row in rows:
        new = wer(row["reference"], row["text"], language_of(row))
        before = row.get("wer_before", row["wer"])
        out.append({**row, "language": language_of(row), "wer": new,
                    **({"wer_before": before} if abs(before - new) > 1e-12 else {})})
    return out


def summarise(rows: list[dict]) -> list[dict]:
    """Corpus WER and RTF per (model, set, decoder), plus the change against standard beam on the same clips."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["set"], row["decoder"]), []).append(row)
    table = []
    for (model, set_name, decoder), items in groups.items():
        table.append({"model": model, "set": set_name, "decoder": decoder, "clips": len(items),
                      "wer": corpus_wer([(r["reference"], r["text"]) for r in items], language_of(items[0])),
                      "rtf": sum(r["seconds"] for r in items) / sum(r["audio_seconds"] for r in items)})
    beam = {(t["model"], t["set"]): t["wer"] for t in table if t["decoder"] == "beam"}
    for t in table:
        base = beam.get((t["model"], t["set"]))
        t["delta_vs_beam"] = None if base is None else t["wer"] - base
    return table


def markdown(table: list[dict], meta: dict) -> str:
    lines = [f"# Whisper decoders: WER and real-time factor ({meta['date']})", "",
             f"{meta['machine']}; torch {meta['torch']}, {meta['threads']} threads, float32; beam size "
             f"{meta['beam_size']}, patience 1, Filter-Ends margin 1.0 nats, Min Lookahead depth 2 / min. WER in % "
             f"after {meta.get('normalizer', 'lower-casing and dropping punctuation')} "
             f"(decoders/whisper/wer.py){_rescored(meta)}; corpus WER = total edits / total reference words. "
             "RTF = decode seconds / audio seconds (encoder + search). Clips per set: "
             f"{meta.get('clips_per_set') or 'all'} (the shortest of each set, a number chosen to fit ~40 min of CPU); "
             f"wall time {meta.get('wall_seconds', 0) / 60:.1f} min.", "",
             "Filter-Ends and Min Lookahead are SpecLab's reconstructions from the paper's abstract and names "
             "(their exact definitions could not be retrieved; decoders/whisper/search.py says what SpecLab does), "
             "not the authors' algorithms.", "",
             "| model | set | decoder | clips | WER % | Δ vs beam (points) | RTF |", "|---|---|---|---|---|---|---|"]
    for t in table:
        delta = "" if t["delta_vs_beam"] is None or t["decoder"] == "beam" else f"{100 * t['delta_vs_beam']:+.2f}"
        lines.append(f"| {t['model']} | {t['set']} | {t['decoder']} | {t['clips']} | {100 * t['wer']:.2f} | "
                     f"{delta} | {t['rtf']:.2f} |")
    combined = [t for t in table if t["decoder"] == "filter-ends+min-lookahead" and t["delta_vs_beam"] is not None]
    if combined:
        mean = 100 * sum(t["delta_vs_beam"] for t in combined) / len(combined)
        lines += ["", "## Against the paper's claim", "",
                  "| | Filter-Ends + Min Lookahead vs standard beam, mean WER change |", "|---|---|",
                  f"| paper (arXiv 2309.10299, abstract; their algorithms, languages and models) | {PAPER_CLAIM:+.2f} |",
                  f"| measured here (SpecLab's reconstructions, mean over {len(combined)} model×set rows) | "
                  f"{mean:+.2f} |"]
    return "\n".join(lines) + "\n"


def _rescored(meta: dict) -> str:
    return f" (rescored {meta['rescored']} from the transcripts decoded on {meta['date']})" if meta.get("rescored") \
        else ""


def rescore_file(path: Path) -> str:
    """--rescore: rewrite the results' WER from their recorded transcripts; returns the new markdown."""
    data = json.loads(path.read_text())
    rows = rescore(data["rows"])
    meta = {**data["meta"], "normalizer": NORMALIZER, "rescored": datetime.date.today().isoformat()}
    table = summarise(rows)
    path.write_text(json.dumps({"meta": meta, "table": table, "rows": rows}, indent=1, ensure_ascii=False))
    text = markdown(table, meta)
    path.with_suffix(".md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.whisper", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_PLAN))
    parser.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=DECODERS)
    parser.add_argument("--sets", nargs="+", default=None, choices=ALL_SETS, help="default: the plan per model")
    parser.add_argument("--clips", type=int, default=None, help="at most this many clips per set (default: all)")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="whisper", help="results file stem")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    parser.add_argument("--rescore", action="store_true", help="recompute WER of <out>/<name>.json, no decoding")
    args = parser.parse_args(argv)
    if args.rescore:
        print(rescore_file(args.out / f"{args.name}.json"))
        return
    if args.clips is not None and args.clips < 1:
        parser.error(f"--clips must be at least 1, got {args.clips}")
    torch.set_num_threads(args.threads)
    pairs = plan(args.models, args.sets)
    meta = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()} CPU",
            "torch": torch.__version__, "threads": args.threads, "beam_size": args.beam_size,
            "clips_per_set": args.clips, "plan": [list(p) for p in pairs], "normalizer": NORMALIZER}
    start = time.perf_counter()

    def save(rows: list[dict]) -> str:
        meta["wall_seconds"] = round(time.perf_counter() - start, 1)
        table = summarise(rows)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "table": table, "rows": rows},
                                                               indent=1, ensure_ascii=False))
        text = markdown(table, meta)
        (args.out / f"{args.name}.md").write_text(text)
        return text

    with tempfile.TemporaryDirectory(prefix="speclab-espeak-") as folder:
        sets = clip_sets([name for _, name in pairs], Path(folder), args.clips)
        rows = run(pairs, args.decoders, sets, args.beam_size, after_set=save)
    print(save(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
