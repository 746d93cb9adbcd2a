"""An engine in a process of its own, for the CPU benchmarks' side-by-side timings.

CTranslate2 (faster-whisper) and PyTorch each bring their own OpenMP runtime. In one process,
once faster-whisper had run, whisperforge's passes took 28 % (float32) and 66 % (int8) longer
on a 2-core machine (benchmarks/RESULTS.md, session 34): the two runtimes' threads contend for
the cores. So each engine is built in a spawned process, which transcribes when asked and
reports its wall time and texts. The caller still takes the engines in turn, pass after pass,
so a change in the machine's load hits all of them alike.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

Transcribe = Callable[[np.ndarray, int], str]  # (16 kHz audio, beam size) -> text
# () -> (the engine's transcribe, figures about it such as its weights' bytes). Spawned
# processes unpickle it, so a function of a module, or a functools.partial of one.
Factory = Callable[[], tuple[Transcribe, dict]]


def faster_whisper(compute_type: str, threads: int):
    """faster-whisper on the packaged tiny.en CTranslate2 folder (the weights whisperforge loads)."""
    from faster_whisper import WhisperModel

    from whisperforge.checkpoints import packaged_model_folders

    folder = str(packaged_model_folders("tiny.en")[0])
    return WhisperModel(folder, device="cpu", compute_type=compute_type, cpu_threads=threads)


def transcript(model, audio: np.ndarray, beam_size: int) -> str:
    """The text of `model` (whisperforge's or faster-whisper's: they share an API)."""
    return "".join(s.text for s in model.transcribe(audio, beam_size=beam_size)[0])


def rss_mb() -> float:
    """This process's resident memory, in MB."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class EngineProcess:
    """`factory`'s engine, built in a process of its own with `threads` threads. `info`: the
    factory's figures, and `rss_growth_MB` while the engine loaded there."""

    def __init__(self, factory: Factory, audios: list[np.ndarray], threads: int):
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(factory, audios, threads, child), daemon=True
        )
        self._process.start()
        self.info: dict = self._receive()

    def transcribe(self, beam_size: int, first: int | None = None) -> tuple[float, list[str]]:
        """Wall seconds to transcribe the audios (the first `first` of them), and the texts."""
        self._conn.send((beam_size, first))
        return self._receive()

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(timeout=30)

    def _receive(self):
        reply = self._conn.recv()
        if isinstance(reply, Exception):
            self._process.join(timeout=30)
            raise RuntimeError("the engine's process failed") from reply  # noqa: TRY004
        return reply


def _serve(factory: Factory, audios: list[np.ndarray], threads: int, conn) -> None:
    try:
        torch.set_num_threads(threads)
        before = rss_mb()
        transcribe, info = factory()
        conn.send({**info, "rss_growth_MB": rss_mb() - before})
        while (request := conn.recv()) is not None:
            beam_size, first = request
            start = time.perf_counter()
            texts = [transcribe(audio, beam_size) for audio in audios[:first]]
            conn.send((time.perf_counter() - start, texts))
    except Exception as error:  # noqa: BLE001 -- handed to the caller, which raises it
        conn.send(error)
