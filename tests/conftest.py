"""Shared fixtures: the dev audio set and the real models, loaded once per session."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import wave
from pathlib import Path

# Under pytest-xdist the cores are shared out among the workers: one thread each, set before
# torch and numpy are imported (here, and in the fresh Pythons that tests start), or each
# worker's OpenMP and OpenBLAS threads would spin on the cores the others are using.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(threads, "1")

import numpy as np
import pytest

# The dev set and its scoring are the benchmarks' (benchmarks/devset.py), so that a test and a
# benchmark read the manifest and count word errors alike.
sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # after the packages
import devset
from devset import DEV_DIR, manifest, plain_wer, plain_words  # noqa: F401
from devset import wer as english_wer  # noqa: F401

JFK = DEV_DIR / "openai-whisper__jfk.flac"
LONG_FILE = DEV_DIR / devset.LONG_FILE  # 19 minutes


def run_script(script: str, timeout: float = 300, **env: str) -> None:
    """Run a script that prints "ok" in a fresh Python, with `env` added to the environment."""
    run = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def run_interpreted(script: str, timeout: float = 300) -> None:
    """Run a script that prints "ok" under Triton's CPU interpreter (the kernels are CUDA's);
    skips where Triton is not installed (CI)."""
    pytest.importorskip("triton")
    run_script(script, timeout, TRITON_INTERPRET="1")


def short_english_clips() -> list[dict]:
    """The English dev clips of at most 30 s (one window), less seven in eight of LJSpeech's 32:
    one reader reading one book, while the other 21 are each of their own kind (25 clips). The
    suite's time goes to variety; `benchmarks/gpu.py --check` decodes all 53."""
    short = [r for r in manifest() if r["language"] == "en" and r["duration_s"] <= 30]
    ljspeech = [r for r in short if r["audio"].startswith("coqui-tts-ljspeech__")]
    return [r for r in short if r not in ljspeech or ljspeech.index(r) % 8 == 0]


def pcm_wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    """16-bit PCM WAV of float samples: [n] mono, or [n, channels] interleaved."""
    frames = samples if samples.ndim == 2 else samples[:, None]
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(frames.shape[1])
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.clip(np.round(frames * 32768), -32768, 32767).astype("<i2").tobytes())
    return out.getvalue()


def hub_cache_of_tiny_en(cache: Path, repo_id: str, ref: str = "main") -> Path:
    """A Hugging Face hub cache at `cache` holding tiny.en's CTranslate2 files as `repo_id` at
    `ref` (links to the installed package's), as a download would leave it; its snapshot."""
    from whisperforge.model_names import packaged_model_folders

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef" * 2 + "01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / ref).write_text(commit)
    for path in packaged_model_folders("tiny.en")[0].iterdir():
        if path.suffix in (".json", ".bin", ".txt"):
            (snapshot / path.name).symlink_to(path)
    return snapshot


@pytest.fixture(scope="session")
def tiny_en_checkpoint():
    """tiny.en's weights as loaded (a `WhisperModel` keeps only its description)."""
    from whisperforge.checkpoints import resolve_checkpoint

    return resolve_checkpoint("tiny.en")


@pytest.fixture(scope="session")
def tiny_en(tiny_en_checkpoint):
    from whisperforge import WhisperModel

    return WhisperModel(tiny_en_checkpoint, device="cpu", compute_type="float32")


@pytest.fixture(scope="session")
def tiny_en_greedy(tiny_en, tmp_path_factory) -> dict[str, list]:
    """tiny.en's greedy segments (PyTorch, fp32) of every short English clip, by file name:
    decoded once for the tests that compare other paths with them. Under pytest-xdist the
    first worker to need them decodes them and the others read its file (half a minute of a
    core each): the run's base temporary folder is shared by its workers."""
    from filelock import FileLock

    from whisperforge import load_audio

    def decode() -> dict[str, list]:
        return {
            clip["audio"]: list(
                tiny_en.transcribe(
                    load_audio(DEV_DIR / clip["audio"]), beam_size=1, temperature=0.0
                )[0]
            )
            for clip in short_english_clips()
        }

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return decode()
    shared = tmp_path_factory.getbasetemp().parent / "tiny_en_greedy.pickle"
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            shared.write_bytes(pickle.dumps(decode()))
        return pickle.loads(shared.read_bytes())


@pytest.fixture(scope="session")
def base_checkpoint():
    from whisperforge.checkpoints import resolve_checkpoint

    return resolve_checkpoint("base")


@pytest.fixture(scope="session")
def base(base_checkpoint):
    from whisperforge import WhisperModel

    return WhisperModel(base_checkpoint, device="cpu", compute_type="float32")
