"""The model card written next to trained self-drafter weights (README.md)."""
from __future__ import annotations

from .store import train_command

_WHAT = {
    "early-exit": "the target's first {k} layers (shared: their KV and hidden states for drafted tokens are reused by "
                  "verification) -> a trained linear adapter (started as the least-squares map to the target's top feature) "
                  "-> one trained {layer} (started from target layer {k}, as an identity) -> a trained copy of the "
                  "target's final norm -> the target's LM head",
    "prophet": "[W [f_t ; E(x_t+1)], E(d_2), ...] -> {n} trained {layer}(s) (started from copies of the target's "
               "last {n}, as identities; W the least-squares map to the next feature) -> a trained copy of the final "
               "norm -> the target's LM head; f_t = the target's last hidden state at the last accepted position; no "
               "other context",
}


def model_card(info: dict) -> str:
    shape, final, initial = info["shape"], info["final_eval"], info["initial_eval"]
    what = _WHAT[info["kind"]].format(k=shape.get("exit_layer"), n=shape.get("n_layers"), layer="decoder layer")
    depths = len(final["alpha"])
    row = lambda r: " | ".join(f"{a:.3f}" for a in r["alpha"])
    history = "\n".join(f"| {step} | {row(result)} |" for step, result in info["evals"])
    return f"""# {info['kind']} self-drafter for {info['target']}

Draft = {what}. Shape: {shape}; {info['params']:,} trained parameters, stored as {info['save_dtype']}
({info['size_mb']:.1f} MB); draft vocabulary: {info['draft_vocab']:,} most frequent training tokens.

## Held-out acceptance ({final['chains']} greedy chains on {info['heldout_sequences']} {info.get('heldout_note') or "held-out ShareGPT conversations"})

α(d) = P(draft step d equals the target's argmax | steps 1..d-1 did), teacher-forced on the data's tokens.

| | {' | '.join(str(d + 1) for d in range(depths))} |
|---|{'---|' * depths}
| {info.get('initial_label', 'fitted lens, before training')} | {row(initial)} |
| trained | {row(final)} |

Expected accepted drafts per chain of {depths}: {final['mean_accepted']:.2f}.

## Training

- Data: {info['data']}; {info['train_sequences']} sequences, {info['train_tokens']:,} tokens (loss on assistant tokens).
- Loss: cross-entropy against the target's own next-token distribution over the draft vocabulary.
- {info['steps']} AdamW steps (~{info['batch_tokens']} tokens each, lr {info['lr']}), {info['tokens_seen']:,} loss tokens.
- Time: {info['feature_seconds']:.0f} s of target features (shared by a sweep) + {info['train_seconds'] / 60:.1f} min
  of training. Hardware: {info['hardware']}, shared with other work.
- Curves: training_curves.png / .json (loss and held-out α by evaluation).

| step | {' | '.join(str(d + 1) for d in range(depths))} |
|---|{'---|' * depths}
{history}

## Reproduce, or train for any registry target

```bash
{info['command']}
{train_command(info['kind'], '<registry target>')}
```
{_resume_note(info)}"""


def _resume_note(info: dict) -> str:
    from ..eagle.card import _resume_note as note

    return note(info)
