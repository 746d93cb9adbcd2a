"""CPU speed of the ONNX export on onnxruntime vs the PyTorch path, side by side in one process.

tiny.en fp32 both ways, the same decoded audio arrays, the same thread count for torch and
onnxruntime. Each engine transcribes the clip set once to warm up, then `--runs` times, the
engines taking turns; we report the median wall time per pass, the ratio, the encoder alone on
one 30 s window, and whether the transcripts are token-identical.

    python benchmarks/export_cpu.py                        # all <= 30 s English dev clips
    python benchmarks/export_cpu.py --export-dir /tmp/tiny.en-onnx --modes greedy --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from devset import DEV_DIR, short_english_clips
from engine_process import scratch_dir

if TYPE_CHECKING:
    from whisperforge import WhisperModel

T = TypeVar("T")


def median_times(runs: dict[str, Callable[[], T]], repeats: int) -> dict[str, tuple[float, T]]:
    """Per engine: the median wall time of `repeats` calls after a warm-up one, and the last
    call's result. The engines take turns, so that a slower spell of a shared machine falls
    on both."""
    results = {name: run() for name, run in runs.items()}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), results[name]) for name in runs}


def transcribe_all(model: WhisperModel, audios: list[np.ndarray], beam: int) -> list[list[int]]:
    # Temperature 0 only, as the CI test: a fallback to sampling would make the tokens random.
    return [
        [t for s in model.transcribe(a, beam_size=beam, temperature=0.0)[0] for t in s.tokens]
        for a in audios
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", nargs="*", help="dev files (default: all <= 30 s English)")
    parser.add_argument("--modes", nargs="*", default=["greedy", "beam5"])
    parser.add_argument("--export-dir", type=Path, help="an ONNX export of tiny.en (default: "
                        "export into a temporary folder first)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    from whisperforge import WhisperModel, load_audio
    from whisperforge.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
    from whisperforge.export import export_model

    torch.set_num_threads(args.threads)
    export_dir = args.export_dir
    if export_dir is None:
        start = time.perf_counter()
        export_dir = export_model("tiny.en", scratch_dir() / "tiny.en-onnx")
        print(f"export: {time.perf_counter() - start:.1f} s")
    models = {
        "pytorch": WhisperModel("tiny.en", device="cpu", compute_type="float32",
                                cpu_threads=args.threads),
        "onnxruntime": WhisperModel(export_dir, device="cpu", cpu_threads=args.threads),
    }  # fmt: skip
    files = args.files or short_english_clips()
    audios = [load_audio(DEV_DIR / f) for f in files]
    seconds = sum(len(a) for a in audios) / 16000
    print(f"{len(files)} files, {seconds:.1f} s of audio, {args.threads} threads, "
          f"median of {args.runs}")  # fmt: skip

    results: dict[str, float] = {}
    mel = pad_or_trim(log_mel_spectrogram(audios[0], 80, N_SAMPLES), N_FRAMES)[None]
    encoders = {name: (lambda m=model: m.encode(mel)) for name, model in models.items()}
    for name, (median, _) in median_times(encoders, args.runs).items():
        results[f"encoder/{name}"] = median
        print(f"  encoder, one window  {name:12} {median:7.3f} s", flush=True)
    tokens: dict[tuple[str, str], list[list[int]]] = {}
    for mode in args.modes:
        beam = 5 if mode == "beam5" else 1
        passes = {
            name: (lambda m=model, b=beam: transcribe_all(m, audios, b))
            for name, model in models.items()
        }
        for name, (median, decoded) in median_times(passes, args.runs).items():
            results[f"{mode}/{name}"], tokens[(mode, name)] = median, decoded
            print(f"  {mode:6} {name:12} {median:7.2f} s  RTFx {seconds / median:6.1f}", flush=True)

    print("\n| what | pytorch s | onnxruntime s | onnxruntime / pytorch | tokens identical |")
    print("|---|---|---|---|---|")
    for what in ["encoder", *args.modes]:
        ours, theirs = results[f"{what}/pytorch"], results[f"{what}/onnxruntime"]
        same = "-"
        if what in args.modes:
            pairs = zip(tokens[(what, "pytorch")], tokens[(what, "onnxruntime")])
            same = f"{sum(a == b for a, b in pairs)} / {len(audios)}"
        print(f"| {what} | {ours:.3f} | {theirs:.3f} | {theirs / ours:.2f} | {same} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
