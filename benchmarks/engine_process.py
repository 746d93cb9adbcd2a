"""An engine in a process of its own, for the CPU benchmarks' side-by-side timings.

CTranslate2 (faster-whisper) and PyTorch each bring their own OpenMP runtime. In one process,
once faster-whisper had run, whisperforge's passes took 28 % (float32) and 66 % (int8) longer
on a 2-core machine (benchmarks/RESULTS.md, session 34): the two runtimes' threads contend for
the cores. So each engine is built in a spawned process, which transcribes when asked and
reports its wall time and texts. The caller still takes the engines in turn, pass after pass,
so a change in the machine's load hits all of them alike.

The peers' weights are found or written by the caller (`ctranslate2_folder`, `ggml_file`,
`openai_pt`), so an engine's process imports nothing of whisperforge's but the peer itself
needs, and its memory figure is the peer's alone. Written files go to `scratch_dir`, removed when
the caller exits.
"""

from __future__ import annotations

import atexit
import functools
import gc
import multiprocessing
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

Transcribe = Callable[[np.ndarray, int], str]  # (16 kHz audio, beam size) -> text
# () -> (the engine's transcribe, figures about it such as its weights' bytes). Spawned
# processes unpickle it, so a function of a module, or a functools.partial of one.
Factory = Callable[[], tuple[Transcribe, dict]]


def scratch_dir() -> Path:
    """A folder for converted weights and exports, removed when this process exits."""
    folder = tempfile.TemporaryDirectory(prefix="whisperforge-bench-")
    atexit.register(folder.cleanup)
    return Path(folder.name)


def ctranslate2_folder() -> str:
    """The packaged tiny.en CTranslate2 folder (the weights whisperforge loads)."""
    from whisperforge.model_names import packaged_model_folders

    return str(packaged_model_folders("tiny.en")[0])


@functools.cache
def ggml_file(weights: str = "f16") -> str:
    """tiny.en as the ggml file whisper.cpp loads (`write_ggml`: f16, or q8_0 matrices)."""
    from whisperforge.checkpoints import resolve_checkpoint

    path = scratch_dir() / f"ggml-tiny.en-{weights}.bin"
    write_ggml(resolve_checkpoint("tiny.en"), path, q8_0=weights == "q8_0")
    return str(path)


@functools.cache
def openai_pt() -> str:
    """tiny.en as the openai-whisper .pt our converter writes."""
    from whisperforge.checkpoints import resolve_checkpoint, save_openai

    path = scratch_dir() / "tiny.en.pt"
    save_openai(resolve_checkpoint("tiny.en"), path)
    return str(path)


def peer_weights(engine: str) -> str | None:
    """What the engine named `engine` loads, found or written here (before its process starts):
    "faster-whisper-TYPE" the CTranslate2 folder, "whisper.cpp[-f16|-q8_0]" the ggml file,
    "openai-whisper" the .pt; whisperforge loads tiny.en by name (None)."""
    if engine.startswith("faster-whisper"):
        return ctranslate2_folder()
    if engine.startswith("whisper.cpp"):
        return ggml_file(engine.partition("-")[2] or "f16")
    if engine == "openai-whisper":
        return openai_pt()
    return None


def peer(engine: str, threads: int, weights: str) -> tuple[Transcribe, dict]:
    """The peer named `engine` ("faster-whisper-TYPE", "whisper.cpp[-f16|-q8_0]",
    "openai-whisper") as (audio, beam_size) -> text on `weights` (`peer_weights`), built in the
    process that runs it, and its figures (whisper.cpp: its file's size as `weights_MB`)."""
    if engine.startswith("faster-whisper-"):
        model = faster_whisper(engine.removeprefix("faster-whisper-"), threads, weights)
        return functools.partial(transcript, model), {}
    if engine.startswith("whisper.cpp"):
        return whisper_cpp(threads, weights)
    if engine == "openai-whisper":
        return openai_whisper(weights), {}
    raise ValueError(f"no peer named {engine!r}")


def faster_whisper(compute_type: str, threads: int, folder: str):
    """faster-whisper on a CTranslate2 folder (`ctranslate2_folder`)."""
    from faster_whisper import WhisperModel

    return WhisperModel(folder, device="cpu", compute_type=compute_type, cpu_threads=threads)


def openai_whisper(path: str) -> Transcribe:
    """openai-whisper's `transcribe` (its defaults: fallback, best of 5) on a .pt (`openai_pt`)."""
    import whisper

    reference = whisper.load_model(path, device="cpu")

    def transcribe(audio: np.ndarray, beam: int) -> str:
        options = {"beam_size": beam if beam > 1 else None, "best_of": 5}
        return whisper.transcribe(reference, audio, fp16=False, **options)["text"]

    return transcribe


