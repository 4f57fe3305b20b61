"""python -m decoders.selfdraft train --kind early-exit --target smollm2-135m --exit-layer 4 --out DIR

record: the target's features once, into a .pt file (train --features reuses it, so a sweep pays once).
train:  one learned self-drafter (early-exit block or prophet) on the shared loop (decoders/training), held-out α
        by depth printed as it goes; saves weights, a model card, and the loss / α curves (PNG + JSON).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from ..training import FitSettings, save_curves
from ..training.checkpoint import add_checkpoint_arguments, resume_command


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m decoders.selfdraft")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the target's features once (for a sweep)")
    train = sub.add_parser("train", help="train an early-exit block or a prophet for a target")
    for p in (rec, train):
        p.add_argument("--target", required=True, help="registry name, local model folder or hub id")
        p.add_argument("--data", choices=("sharegpt", "code", "sharegpt+code", "generated"), default="sharegpt+code",
                       help="generated: the target's own greedy replies to ShareGPT and HumanEval prompts")
        p.add_argument("--train-tokens", type=int, default=50_000)
        p.add_argument("--heldout", type=int, default=24, help="ShareGPT conversations held out for α")
        p.add_argument("--seq-len", type=int, default=256)
        p.add_argument("--stems", default="2,4,6", help="exit layers whose hidden states are recorded")
        p.add_argument("--threads", type=int, default=0)
        p.add_argument("--seed", type=int, default=0)
    rec.add_argument("--out", required=True, help=".pt file")
    train.add_argument("--kind", choices=("early-exit", "prophet"), required=True)
    train.add_argument("--features", default=None, help="a .pt file from `record` (default: record now)")
    train.add_argument("--exit-layer", type=int, default=4)
    train.add_argument("--layers", type=int, default=1, help="prophet decoder layers")
    train.add_argument("--gamma", type=int, default=5, help="prophet: tokens drafted per training chain")
    train.add_argument("--draft-vocab", type=int, default=8192, help="N most frequent training tokens (0: all)")
    train.add_argument("--max-minutes", type=float, default=10.0)
    train.add_argument("--max-steps", type=int, default=0)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--batch-tokens", type=int, default=1024)
    train.add_argument("--warmup", type=int, default=5, help="warm-up steps")
    train.add_argument("--eval-every", type=float, default=3.0, help="minutes")
    train.add_argument("--depths", type=int, default=5)
    train.add_argument("--save-dtype", choices=("float32", "float16"), default="float32")
    train.add_argument("--out", default=None, help="default: the cache, where the drafter looks")
    train.add_argument("--init", default=None, help="continue from saved weights (a folder from an earlier run)")
    train.add_argument("--replies", default=None, help="train on the target's own replies: a folder written by "
                       "`python -m decoders.training replies` (its held-out split is the held-out set)")
    add_checkpoint_arguments(train)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    from ..eagle.data import DataError
    from ..runtime.model_files import ModelError

    args = parse(argv)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.command == "record":
            return run_record(args)
        return run_train(args, argv if argv is not None else sys.argv[1:])
    except (DataError, ModelError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _load(args):
    from ..runtime.models import load_model
    from ..runtime import kernels

    lm = load_model(args.target, dtype="float32", device="cpu", progress=lambda m: print(m, flush=True))
    kernels.use(lm.model, kernels.STOCK)  # training reads the LM head's dense weight
    lm.model.requires_grad_(False)
    return lm


def recorded_data(args, lm) -> dict:
    from ..eagle.__main__ import conversations
    from ..eagle.data import build_examples, frequent_ids
    from ..training import Progress
    from ..training.continuations import generated_examples
    from .record import record

    train_chats, held_chats, note = conversations(args.data, args.heldout, args.seed)
    began = time.perf_counter()
    if args.data == "generated":  # train_chats are prompts: the target writes the replies (one step per B tokens)
        bar = Progress(args.train_tokens, unit="tok", desc="target replies")
        train_ex = generated_examples(lm.model, lm.tokenizer, train_chats, args.seq_len, args.train_tokens,
                                      progress=lambda n: bar.update(n=n))
        bar.close()
        note += f" ({time.perf_counter() - began:.0f} s of generation)"
    else:
        train_ex = build_examples(lm.tokenizer, train_chats, args.seq_len, args.train_tokens)
    held_ex = build_examples(lm.tokenizer, held_chats, args.seq_len, 10**9)
    stems = [int(k) for k in args.stems.split(",") if k]
    total = sum(len(e.ids) for e in train_ex + held_ex)
    print(f"{len(train_ex)} training sequences, {len(held_ex)} held out, {total:,} tokens", flush=True)
    bar = Progress(total, unit="tok", desc="target features")
    train = record(lm.model, train_ex, stems, progress=lambda n: bar.update(n=n))
    held = record(lm.model, held_ex, stems, progress=lambda n: bar.update(n=n))
    bar.close()
    return {"train": train, "heldout": held, "note": note, "seconds": time.perf_counter() - began,
            "target": lm.name, "stems": stems, "frequent": frequent_ids(train_ex, 65536, lm.model.config.vocab_size)}


def replies_data(folder: str, target: str, vocab: int) -> dict:
    """The training dict of `recorded_data`, read from a reply store (decoders/training/replies.py)."""
    from ..eagle.data import frequent_ids
    from ..training.replies import REPLIES_NOTE, ReplyStore

    store = ReplyStore(folder)
    train, held = store.load("train"), store.load("heldout")
    if not train or not held:
        raise ValueError(f"{folder} holds {len(train)} training and {len(held)} held-out replies; write them first: "
                         f"python -m decoders.training replies --target {target} --out {folder}")
    store.check_target(target)
    return {"train": train, "heldout": held, "note": REPLIES_NOTE, "seconds": 0.0, "target": target,
            "stems": sorted(train[0].stems), "frequent": frequent_ids(train, 65536, vocab)}


def run_record(args) -> int:
    lm = _load(args)
    data = recorded_data(args, lm)
    torch.save(data, args.out)
    print(f"saved {args.out} ({data['seconds']:.0f} s of target features)", flush=True)
    return 0


def run_train(args, argv) -> int:
    from ..eagle.card import hardware
    from . import card, store
    from .heads import ExitBlock, Prophet
    from .train import exit_alpha, init_exit, init_prophet, prophet_alpha, train_exit, train_prophet

    started = time.perf_counter()
    lm = _load(args)
    if args.replies:
        data = replies_data(args.replies, lm.name, lm.model.config.vocab_size)
    else:
        data = torch.load(args.features, weights_only=False) if args.features else recorded_data(args, lm)
    if data["target"] != lm.name:
        raise ValueError(f"{args.features} holds features of {data['target']}, not {lm.name}")
    frequent = data["frequent"]
    vocab_ids = torch.sort(frequent[: args.draft_vocab]).values if args.draft_vocab else None
    settings = FitSettings(lr=args.lr, max_minutes=args.max_minutes, max_steps=args.max_steps, warmup_steps=args.warmup,
                           eval_every_minutes=args.eval_every, seed=args.seed, session_minutes=args.session_minutes)
    if args.resume and not args.checkpoint:
        raise ValueError("--resume needs --checkpoint FILE (the run to continue)")
    checkpoint = ({"path": Path(args.checkpoint), "every_minutes": args.checkpoint_every, "resume": args.resume}
                  if args.checkpoint else None)
    log = lambda line: print(line, flush=True)
    if args.init:  # continue training saved weights (a sweep's winner); its shape and vocabulary win
        model = store.load(args.init, lm.model).train().requires_grad_(True)
        args.exit_layer = model.meta().get("exit_layer", args.exit_layer)
        args.layers = model.meta()["n_layers"]
        vocab_ids = model.vocab.vocab_ids
    if args.kind == "early-exit":
        if args.exit_layer not in data["stems"]:
            raise ValueError(f"the features hold stems {data['stems']}; record with --stems including {args.exit_layer}")
        if not args.init:
            model = ExitBlock(lm.model, args.exit_layer, vocab_ids=vocab_ids)
            init_exit(model, data["train"])  # the tuned-lens start (train.lens_init)
        initial = exit_alpha(model, data["heldout"], args.depths)
        log(("start (from --init)" if args.init else "fitted lens, before training") + ": α by depth " + " ".join(f"{a:.2f}" for a in initial["alpha"]))
        history = train_exit(model, data["train"], data["heldout"], settings, args.batch_tokens, args.depths, log,
                             checkpoint)
    else:
        if not args.init:
            model = Prophet(lm.model, args.layers, vocab_ids=vocab_ids)
            init_prophet(model, data["train"])
        initial = prophet_alpha(model, data["heldout"], args.depths)
        log(("start (from --init)" if args.init else "fitted lens, before training") + ": α by depth " + " ".join(f"{a:.2f}" for a in initial["alpha"]))
        history = train_prophet(model, data["train"], data["heldout"], settings, args.gamma, args.batch_tokens,
                                args.depths, log, checkpoint)
    final = history.evals[-1][1]
    prior = model.config_record.get("training", {}) if args.init else {}  # minutes and steps of the run continued
    history.seconds += prior.get("train_seconds", 0.0)
    history.steps += prior.get("steps", 0)
    history.tokens_seen += prior.get("tokens_seen", 0)
    out = Path(args.out) if args.out else store.cache_dir(args.kind, lm.name)
    command = "python -m decoders.selfdraft " + " ".join(shlex.quote(a) for a in argv)
    info = {"kind": args.kind, "target": lm.name, "shape": model.meta(), "final_eval": final, "initial_eval": initial,
            "data": data["note"], "train_sequences": len(data["train"]),
            "train_tokens": sum(len(r.ids) for r in data["train"]), "heldout_sequences": len(data["heldout"]),
            "feature_seconds": data["seconds"], "train_seconds": history.seconds, "steps": history.steps,
            "tokens_seen": history.tokens_seen, "lr": args.lr, "batch_tokens": args.batch_tokens,
            "draft_vocab": model.vocab.size, "hardware": hardware(torch.device("cpu")), "command": command,
            "save_dtype": args.save_dtype, "params": sum(p.numel() for p in model.parameters()),
            "evals": history.evals, "total_seconds": time.perf_counter() - started,
            "initial_label": f"start (--init {args.init})" if args.init else "fitted lens, before training",
            "heldout_note": "held-out replies (the target's own, to prompts never trained on)" if args.replies else None,
            "resume_command": resume_command(command) if args.checkpoint else None}
    store.save(model, out, getattr(torch, args.save_dtype), {k: v for k, v in info.items() if k != "evals"})
    info["size_mb"] = (out / "model.safetensors").stat().st_size / 1e6
    save_curves(history, out, f"{args.kind} for {lm.name}: {model.meta()}")
    (out / "README.md").write_text(card.model_card(info))
    (out / "training.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    log(f"saved {out} ({info['size_mb']:.1f} MB): final α by depth " + " ".join(f"{a:.3f}" for a in final["alpha"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
