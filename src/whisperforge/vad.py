"""Voice activity: Silero VAD in PyTorch, speech regions, and packing them into windows.

The model ships inside the `silero-vad` wheel, so nothing is downloaded. Region finding
follows Silero's `get_speech_timestamps` (hysteresis between `threshold` and a lower
`neg_threshold`, minimum silence to close a region, padding, long regions cut at their
longest inner pause); packing follows WhisperX: neighbouring regions are merged while the
merged span stays within one 30 s window, and every window remembers where its audio sits in
the original timeline.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .audio import CHUNK_LENGTH, SAMPLE_RATE
from .errors import InvalidOptionError, ModelNotFoundError, check_probability, is_number

FRAME = 512  # samples per VAD decision at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous frame the model sees
STFT_PAD = 64  # Silero reflect-pads each frame's right end before its STFT


@dataclass(frozen=True)
class VadOptions:
    threshold: float = 0.5
    neg_threshold: float | None = None  # default: threshold - 0.15
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400

    def __post_init__(self) -> None:
        # Checked here, so dicts and faster-whisper's VadOptions (both made into these) are too:
        # a string failed deep in the region search with a bare TypeError, and a threshold past
        # 1 or NaN silently found no speech at all (an empty transcript, no error).
        check_probability("vad threshold", self.threshold)
        if self.neg_threshold is not None:
            check_probability("vad neg_threshold (or None: threshold - 0.15)", self.neg_threshold)
            if self.neg_threshold > self.threshold:  # speech would end above where it starts
                raise InvalidOptionError(
                    f"vad neg_threshold ({self.neg_threshold:g}) must not be above threshold "
                    f"({self.threshold:g}): speech starts above threshold and ends below "
                    "neg_threshold"
                )
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            value = getattr(self, name)
            if not is_number(value) or not 0 <= value < math.inf:
                raise InvalidOptionError(
                    f"vad {name} must be a number of ms, 0 or more, not {value!r}"
                )
        value = self.max_speech_duration_s
        if not is_number(value) or not value > 0:
            raise InvalidOptionError(
                f"vad max_speech_duration_s must be a number of seconds above 0 (inf: no limit), "
                f"not {value!r}"
            )


# vad_parameters without vad_filter: said, not silently ignored (the CLI refuses them).
VAD_PARAMETERS_UNUSED = "vad_parameters are ignored: no VAD runs without vad_filter=True"


def vad_options_of(
    parameters: VadOptions | Mapping | None, default: VadOptions | None = None
) -> VadOptions:
    """`vad_parameters` as faster-whisper takes them: VadOptions, or a dict of the fields to
    change in `default` (VadOptions' own defaults where None), or None for `default`."""
    default = default or VadOptions()
    if isinstance(parameters, VadOptions):
        return parameters
    if is_dataclass(parameters) and not isinstance(parameters, type):
        # faster-whisper's own VadOptions, from code that still imports it: the same fields
        parameters = asdict(parameters)
    if parameters is not None and not isinstance(parameters, Mapping):
        raise InvalidOptionError(
            f"vad_parameters must be a VadOptions or a dict of its fields, not "
            f"{type(parameters).__name__}"
        )
    unknown = set(parameters or {}) - {f.name for f in fields(VadOptions)}
    if unknown:
        raise InvalidOptionError(
            f"unknown vad_parameters {sorted(unknown)}; VadOptions has "
            f"{', '.join(f.name for f in fields(VadOptions))}"
        )
    return replace(default, **(parameters or {}))


@dataclass(frozen=True)
class SpeechRegion:
    start: int  # samples
    end: int


class SileroVad:
    """Silero VAD (the TorchScript model of the `silero-vad` package) re-run in plain PyTorch.

    Silero is a small convolutional front end per 32 ms frame (an STFT as a convolution and four
    conv layers) followed by an LSTM across frames. Run frame by frame, as the package does,
    that is one call per 32 ms; here the front end runs over all frames at once and the LSTM as
    one sequence call, so a file costs a handful of large operations (an hour of audio: about a
    second of one CPU core, 15 ms of an H100) and the probabilities equal the frame-by-frame
    ones (on a GPU to 1e-2, as cuDNN's LSTM rounds differently).
    """

    FRONT_END_FRAMES = 4096  # frames per front-end pass (~2 min of audio) bounds its memory

    def __init__(self, path: Path | None = None, device: str = "cpu"):
        self.device = torch.device(device)
        with warnings.catch_warnings():  # TorchScript loading is deprecated; the weights are not
            warnings.simplefilter("ignore", DeprecationWarning)
            scripted = torch.jit.load(str(path or silero_model_path()), map_location="cpu")
        weights = {k: t.detach().to(self.device) for k, t in scripted._model.state_dict().items()}
        self.stft = weights["stft.forward_basis_buffer"]  # [258, 1, 256]
        self.convs = [
            (weights[f"encoder.{i}.reparam_conv.weight"], weights[f"encoder.{i}.reparam_conv.bias"],
             stride)
            for i, stride in enumerate((1, 2, 2, 1))
        ]  # fmt: skip
        self.lstm = nn.LSTM(128, 128, batch_first=True, device=self.device)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(self.lstm, f"{name}_l0").data.copy_(weights[f"decoder.rnn.{name}"])
        self.head = weights["decoder.decoder.2.weight"], weights["decoder.decoder.2.bias"]

    def speech_probs(self, audio: np.ndarray) -> np.ndarray:
        """Probability of speech for each 32 ms frame of 16 kHz audio."""
        return self.speech_probs_many([audio])[0]

    @torch.inference_mode()
    def speech_probs_many(self, audios: Sequence[np.ndarray]) -> list[np.ndarray]:
        """`speech_probs` of several files, their LSTMs run as one batch (the shorter padded at
        the end, which a causal LSTM never reads back). The LSTM's steps are sequential, so on
        a GPU it is latency-bound (9 ms for a 3-minute file on an H100, more than the rest of
        the file's VAD): a batch of files costs what the longest one does alone."""
        features = [self._features(audio) for audio in audios]
        lengths = [f.shape[0] for f in features]
        if max(lengths, default=0) == 0:
            return [np.zeros(0, dtype=np.float32) for _ in audios]
        hidden, _ = self.lstm(nn.utils.rnn.pad_sequence(features, batch_first=True))
        probs = self._probs(hidden)
        return [p[:n] for p, n in zip(probs, lengths)]

    def _probs(self, hidden: Tensor) -> np.ndarray:
        """[files, frames, 128] LSTM outputs -> [files, frames] speech probabilities."""
        weight, bias = self.head
        logits = F.relu(hidden) @ weight[:, :, 0].T + bias  # [files, frames, 1]
        return torch.sigmoid(logits)[..., 0].cpu().numpy()

    def _features(self, audio: np.ndarray) -> Tensor:
        """[n_frames, 128] front-end features of 16 kHz audio."""
        n_frames = -(-len(audio) // FRAME)
        if n_frames == 0:
            return torch.zeros(0, 128, device=self.device)
        # Padded in NumPy: a read-only `audio` (np.frombuffer's) is copied without torch's
        # UserWarning about non-writable arrays.
        samples = np.zeros(CONTEXT + n_frames * FRAME, np.float32)
        samples[CONTEXT : CONTEXT + len(audio)] = audio
        padded = torch.from_numpy(samples).to(self.device)
        # Every frame with the 64 samples before it: [n_frames, CONTEXT + FRAME], a view.
        frames = padded.unfold(0, CONTEXT + FRAME, FRAME)
        return torch.cat(
            [self._front_end(frames[i : i + self.FRONT_END_FRAMES])
             for i in range(0, n_frames, self.FRONT_END_FRAMES)]
        )  # fmt: skip

    def _front_end(self, frames: Tensor) -> Tensor:
        """[n, 576] samples -> [n, 128] features, as Silero's STFT magnitude and encoder."""
        x = F.pad(frames[:, None], (0, STFT_PAD), mode="reflect")
        spectrum = F.conv1d(x, self.stft, stride=128)  # [n, 258, 4]: real and imaginary halves
        half = spectrum.shape[1] // 2
        x = (spectrum[:, :half] ** 2 + spectrum[:, half:] ** 2).sqrt()
        for weight, bias, stride in self.convs:
            x = F.relu(F.conv1d(x, weight, bias, stride=stride, padding=1))
        return x[:, :, 0]  # one time step remains after the two stride-2 layers


class StreamingVad:
    """`SileroVad.speech_probs` of audio that arrives in pieces (a live stream's): each whole
    frame's probability once, as it completes, with the LSTM's state and the frame's context
    carried from piece to piece, so the pieces give the probabilities of the audio as one.
    A piece costs one front-end pass and one LSTM call over its frames (not the whole stream's
    again, as `speech_probs` of all the audio so far would)."""

    def __init__(self, vad: SileroVad):
        self.vad = vad
        self._rest = np.zeros(0, np.float32)  # the samples of a frame not yet whole
        self._context = np.zeros(CONTEXT, np.float32)  # the last samples of the frame before
        self._state: tuple[Tensor, Tensor] | None = None  # the LSTM's (h, c)

    @torch.inference_mode()
    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """The probabilities of the frames that `audio` (16 kHz float32) completes."""
        audio = np.concatenate([self._rest, audio.astype(np.float32, copy=False)])
        whole = len(audio) // FRAME * FRAME
        self._rest = audio[whole:]
        if not whole:
            return np.zeros(0, np.float32)
        samples = np.concatenate([self._context, audio[:whole]])
        self._context = samples[-CONTEXT:]
        frames = torch.from_numpy(samples).to(self.vad.device).unfold(0, CONTEXT + FRAME, FRAME)
        hidden, self._state = self.vad.lstm(self.vad._front_end(frames)[None], self._state)
        return self.vad._probs(hidden)[0]


def silero_model_path() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError("voice activity detection needs `pip install silero-vad`")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.jit"


@lru_cache(maxsize=4)
def default_vad(device: str = "cpu") -> SileroVad:
    return SileroVad(device=device)


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
                prev_end = next_start = temp_end = 0
                # No `continue` (Silero's and faster-whisper's): this frame's silence counts.
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


def detect_speech(
    audio: np.ndarray, options: VadOptions = VadOptions(), device: str = "cpu"
) -> list[SpeechRegion]:
    return detect_speech_many([audio], options, device)[0]


def detect_speech_many(
    audios: Sequence[np.ndarray], options: VadOptions = VadOptions(), device: str = "cpu"
) -> list[list[SpeechRegion]]:
    """`detect_speech` of several files at once (one batched LSTM: see `speech_probs_many`)."""
    probs = default_vad(device).speech_probs_many(audios)
    return [speech_regions(p, len(audio), options) for p, audio in zip(probs, audios)]


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

    def region_of(self, seconds: float, is_end: bool = False) -> int:
        """The region a time of the concatenation lies in; an end exactly on a boundary
        belongs to the region before it."""
        return self.region_of_sample(seconds * SAMPLE_RATE, is_end)

    def region_of_sample(self, sample: float, is_end: bool = False) -> int:
        side = "left" if is_end else "right"
        return max(0, int(np.searchsorted(self.concat_starts, sample, side=side)) - 1)

    def original_time(
        self, seconds: float, is_end: bool = False, region: int | None = None
    ) -> float:
        """`seconds` of the concatenation on the original timeline, through its own region or
        the one given (a word's, so that it never spans the silence cut between two)."""
        if not self.regions:
            return seconds
        index = self.region_of(seconds, is_end) if region is None else region
        sample = seconds * SAMPLE_RATE
        return float(self.regions[index].start + sample - self.concat_starts[index]) / SAMPLE_RATE


def regions_within(regions: list[SpeechRegion], spans: list[tuple[int, int]]) -> list[SpeechRegion]:
    """The parts of `regions` inside the (start, end) sample spans (both in order)."""
    return [
        SpeechRegion(max(r.start, start), min(r.end, end))
        for start, end in spans
        for r in regions
        if max(r.start, start) < min(r.end, end)
    ]


def collect_speech(audio: np.ndarray, regions: list[SpeechRegion]) -> np.ndarray:
    return np.concatenate([audio[r.start : r.end] for r in regions]) if regions else audio[:0]


# faster-whisper's `faster_whisper.vad` functions, for code that runs the VAD itself: speech as
# [{"start": sample, "end": sample}], cut and mapped back by the region code above.


def check_sampling_rate(sampling_rate: int) -> None:
    if sampling_rate != SAMPLE_RATE:  # the Silero weights here are its 16 kHz ones
        raise InvalidOptionError(
            f"the VAD reads 16 kHz audio, not {sampling_rate!r} Hz; "
            "decode it with decode_audio(path, sampling_rate=16000)"
        )


def get_speech_timestamps(
    audio: np.ndarray,
    vad_options: VadOptions | None = None,
    sampling_rate: int = SAMPLE_RATE,
    **kwargs: float,
) -> list[dict[str, int]]:
    """faster-whisper's: the speech in 16 kHz audio as [{"start": sample, "end": sample}, ...];
    `vad_options` (or, without it, VadOptions' fields as keywords) as `vad_parameters` takes."""
    check_sampling_rate(sampling_rate)
    options = vad_options_of(kwargs if vad_options is None else vad_options)
    return [{"start": r.start, "end": r.end} for r in detect_speech(audio, options)]


def regions_of(chunks: Sequence[Mapping[str, int]]) -> list[SpeechRegion]:
    return [SpeechRegion(int(c["start"]), int(c["end"])) for c in chunks]


def collect_chunks(
    audio: np.ndarray,
    chunks: list[dict],
    sampling_rate: int = SAMPLE_RATE,
    max_duration: float = float("inf"),
) -> tuple[list[np.ndarray], list[dict]]:
    """faster-whisper's: the speech `chunks` cut from `audio`, joined into pieces of at most
    `max_duration` seconds of speech each (a longer chunk alone), with each piece's metadata:
    {"offset": seconds of speech before it, "duration": its seconds, "segments": its chunks}.
    No chunks: one empty piece."""
    check_sampling_rate(sampling_rate)
    groups: list[list[dict]] = []
    length = 0
    for chunk in chunks:
        size = chunk["end"] - chunk["start"]
        if not groups or length + size > max_duration * sampling_rate:
            groups.append([])
            length = 0
        groups[-1].append(chunk)
        length += size
    pieces, metadata, offset = [], [], 0
    for group in groups or [[]]:
        piece = collect_speech(audio, regions_of(group))
        pieces.append(piece)
        metadata.append(
            {"offset": offset / sampling_rate, "duration": len(piece) / sampling_rate,
             "segments": group}
        )  # fmt: skip
        offset += len(piece)
    return pieces, metadata


class SpeechTimestampsMap:
    """faster-whisper's: times in the speech that `collect_chunks` joined, back on the original
    audio's timeline (`TimelineMap`), rounded to `time_precision` decimals."""

    def __init__(self, chunks: list[dict], sampling_rate: int, time_precision: int = 2):
        check_sampling_rate(sampling_rate)
        self.sampling_rate = sampling_rate
        self.time_precision = time_precision
        self.timeline = TimelineMap(regions_of(chunks))

    def get_original_time(
        self, time: float, chunk_index: int | None = None, is_end: bool = False
    ) -> float:
        if chunk_index is None:
            chunk_index = self.get_chunk_index(time, is_end)
        return round(self.timeline.original_time(time, region=chunk_index), self.time_precision)

    def get_chunk_index(self, time: float, is_end: bool = False) -> int:
        # A whole sample, as faster-whisper counts it: an end a rounding error past a chunk's
        # last sample still belongs to that chunk.
        return self.timeline.region_of_sample(int(time * self.sampling_rate), is_end)
