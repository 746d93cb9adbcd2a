"""Time to a first transcript on a GPU: a new process's import, model load, first and second
`transcribe`, and first and second `BatchedInferencePipeline` call, with Triton's kernel cache
empty (a machine's first run) and then filled (every run after it).

    python3 benchmarks/startup.py --preset large-v3-turbo --out $OUT/startup.json
    python3 benchmarks/startup.py --model /tmp/tiny.en ...      # real weights

Each measurement is a child process of its own (`--child`), so nothing is warm but what the
cache directory holds. The first call's time over the second's is what compiling the kernels
and capturing the CUDA graphs cost it. The audio is generated (noise with tones, 30 s for
`transcribe`, 8 min for the batched pipeline at batch 16): speed only, `transcribe`'s defaults
(beam 5, the fallback ladder), so the first call meets the kernels a real file would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def audio(seconds: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * 16000)) / 16000
    tones = 0.1 * np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 0.5 * t) > 0)
    return (tones + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


def child(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    sys.path.insert(0, str(HERE.parent / "src"))
    sys.path.insert(0, str(HERE))
    import torch

    from whisperforge import BatchedInferencePipeline, WhisperModel

    times: dict[str, float] = {"import": time.perf_counter() - start}
    mark = time.perf_counter()
    if args.model:
        model = WhisperModel(args.model, "cuda")
    else:
        from batched_gpu import turbo_model

        model = turbo_model(name=args.preset)
    torch.cuda.synchronize()
    times["load"] = time.perf_counter() - mark
    clip, long = audio(30), audio(480)
    for name in ("transcribe, first", "transcribe, second"):
        mark = time.perf_counter()
        segments, _ = model.transcribe(clip, language="en")
        list(segments)
        times[name] = time.perf_counter() - mark
    pipeline = BatchedInferencePipeline(model)
    for name in ("batched, first", "batched, second"):
        mark = time.perf_counter()
        segments, _ = pipeline.transcribe(long, language="en", batch_size=16, vad_filter=False)
        list(segments)
        times[name] = time.perf_counter() - mark
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", default="large-v3-turbo", help="random weights of a preset")
    source.add_argument("--model", help="a model name or folder (real weights)")
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    source_args = ["--model", args.model] if args.model else ["--preset", args.preset]
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        for run in ("empty kernel cache", "filled kernel cache"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", *source_args],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if out.returncode:
                sys.exit(out.stderr)
            results[run] = json.loads(out.stdout.strip().splitlines()[-1])
            kernels = sum(1 for p in Path(cache).rglob("*.cubin"))
            results[run]["cached kernels"] = kernels
    columns = list(results["empty kernel cache"])
    print("| | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for run, times in results.items():
        print(f"| {run} | " + " | ".join(f"{times[c]:.2f}" if isinstance(times[c], float)
                                         else str(times[c]) for c in columns) + " |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
