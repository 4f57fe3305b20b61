"""The target's features, recorded once and shared by every learned drafter's training.

Per sequence: token ids, the loss mask (assistant tokens), the hidden state after the first k layers for each
requested k (what an early-exit block reads), the top feature after the final norm (what the LM head reads: an
EAGLE head's and a prophet's input, and every drafter's soft labels), and the target's own greedy next token at
every position (what held-out acceptance compares with).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..training.batches import length_sorted_chunks


@dataclass
class Recorded:
    ids: torch.Tensor  # (n,) long
    loss_mask: torch.Tensor  # (n,) bool: assistant tokens
    final: torch.Tensor  # (n, d) float16: after the final norm
    stems: dict[int, torch.Tensor]  # k -> (n, d) float16: the hidden state after layers 0..k-1
    greedy: torch.Tensor  # (n,) long: the target's argmax next token after position m


@torch.inference_mode()
def record(target: torch.nn.Module, examples, stem_layers: list[int], batch_tokens: int = 2048,
           store_dtype: torch.dtype = torch.float16, progress=None) -> list[Recorded]:
    """One target pass over every example (length-sorted batches, right padding)."""
    device = next(target.parameters()).device
    head = target.get_output_embeddings()
    out: list[Recorded | None] = [None] * len(examples)
    for chunk, ids, attention in length_sorted_chunks(examples, batch_tokens):  # (B, n) each
        result = target.get_decoder()(input_ids=ids.to(device), attention_mask=attention.to(device),
                                      output_hidden_states=bool(stem_layers))
        final = result.last_hidden_state  # (B, n, d)
        greedy = head(final).argmax(-1).cpu()  # (B, n)
        for row, i in enumerate(chunk):
            n = len(examples[i].ids)
            stems = {k: result.hidden_states[k][row, :n].to("cpu", store_dtype) for k in stem_layers}  # (n, d) each
            out[i] = Recorded(examples[i].ids, examples[i].loss_mask, final[row, :n].to("cpu", store_dtype), stems,
                              greedy[row, :n])
        if progress:
            progress(sum(len(examples[i].ids) for i in chunk))
    return out  # type: ignore[return-value]
