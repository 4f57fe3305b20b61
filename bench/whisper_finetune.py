"""python -m bench.whisper_finetune: zero-shot vs full fine-tuning vs LoRA of Whisper on a small Vietnamese set.

The set is built offline: espeak-ng `-v vi` reads fixed Vietnamese sentences; every fourth sentence is held out
(split by sentence, so no held-out sentence is ever heard in training), the others are spoken in two voices
(speed/pitch) for training. Model: whisper-base, the smallest multilingual Whisper installed here (the paper used
Whisper-Tiny). Both arms adapt the text decoder with the encoder frozen (features computed once; CPU-sized):
full = every decoder weight, LoRA = rank-r peft adapters on the attention query/value projections
(decoders/whisper/finetune.py). Greedy decoding on the held-out clips; WER on syllables by jiwer after Whisper's
BasicTextNormalizer (decoders/whisper/wer.py).
Results: bench/results/whisper-finetune.{json,md}.

  python -m bench.whisper_finetune                 # a few minutes per arm on 2 CPU threads
  python -m bench.whisper_finetune --sentences 8 --steps 5      # a quick look
  python -m bench.whisper_finetune --rescore       # WER of the recorded transcripts again (no training)
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
from decoders.whisper.finetune import Example, add_lora, encode, loss_on, merge_lora, train, trainable_count
from decoders.whisper.models import ensure_checkpoint
from decoders.whisper.task import mel_for
from decoders.whisper.wer import NORMALIZER, corpus_wer

RESULTS = Path(__file__).resolve().parent / "results"
PAPER = {"lora_vs_zero_shot": -38.49, "lora_vs_full": -1.45}  # arXiv 2309.10299 abstract, Whisper-Tiny, Vietnamese
TRAIN_VOICES = (("175", "50"), ("140", "35"))  # espeak-ng words per minute, pitch 0-99 (two: CPU time)
HELD_OUT_VOICE = ("175", "50")
SENTENCES = (  # short everyday Vietnamese; the references are exactly what espeak-ng is asked to say
    "Xin chào, tôi tên là Nam.", "Hôm nay trời đẹp quá.", "Tôi thích ăn phở vào buổi sáng.",
    "Chúng tôi đi học bằng xe đạp.", "Mẹ tôi đang nấu cơm trong bếp.", "Anh ấy làm việc ở bệnh viện.",
    "Cô giáo đọc sách cho học sinh.", "Bây giờ là mấy giờ rồi?", "Tôi muốn mua một cái áo mới.",
    "Em gái tôi rất thích vẽ tranh.", "Chợ này bán rất nhiều hoa quả.", "Ngày mai chúng ta đi biển nhé.",
    "Bố tôi uống trà mỗi buổi chiều.", "Con mèo đang ngủ trên ghế.", "Tôi đã học tiếng Anh ba năm.",
    "Thành phố này có nhiều công viên.", "Bạn có khỏe không?", "Cảm ơn bạn rất nhiều.",
    "Xe buýt đến lúc bảy giờ sáng.", "Họ đang xem phim ở nhà.", "Mùa hè ở đây rất nóng.",
    "Tôi cần gọi điện cho bác sĩ.", "Ông bà tôi sống ở nông thôn.", "Chúng tôi ăn tối lúc sáu giờ.",
    "Cửa hàng đóng cửa vào chủ nhật.", "Hãy mở cửa sổ ra đi.", "Sông này rất dài và rộng.",
    "Anh trai tôi chơi bóng đá giỏi.", "Tôi không hiểu câu hỏi này.", "Trời sắp mưa rồi.",
    "Cái bàn này làm bằng gỗ.", "Chị ấy hát rất hay.", "Tôi thường đi ngủ lúc mười giờ.",
    "Nhà tôi ở gần trường học.", "Chúng ta hãy bắt đầu bài học.", "Cà phê ở đây rất ngon.",
    "Tôi đã quên chìa khóa ở nhà.", "Mùa xuân hoa nở khắp nơi.", "Đường phố rất đông người.",
    "Bạn làm nghề gì?",
)


def split(sentences=SENTENCES) -> tuple[list[str], list[str]]:
    """(train, held_out): every fourth sentence is held out."""
    return [s for i, s in enumerate(sentences) if i % 4 != 3], [s for i, s in enumerate(sentences) if i % 4 == 3]


def speak(sentence: str, voice: tuple[str, str], path: Path) -> Path:
    speed, pitch = voice
    subprocess.run(["espeak-ng", "-v", "vi", "-s", speed, "-p", pitch, "-w", str(path), sentence], check=True,
                   capture_output=True)
    return path


def examples_for(model, tokenizer, sentences: list[str], voices, folder: Path) -> list[Example]:
    prompt = list(tokenizer.sot_sequence_including_notimestamps)
    examples = []
    for i, sentence in enumerate(sentences):
        for j, voice in enumerate(voices):
            clip = load_file(speak(sentence, voice, folder / f"vi-{len(examples)}-{i}-{j}.wav"))
            tokens = prompt + tokenizer.encode(" " + sentence) + [tokenizer.eot]
            examples.append(Example(encode(model, mel_for(model, clip)), tuple(tokens)))
    return examples


def transcribe_all(model, examples: list[Example]) -> list[str]:
    """Greedy, Vietnamese, no timestamps; the cached encoder features go straight to the decoder."""
    import whisper

    options = whisper.DecodingOptions(language="vi", without_timestamps=True, fp16=False, sample_len=96)
    with torch.no_grad():
        return [r.text for r in whisper.decode(model, torch.stack([e.features for e in examples]), options)]


def fresh_model(name: str):
    import whisper

    return whisper.load_model(str(ensure_checkpoint(name)), device="cpu").float()


def evaluate(arm: str, model, held_out: list[Example], references: list[str], prompt_len: int, extra: dict) -> dict:
    start = time.perf_counter()
    texts = transcribe_all(model, held_out)
    with torch.no_grad():
        loss = loss_on(model, held_out, prompt_len).item()
    result = {"arm": arm, "wer": corpus_wer(list(zip(references, texts)), "vi"), "held_out_loss": loss,
              "eval_seconds": time.perf_counter() - start, "texts": texts, **extra}
    print(f"{arm:10s} WER {100 * result['wer']:6.2f}  held-out loss {loss:.3f}  {texts[0][:60]}", flush=True)
    return result


def run_arm(arm: str, args, train_set: list[Example], prompt_len: int) -> tuple[object, dict]:
    """A fine-tuned copy of the model and what it took: trainable weights, steps, seconds, losses."""
    model = fresh_model(args.model)
    if arm == "lora":
        params, lr = add_lora(model, args.rank, args.alpha), args.lora_lr
    else:
        model.requires_grad_(False)
        params, lr = [p for p in model.decoder.parameters()], args.full_lr
        for p in params:
            p.requires_grad_(True)
    start = time.perf_counter()
    losses = train(model, params, train_set, prompt_len, args.steps, lr, args.batch_size, args.seed)
    seconds = time.perf_counter() - start
    if arm == "lora":
        merge_lora(model)
    print(f"{arm:10s} {args.steps} steps in {seconds:.0f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    return model, {"trainable": trainable_count(params), "lr": lr, "train_seconds": seconds,
                   "first_loss": losses[0], "last_loss": losses[-1], "losses": losses}


def row(r: dict, steps: int) -> str:
    if r["arm"] == "zero-shot":
        trained = "| 0 | | 0 | 0 | |"
    else:
        trained = (f"| {r['trainable']:,} | {r['lr']:g} | {steps} | {r['train_seconds']:.0f} | "
                   f"{r['first_loss']:.2f} → {r['last_loss']:.2f} |")
    return f"| {r['arm']} {trained} {r['held_out_loss']:.3f} | {100 * r['wer']:.2f} |"


def markdown(results: list[dict], meta: dict) -> str:
    by_arm = {r["arm"]: r for r in results}
    lines = [f"# Whisper fine-tuning on synthetic Vietnamese ({meta['date']})", "",
             f"{meta['model']}, {meta['machine']}, torch {meta['torch']}, {meta['threads']} threads, float32. "
             f"Data: espeak-ng `-v vi` reading {meta['train_sentences']} training sentences in "
             f"{len(TRAIN_VOICES)} voices ({meta['train_clips']} clips) and {meta['held_out_sentences']} held-out "
             "sentences in one voice (split by sentence). Decoder-only adaptation, encoder frozen; "
             f"{meta['steps']} AdamW steps of batch {meta['batch_size']} per arm; LoRA rank {meta['rank']}, "
             f"alpha {meta['alpha']} on every decoder attention's query and value (self and cross), "
             f"{meta.get('lora', 'own code (no peft)')}. Greedy decoding; WER on space-separated syllables after "
             f"{meta.get('normalizer', 'decoders/whisper/wer.py' + chr(39) + 's own normalisation')}"
             f"{_rescored(meta)}. Building the set and encoding it once took {meta['data_seconds']:.0f} s.", "",
             "| arm | trainable weights | LR | train steps | train time (s) | train loss first → last | "
             "held-out loss | held-out WER % |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(row(r, meta["steps"]))
    if {"zero-shot", "full", "lora"} <= by_arm.keys():
        zero, full, lora = (100 * by_arm[a]["wer"] for a in ("zero-shot", "full", "lora"))
        lines += ["", "## Against the paper's claims (WER points; negative = LoRA better)", "",
                  "| | LoRA vs zero-shot | LoRA vs full fine-tuning |", "|---|---|---|",
                  f"| paper (arXiv 2309.10299 abstract; Whisper-Tiny, real Vietnamese speech, GPU) | "
                  f"{PAPER['lora_vs_zero_shot']:+.2f} | {PAPER['lora_vs_full']:+.2f} |",
                  f"| measured here ({meta['model']}, espeak-ng speech, CPU) | {lora - zero:+.2f} | {lora - full:+.2f} |"]
    return "\n".join(lines) + "\n"


def _rescored(meta: dict) -> str:
    return f" (rescored {meta['rescored']} from the transcripts of {meta['date']})" if meta.get("rescored") else ""


def rescore_file(path: Path) -> str:
    """--rescore: the recorded held-out transcripts scored again with today's WER; returns the new markdown."""
    data = json.loads(path.read_text())
    meta = {**data["meta"], "normalizer": NORMALIZER, "rescored": datetime.date.today().isoformat()}
    references = meta["held_out_references"]
    results = []
    for r in data["results"]:
        new = corpus_wer(list(zip(references, r["texts"])), "vi")
        results.append({**r, "wer": new, "wer_before": r.get("wer_before", r["wer"])})
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1, ensure_ascii=False))
    text = markdown(results, meta)
    path.with_suffix(".md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    import peft
    import whisper.tokenizer

    parser = argparse.ArgumentParser(prog="python -m bench.whisper_finetune", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-base", choices=["whisper-base"], help="a multilingual Whisper")
    parser.add_argument("--arms", nargs="+", default=["zero-shot", "full", "lora"], choices=["zero-shot", "full", "lora"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--full-lr", type=float, default=1e-5)
    parser.add_argument("--lora-lr", type=float, default=1e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--sentences", type=int, default=len(SENTENCES), help="use the first N sentences (quick look)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="whisper-finetune")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rescore", action="store_true", help="recompute WER of <out>/<name>.json, no training")
    args = parser.parse_args(argv)
    if args.rescore:
        print(rescore_file(args.out / f"{args.name}.json"))
        return
    if args.steps < 1 or args.batch_size < 1 or args.rank < 1:
        parser.error("--steps, --batch-size and --rank must be at least 1")
    if not 4 <= args.sentences <= len(SENTENCES):
        parser.error(f"--sentences must be between 4 and {len(SENTENCES)}, got {args.sentences}")
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng missing: run `make speech`")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    base = fresh_model(args.model)
    tokenizer = whisper.tokenizer.get_tokenizer(True, language="vi", task="transcribe")
    prompt_len = len(tokenizer.sot_sequence_including_notimestamps)
    train_sentences, held_out_sentences = split(SENTENCES[:args.sentences])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="speclab-vi-") as folder:
        train_set = examples_for(base, tokenizer, train_sentences, TRAIN_VOICES, Path(folder))
        held_out = examples_for(base, tokenizer, held_out_sentences, [HELD_OUT_VOICE], Path(folder))
    meta = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()} CPU", "torch": torch.__version__,
            "threads": args.threads, "model": args.model, "steps": args.steps, "batch_size": args.batch_size,
            "rank": args.rank, "alpha": args.alpha, "seed": args.seed, "train_sentences": len(train_sentences),
            "held_out_sentences": len(held_out_sentences), "train_clips": len(train_set),
            "data_seconds": time.perf_counter() - start, "held_out_references": held_out_sentences,
            "lora": f"peft {peft.__version__}", "normalizer": NORMALIZER}
    results = []
    for arm in args.arms:
        model, extra = (base, {}) if arm == "zero-shot" else run_arm(arm, args, train_set, prompt_len)
        results.append(evaluate(arm, model, held_out, held_out_sentences, prompt_len, extra))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1,
                                                               ensure_ascii=False))
        text = markdown(results, meta)
        (args.out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
