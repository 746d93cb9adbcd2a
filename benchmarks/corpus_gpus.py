"""The corpus job (`whisperforge batch`) on 1 GPU and then on 2: throughput and their ratio
(issue 8, item 2; the goal is 2 GPUs >= 1.8x one).

The corpus: `--minutes` of audio (default 60) made by repeating a 16 kHz int16 .npy recording,
cut into 3-minute .npy files (read with numpy: no FFmpeg needed). The model: large-v3-turbo's
architecture with random fp16 weights and 100 forced tokens per window (batched_gpu.py's
`turbo_model` and `forced_options`).

Two modes (`--mode auto` picks ray where Ray is installed, processes otherwise):
- processes: one worker process per GPU (CUDA_VISIBLE_DEVICES set per worker), the file list
  split evenly between them; each runs the job's one-process path (`transcribe_corpus`:
  decode-ahead threads, `transcribe_many`, the JSONL journal) on its files into its own JSONL.
  Workers build the model and warm up first; the clock runs from a shared start (a barrier) to
  the last worker's end. This is what Ray's actor pool does, without Ray's scheduling.
- ray: the job's Ray path on a local Ray started with N GPUs (one model actor per GPU). The
  wall time includes the actors' start-up (model build, CUDA graphs); "steady" is the audio of
  the rows after the first over the time from the first row to the last.

    python benchmarks/corpus_gpus.py --audio .device/longform.npy --gpus 1 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
SRC_DIR = BENCH_DIR.parent / "src"
sys.path[:0] = [str(BENCH_DIR), str(SRC_DIR)]  # batched_gpu's turbo model; whisperforge
SR = 16000
FILE_S = 180


def make_corpus(audio_path: str, minutes: float, folder: Path) -> list[str]:
    """`minutes` of the recording, repeated, as 3-minute int16 .npy files."""
    audio = np.load(audio_path)
    total = int(minutes * 60 * SR)
    long = np.resize(audio.astype(np.int16), total)
    files = []
    for i, start in enumerate(range(0, total, FILE_S * SR)):
        path = folder / f"part{i:04d}.npy"
        np.save(path, long[start : start + FILE_S * SR])
        files.append(str(path))
    return files


def turbo_eot() -> int:
    """The end-of-text id of turbo's vocabulary, without building the model."""
    from whisperforge.checkpoints import Checkpoint
    from whisperforge.presets import preset
    from whisperforge.transcribe import build_tokenizer

    return build_tokenizer(Checkpoint(preset("large-v3-turbo"), {}, None, None, "")).eot


# --- processes ---------------------------------------------------------------------------------


def worker(rank: int, files: list[str], out: str, args: argparse.Namespace, barrier, results):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # before anything touches CUDA
    from batched_gpu import forced_options, turbo_model

    from whisperforge.corpus import transcribe_corpus

    model = turbo_model()
    options = forced_options(model.tokenizer.eot)
    batch = args.batch or None
    warm = files[: args.warmup_files]
    transcribe_corpus(warm, f"{out}/warmup-{rank}.jsonl", model, batch_size=batch, **options)
    for run in range(args.runs):
        barrier.wait()
        start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        summary = transcribe_corpus(
            files, f"{out}/run{run}-part{rank}.jsonl", model, batch_size=batch, **options
        )
        end = time.perf_counter()
        results.put((run, start, end, summary.ok, summary.failed, summary.audio_s))


def processes(n: int, files: list[str], out: str, args: argparse.Namespace) -> list[dict]:
    spawn = mp.get_context("spawn")  # a fresh CUDA context per worker
    barrier, results = spawn.Barrier(n), spawn.Queue()
    workers = [
        spawn.Process(target=worker, args=(rank, files[rank::n], out, args, barrier, results))
        for rank in range(n)
    ]
    for w in workers:
        w.start()
    got = []
    while len(got) < n * args.runs:
        try:
            got.append(results.get(timeout=5))
        except queue.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if dead:
                sys.exit(f"a worker died (exit codes {dead}); see its traceback above")
    for w in workers:
        w.join()
    runs = []
    for run in range(args.runs):
        parts = [g for g in got if g[0] == run]
        wall = max(p[2] for p in parts) - min(p[1] for p in parts)
        ok, failed, audio = (sum(p[i] for p in parts) for i in (3, 4, 5))
        runs.append({"wall": wall, "steady": wall, "ok": ok, "failed": failed, "audio": audio})
    return runs


# --- Ray ---------------------------------------------------------------------------------------


def turbo_on_ray_actor():
    """The model factory each Ray actor calls (a module-level function: it pickles)."""
    from batched_gpu import turbo_model

    return turbo_model()


