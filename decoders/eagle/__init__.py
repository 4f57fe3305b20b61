"""EAGLE draft heads: the head (head.py), SafeAILab/EAGLE's released format (official.py), training data
(data.py) and training (train.py; CLI: `python -m decoders.eagle train --target smollm2-135m`)."""
from .head import EagleHead

__all__ = ["EagleHead"]
