"""python -m decoders.training replies --target smollm2-135m --out DIR --train-tokens 400000
python -m decoders.training compare --kind eagle --target smollm2-135m --replies DIR --candidate CHECKPOINT_OR_FOLDER

replies: the target answers held-out then training prompts (decoders/training/prompts.py), batched, with its
features recorded as it writes (decoders/training/replies.py); shards land in DIR as they finish, and the same
command run again continues where the last one stopped (a bar shows tokens and the ETA to the budget).
The drafters train on such a folder: `python -m decoders.eagle train --replies DIR ...`,
`python -m decoders.selfdraft train --replies DIR ...`.
compare: the ship rule (decoders/training/compare.py): a candidate against the shipped weights on the held-out
replies, written to bench/results/drafter-<kind>-<target>-heldout.{json,md}.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m decoders.training")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("replies", help="the target's own replies + features, resumable")
    rep.add_argument("--target", required=True)
    rep.add_argument("--out", required=True, help="folder of reply shards (created; an existing one is continued)")
    rep.add_argument("--train-tokens", type=int, default=400_000, help="stop when the train split holds this many")
    rep.add_argument("--heldout-chat", type=int, default=36, help="ShareGPT prompts held out (the permutation's last)")
    rep.add_argument("--heldout-code", type=int, default=12, help="stdlib-function prompts held out (by module)")
    rep.add_argument("--batch", type=int, default=16, help="rows answered together")
    rep.add_argument("--max-new", type=int, default=256, help="reply tokens at most")
    rep.add_argument("--max-prompt", type=int, default=256, help="longer prompts are skipped")
    rep.add_argument("--stems", default="2", help="layers whose hidden states are kept (early exit reads them)")
    rep.add_argument("--threads", type=int, default=0)
    rep.add_argument("--seed", type=int, default=0)
    rep.add_argument("--prompts", default=None, help="a prompt file (decoders/training/prompts.py "
                     "write_prompt_file) instead of the datasets: how the prompts travel to a lent GPU")
    rep.add_argument("--device", default="auto", help="auto | cpu | cuda (a GPU writes tens of thousands a second)")
    rep.add_argument("--max-minutes", type=float, default=0.0, help="stop after this long, between two batches "
                     "(0: at --train-tokens); the folder stays resumable")
    cmp = sub.add_parser("compare", help="a trained drafter against the shipped one on the held-out replies")
    cmp.add_argument("--kind", choices=("eagle", "early-exit", "prophet"), required=True)
    cmp.add_argument("--target", required=True)
    cmp.add_argument("--replies", required=True, help="the reply folder whose held-out split scores both")
    cmp.add_argument("--candidate", required=True, help="a weights folder or a training checkpoint (.pt)")
    cmp.add_argument("--against", default=None, help="default: the shipped weights, assets/<kind>/<target>")
    cmp.add_argument("--decode-prompts", type=int, default=8, help="held-out prompts decoded for τ (0: α only)")
    cmp.add_argument("--max-new", type=int, default=96)
    cmp.add_argument("--depths", type=int, default=5)
    cmp.add_argument("--out", default=None, help="writes OUT.json and OUT.md (default: bench/results/"
                     "drafter-<kind>-<target>-heldout)")
    cmp.add_argument("--threads", type=int, default=0)
    cmp.add_argument("--device", default="auto", help="auto | cpu | cuda")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    from ..eagle.data import DataError
    from ..runtime.model_files import ModelError

    args = parse(argv)
    try:
        return run_compare(args) if args.command == "compare" else run_replies(args)
    except (DataError, ModelError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def run_replies(args) -> int:
    from ..runtime.models import load_model
    from .loop import Progress
    from .prompts import read_prompt_file, reply_prompts
    from .replies import ReplyStore, write_replies

    if args.threads:
        torch.set_num_threads(args.threads)
    stems = [int(k) for k in args.stems.split(",") if k]
    store = ReplyStore(args.out)
    lm = load_model(args.target, dtype="float32", device=args.device, progress=lambda m: print(m, flush=True))
    meta = {"target": lm.name, "stems": stems, "max_new": args.max_new, "max_prompt": args.max_prompt,
            "heldout_chat": args.heldout_chat, "heldout_code": args.heldout_code, "seed": args.seed}
    store.check_split(meta)
    if args.prompts:
        train, held = read_prompt_file(args.prompts)
    else:
        train, held = reply_prompts(args.heldout_chat, args.heldout_code, seed=args.seed)
    print(f"{lm.name}: {len(train):,} training prompts, {len(held)} held out; {len(store.done_keys()):,} answered "
          f"already in {args.out}", flush=True)
    began = time.perf_counter()
    until = time.monotonic() + args.max_minutes * 60 if args.max_minutes else None
    common = dict(batch=args.batch, max_new=args.max_new, max_prompt=args.max_prompt, stems=stems, meta=meta,
                  until=until)
    bar = Progress(None, unit="tok", desc="held-out replies", initial=store.tokens("heldout"))
    held_tokens = write_replies(lm.model, lm.tokenizer, held, store, "heldout", 0, progress=lambda n: bar.update(n=n),
                                **common)
    bar.close()
    bar = Progress(args.train_tokens, unit="tok", desc="training replies", initial=store.tokens("train"))
    train_tokens = write_replies(lm.model, lm.tokenizer, train, store, "train", args.train_tokens,
                                 progress=lambda n: bar.update(n=n), **common)
    bar.close()
    seconds = time.perf_counter() - began
    made = held_tokens + train_tokens
    print(f"wrote {made:,} tokens in {seconds / 60:.1f} min ({made / max(seconds, 1e-9):.0f} tok/s at "
          f"{_where(lm.device)}); {args.out} holds {store.tokens('train'):,} training and "
          f"{store.tokens('heldout'):,} held-out tokens", flush=True)
    return 0


def run_compare(args) -> int:
    from pathlib import Path

    from ..runtime.models import load_model
    from .compare import compare, write

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.target, dtype="float32", device=args.device, progress=lambda m: print(m, flush=True))
    root = Path(__file__).resolve().parents[2]
    against = Path(args.against) if args.against else root / "assets" / args.kind / lm.name.replace("/", "--")
    record = compare(args.kind, lm, Path(args.replies), Path(args.candidate), against, args.depths,
                     args.decode_prompts, args.max_new, log=lambda line: print(line, flush=True))
    out = Path(args.out) if args.out else root / "bench" / "results" / f"drafter-{args.kind}-{lm.name}-heldout"
    json_path, md_path = write(record, out)
    print(f"wrote {json_path} and {md_path}", flush=True)
    return 0


def _where(device: torch.device) -> str:
    return str(device) if device.type != "cpu" else f"{torch.get_num_threads()} threads"


if __name__ == "__main__":
    raise SystemExit(main())
