"""Batched decoding with ragged rows: B prompts decoded together, each row advancing at its own rate.

Why it is hard. In a round of speculative decoding row r accepts a_r of its drafts, and a_r differs by row, so the
rows' lengths, position ids, masks and KV caches fall out of step. Published batch implementations break output
equivalence exactly there. The defining property kept here: every row's output equals that row decoded alone
(decoders.api.generate with seed = seeds[r]), token for token, up to float rounding of the batched forward.

Realignment strategy (decoders/batch/ragged.py does it; decoders/batch/loop.py calls it):
- One rectangular KV cache per model (target; draft model if any), (B, heads, width, head_dim), with a per-row
  boolean `valid` (B, width): which slots hold that row's real tokens. Every other slot is padding.
- Prompts are left-padded at prefill. Each later forward appends a block of n = the longest row's new tokens;
  shorter rows are left-padded inside the block (so every row's last token is in the block's last slot).
- Position ids are per row: a row's k-th real token has position k, whatever slot it sits in (padding never
  counts). Pad tokens get finite dummy positions; nothing attends to them.
- The mask is built here, per row: a query sees the real slots of its own row up to its own slot (slot order is
  token order within a row) plus its own slot (so a pad query is never fully masked and never makes NaNs).
- After a round, a row that accepted a_r of N_r drafts keeps its root and its a_r drafts; the N_r - a_r rejected
  slots are marked padding in that row only (no copy, the other rows untouched). The draft model's cache gives back
  the drafts it was fed but the target rejected, the same way, per row. Layer-skip drafts write into the target's
  own cache and every slot they wrote is cut again before verification. Early-exit drafts run the stem (target
  layers 0..k-1) in the target's own cache, so during a round those k layers hold extra columns the others do not;
  verification runs layers k..L-1 only, over the h_k the draft kept, and then the stem layers' round slots are
  gathered into the verification block's layout, so every layer holds the same slots again before the cuts below.
  The exit block and the prophet keep ragged caches of their own, cut per row like a draft model's. An int8 draft
  model is the exception: it drafts each row alone, with the single run's own drafter and cache, because its
  per-token quantization turns the batched forward's last-bit differences into other q values
  (decoders/batch/drafters.py draft_model_form).
- Finished rows (their EOS or their own max_new_tokens) leave the batch at the end of the round: their batch rows
  are dropped from every cache (an index_select), the others keep their order and their state.
- Then the caches are trimmed (columns that are padding in every row, at either end, are sliced away) and, when at
  least a quarter of the width (and 8 slots) is holes that only moving slots can free, compacted: each row's real
  slots are gathered to the right end in order. Trim, compaction and rows leaving are the realignment the batch
  trace times (BatchRound.seconds["realign"]).

Invariants (tests/test_batch.py checks the consequences): for every row, its valid slots hold exactly the KV
entries of its committed tokens except the pending last one (target; the draft model: what it has consumed), in
order, at positions 0..len-1; lengths[r] = the number of valid slots of row r; a real query never attends to a pad
slot or to another row; each row draws from its own generator in the same order as the single-row loop, because
drafting (decoders.drafters.base.draft_position), verification (decoders/verify.py) and the rule run per row
unchanged; only forwards are shared.
"""
from .run import MAX_BATCH, batched_drafters
from .trace import BatchRound, BatchTrace

__all__ = ["BatchRound", "BatchTrace", "MAX_BATCH", "batched_drafters"]
