"""The model card written next to a trained head (README.md): what it was trained on, how long, how good."""
from __future__ import annotations

import json
import platform
from pathlib import Path

import torch


def hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA)"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = torch.get_num_threads()
    return f"{cpu}, {threads} torch thread{'s' if threads != 1 else ''}"


def _vocab_note(info: dict) -> str:
    if info.get("arch") == "eagle3":  # its own LM head: no full-vocabulary score of the same head
        return (f"Draft vocabulary: {info['draft_vocab']:,} target ids (`d2t`: target id = column + d2t[column]; "
                f"`t2d` marks them), the most frequent of the training text unless it is the whole vocabulary.")
    full = info.get("full_vocab_eval")
    if not full:
        return "Draft vocabulary: the target's full vocabulary."
    alpha = " | ".join(f"{a:.3f}" for a in full["alpha"])
    return (f"Draft vocabulary: the {info['draft_vocab']:,} most frequent tokens of the training text (EAGLE-3's "
            f"reduced vocabulary; ids in `vocab_ids`). The same head scored over the full vocabulary "
            f"(`head.set_draft_vocab(None)`): α by depth {alpha}, top-1 recall {full['recall'][1]:.3f}.")


def _init_line(info: dict) -> str:
    """Where the weights started: a continued head's history is its starting head's card plus this one."""
    if not info.get("init"):
        return ""
    return (f"\n- Started from: `{info['init']}` (a fresh optimizer unless resumed; the first row below is its held-out "
            "α), so this card's steps and minutes add to that head's")


def _time_line(info: dict) -> str:
    """Training time over every session of a resumed run; the wall time and hardware are the last session's."""
    resumed = info.get("resumed", info["total_seconds"] < info["train_seconds"])  # older cards lack the flag
    where = (f"over all sessions of the resumed run; the last session took {info['total_seconds'] / 60:.1f} min wall, "
             "on the hardware below" if resumed else f"{info['total_seconds'] / 60:.1f} min wall in all")
    return (f"{info['feature_seconds']:.0f} s of target features + {info['train_seconds'] / 60:.1f} min of training\n"
            f"  ({where})")


def _resume_note(info: dict) -> str:
    if not info.get("resume_command"):
        return ""
    return f"""
The run is resumable (model, optimizer, step, data position and RNG in the checkpoint); to continue it (a run
that spent its `--max-minutes` goes on only with a larger one, its learning-rate decay restarting warm):

```bash
{info['resume_command']}
```
"""


def _architecture(info: dict) -> str:
    """The card's title and first paragraph: which head this is and how its weights are laid out."""
    if info.get("arch") == "eagle3":
        return f"""# EAGLE-3 draft head for {info['target']}

EAGLE-3's head (Li et al., 2025): fc over the target's hidden states entering layers {info.get('feature_layers')}
(low, mid, high) -> one {info['layer_class']} reading [norm(embedding of the next token) ; norm(fc output)] -> its
own norm and LM head over the draft vocabulary, trained with training-time test {info.get('ttt_depths')} steps deep.
Weights in SafeAILab/EAGLE's EAGLE-3 layout (`config.json` + `model.safetensors`, keys `fc.weight`, `midlayer.*`,
`norm.weight`, `lm_head.weight`, `d2t`, `t2d`); load with `decoders.eagle.official.load_official(folder, target_model)`.
"""
    return f"""# EAGLE-1/2 draft head for {info['target']}

A feature-level draft head (Li et al., ICML 2024): fc over [embedding of the next token ; target feature] -> one
{info['layer_class']} -> the target's own LM head (not stored here: it is the target's, shared and frozen).
Weights in SafeAILab/EAGLE's released layout (`config.json` + `model.safetensors`, keys `fc.*`, `layers.0.*`);
load with `decoders.eagle.official.load_official(folder, target_model)`.
"""


def model_card(info: dict) -> str:
    """Markdown from the training record `info` (keys written by decoders/eagle/__main__.py)."""
    final = info["final_eval"]
    alpha = " | ".join(f"{a:.3f}" for a in final["alpha"])
    depths = " | ".join(str(k + 1) for k in range(len(final["alpha"])))
    recall = ", ".join(f"top-{k}: {r:.3f}" for k, r in final["recall"].items())
    evals = ([("start (--init)" if info.get("init") else "untrained", info["initial_eval"])]
             if info.get("initial_eval") else []) + list(info["evals"])
    history = "\n".join(f"| {step} | " + " | ".join(f"{a:.3f}" for a in result["alpha"]) + f" | {result['recall'][1]:.3f} |"
                        for step, result in evals)
    return f"""{_architecture(info).rstrip()}

## Held-out acceptance ({final['chains']} greedy draft chains on {info['heldout_conversations']} {info.get('heldout_note') or "held-out ShareGPT conversations, assistant turns"})

α(k) = P(draft step k equals the target's argmax | steps 1..k-1 did), the head drafting on its own features:

| depth | {depths} |
|---|{'---|' * len(final['alpha'])}
| α | {alpha} |

Depth-1 recall ({recall}); expected accepted drafts per chain of {len(final['alpha'])}: {final['mean_accepted']:.2f}.
Target of the issue: α(depth 1) >= 0.6 ({'met' if final['alpha'][0] >= 0.6 else 'not met'}).
{_vocab_note(info)}

## Training

- Data: {info['data']}{_init_line(info)}
- Examples: {info['train_examples']} sequences, {info['train_tokens']:,} tokens (loss on assistant tokens; sequences
  cut at {info['seq_len']} tokens); held out: {info['heldout_conversations']} conversations never trained on.
- Loss: SmoothL1 on the next feature + 0.1 x cross-entropy against the target's next-token distribution (EAGLE).
- Steps: {info['steps']} AdamW steps of ~{info['batch_tokens']} tokens, lr {info['lr']} (warm-up, linear decay),
  {info['tokens_seen']:,} loss tokens seen.
- Time: {_time_line(info)}.
- Hardware: {info['hardware']}.
- Stored as {info['save_dtype']} ({info['size_mb']:.1f} MB).

Evaluations during training (α by depth, top-1 recall):

| step | {depths} | top-1 |
|---|{'---|' * len(final['alpha'])}---|
{history}

## Reproduce or train further

```bash
{info['command']}
```
{_resume_note(info)}
On a GPU (the same recipe, more data and time; `--device cuda`):

```bash
{info['gpu_command']}
```
"""


def rewrite(folder: str | Path) -> Path:
    """README.md again from the folder's training.json (after the card's wording changed): JSON turned the
    recall's top-k keys into strings and the evaluations into lists; both come back as the trainer wrote them."""
    folder = Path(folder)
    info = json.loads((folder / "training.json").read_text())
    for result in [info["final_eval"], info.get("full_vocab_eval"), info.get("initial_eval"),
                   *(e[1] for e in info["evals"])]:
        if result:
            result["recall"] = {int(k): v for k, v in result["recall"].items()}
    info["evals"] = [tuple(e) for e in info["evals"]]
    (folder / "README.md").write_text(model_card(info))
    return folder / "README.md"
