"""`WhisperModel(num_workers=N)`: throughput of N threads transcribing at once, against the
same threads on a model with one worker (they take turns), in one process on the same clips.

    python benchmarks/workers.py --model .device/tiny.en --audio .gpuaudio/clips53.npz \
        --device cuda --threads 8 --runs 3 --out $OUT/workers.json
    python benchmarks/workers.py --score workers.json   # WER of each against the dev references

Each run hands the clips (int16 16 kHz, an .npz by file name) to --threads threads, each taking
the next clip until none is left, with `transcribe`'s defaults (beam 5, the fallback ladder).
The runs alternate between the two models. Prints the median seconds a run of each, the ratio,
and how many clips got the same text from both; --out saves the texts for --score here (the
GPU machine has no WER scorer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from whisperforge import WhisperModel


def run(model: WhisperModel, clips: dict[str, np.ndarray], threads: int) -> tuple[float, dict]:
    """Seconds to transcribe every clip from `threads` threads, and each clip's text."""

    def text(name: str) -> tuple[str, str]:
        segments, _ = model.transcribe(clips[name].astype(np.float32) / 32768)
        return name, "".join(segment.text for segment in segments)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        texts = dict(pool.map(text, clips))
    return time.perf_counter() - start, texts


def measure(args: argparse.Namespace) -> None:
    import torch

    clips = dict(np.load(args.audio))
    seconds = sum(len(clip) for clip in clips.values()) / 16000
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{device}, {len(clips)} clips, {seconds:.1f} s of audio, {args.threads} threads")
    models = {
        workers: WhisperModel(
            args.model, device=args.device, compute_type=args.compute_type, num_workers=workers
        )
        for workers in (1, args.threads)
    }
    times: dict[int, list[float]] = {workers: [] for workers in models}
    texts: dict[int, dict] = {}
    for workers, model in models.items():  # warm-up: graphs, batch shapes
        run(model, clips, args.threads)
    for index in range(args.runs):
        order = list(models) if index % 2 == 0 else list(reversed(models))
        for workers in order:
            elapsed, texts[workers] = run(models[workers], clips, args.threads)
            times[workers].append(elapsed)
    one, many = (statistics.median(times[w]) for w in models)
    same = sum(texts[1][name] == texts[args.threads][name] for name in clips)
    for workers in models:
        runs = " ".join(f"{t:.2f}" for t in times[workers])
        median = statistics.median(times[workers])
        print(
            f"num_workers={workers:<3} {median:.2f} s a run (RTFx {seconds / median:.0f}; {runs})"
        )
    print(
        f"num_workers={args.threads} / 1: {one / many:.2f}x the throughput; same text {same} / {len(clips)}"
    )
    if args.out:
        result = {"device": device, "threads": args.threads, "times": times, "texts": texts}
        Path(args.out).write_text(json.dumps(result, indent=1))


def score(path: str) -> None:
    from devset import manifest_by_name, wer

    result = json.loads(Path(path).read_text())
    rows = manifest_by_name()
    for workers, texts in result["texts"].items():
        exact = [name for name in texts if rows[name]["ref_kind"] == "exact"]
        value = wer([rows[n]["text"] for n in exact], [texts[n] for n in exact])
        print(f"num_workers={workers}: WER {100 * value:.2f} % on {len(exact)} exact clips")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--audio", help=".npz of int16 16 kHz clips by file name")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compute-type", default="default")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", help="save the texts and times here (JSON)")
    parser.add_argument("--score", help="a saved --out file: print each one's WER")
    args = parser.parse_args()
    if args.score:
        score(args.score)
    else:
        measure(args)


if __name__ == "__main__":
    main()
