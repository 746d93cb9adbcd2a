"""Batched (VAD) vs sequential transcription on the CPU: WER against the reference text and
wall time, in one process, tiny.en fp32.

Wall times are medians over `--runs` runs after a warm-up on jfk; WER is of the last run (the
output is deterministic).

    python benchmarks/batched.py [--batch-size 16] [--beam-size 1] [--runs 3] [--modes ...]

The first mode's wall time is the one the others are divided into ("x sequential").
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from devset import DEV_DIR, LONG_FILE, manifest, wer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["sequential", "sequential, no conditioning", "batched",
                 "batched, conditioned chains"],
    )  # fmt: skip
    args = parser.parse_args()

    from whisperforge import BatchedInferencePipeline, WhisperModel, load_audio

    torch.set_num_threads(2)
    model = WhisperModel("tiny.en", device="cpu", compute_type="float32")
    pipeline = BatchedInferencePipeline(model)
    rows = manifest()
    clips = [
        r
        for r in rows
        if r["language"] == "en" and r["ref_kind"] == "exact" and r["duration_s"] <= 30
    ]
    joined = np.concatenate([load_audio(DEV_DIR / r["audio"]) for r in clips])
    longform = next(r for r in rows if r["audio"] == LONG_FILE)
    inputs = {
        "dev English exact clips joined": (joined, " ".join(r["text"] for r in clips)),
        "19-minute long-form file": (load_audio(DEV_DIR / LONG_FILE), longform["text"]),
    }

    modes = {
        "sequential": lambda audio: model.transcribe(audio, beam_size=args.beam_size)[0],
        "sequential, no conditioning": lambda audio: model.transcribe(
            audio, beam_size=args.beam_size, condition_on_previous_text=False
        )[0],
        "batched": lambda audio: pipeline.transcribe(
            audio, batch_size=args.batch_size, beam_size=args.beam_size
        )[0],
        "batched, conditioned chains": lambda audio: pipeline.transcribe(
            audio,
            batch_size=args.batch_size,
            beam_size=args.beam_size,
            condition_on_previous_text=True,
        )[0],
    }
    modes = {name: modes[name] for name in args.modes}

    def transcribe(mode: str, audio: np.ndarray) -> str:
        return "".join(s.text for s in modes[mode](audio))

    for mode in modes:  # warm-up
        transcribe(mode, load_audio(DEV_DIR / "openai-whisper__jfk.flac"))
    for name, (audio, reference) in inputs.items():
        print(f"\n{name} ({len(audio) / 16000:.0f} s), batch size {args.batch_size}, "
              f"beam {args.beam_size}, medians of {args.runs}")  # fmt: skip
        print("| mode | WER % | wall s | x sequential |\n|---|---|---|---|")
        first = None
        for mode in modes:
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                text = transcribe(mode, audio)
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            first = first or seconds
            error = 100 * wer([reference], [text])
            print(f"| {mode} | {error:.2f} | {seconds:.1f} | {first / seconds:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