def whisper_cpp(threads: int, path: str) -> tuple[Transcribe, dict]:
    """whisper.cpp (the `pywhispercpp` wheel) on a ggml file (`ggml_file`). Decoding as
    openai-whisper's defaults: the temperature fallback with best of 5, the non-speech tokens
    suppressed. With the ggml file's size as its weights' bytes."""
    from pywhispercpp.model import Model

    loaded: dict[int, Model] = {}  # whisper.cpp fixes greedy or beam search per context

    def model(beam_size: int) -> Model:
        if beam_size not in loaded:
            loaded.clear()  # one context at a time: the other one is freed before this loads
            loaded[beam_size] = Model(
                path, params_sampling_strategy=int(beam_size > 1), n_threads=threads,
                beam_search={"beam_size": beam_size, "patience": -1.0}, suppress_nst=True,
                print_progress=False, print_realtime=False, redirect_whispercpp_logs_to=None,
            )  # fmt: skip
        return loaded[beam_size]

    def transcribe(audio: np.ndarray, beam_size: int) -> str:
        return " ".join(
            s.text for s in model(beam_size).transcribe(audio.astype(np.float32, copy=False))
        )

    model(1)  # loaded here, so that its memory counts as the engine's
    return transcribe, {"weights_MB": Path(path).stat().st_size / 1e6}


GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8  # ggml's tensor types
GGML_FILE_Q8_0 = 2 * 1000 + 7  # the file's type: quantization version 2, mostly q8_0


def write_ggml(checkpoint, path: Path, q8_0: bool = False) -> None:
    """The checkpoint in whisper.cpp's ggml file format: the dimensions, the mel filterbank, the
    text vocabulary's bytes (openai-whisper's tiktoken file), then each weight under its
    openai-whisper name, shape innermost first. As whisper.cpp's converter writes them: the
    matrices and the convolutions in float16, the rest in float32; `q8_0` (as its quantizer):
    the matrices in blocks of 32 int8 with a float16 scale each."""
    import base64
    import struct

    import whisper

    from whisperforge.audio import mel_filters_numpy

    c = checkpoint.config
    vocab = "multilingual" if c.n_vocab >= 51865 else "gpt2"
    lines = (Path(whisper.__file__).parent / "assets" / f"{vocab}.tiktoken").read_text().split()
    tokens = [base64.b64decode(token) for token in lines[::2]]  # "<base64> <rank>", by rank
    filters = mel_filters_numpy(c.n_mels).astype(np.float32)
    dims = (c.n_vocab, c.n_audio_ctx, c.n_audio_state, c.n_audio_head, c.n_audio_layer,
            c.n_text_ctx, c.n_text_state, c.n_text_head, c.n_text_layer, c.n_mels,
            GGML_FILE_Q8_0 if q8_0 else GGML_F16)  # fmt: skip
    with path.open("wb") as f:
        f.write(struct.pack("<I", 0x67676D6C) + struct.pack(f"<{len(dims)}i", *dims))
        f.write(struct.pack("<2i", *filters.shape) + filters.tobytes())
        f.write(struct.pack("<i", len(tokens)))
        for token in tokens:
            f.write(struct.pack("<i", len(token)) + token)
        for name, tensor in checkpoint.state_dict.items():
            data = tensor.detach().float().numpy()
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(-1, 1)
            kind = GGML_F32
            if data.ndim >= 2 and "positional_embedding" not in name and data.shape[1] > 1:
                kind = GGML_Q8_0 if q8_0 and data.ndim == 2 else GGML_F16
            encoded = name.encode()
            f.write(struct.pack("<3i", data.ndim, len(encoded), kind))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)) + encoded)
            f.write(_q8_0(data) if kind == GGML_Q8_0 else data.astype(_NUMPY[kind]).tobytes())


_NUMPY = {GGML_F32: np.float32, GGML_F16: np.float16}


def _q8_0(matrix: np.ndarray) -> bytes:
    """ggml's q8_0 blocks of a matrix's rows: 32 weights as int8 and their absmax / 127 as a
    float16 scale."""
    blocks = matrix.astype(np.float32).reshape(-1, 32)
    scale = np.abs(blocks).max(axis=1) / 127
    q = np.round(blocks / np.where(scale == 0, 1, scale)[:, None]).astype(np.int8)
    packed = np.empty(len(blocks), dtype=[("scale", "<f2"), ("q", "i1", 32)])
    packed["scale"], packed["q"] = scale, q
    return packed.tobytes()


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
