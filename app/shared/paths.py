"""Where the repository's assets are, for every tab (recorded traces, example prompts, audio clips)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
