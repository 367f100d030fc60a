"""Where the tiny trained model shipped inside the package lives."""
from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def default_model_path() -> Path:
    path = ASSETS / "tiny"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: the embedded model is missing from this installation; pass --model DIR")
    return path
