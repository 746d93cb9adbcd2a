"""A model's host memory as it loads and transcribes, each case in a fresh process (one thread).

    python benchmarks/load_memory.py base:float32 base:int8 /path/to/base-int8:default

For each MODEL:COMPUTE_TYPE: the process's RSS before loading, after loading, after transcribing
JFK once, and its peak (ru_maxrss), in MB. Quantized folders come from `whisperforge quantize`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource

from devset import DEV_DIR
from engine_process import rss_mb


def measure(model: str, compute_type: str) -> dict[str, float]:
    from whisperforge import WhisperModel, load_audio

    audio = load_audio(DEV_DIR / "openai-whisper__jfk.flac")
    figures = {"before": rss_mb()}
    loaded = WhisperModel(model, device="cpu", compute_type=compute_type, cpu_threads=1)
    figures["loaded"] = rss_mb()
    list(loaded.transcribe(audio, beam_size=1)[0])
    figures["transcribed"] = rss_mb()
    figures["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {name: round(mb) for name, mb in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", metavar="MODEL:COMPUTE_TYPE")
    args = parser.parse_args()
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        for case in args.cases:
            model, _, compute_type = case.rpartition(":")
            print(case, json.dumps(pool.apply(measure, (model, compute_type))), flush=True)


if __name__ == "__main__":
    main()
