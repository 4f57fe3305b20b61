"""Per-round overhead of SpecLab's loop, measured with near-free models of the Qwen vocabulary size.

python -m bench.overhead [--vocab 151936] [--tokens 256] [--reps 5]

The models are 1-layer, 32-wide Qwen2s with the real vocabulary (151936 rows), so a forward costs a few ms and the
time per round is dominated by what SpecLab does around the forwards: building tensors, cache crops, the
softmax/argmax over vocabulary rows, verification, the draft-length rule, and the trace recording. The result is
ms per round (min over repetitions, the least disturbed by other jobs), recording on and off.
"""
from __future__ import annotations

import argparse
import time

import torch


def tiny_pair(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def make(seed):
        torch.manual_seed(seed)
        config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             tie_word_embeddings=False)
        return Qwen2ForCausalLM(config).float().eval()

    target = make(0)
    draft = make(0)  # the same weights: every draft is accepted, rounds are full length
    return target, draft


class _LM:
    def __init__(self, model, name):
        self.model, self.name = model, name
        self.eos_token_ids = ()
        self.context_length = 8192
        self.dtype = torch.float32
        self.device = torch.device("cpu")
        self.source = "random init"

    def encode_prompt(self, text, chat=True):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


def measure(vocab: int = 151936, tokens: int = 256, reps: int = 5) -> list[dict]:
    from decoders import DecodeOptions, generate

    target_model, draft_model = tiny_pair(vocab)
    target, draft = _LM(target_model, "tiny-target"), _LM(draft_model, "tiny-draft")
    prompt = list(range(100, 164))
    configs = [("baseline", {"method": "baseline"}),
               ("draft-model static γ=4", {"method": "speculative", "drafter": "draft-model", "rule": "static",
                                           "gamma": 4}),
               ("draft-model AdaEDL L=8", {"method": "speculative", "drafter": "draft-model", "rule": "adaedl",
                                          "max_draft": 8}),
               ("prompt lookup γ=10", {"method": "speculative", "drafter": "prompt-lookup", "gamma": 10}),
               ("draft-model static γ=4, T=1", {"method": "speculative", "drafter": "draft-model", "rule": "static",
                                                "gamma": 4, "temperature": 1.0})]
    rows = []
    for label, options in configs:
        for record in (True, False):
            best = None
            for _ in range(reps):
                opts = DecodeOptions(model="tiny", max_new_tokens=tokens, record=record, **options)
                trace = generate(opts, prompt, target=target, draft=draft)
                per_round = trace.decode_seconds / max(1, len(trace.rounds))
                best = per_round if best is None else min(best, per_round)
            rows.append({"config": label, "record": record, "ms_per_round": best * 1000,
                         "rounds": len(trace.rounds), "draft_forwards_per_round":
                         trace.totals["draft_forwards"] / max(1, len(trace.rounds))})
    return rows


def forward_floor(vocab: int = 151936, reps: int = 20) -> dict:
    """ms of the bare model calls alone (target 5-token forward, draft 1-token step), for subtraction."""
    from decoders.runtime.runner import CachedModel

    target_model, _ = tiny_pair(vocab)
    runner = CachedModel(target_model)
    runner.forward(list(range(64)), last_only=True)
    out = {}
    for n, last in ((1, True), (1, False), (5, False)):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            runner.forward(list(range(n)), last_only=last)
            times.append(time.perf_counter() - t0)
            runner.drop_last(n)
        out[f"forward n={n}{' last_only' if last else ''}"] = min(times) * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, vocab {args.vocab}")
    for name, ms in forward_floor(args.vocab).items():
        print(f"  bare {name}: {ms:.2f} ms")
    print("| config | record | ms per round | draft forwards per round |")
    print("|---|---|---|---|")
    for row in measure(args.vocab, args.tokens, args.reps):
        print(f"| {row['config']} | {'on' if row['record'] else 'off'} | {row['ms_per_round']:.2f} | "
              f"{row['draft_forwards_per_round']:.1f} |")


if __name__ == "__main__":
    main()
