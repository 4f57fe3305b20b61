"""SpecLab decoders: speculative decoding methods that record every decision in one trace format.

No gradio here. Public API: DecodeOptions, generate, stream, generate_batch, stream_batch, Trace (see decoders/api.py and decoders/trace.py).
"""
from .api import draft_for, generate, generate_batch, label, stream, stream_batch
from .drafters.suffix import SuffixStore
from .options import DRAFTERS, METHODS, RULES, DecodeOptions, OptionsError
from .trace import SCHEMA_VERSION, Trace, TraceError

__all__ = ["draft_for", "DecodeOptions", "OptionsError", "generate", "stream", "generate_batch", "stream_batch", "label", "Trace", "TraceError", "SCHEMA_VERSION",
           "METHODS", "DRAFTERS", "RULES", "SuffixStore"]
