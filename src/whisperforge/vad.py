"""Voice activity: Silero VAD on onnxruntime, speech regions, and packing them into windows.

The ONNX model ships inside the `silero-vad` wheel, so nothing is downloaded. Region finding
follows Silero's `get_speech_timestamps` (hysteresis between `threshold` and a lower
`neg_threshold`, minimum silence to close a region, padding, long regions cut at their
longest inner pause); packing follows WhisperX: neighbouring regions are merged while the
merged span stays within one 30 s window, and every window remembers where its audio sits in
the original timeline.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .audio import CHUNK_LENGTH, SAMPLE_RATE
from .errors import ModelNotFoundError

FRAME = 512  # samples per VAD decision at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous frame the model sees


@dataclass(frozen=True)
class VadOptions:
    threshold: float = 0.5
    neg_threshold: float | None = None  # default: threshold - 0.15
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


@dataclass(frozen=True)
class SpeechRegion:
    start: int  # samples
    end: int


class SileroVad:
    """Silero VAD v5/v6 (the ONNX file from the `silero-vad` package), one stream at a time."""

    def __init__(self, path: Path | None = None):
        import onnxruntime

        path = path or silero_onnx_path()
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = min(4, os.cpu_count() or 1)
        self.session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def speech_probs(
        self, audio: np.ndarray, stream_frames: int = 1875, warmup_frames: int = 64
    ) -> np.ndarray:
        """Probability of speech for each 32 ms frame of 16 kHz audio.

        The model is recurrent, so frames go one by one; to make that fast, the audio is cut
        into 60 s streams run side by side as one batch. Each stream first runs over the 2 s
        before its start (outputs dropped) so its state is warm where its outputs count.
        """
        n_frames = -(-len(audio) // FRAME)
        padded = np.zeros(CONTEXT + n_frames * FRAME, dtype=np.float32)
        padded[CONTEXT : CONTEXT + len(audio)] = audio
        # Every frame with the 64 samples before it: [n_frames, CONTEXT + FRAME].
        starts = np.arange(n_frames) * FRAME
        frames = padded[starts[:, None] + np.arange(CONTEXT + FRAME)]

        n_streams = -(-n_frames // stream_frames)
        steps = warmup_frames + stream_frames
        batch = np.zeros((n_streams, steps, CONTEXT + FRAME), dtype=np.float32)
        for k in range(n_streams):
            first = k * stream_frames - warmup_frames
            lo, hi = max(first, 0), min(first + steps, n_frames)
            batch[k, lo - first : hi - first] = frames[lo:hi]
        state = np.zeros((2, n_streams, 128), dtype=np.float32)
        rate = np.array(SAMPLE_RATE, dtype=np.int64)
        out = np.empty((n_streams, steps), dtype=np.float32)
        for t in range(steps):
            probs, state = self.session.run(
                None, {"input": batch[:, t], "state": state, "sr": rate}
            )
            out[:, t] = probs[:, 0]
        return out[:, warmup_frames:].reshape(-1)[:n_frames]


def silero_onnx_path() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "voice activity detection needs `pip install silero-vad onnxruntime`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


@lru_cache(maxsize=1)
def default_vad() -> SileroVad:
    return SileroVad()


def speech_regions(
    probs: np.ndarray, n_samples: int, options: VadOptions = VadOptions()
) -> list[SpeechRegion]:
    """Speech regions in samples from per-frame speech probabilities."""
    neg_threshold = options.neg_threshold
    if neg_threshold is None:
        neg_threshold = max(options.threshold - 0.15, 0.01)
    min_speech = SAMPLE_RATE * options.min_speech_duration_ms / 1000
    pad = int(SAMPLE_RATE * options.speech_pad_ms / 1000)
    max_speech = SAMPLE_RATE * options.max_speech_duration_s - FRAME - 2 * pad
    min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
    min_silence_at_max_speech = SAMPLE_RATE * 98 / 1000

    regions: list[list[int]] = []
    start: int | None = None
    temp_end = prev_end = next_start = 0
    for i, prob in enumerate(probs):
        sample = FRAME * i
        if prob >= options.threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = sample
        if prob >= options.threshold and start is None:
            start = sample
            continue
        if start is not None and sample - start > max_speech:
            # Too long: cut at the last pause long enough, else right here.
            if prev_end:
                regions.append([start, prev_end])
                start = next_start if next_start >= prev_end else None
            else:
                regions.append([start, sample])
                start = None
            prev_end = next_start = temp_end = 0
            continue
        if prob < neg_threshold and start is not None:
            if not temp_end:
                temp_end = sample
            if sample - temp_end > min_silence_at_max_speech:
                prev_end = temp_end
            if sample - temp_end < min_silence:
                continue
            if temp_end - start > min_speech:
                regions.append([start, temp_end])
            start = None
            prev_end = next_start = temp_end = 0
    if start is not None and n_samples - start > min_speech:
        regions.append([start, n_samples])

    # Pad each region, splitting short gaps between neighbours evenly.
    for i, region in enumerate(regions):
        if i == 0:
            region[0] = max(0, region[0] - pad)
        if i + 1 < len(regions):
            gap = regions[i + 1][0] - region[1]
            if gap < 2 * pad:
                region[1] += gap // 2
                regions[i + 1][0] = max(0, regions[i + 1][0] - gap // 2)
            else:
                region[1] = min(n_samples, region[1] + pad)
                regions[i + 1][0] = max(0, regions[i + 1][0] - pad)
        else:
            region[1] = min(n_samples, region[1] + pad)
    return [SpeechRegion(start, end) for start, end in regions if end > start]


def detect_speech(audio: np.ndarray, options: VadOptions = VadOptions()) -> list[SpeechRegion]:
    return speech_regions(default_vad().speech_probs(audio), len(audio), options)


@dataclass(frozen=True)
class Window:
    """Up to 30 s of audio cut from the original: samples [start, end), speech inside."""

    start: int
    end: int
    regions: tuple[SpeechRegion, ...]

    @property
    def offset(self) -> float:
        return self.start / SAMPLE_RATE


def pack_windows(regions: list[SpeechRegion], max_seconds: float = CHUNK_LENGTH) -> list[Window]:
    """Merge neighbouring regions while the merged span fits one window (WhisperX's merge);
    a region longer than a window is cut into window-sized pieces."""
    limit = int(max_seconds * SAMPLE_RATE)
    pieces = [
        SpeechRegion(s, min(s + limit, r.end))
        for r in regions
        for s in range(r.start, r.end, limit)
    ]
    windows: list[Window] = []
    current: list[SpeechRegion] = []
    for piece in pieces:
        if current and piece.end - current[0].start > limit:
            windows.append(Window(current[0].start, current[-1].end, tuple(current)))
            current = []
        current.append(piece)
    if current:
        windows.append(Window(current[0].start, current[-1].end, tuple(current)))
    return windows


class TimelineMap:
    """Maps times in the concatenation of speech regions back to the original audio."""

    def __init__(self, regions: list[SpeechRegion]):
        self.regions = regions
        lengths = np.array([r.end - r.start for r in regions], dtype=np.int64)
        self.concat_starts = (
            np.concatenate([[0], np.cumsum(lengths)[:-1]]) if regions else np.zeros(0)
        )

    def original_time(self, seconds: float, is_end: bool = False) -> float:
        if not self.regions:
            return seconds
        sample = seconds * SAMPLE_RATE
        # An end exactly on a boundary belongs to the region before it.
        side = "left" if is_end else "right"
        index = max(0, int(np.searchsorted(self.concat_starts, sample, side=side)) - 1)
        return (self.regions[index].start + sample - self.concat_starts[index]) / SAMPLE_RATE


def collect_speech(audio: np.ndarray, regions: list[SpeechRegion]) -> np.ndarray:
    return np.concatenate([audio[r.start : r.end] for r in regions]) if regions else audio[:0]
