"""Batched (VAD) vs sequential transcription on the CPU: WER against the reference text and
wall time, in one process, tiny.en fp32.

Wall times are medians over `--runs` runs after a warm-up on jfk; WER is of the last run (the
output is deterministic).

    python benchmarks/batched.py [--batch-size 16] [--beam-size 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

DEV_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"
LONGFORM = "derived__longform_en_amateur_LJ001-LJ003_prompts.flac"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import jiwer
    from whisper.normalizers import EnglishTextNormalizer

    from whisperforge import BatchedInferencePipeline, WhisperModel, load_audio

    torch.set_num_threads(2)
    normalize = EnglishTextNormalizer()
    model = WhisperModel("tiny.en", device="cpu", compute_type="float32")
    pipeline = BatchedInferencePipeline(model)
    rows = [
        json.loads(line) for line in (DEV_DIR / "manifest.jsonl").read_text().splitlines() if line
    ]
    clips = [
        r
        for r in rows
        if r["language"] == "en" and r["ref_kind"] == "exact" and r["duration_s"] <= 30
    ]
    joined = np.concatenate([load_audio(DEV_DIR / r["audio"]) for r in clips])
    longform = next(r for r in rows if r["audio"] == LONGFORM)
    inputs = {
        "dev English exact clips joined": (joined, " ".join(r["text"] for r in clips)),
        "19-minute long-form file": (load_audio(DEV_DIR / LONGFORM), longform["text"]),
    }

    def transcribe(mode: str, audio: np.ndarray) -> str:
        if mode == "sequential":
            segments = model.transcribe(audio, beam_size=args.beam_size)[0]
        else:
            segments = pipeline.transcribe(
                audio, batch_size=args.batch_size, beam_size=args.beam_size
            )[0]
        return "".join(s.text for s in segments)

    for mode in ("sequential", "batched"):  # warm-up
        transcribe(mode, load_audio(DEV_DIR / "openai-whisper__jfk.flac"))
    for name, (audio, reference) in inputs.items():
        figures = {}
        for mode in ("sequential", "batched"):
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                text = transcribe(mode, audio)
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            figures[mode] = (jiwer.wer(normalize(reference), normalize(text)), seconds)
        (wer_s, t_s), (wer_b, t_b) = figures["sequential"], figures["batched"]
        print(
            f"{name} ({len(audio) / 16000:.0f} s): WER sequential {100 * wer_s:.2f}% batched "
            f"{100 * wer_b:.2f}% (diff {100 * (wer_b - wer_s):+.2f} points); wall sequential "
            f"{t_s:.1f} s batched {t_b:.1f} s (medians of {args.runs}), batched speed-up "
            f"{t_s / t_b:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
