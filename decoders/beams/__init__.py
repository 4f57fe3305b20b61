"""Several hypotheses at once: beam search, beam sampling and DSBD (dynamic-width speculative beam decoding).

DSBD is Qin, He, Prakriya, Cong, Sun (AAAI 2025, arXiv 2409.16560). The paper's full text was not available to
this project: the algorithm here is reconstructed from the official code (ZongyueQin/DSBD) and the abstract, see
docs/algorithms.md §6, with one deliberate change: draft beams are drawn i.i.d., so every accepted
beam is an exact draw from the target (the code's 1e-3 -> argmax substitution is dropped).
"""
from . import dsbd  # the submodule, not its function dsbd.dsbd: binding the function here shadowed the submodule
from .dsbd import DsbdSettings
from .dsbd import dsbd as dsbd_decode  # (`import decoders.beams.dsbd` yielded the function), hence its own name
from .search import BeamResult, beam_sampling, beam_search
from .width import acceptance_count_distribution, choose_width

__all__ = ["BeamResult", "DsbdSettings", "acceptance_count_distribution", "beam_sampling", "beam_search",
           "choose_width", "dsbd_decode"]
