"""`WhisperModel(num_workers=N)`: throughput of N threads transcribing at once, against the
same threads on a model with one worker (they take turns), in one process on the same clips;
with --gpus, also the model on several GPUs (`device_index=[0, 1, ...]`, a replica on each).

    python benchmarks/workers.py --model .device/tiny.en --audio .gpuaudio/clips53.npz \
        --device cuda --threads 8 --runs 3 --out $OUT/workers.json
    python benchmarks/workers.py ... --gpus 2          # also the model on two GPUs (device_index)
    python benchmarks/workers.py --preset large-v3-turbo --audio ... --gpus 2   # random weights
    python benchmarks/workers.py --score workers.json   # WER of each against the dev references

Each run hands the clips (int16 16 kHz, an .npz by file name) to --threads threads, each taking
the next clip until none is left, with `transcribe`'s defaults (beam 5, the fallback ladder).
The runs alternate between the models. Prints the median seconds a run of each, its throughput
over one worker's, and how many clips got one worker's text; --out saves the texts for --score
here (the GPU machine has no WER scorer).
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


def run(
    model: WhisperModel, clips: dict[str, np.ndarray], threads: int, options: dict
) -> tuple[float, dict]:
    """Seconds to transcribe every clip from `threads` threads, and each clip's text."""

    def text(name: str) -> tuple[str, str]:
        segments, _ = model.transcribe(clips[name].astype(np.float32) / 32768, **options)
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
    # (name, device_index, num_workers): the same threads on each
    workers = args.workers or args.threads
    configs = [("num_workers=1", 0, 1), (f"num_workers={workers}", 0, workers)]
    if args.gpus > 1:
        configs.append((f"{args.gpus} GPUs, num_workers={workers}", list(range(args.gpus)),
                        workers))  # fmt: skip
    if args.preset:  # random weights: every window decodes 100 tokens (`forced_options`)
        from batched_gpu import forced_options, turbo_model

        models = {
            name: turbo_model(args.device, args.preset, device_index=index, num_workers=workers)
            for name, index, workers in configs
        }
        options = forced_options(next(iter(models.values())).tokenizer.eot)
    else:
        models = {
            name: WhisperModel(args.model, args.device, index, args.compute_type, num_workers=w)
            for name, index, w in configs
        }
        options = {}
    times: dict[str, list[float]] = {name: [] for name in models}
    texts: dict[str, dict] = {}
    for model in models.values():  # warm-up: graphs, batch shapes
        run(model, clips, args.threads, options)
    for index in range(args.runs):
        order = list(models) if index % 2 == 0 else list(reversed(models))
        for name in order:
            elapsed, texts[name] = run(models[name], clips, args.threads, options)
            times[name].append(elapsed)
    first = statistics.median(times[configs[0][0]])
    for name in models:
        median = statistics.median(times[name])
        runs = " ".join(f"{t:.2f}" for t in times[name])
        same = sum(texts[name][clip] == texts[configs[0][0]][clip] for clip in clips)
        concurrent = models[name].concurrent
        batches = [f"{e.backend.windows} windows in {e.backend.batches} batches"
                   for e in concurrent.engines] if concurrent else []  # fmt: skip
        print(f"{name:28s} {median:.2f} s a run (RTFx {seconds / median:.0f}; {runs}): "
              f"{first / median:.2f}x the throughput, same text {same} / {len(clips)}"
              + (f"; {', '.join(batches)}" if batches else ""))  # fmt: skip
    if args.out:
        result = {"device": device, "threads": args.threads, "times": times, "texts": texts}
        Path(args.out).write_text(json.dumps(result, indent=1))


def score(path: str) -> None:
    from devset import manifest_by_name, wer

    result = json.loads(Path(path).read_text())
    rows = manifest_by_name()
    for name, texts in result["texts"].items():
        exact = [clip for clip in texts if rows[clip]["ref_kind"] == "exact"]
        value = wer([rows[n]["text"] for n in exact], [texts[n] for n in exact])
        print(f"{name}: WER {100 * value:.2f} % on {len(exact)} exact clips")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--preset", help="random weights of this architecture, 100 tokens a window")
    parser.add_argument("--audio", help=".npz of int16 16 kHz clips by file name")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compute-type", default="default")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, help="num_workers (default: --threads)")
    parser.add_argument("--gpus", type=int, default=1, help="also a model on this many GPUs")
    parser.add_argument("--out", help="save the texts and times here (JSON)")
    parser.add_argument("--score", help="a saved --out file: print each one's WER")
    args = parser.parse_args()
    if args.score:
        score(args.score)
    else:
        measure(args)


if __name__ == "__main__":
    main()