def on_ray(n: int, files: list[str], out: str, args: argparse.Namespace) -> list[dict]:
    import ray
    from batched_gpu import forced_options

    from whisperforge.corpus import transcribe_corpus

    path = os.pathsep.join([str(BENCH_DIR), str(SRC_DIR), os.environ.get("PYTHONPATH", "")])
    ray.init(num_gpus=n, runtime_env={"env_vars": {"PYTHONPATH": path}})
    options = forced_options(turbo_eot())
    runs = []
    try:
        for run in range(args.runs):
            arrivals: list[tuple[float, float]] = []
            start = time.perf_counter()
            summary = transcribe_corpus(
                files, f"{out}/run{run}.jsonl", turbo_on_ray_actor, batch_size=args.batch or None,
                ray_address="local", files_per_task=args.files_per_task,
                on_row=lambda row, seen=arrivals: seen.append(
                    (time.perf_counter(), row["duration"] or 0)
                ),
                **options,
            )  # fmt: skip
            wall = time.perf_counter() - start
            first = arrivals[0][0]
            steady_audio = sum(a for _, a in arrivals[1:])
            steady = (arrivals[-1][0] - first) * summary.audio_s / max(steady_audio, 1e-9)
            runs.append({"wall": wall, "steady": steady, "ok": summary.ok,
                         "failed": summary.failed, "audio": summary.audio_s})  # fmt: skip
    finally:
        ray.shutdown()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--audio", required=True, help="16 kHz int16 .npy recording")
    parser.add_argument("--minutes", type=float, default=60, help="corpus length (default 60)")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts to run")
    parser.add_argument("--batch", type=int, default=16, help="windows per batch; 0: auto")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per GPU count")
    parser.add_argument("--warmup-files", type=int, default=4, help="processes mode")
    parser.add_argument("--files-per-task", type=int, default=4, help="ray mode")
    parser.add_argument("--mode", choices=["auto", "processes", "ray"], default="auto")
    parser.add_argument("--workdir", default=None, help="for the corpus and outputs (temp)")
    args = parser.parse_args()

    mode = args.mode
    if mode == "auto":
        try:
            import ray  # noqa: F401
        except ImportError:
            mode = "processes"
        else:
            mode = "ray"
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="corpus_gpus-"))
    (workdir / "corpus").mkdir(parents=True, exist_ok=True)
    files = make_corpus(args.audio, args.minutes, workdir / "corpus")
    import torch

    print(f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}, torch {torch.__version__}")
    if mode == "processes":
        print(
            "MODE: process-per-GPU (not Ray): one worker process per GPU, CUDA_VISIBLE_DEVICES "
            "per worker, the files split evenly; each worker runs transcribe_corpus (one-process "
            "path); wall = shared start after warm-up -> last worker done"
        )
    else:
        print("MODE: Ray Data, one model actor per GPU; wall includes actor start-up")
    print(f"corpus: {args.minutes:.0f} min in {len(files)} files of {FILE_S} s (.npy); "
          "large-v3-turbo random fp16, 100 forced tokens per window, "
          f"batch {args.batch or 'auto'}")  # fmt: skip
    print("| GPUs | median wall s | median steady s | RTFx (wall) | RTFx (steady) | ok/failed |")
    print("|---|---|---|---|---|---|", flush=True)
    rtfx = {}
    for n in args.gpus:
        out = workdir / f"out-{n}gpu-{time.time_ns()}"
        out.mkdir()
        runs = (processes if mode == "processes" else on_ray)(n, files, str(out), args)
        wall = statistics.median(r["wall"] for r in runs)
        steady = statistics.median(r["steady"] for r in runs)
        audio = runs[0]["audio"]
        rtfx[n] = audio / steady
        counts = "; ".join(f"{r['ok']}/{r['failed']}" for r in runs)
        print(f"| {n} | {wall:.2f} | {steady:.2f} | {audio / wall:.0f} | {audio / steady:.0f} | "
              f"{counts} |", flush=True)  # fmt: skip
        if any(r["ok"] != len(files) for r in runs):
            print(f"  WARNING: expected {len(files)} ok rows per run")
    if 1 in rtfx and len(rtfx) > 1:
        for n in sorted(rtfx):
            if n > 1:
                label = "process-per-GPU" if mode == "processes" else "Ray"
                print(f"{n} GPUs vs 1 ({label}): {rtfx[n] / rtfx[1]:.2f}x (goal >= 1.8x for 2)")


if __name__ == "__main__":
    main()
