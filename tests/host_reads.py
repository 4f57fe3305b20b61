"""Count host reads: the Python calls that, on a GPU, make the host wait for the device (a sync) to read a value.

Patched on torch.Tensor while a `HostReads` is active: item, tolist, cpu, numpy, __array__, the conversions
bool/int/float/index/format of a tensor, torch.equal / allclose, and the ops whose output shape depends on the data
(nonzero, unique, masked_select, indexing with a bool tensor), which sync on CUDA too. A `.cpu()` copy counts once:
reading the copy afterwards (`.cpu().tolist()`) is host work. On the CPU every tensor is a
host tensor, so the count is a ceiling: a read of a CPU-built helper tensor counts as if it lived on the device.

`rounds(generator, counter)` runs a decode generator (decoders/loop.run_rounds) and returns the reads of each round:
those between two of its yields (the first round also holds the prefill and the last yield's `finally` none, so both
are dropped; the table reports rounds 2..n). Reads made inside the drafter's propose (`counter.drafting()`) are
counted as "draft:<kind>", so a table row says what the drafter read apart from the verifier. Tensors built from Python
data (torch.tensor / as_tensor of a list: a host-to-device copy on a GPU, which waits too) are counted as uploads,
apart from the reads, and only reported.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch

_METHODS = ("item", "tolist", "cpu", "numpy", "__array__", "__bool__", "__int__", "__float__", "__index__",
            "__format__", "nonzero", "unique", "masked_select")
_FUNCTIONS = ("equal", "allclose", "nonzero", "unique", "masked_select")


class HostReads:
    def __init__(self):
        self.kinds: Counter = Counter()
        self._depth = 0  # a read inside a read (format -> item) counts once
        self.prefix = ""  # "draft:" while a drafter proposes (`drafting`): its reads apart from the verifier's

    @contextmanager
    def drafting(self):
        self.prefix = "draft:"
        try:
            yield
        finally:
            self.prefix = ""

    def take(self) -> Counter:
        kinds, self.kinds = self.kinds, Counter()
        return kinds

    def _wrap(self, name: str, original):
        counter = self

        def counted(*args, **kwargs):
            copied = args and getattr(args[0], "_host_copy", False)  # reading what .cpu() brought over: no sync
            if counter._depth == 0 and not copied:
                counter.kinds[counter.prefix + name] += 1
            counter._depth += 1
            try:
                out = original(*args, **kwargs)
            finally:
                counter._depth -= 1
            if name == "cpu" and isinstance(out, torch.Tensor):
                out = out.clone() if out is args[0] else out  # a CPU tensor's .cpu() is itself; a GPU's, a copy
                out._host_copy = True
            return out

        return counted

    def _wrap_getitem(self, original):
        counter = self

        def getitem(tensor, index):
            parts = index if isinstance(index, tuple) else (index,)
            if counter._depth == 0 and any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                counter.kinds[counter.prefix + "bool-index"] += 1
            return original(tensor, index)

        return getitem

    def _wrap_upload(self, original):
        counter = self

        def upload(data, *args, **kwargs):
            if counter._depth == 0 and not isinstance(data, torch.Tensor):
                counter.kinds[counter.prefix + "upload"] += 1
            return original(data, *args, **kwargs)

        return upload

    @contextmanager
    def active(self):
        saved = {}
        try:
            for name in _METHODS:
                saved[(torch.Tensor, name)] = getattr(torch.Tensor, name)
                setattr(torch.Tensor, name, self._wrap(name, saved[(torch.Tensor, name)]))
            for name in _FUNCTIONS:
                saved[(torch, name)] = getattr(torch, name)
                setattr(torch, name, self._wrap(f"torch.{name}", saved[(torch, name)]))
            for name in ("tensor", "as_tensor"):  # a tensor built from Python data: on a GPU, a host-to-device copy
                saved[(torch, name)] = getattr(torch, name)
                setattr(torch, name, self._wrap_upload(saved[(torch, name)]))
            saved[(torch.Tensor, "__getitem__")] = torch.Tensor.__getitem__
            torch.Tensor.__getitem__ = self._wrap_getitem(saved[(torch.Tensor, "__getitem__")])
            yield self
        finally:
            for (owner, name), original in saved.items():
                setattr(owner, name, original)


def rounds(generator, counter: HostReads) -> list[Counter]:
    """Drain a decode generator under counting; the reads of rounds 2..n, one Counter per round."""
    per_yield = []
    with counter.active():
        for _ in generator:
            per_yield.append(counter.take())
    return per_yield[1:]


def reads(counts: Counter, drafting: bool = False, kind: str = "read") -> int:
    """A round's reads (or uploads): all of them, or the drafter's alone."""
    return sum(n for name, n in counts.items() if (name.startswith("draft:") or not drafting)
               and (name.endswith("upload") == (kind == "upload")))


def table(rows: dict[str, list[Counter]]) -> str:
    """drafter | rounds | most reads a round (all, the drafter's) | mean | what the most-read round read."""
    lines = [f"{'drafter':<14} {'rounds':>6} {'max':>4} {'draft':>5} {'mean':>5} {'uploads':>7}  the worst round (uploads: all/draft)"]
    for name, counts in rows.items():
        totals = [reads(c) for c in counts] or [0]
        drafted = [reads(c, drafting=True) for c in counts] or [0]
        uploads = f"{max((reads(c, kind='upload') for c in counts), default=0)}/" \
                  f"{max((reads(c, True, 'upload') for c in counts), default=0)}"  # all / the drafter's
        worst = max(counts, key=reads) if counts else Counter()
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(worst.items()) if not k.endswith("upload"))
        lines.append(f"{name:<14} {len(counts):>6} {max(totals):>4} {max(drafted):>5} "
                     f"{sum(totals) / len(totals):>5.1f} {uploads:>7}  {kinds}")
    return "\n".join(lines)
