"""The dev audio set (`../shared/data/dev`, described by its manifest.jsonl) and the one way
the benchmarks score transcripts of it.

`wer` is the figure RESULTS.md quotes: corpus word error rate after openai-whisper's English
normalizer. The GPU machine has neither openai-whisper nor jiwer, so scripts there save their
transcripts for `wer` here, or compare them with `plain_wer` (a plain lower-case word split).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

DEV_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"
LONG_FILE = "derived__longform_en_amateur_LJ001-LJ003_prompts.flac"  # 19 minutes, read prompts


def manifest() -> list[dict]:
    """The manifest's rows: audio (file name), language, text, ref_kind, duration_s."""
    lines = (DEV_DIR / "manifest.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def manifest_by_name() -> dict[str, dict]:
    return {row["audio"]: row for row in manifest()}


def short_english_clips() -> list[str]:
    """Every English dev clip of at most 30 s (one window), by file name."""
    return [r["audio"] for r in manifest() if r["language"] == "en" and r["duration_s"] <= 30]


def english_normalizer() -> Callable[[str], str]:
    """openai-whisper's EnglishTextNormalizer (ImportError where openai-whisper is missing)."""
    from whisper.normalizers import EnglishTextNormalizer

    return EnglishTextNormalizer()


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Word errors over all the references' words, both sides English-normalized."""
    import jiwer

    normalize = english_normalizer()
    return jiwer.wer([normalize(r) for r in references], [normalize(h) for h in hypotheses])


def plain_words(text: str) -> str:
    """Lower-case words of letters, digits and apostrophes, one space apart."""
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c in " '").split())


def plain_wer(reference: str, text: str) -> float:
    """Word error rate over plain words, with no package beyond Python (the GPU machine)."""
    ref, hyp = plain_words(reference).split(), plain_words(text).split()
    row = list(range(len(hyp) + 1))  # edit distances of ref[:i] to each prefix of hyp
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1] / max(len(ref), 1)
