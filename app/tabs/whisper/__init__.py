"""The Whisper tab: record or upload speech, transcribe it with several beam-search decoders side by side, scrub
through each decoder's beam tree. handlers.py runs a click (once, in the decode slot, stoppable); layout.py wires it."""
from app.tabs.whisper.handlers import AUDIO_DIR, DECODERS, example_clips  # noqa: F401  (lessons.py, tests)
from app.tabs.whisper.layout import build  # noqa: F401  (app/page.py)
