"""One training loop for every learned drafter (EAGLE head, early-exit block, prophet decoder).

loop.fit: AdamW under a time or step budget, warm-up + linear decay, gradient-value clipping, held-out evaluation
every few minutes, a progress bar. curves.save_curves: the loss and α-by-depth curves as PNG + JSON.
"""
from .loop import FitSettings, History, Progress, fit
from .curves import save_curves

__all__ = ["FitSettings", "History", "Progress", "fit", "save_curves"]
