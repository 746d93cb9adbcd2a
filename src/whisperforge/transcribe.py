"""The user-facing API: `WhisperModel(...).transcribe(audio) -> (segments, info)`.

Signatures follow faster-whisper, so switching is one import; the semantics of the
long-form loop follow openai-whisper's `transcribe()`: a seek pointer over 30 s windows,
segments cut at timestamp tokens, temperature fallback per window, the no-speech skip,
conditioning on previous text, clip timestamps and hallucination-silence skipping.
`segments` is a lazy generator: each window's segments are yielded as soon as they are final.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import numbers
import os
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .audio import (
    CHUNK_LENGTH,
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    AudioInput,
    FeatureExtractor,
    load_audio,
    log_mel_spectrogram,
    pad_or_trim,
)
from .checkpoints import Checkpoint, load_files, resolve_checkpoint
from .decoding import (
    DecodingOptions,
    DecodingResult,
    decode,
    detect_language,
    suppress_token_list,
    token_ids_or_text,
    validate_options,
)
from .errors import InvalidOptionError, ModelFormatError, check_probability, check_whole_number
from .export import is_export_folder, load_onnx_export
from .model import Whisper, fused_weights
from .quantize import quantize_model, quantize_module, resolve_compute_type
from .results import Segment, TranscriptionInfo, Word
from .runtime import Runtime, RuntimeWhisper, current_device
from .timing import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, add_word_timestamps
from .tokenizer import HuggingFaceCodec, TiktokenCodec, Tokenizer, normalize_language
from .vad import (
    VAD_PARAMETERS_UNUSED,
    SpeechRegion,
    TimelineMap,
    VadOptions,
    collect_speech,
    detect_speech,
    regions_within,
    vad_options_of,
)

if TYPE_CHECKING:
    from .engine import ConcurrentTranscriber

T = TypeVar("T")

# Windows whose samples never exceed this (-60 dBFS) are silence: skipped without decoding.
SILENCE_PEAK = 10 ** (-60 / 20)
# A window that would begin with this much digital silence (2 s) begins after it.
LEADING_SILENCE_FRAMES = 200


@dataclass(frozen=True)
class TranscriptionOptions:
    beam_size: int = 5
    best_of: int = 5
    patience: float = 1.0
    # faster-whisper's: candidates ranked by log-prob / length ** length_penalty (1: by their
    # mean log-prob), unless openai-whisper's Google NMT alpha is set (`DecodingOptions`).
    length_penalty: float = 1.0
    nmt_length_penalty: float | None = None
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    # faster-whisper's: a window decoded below this average log-probability is skipped as
    # if it were silence, whatever its no-speech probability (with no_speech_threshold set).
    log_prob_low_threshold: float | None = None
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    initial_prompt: str | list[int] | None = None
    carry_initial_prompt: bool = False
    prefix: str | list[int] | None = None  # text, or token ids (openai-whisper takes both)
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] | None = (-1,)
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0
    word_timestamps: bool = False
    prepend_punctuations: str = PREPEND_PUNCTUATIONS
    append_punctuations: str = APPEND_PUNCTUATIONS
    clip_timestamps: tuple[float, ...] = ()
    hallucination_silence_threshold: float | None = None
    max_new_tokens: int | None = None  # tokens per window; default half the text context
    # faster-whisper's additions: words to favour, repetition controls (`DecodingOptions`),
    # each window's own language, and how the file's language is found (`language_of`).
    hotwords: str | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    multilingual: bool = False
    language_detection_threshold: float = 0.5
    language_detection_segments: int = 1
    # Seconds of audio a window holds, at most 30 (the encoder's input stays 30 s, zero-padded
    # past them); None: 30.
    chunk_length: float | None = None
    # openai-whisper keeps the instantaneous or textless segments a window cuts, emptied (its
    # result dicts, files and ids count them); faster-whisper drops them (the default here).
    keep_empty_segments: bool = False

    @classmethod
    def from_arguments(
        cls,
        temperature: float | Iterable[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        clip_timestamps: str | Iterable[float] = "0",
        initial_prompt: str | Iterable[int] | None = None,
        suppress_tokens: Iterable[int] | None = (-1,),
        length_penalty: float | None = 1.0,
        **fields,
    ) -> TranscriptionOptions:
        """The options of `WhisperModel.transcribe`'s keyword arguments (but language, task and
        VAD), checked. `length_penalty=None` is 1."""
        # Python callers pass anything: a string where a number goes would fail deep in the
        # decode with a bare TypeError, or as temperature="0.2" become the characters 0 . 2.
        if isinstance(temperature, numbers.Real):
            temperatures: tuple = (temperature,)
        elif isinstance(temperature, Iterable) and not isinstance(temperature, str):
            temperatures = tuple(temperature)
        else:
            temperatures = (temperature,)  # refused by name below
        if not temperatures:
            raise InvalidOptionError("temperature needs at least one value")
        for t in temperatures:
            if not isinstance(t, numbers.Real) or isinstance(t, bool):
                raise InvalidOptionError(
                    f"temperature {temperature!r} must be a number or a list of numbers, "
                    "e.g. 0.2 or (0.0, 0.2, 0.4)"
                )
        initial_prompt = token_ids_or_text("initial_prompt", initial_prompt)
        if "prefix" in fields:
            fields["prefix"] = token_ids_or_text("prefix", fields["prefix"])
        suppress_tokens = token_ids_or_text("suppress_tokens", suppress_tokens, text=False)
        options = cls(
            temperatures=temperatures,
            clip_timestamps=parse_clip_timestamps(clip_timestamps),
            initial_prompt=initial_prompt,
            suppress_tokens=tuple(suppress_tokens) if suppress_tokens else None,
            length_penalty=1.0 if length_penalty is None else length_penalty,
            **fields,
        )
        check_option_types(options)
        if options.hotwords is not None and not isinstance(options.hotwords, str):
            raise InvalidOptionError("hotwords must be text, e.g. 'Subiaco, Pannartz'")
        check_probability("language_detection_threshold", options.language_detection_threshold)
        if options.chunk_length is not None and not 1 <= options.chunk_length <= CHUNK_LENGTH:
            raise InvalidOptionError(
                f"chunk_length is the seconds of audio a window holds, 1 to {CHUNK_LENGTH} (the "
                f"model hears {CHUNK_LENGTH} s at a time), not {options.chunk_length!r}"
            )
        threshold = options.hallucination_silence_threshold
        if threshold is not None and threshold < 0:  # every gap would pass it: windows skipped
            raise InvalidOptionError(
                f"hallucination_silence_threshold is seconds of silence, 0 or more (openai-"
                f"whisper's CLI example is 2), not {threshold!r}"
            )
        for t in options.temperatures:  # now, not lazily at the first window
            validate_options(options.decoding_options(t, "en", "transcribe", []))
        if options.hallucination_silence_threshold is not None and not options.word_timestamps:
            # openai-whisper and faster-whisper ignore it silently: say so.
            warnings.warn(
                "hallucination_silence_threshold does nothing without word_timestamps=True (the "
                "silences are found from word times); it is ignored",
                stacklevel=3,
            )
        return options

    @property
    def window_seconds(self) -> float:
        """Seconds of audio a window holds (`chunk_length`)."""
        return CHUNK_LENGTH if self.chunk_length is None else self.chunk_length

    @property
    def window_frames(self) -> int:
        """Mel frames of audio a window holds."""
        return min(N_FRAMES, round(self.window_seconds * FRAMES_PER_SECOND))

    def as_reported(self, tokenizer: Tokenizer) -> TranscriptionOptions:
        """These options as `info.transcription_options` shows them, in faster-whisper's types
        (code written for it compares `temperatures == [0.0]` or appends to it): lists, not
        tuples, and suppress_tokens as the tokens suppressed (-1 and the task tokens resolved)."""
        suppressed = self.suppress_tokens
        if suppressed:
            suppressed = tuple(suppress_token_list(tokenizer, suppressed))
        return replace(
            self,
            temperatures=list(self.temperatures),  # type: ignore[arg-type]
            suppress_tokens=suppressed,
            clip_timestamps=list(self.clip_timestamps),  # type: ignore[arg-type]
        )

    def decoding_options(
        self, temperature: float, language: str, task: str, prompt: list[int]
    ) -> DecodingOptions:
        """One window's decode at one temperature: beams at 0, best-of sampling above.
        `multilingual`: no language, so that the decode detects the window's own."""
        return DecodingOptions(
            task=task,
            language=None if self.multilingual else language,
            temperature=temperature,
            beam_size=self.beam_size if temperature == 0 and self.beam_size > 1 else None,
            patience=self.patience if temperature == 0 and self.beam_size > 1 else None,
            best_of=self.best_of if temperature > 0 else None,
            length_penalty=self.nmt_length_penalty,
            length_exponent=self.length_penalty,
            prompt=prompt or None,
            prefix=self.prefix,
            prefix_in_text=True,  # faster-whisper's
            suppress_tokens=list(self.suppress_tokens) if self.suppress_tokens else None,
            suppress_blank=self.suppress_blank,
            without_timestamps=self.without_timestamps,
            max_initial_timestamp=self.max_initial_timestamp,
            sample_len=self.max_new_tokens,
            hotwords=self.hotwords,
            repetition_penalty=self.repetition_penalty,
            no_repeat_ngram_size=self.no_repeat_ngram_size,
        )


# TranscriptionOptions' fields by the type they take (None too, where `MAY_BE_NONE`).
# (whole numbers: the least each may be)
WHOLE_NUMBER_OPTIONS = {"beam_size": 1, "best_of": 1, "max_new_tokens": 1,
                        "no_repeat_ngram_size": 0, "language_detection_segments": 1}  # fmt: skip
NUMBER_OPTIONS = ("patience", "compression_ratio_threshold", "log_prob_threshold",
                  "no_speech_threshold", "log_prob_low_threshold", "prompt_reset_on_temperature",
                  "max_initial_timestamp", "hallucination_silence_threshold",
                  "repetition_penalty", "language_detection_threshold", "chunk_length")  # fmt: skip
FLAG_OPTIONS = ("condition_on_previous_text", "carry_initial_prompt", "suppress_blank",
                "without_timestamps", "word_timestamps", "multilingual", "keep_empty_segments")  # fmt: skip
TEXT_OPTIONS = ("prepend_punctuations", "append_punctuations")
MAY_BE_NONE = ("max_new_tokens", "compression_ratio_threshold", "log_prob_threshold",
               "no_speech_threshold", "log_prob_low_threshold", "max_initial_timestamp",
               "hallucination_silence_threshold", "chunk_length")  # fmt: skip


def check_option_types(options: TranscriptionOptions) -> None:
    """Refuse an option of the wrong type by name: a string where a number goes fails deep in
    the decode with a bare TypeError, a NaN threshold compares false and silently turns its
    check off, and word_timestamps="no" would be true."""
    for name in (*WHOLE_NUMBER_OPTIONS, *NUMBER_OPTIONS, *FLAG_OPTIONS, *TEXT_OPTIONS):
        value = getattr(options, name)
        if value is None and name in MAY_BE_NONE:
            continue
        if name in WHOLE_NUMBER_OPTIONS:
            check_whole_number(name, value, WHOLE_NUMBER_OPTIONS[name])
        elif name in NUMBER_OPTIONS:
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                hint = " (or None)" if name in MAY_BE_NONE else ""
                raise InvalidOptionError(f"{name} must be a finite number{hint}, not {value!r}")
        elif name in FLAG_OPTIONS:
            if not isinstance(value, (bool, np.bool_)):
                raise InvalidOptionError(f"{name} must be True or False, not {value!r}")
        elif not isinstance(value, str):
            raise InvalidOptionError(f"{name} must be text, not {value!r}")


def temperature_ladder(temperature: float, increment: float | None = 0.2) -> tuple[float, ...]:
    """openai-whisper's fallback temperatures: from `temperature` up to 1.0 by `increment`
    (the CLI's --temperature_increment_on_fallback; OpenAI's API raises by 0.2 from its
    `temperature` when a window fails the thresholds)."""
    if increment is not None and not increment >= 0:  # NaN too
        raise InvalidOptionError(
            f"temperature_increment_on_fallback must be a number from 0 up (0 or none: no "
            f"fallback), not {increment}"
        )
    # A NaN temperature is one rung, refused by name with the other options (no int(NaN) here).
    if increment is None or increment <= 0 or not temperature < 1.0:
        return (temperature,)
    steps = int((1.0 - temperature) / increment + 1e-6)
    return tuple(round(temperature + i * increment, 6) for i in range(steps + 1))


# A `transcribe` method's arguments that are the call's, not the transcription's options.
CALL_ARGUMENTS = frozenset(
    {"self", "audio", "language", "task", "log_progress", "vad_filter", "vad_parameters"}
)


def options_of(arguments: dict[str, Any], *others: str) -> dict[str, Any]:
    """`TranscriptionOptions.from_arguments`' keywords among a `transcribe` method's arguments
    (its `locals()`, taken before it sets any other name): all but the call's own
    (`CALL_ARGUMENTS`) and `others`. faster-whisper's signatures stay spelled out, in its
    order, and are passed on by name here."""
    return {k: v for k, v in arguments.items() if k not in CALL_ARGUMENTS and k not in others}


def parse_clip_timestamps(clips: str | Iterable[float]) -> tuple[float, ...]:
    """openai-whisper's clip_timestamps, "start,end,start,..." seconds (or the numbers)."""
    try:
        if isinstance(clips, str):
            times = tuple(float(t) for t in clips.split(",") if t.strip())
        else:
            times = tuple(float(t) for t in clips)
    except (TypeError, ValueError):
        raise InvalidOptionError(
            f"clip_timestamps {clips!r} must be seconds, start,end,start,... e.g. '0,10,20'"
        ) from None
    if not all(math.isfinite(t) and t >= 0 for t in times):
        raise InvalidOptionError(f"clip_timestamps {clips!r} must be seconds from 0 on, finite")
    if any(later < earlier for earlier, later in pairwise(times)) or any(
        end == start for start, end in zip(times[::2], times[1::2])
    ):
        raise InvalidOptionError(
            f"clip_timestamps {clips!r} must be stretches of the audio in order, "
            "start,end,start,... each ending after it starts"
        )
    return times


def clip_spans(clips: Iterable[float], per_second: int, end: int) -> list[tuple[int, int]]:
    """clip_timestamps' (start, end) pairs, counted `per_second` (mel frames or samples), each
    point at most `end` (the audio's); none is all the audio, and an odd last start runs to
    `end`. (openai-whisper does not clamp: a clip ending past the audio loops forever there.)"""
    points = [min(round(t * per_second), end) for t in clips] or [0]
    return list(zip(points[::2], [*points[1::2], end]))


@dataclass
class WindowRequest:
    """A long-form loop's request: decode this 30 s window after `prompt` (see `long_form`)."""

    mel: Tensor  # [n_mels, N_FRAMES], zero-padded past the audio's end
    prompt: list[int]  # the text to condition on: the initial prompt or the previous windows'
    tokenizer: Tokenizer  # language and task
    options: TranscriptionOptions  # beams, temperature fallback and its thresholds


# What a long-form loop is sent for a WindowRequest: the decode (after temperature fallback) and
# the window's audio features [n_audio_ctx, D], which word timestamps need.
WindowResult = tuple[DecodingResult, Tensor]
# It yields WindowRequests (send back their WindowResult) and final Segments (send None).
LongForm = Generator[WindowRequest | Segment, WindowResult | None, None]


@dataclass
class PreparedAudio:
    """A long-form transcription's audio, made ready without the model (`WhisperModel.prepare`):
    what the loop decodes, after the VAD where it ran, with its mel."""

    samples: np.ndarray  # what is decoded: all of the audio, or its speech
    duration: float  # seconds of the audio as given
    mel: Tensor | None  # None: the VAD found no speech
    peaks: np.ndarray | None  # `frame_peaks` of the samples
    timeline: TimelineMap | None  # the speech's times in the audio, where the VAD ran
    vad_options: VadOptions | None
    window_options: TranscriptionOptions  # the options, with clips already applied by the VAD


def frame_peaks(samples: np.ndarray) -> np.ndarray:
    """Largest absolute sample per mel frame (10 ms hop), to find silent windows cheaply."""
    n_frames = -(-len(samples) // HOP_LENGTH)
    padded = np.zeros(n_frames * HOP_LENGTH, dtype=np.float32)
    padded[: len(samples)] = np.abs(samples)
    return padded.reshape(n_frames, HOP_LENGTH).max(axis=1)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):  # mps, xpu, meta: not run here
        raise InvalidOptionError(f"unsupported device {device!r}; use auto, cpu or cuda[:N]")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        # Said without `device=`: the command's --device reads this message too.
        raise InvalidOptionError(f"device {device!r}: no CUDA GPU is visible here; use cpu or auto")
    return resolved


def gpu_indices(device_index: int | Sequence[int], device: torch.device) -> list[int]:
    """The GPUs a model goes on: `device`'s own index (cuda:N), else faster-whisper's
    `device_index`, one or a list (a replica on each). Nothing on the CPU."""
    if device.type != "cuda":
        return []
    if device.index is not None:
        return [device.index]
    indices = [device_index] if isinstance(device_index, numbers.Integral) else device_index
    n = torch.cuda.device_count()
    if (
        not isinstance(indices, (list, tuple))
        or not indices
        or not all(isinstance(i, numbers.Integral) for i in indices)
    ):
        raise InvalidOptionError(
            f"device_index must be a GPU number or a list of them, not {device_index!r}"
        )
    if len(set(indices)) < len(indices):
        raise InvalidOptionError(f"device_index {device_index!r} names a GPU twice")
    for index in indices:
        if not 0 <= index < n:
            raise InvalidOptionError(f"no CUDA GPU {index}: {n} visible, numbered from 0")
    return [int(i) for i in indices]


class _WithoutRandomInit(TorchFunctionMode):
    """Skips `torch.nn.init`'s fills while a network is built whose weights are copied in next:
    filling large-v3's took 16 s on one CPU thread and made all of its 6.1 GB of float32
    resident at once; unfilled, its pages are not touched until a weight is copied in."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def build_model(
    checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, weights: str | None = None
) -> Whisper:
    """The network holding the checkpoint's weights, in `dtype` on `device`, quantized to
    `weights` (a compute type's, see `quantize.py`) where given.

    On the CPU it is built there unfilled and the weights are converted as they are copied in,
    one at a time; each quantized module is swapped in as soon as its weights are in, so the
    float model never exists whole (base int8's peak was above float32's). Elsewhere it is built
    on the meta device and takes each weight converted where it will live, so the host holds
    only the loaded weights: built on the host in float32 first and then moved, it peaked at
    17 GB for large-v3. (Not so on the CPU: the meta device's random init is Python code whose
    first use imports some 800 modules, 70 MB for good.)"""
    scales = checkpoint.weight_scales
    if device.type == "cpu":
        with _WithoutRandomInit():
            model = Whisper(checkpoint.config).to(dtype)
        unfilled = model.state_dict()
        # Each module's weights still to come: at none, its quantized form can be made.
        pending = Counter(name.rpartition(".")[0] for name in unfilled)
        with torch.no_grad():
            for name, tensor in fused_weights(checkpoint.state_dict):
                unfilled.pop(name).copy_(tensor)
                del tensor  # (a quantized folder's dequantized copy: not held while quantizing)
                module = name.rpartition(".")[0]
                pending[module] -= 1
                if weights is not None and not pending[module]:
                    quantize_module(model, module, weights, scales)
        if unfilled:  # `check_state_dict` let a checkpoint through without them: a bug here
            raise ModelFormatError(f"{checkpoint.source}: no weights for {sorted(unfilled)}")
        return model.eval().requires_grad_(False)
    with torch.device("meta"):
        model = Whisper(checkpoint.config)
    state = {  # copies, so that the model never shares memory with the checkpoint
        name: tensor.to(device, dtype, copy=True, memory_format=torch.contiguous_format)
        for name, tensor in checkpoint.state_dict.items()
    }
    model.load_state_dict(dict(fused_weights(state)), strict=True, assign=True)
    return quantize_model(model, weights, scales).eval().requires_grad_(False)


def release_freed_memory() -> None:
    """Give the host memory that loading freed back to the system. glibc keeps freed blocks in
    its heap (its mmap threshold rises to 32 MB as large tensors are freed), so a model loaded
    onto a GPU would keep about half of its loaded weights' memory resident (medium.en: 786 of
    1528 MB). malloc_trim is glibc's; elsewhere this does nothing."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # musl and other C libraries
        pass


def build_tokenizer(checkpoint: Checkpoint) -> Tokenizer:
    config = checkpoint.config
    if checkpoint.tokenizer_file is not None:
        codec = HuggingFaceCodec(checkpoint.tokenizer_file)
    else:
        # openai's vocabulary lists every language token even for .en models, so ids line up.
        vocabulary_languages = config.n_vocab - 51765 - int(config.is_multilingual)
        codec = TiktokenCodec(config.is_multilingual, vocabulary_languages)
    return Tokenizer(codec, config.is_multilingual, config.num_languages)


# The options faster-whisper hands to CTranslate2's Whisper beside its own: taken, not heeded.
CTRANSLATE2_OPTIONS = {"inter_threads", "intra_threads", "max_queued_batches", "flash_attention",
                       "tensor_parallel"}  # fmt: skip


class WhisperModel:
    """A Whisper model ready to transcribe.

    model_size_or_path: a model name ("tiny.en", "base", "large-v3", ...), a model folder
    (CTranslate2 or transformers), an OpenAI `.pt` file, or a loaded `Checkpoint`; or a
    folder from `whisperforge export --format onnx`, run on onnxruntime's CPU provider (word
    timestamps then load the PyTorch model the export came from: see `export.OnnxDecoder`).
    device: "auto" (CUDA when present), "cpu" or "cuda[:N]". device_index: the GPU (where
    device names none), or a list of GPUs as in faster-whisper: the model is loaded on each,
    and `transcribe` calls from threads that the first GPU's worker has no room for go to the
    next (see num_workers). 32 threads on two H100s got large-v3 1.5x the throughput of one
    GPU (RESULTS, session 42); turbo and smaller models gain less, their host work shared by one
    process: for many GPUs, `whisperforge batch` runs a process on each.
    compute_type: "default" (float16 on CUDA, float32 on CPU; a quantized checkpoint's own type),
    "auto" (the fastest here: float16 on CUDA, int8 on CPU), "float32", "float16", "bfloat16"; or quantized weights (see `quantize.py`): "int8" (on the
    CPU every linear in int8, activations quantized per call; on CUDA weight-only int8 for the
    decoder's step linears with float16 activations), "int8_float32", "int8_float16",
    "int8_bfloat16" (int8 weights, activations in that float type; 16-bit ones fall back to
    float32 on the CPU), "float8" (fp8 e4m3 weights and activations on Ada/Hopper GPUs). The
    token embedding and tied logits projection are int8 too, with a scale per 64 columns.
    The weights live in `model` (and `runtime` on a GPU) only: `checkpoint` keeps the
    description (config, tokenizer, alignment heads), not a second copy of them.
    num_workers: how many `transcribe` calls from threads run at once, as in faster-whisper
    (whose CTranslate2 runs that many decodes side by side). Above 1, the calls' windows are
    decoded together in batches on one worker thread (`engine.ConcurrentTranscriber`): on an
    H200, 16 threads got 2.4x (tiny.en), 2.8x (turbo) and 4.4x (large-v3) the throughput they
    get with 1 (RESULTS, session 41). With 1, threads may still share the model and take turns a
    window at a time (`lock`). `BatchedInferencePipeline` batches the windows of one file.
    revision, use_auth_token: for a model from the Hugging Face hub, its branch, tag or commit
    and the hub token (a private repo's), as faster-whisper takes them; a name an installed
    package holds (tiny.en) comes from the hub too when a revision is given.
    files: faster-whisper's model from memory, file names to bytes or binary file objects
    (model.bin, config.json, tokenizer.json, ...), in place of model_size_or_path; they are
    written to a temporary folder that lives as long as the model. CTranslate2's own options
    (`flash_attention`, `inter_threads`, ...) are taken and ignored with a warning (whisperforge
    has none of them); other keywords are a TypeError, as they are in faster-whisper.
    cpu_threads: torch's threads (0: its default), for the whole process: torch has no count
    per model.
    """

    def __init__(
        self,
        model_size_or_path: str | os.PathLike | Checkpoint = "tiny.en",
        device: str = "auto",
        device_index: int | Sequence[int] = 0,
        compute_type: str = "default",
        cpu_threads: int = 0,
        num_workers: int = 1,
        download_root: str | None = None,
        local_files_only: bool = False,
        files: dict | None = None,
        revision: str | None = None,
        use_auth_token: str | bool | None = None,
        **model_kwargs: object,
    ):
        check_whole_number("num_workers", num_workers)
        if files is not None:  # the folder is kept: the tokenizer is read from it
            model_size_or_path, self.files_folder = load_files(files)
        unknown = sorted(set(model_kwargs) - CTRANSLATE2_OPTIONS)
        if unknown:  # a typo (cpu_thread=4) was warned of and the default used
            raise TypeError(f"WhisperModel() got an unexpected keyword argument {unknown[0]!r}")
        if model_kwargs:
            warnings.warn(
                f"{', '.join(sorted(model_kwargs))}: CTranslate2's option(s), which whisperforge "
                "does not have; ignored",
                stacklevel=2,
            )
        # Held while a thread's transcription runs the model (`locked`): the runtime's static
        # buffers and CUDA graphs serve one decode at a time.
        self.lock = threading.RLock()
        self.num_workers = int(num_workers)
        self.concurrent: ConcurrentTranscriber | None = None  # made at the first call (workers)
        # Not `lock`: the worker holds that through each step and takes it again at once, so a
        # new call waiting on it could starve for as long as the running jobs last.
        self._concurrent_lock = threading.Lock()
        self.replicas: list[WhisperModel] = []  # the model on the other GPUs of device_index
        self.device = resolve_device(device)
        indices = gpu_indices(device_index, self.device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", indices[0])
        compute = resolve_compute_type(compute_type, self.device)  # a bad name fails before loading
        self.dtype = compute.dtype
        check_whole_number("cpu_threads", cpu_threads, minimum=0, hint=" (0: torch's default)")
        if cpu_threads > 0:
            torch.set_num_threads(cpu_threads)
        self.runtime = None  # on a GPU: encoder and decode loop on static caches, CUDA graphs
        # The last window `language_of` encoded, with its features, for the next `encode`
        # only: audio of 30 s or more starts its long-form loop with the same mel, which is
        # then not encoded twice (and no later window pays for the comparison).
        self.language_window: tuple[Tensor, Tensor] | None = None
        if not isinstance(model_size_or_path, Checkpoint) and is_export_folder(model_size_or_path):
            # `whisperforge export --format onnx`: encoder and decoder on onnxruntime.
            self.checkpoint, self.model = load_onnx_export(
                model_size_or_path, device, compute_type, cpu_threads
            )
            self.device, self.dtype = self.model.device, self.model.dtype
        else:
            checkpoint = (
                model_size_or_path
                if isinstance(model_size_or_path, Checkpoint)
                else resolve_checkpoint(
                    model_size_or_path, local_files_only, download_root, revision, use_auth_token
                )
            )
            if compute_type == "default":  # a quantized checkpoint's own compute type
                compute = resolve_compute_type("default", self.device, checkpoint.compute_type)
            self.dtype = compute.dtype
            self.replicas = [
                WhisperModel(checkpoint, f"cuda:{i}", 0, compute_type, num_workers=num_workers)
                for i in indices[1:]
            ]
            self.model = build_model(checkpoint, self.device, self.dtype, compute.weights)
            # The model holds the weights now. Keeping the loaded ones too would hold a second
            # copy in host memory (75 MB for tiny.en, 3 GB for large-v3); what stays is the
            # description: config, tokenizer, alignment heads.
            self.checkpoint = replace(checkpoint, state_dict={}, weight_scales=None)
            del checkpoint
            if self.device.type == "cuda":
                with current_device(self.device):
                    self.runtime = Runtime(self.model, max_windows=1, max_rows=5)
            release_freed_memory()
        self.decode_model = RuntimeWhisper(self.runtime) if self.runtime else self.model
        self.tokenizer = build_tokenizer(self.checkpoint)
        heads = self.checkpoint.alignment_heads
        if heads is None:  # unknown heads: the reference's fallback, the upper half of the layers
            config = self.checkpoint.config
            heads = torch.tensor(
                [(layer, head) for layer in range(config.n_text_layer // 2, config.n_text_layer)
                 for head in range(config.n_text_head)]
            )  # fmt: skip
        self.alignment_heads = heads
        # faster-whisper's attributes, which code written for it reads
        self.feature_extractor = FeatureExtractor(self.checkpoint.config.n_mels)
        self.frames_per_second = FRAMES_PER_SECOND
        self.input_stride = N_FRAMES // self.checkpoint.config.n_audio_ctx  # mel frames a token
        self.num_samples_per_token = HOP_LENGTH * self.input_stride
        self.tokens_per_second = SAMPLE_RATE // self.num_samples_per_token
        # The model's tokenizer.json as a `tokenizers.Tokenizer`; None for a model without one
        # (an OpenAI `.pt`: tiktoken's vocabulary, which faster-whisper would download).
        codec = self.tokenizer.codec
        self.hf_tokenizer = codec.hf if isinstance(codec, HuggingFaceCodec) else None

    @property
    def is_multilingual(self) -> bool:
        return self.checkpoint.config.is_multilingual

    @property
    def supported_languages(self) -> list[str]:
        # A list, as faster-whisper's: scripts extend it (["auto"] + model.supported_languages).
        return list(self.tokenizer.all_language_codes)

    def encode(self, mel: Tensor) -> Tensor:
        """Audio features [B, n_audio_ctx, D] of mel windows [B, n_mels, 3000]."""
        known, self.language_window = self.language_window, None
        if known is not None and identical(known[0][None], mel):
            return known[1][None]
        with torch.inference_mode(), current_device(self.device):
            if self.runtime is not None:  # its output is a static buffer: keep a copy
                return self.runtime.encoder(mel).clone()
            return self.model.encoder(mel.to(device=self.device, dtype=self.dtype))

    def detect_language(
        self,
        audio: AudioInput | None = None,
        features: np.ndarray | Tensor | None = None,
        vad_filter: bool = False,
        vad_parameters: VadOptions | dict | None = None,
        language_detection_segments: int = 1,
        language_detection_threshold: float = 0.5,
    ) -> tuple[str, float, list[tuple[str, float]]]:
        """The audio's language: (code, probability, all (code, probability) best first), from
        its first 30 s, or from up to `language_detection_segments` windows (`language_of`);
        with `vad_filter`, of its speech only. faster-whisper's arguments, in its order:
        `features` is a log-mel spectrogram [n_mels, frames] given instead of the audio (with
        both, the audio, as faster-whisper).
        An English-only model has nothing to detect: refused, as faster-whisper refuses it."""
        if not self.is_multilingual:
            raise InvalidOptionError(
                "this model is English-only: it has no language tokens to detect a language "
                "with; use a multilingual model such as base"
            )
        if audio is None and features is None:
            raise InvalidOptionError("pass the audio or its features (a log-mel spectrogram)")
        check_whole_number("language_detection_segments", language_detection_segments)
        check_probability("language_detection_threshold", language_detection_threshold)
        if audio is None:
            mel = torch.as_tensor(features, dtype=torch.float32, device=self.device)
            if mel.ndim != 2 or mel.shape[0] != self.checkpoint.config.n_mels:
                raise InvalidOptionError(
                    f"features must be a log-mel spectrogram [{self.checkpoint.config.n_mels}, "
                    f"frames], got shape {tuple(mel.shape)}"
                )
            # A window's worth of zeros after it, where `leading_windows` looks for the end.
            mel = torch.cat([mel, mel.new_zeros(mel.shape[0], N_FRAMES)], dim=1)
        else:
            samples = load_audio(audio)
            if vad_filter:
                samples = collect_speech(
                    samples, detect_speech(samples, vad_options_of(vad_parameters))
                )
            mel = self.long_form_mel(samples)
        return self.language_of(
            leading_windows(mel, language_detection_segments), language_detection_threshold
        )

    def long_form_mel(self, samples: np.ndarray) -> Tensor:
        """The whole audio's mel with 30 s of zeros after it, on the model's device, sliced
        per window like the reference's. On CUDA under the lock (another thread's CUDA graph may
        be being captured there); on the CPU without, so that a thread preparing a long file
        (`prepare`) does not stop the one decoding other files' windows."""
        with self.lock if self.device.type == "cuda" else contextlib.nullcontext():
            return log_mel_spectrogram(
                samples, self.checkpoint.config.n_mels, N_SAMPLES, self.device
            )

    def language_of(
        self, windows: Iterable[Tensor], threshold: float = 0.5
    ) -> tuple[str, float, list[tuple[str, float]]]:
        """faster-whisper's rule over 30 s windows of mel [n_mels, N_FRAMES], in order: the first
        window whose likeliest language has a probability above `threshold` decides; if none
        does, the language most windows put first, with its highest probability there.
        Returns (code, probability, the deciding or last window's (code, probability) list)."""
        if not self.is_multilingual:
            return "en", 1.0, [("en", 1.0)]
        votes: dict[str, list[float]] = {}
        ranked: list[tuple[str, float]] = []
        for mel in windows:
            with self.lock:
                features = self.encode(mel[None])
                self.language_window = (mel.clone(), features[0])  # not a view of the file's
                _, probs = detect_language(self.model, self.tokenizer, features)
            ranked = sorted(probs[0].items(), key=lambda item: item[1], reverse=True)
            language, probability = ranked[0]
            if probability > threshold:
                return language, probability, ranked
            votes.setdefault(language, []).append(probability)
        language = max(votes, key=lambda code: len(votes[code]))  # ties: the earliest window's
        return language, max(votes[language]), ranked

    def transcribe(
        self,
        audio: AudioInput,
        language: str | None = None,
        task: str = "transcribe",
        log_progress: bool = False,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1.0,
        length_penalty: float = 1,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        temperature: float | Iterable[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        compression_ratio_threshold: float | None = 2.4,
        log_prob_threshold: float | None = -1.0,
        no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True,
        prompt_reset_on_temperature: float = 0.5,
        initial_prompt: str | Iterable[int] | None = None,
        prefix: str | None = None,
        suppress_blank: bool = True,
        suppress_tokens: Iterable[int] | None = (-1,),
        without_timestamps: bool = False,
        max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False,
        prepend_punctuations: str = PREPEND_PUNCTUATIONS,
        append_punctuations: str = APPEND_PUNCTUATIONS,
        multilingual: bool = False,
        vad_filter: bool = False,
        vad_parameters: VadOptions | dict | None = None,
        max_new_tokens: int | None = None,
        chunk_length: float | None = None,
        clip_timestamps: str | Iterable[float] = "0",
        hallucination_silence_threshold: float | None = None,
        hotwords: str | None = None,
        language_detection_threshold: float = 0.5,
        language_detection_segments: int = 1,
        carry_initial_prompt: bool = False,
        log_prob_low_threshold: float | None = None,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """Transcribe audio (a path, bytes, a file object or a 16 kHz mono float array).

        Returns a lazy generator of segments and the `TranscriptionInfo` (language, duration).
        Long-form semantics are openai-whisper's; `beam_size=1` is greedy decoding;
        `length_penalty` is faster-whisper's (candidates ranked by log-prob / length **
        length_penalty, not openai-whisper's Google NMT alpha); `prefix`
        is words the first window's speech is taken to begin with, its decode going on from
        them, and the first segment's text begins with them (faster-whisper's: after <|0.00|>;
        openai-whisper forces them in every window, before the first timestamp, where they
        often end the window at once). Segment ids count from 1, as faster-whisper's. The
        options faster-whisper adds: `hotwords` (words to favour, in the
        prompt unless a `prefix` is given), `repetition_penalty` and `no_repeat_ngram_size` (on
        each window's sampled tokens; on a GPU they run the step loop on the host),
        `multilingual` (each window in its own language), the language found over
        `language_detection_segments` windows (see `language_of`), `log_progress` (a bar of
        the audio done, on stderr), `log_prob_low_threshold` (a window decoded below this
        average log-probability is dropped as silence) and `chunk_length` (seconds of audio a
        window holds, up to 30). With `vad_filter`, `clip_timestamps` (times of the file) keep
        the speech inside them (faster-whisper drops the VAD when given clips).
        """
        # locals(): the arguments, before any other name is set here
        options = TranscriptionOptions.from_arguments(**options_of(locals()))
        return self.transcribe_with(
            audio, options, language, task, vad_filter, vad_parameters, log_progress
        )

    def transcribe_with(
        self,
        audio: AudioInput,
        options: TranscriptionOptions,
        language: str | None = None,
        task: str = "transcribe",
        vad_filter: bool = False,
        vad_parameters: VadOptions | dict | None = None,
        log_progress: bool = False,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """`transcribe` with its options made (`TranscriptionOptions.from_arguments`)."""
        if self.num_workers > 1 or self.replicas:
            from .engine import ConcurrentTranscriber  # it builds on the batched pipeline

            with self._concurrent_lock:
                if self.concurrent is None:
                    models = [self, *self.replicas]
                    self.concurrent = ConcurrentTranscriber(models, self.num_workers)
            segments, info = self.concurrent.transcribe(
                audio, options, language, task, vad_filter, vad_parameters
            )
        else:
            steps, info = self.long_form(audio, language, task, options, vad_filter, vad_parameters)
            segments = locked(self.decode_sequentially(steps), self.lock)
        return (with_progress(segments, info.duration) if log_progress else segments), info

    def check_task(self, task: str) -> None:
        if task not in ("transcribe", "translate"):
            raise InvalidOptionError(f"unknown task {task!r}; use transcribe or translate")
        if not self.is_multilingual and task == "translate":
            raise InvalidOptionError(
                "this model is English-only and cannot translate; use a multilingual model such as base"
            )

    def long_form(
        self,
        audio: AudioInput | PreparedAudio,
        language: str | None,
        task: str,
        options: TranscriptionOptions,
        vad_filter: bool = False,
        vad_parameters: VadOptions | dict | None = None,
    ) -> tuple[LongForm, TranscriptionInfo]:
        """`transcribe`, with the caller decoding the windows: the audio is read and its language
        found now, and the long-form loop comes back as a generator that yields a `WindowRequest`
        per window (send back its `WindowResult`) and each final `Segment`. The server's batched
        backend runs many loops at once and decodes their windows together. `audio` may be
        `prepare`'s, made with the same options, VAD and parameters."""
        self.check_task(task)
        if language is not None:
            language = normalize_language(language, self.supported_languages)
        if options.multilingual and not self.is_multilingual:  # faster-whisper's warning
            warnings.warn("this model is English-only: multilingual=True does nothing; "
                          "setting it to False", stacklevel=4)  # fmt: skip
            options = replace(options, multilingual=False)
        prepared = (
            audio
            if isinstance(audio, PreparedAudio)
            else self.prepare(audio, options, vad_filter, vad_parameters)
        )
        samples, duration, mel = prepared.samples, prepared.duration, prepared.mel
        window_options, vad_options = prepared.window_options, prepared.vad_options
        if mel is None:  # VAD found no speech at all: nothing to decode
            # A language given (or the only one a model knows) is certain; none was heard.
            certain = language is not None or not self.is_multilingual
            # Where one was to be detected, a list still (faster-whisper's always is there).
            heard = None if certain else [("en", 0.0)]
            shown = options.as_reported(self.tokenizer)
            info = TranscriptionInfo(
                language or "en", float(certain), duration, 0.0, heard, shown, vad_options
            )
            return _no_windows(), info

        all_language_probs = None
        language_probability = 1.0
        if language is None:
            # Heard where the transcript starts, at its first clip (as faster-whisper hears it;
            # openai-whisper, in the first 30 s of the file whatever the clips).
            clips = clip_spans(
                window_options.clip_timestamps, FRAMES_PER_SECOND, mel.shape[-1] - N_FRAMES
            )
            start = past_silence(prepared.peaks, *clips[0])
            windows = leading_windows(mel, options.language_detection_segments, start)
            language, language_probability, ranked = self.language_of(
                windows, options.language_detection_threshold
            )
            all_language_probs = ranked if self.is_multilingual else None
        info = TranscriptionInfo(
            language=language,
            language_probability=language_probability,
            duration=duration,
            duration_after_vad=len(samples) / SAMPLE_RATE,
            all_language_probs=all_language_probs,
            transcription_options=options.as_reported(self.tokenizer),
            vad_options=vad_options,
        )
        tokenizer = self.tokenizer.with_options(language, task)
        steps = self.window_steps(
            mel, tokenizer, window_options, duration, prepared.peaks, prepared.timeline
        )
        return steps, info

    def prepare(
        self,
        audio: AudioInput,
        options: TranscriptionOptions,
        vad_filter: bool = False,
        vad_parameters: VadOptions | dict | None = None,
    ) -> PreparedAudio:
        """What `long_form` does before it needs the model: the audio read, its speech found
        (`vad_filter`), its mel. Callers that share one model's worker (the server, num_workers)
        run this in their own thread: made by the worker, a long file's mel held up every other
        call's windows (benchmarks/server_long_upload.py)."""
        if vad_parameters is not None and not vad_filter:
            warnings.warn(VAD_PARAMETERS_UNUSED, stacklevel=5)  # transcribe's caller's line
        samples = load_audio(audio)
        duration = len(samples) / SAMPLE_RATE
        if options.clip_timestamps and options.clip_timestamps[0] >= duration:
            # Nothing to transcribe, as openai-whisper and faster-whisper: one list of clips
            # for files of several lengths stopped at the first short one.
            warnings.warn(
                f"clip_timestamps start at {options.clip_timestamps[0]:g} s, past the end of "
                f"the audio ({duration:.2f} s): no segments",
                stacklevel=5,  # transcribe's caller's line
            )
            return PreparedAudio(samples[:0], duration, None, None, None, None, options)
        timeline = None
        vad_options = None
        window_options = options
        if vad_filter:  # transcribe only the speech, then map times back to the original
            vad_options = vad_options_of(vad_parameters)
            regions = detect_speech(samples, vad_options)
            # clip_timestamps are times of the file: the speech inside them is decoded, and the
            # loop then runs over all of it (clipped again, the times would be the speech's).
            clips = clip_spans(options.clip_timestamps, SAMPLE_RATE, len(samples))
            regions = regions_within(regions, clips)
            window_options = replace(options, clip_timestamps=())
            samples = collect_speech(samples, regions)
            timeline = TimelineMap(regions)
        if len(samples) == 0:
            return PreparedAudio(
                samples, duration, None, None, timeline, vad_options, window_options
            )
        mel, peaks = self.long_form_mel(samples), frame_peaks(samples)
        return PreparedAudio(samples, duration, mel, peaks, timeline, vad_options, window_options)

    def decode_sequentially(self, steps: LongForm) -> Iterator[Segment]:
        """Run a long-form loop, decoding each window when it asks: `transcribe`'s segments."""
        sent: WindowResult | None = None
        while True:
            try:
                item = steps.send(sent)
            except StopIteration:
                return
            if isinstance(item, Segment):
                sent = None
                yield item
                continue
            features = self.encode(item.mel[None])
            result = self.decode_with_fallback(features, item.tokenizer, item.options, item.prompt)
            sent = (result, features[0])

    def decode_with_fallback(
        self,
        audio_features: Tensor,
        tokenizer: Tokenizer,
        options: TranscriptionOptions,
        prompt: list[int],
    ) -> DecodingResult:
        """Decode one window at rising temperatures until the result passes the thresholds
        (if none does, `best_of_failed`)."""
        tried = []
        for t in options.temperatures:
            decode_options = options.decoding_options(
                t, tokenizer.language or "en", tokenizer.task, prompt
            )
            tried.append(decode(self.decode_model, tokenizer, audio_features, decode_options)[0])
            if good_enough(tried[-1], options):
                return tried[-1]
        return best_of_failed(tried, options)

    def span_steps(
        self,
        samples: np.ndarray,
        start: int,
        end: int,
        tokenizer: Tokenizer,
        options: TranscriptionOptions,
        first: bool = False,
    ) -> LongForm:
        """The long-form loop over samples [start, end) of a file, on the file's timeline: what
        `transcribe` does to a whole file, for one stretch of it (batched.py's chains). The
        options' prefix begins the span's first window if it is the file's `first` stretch,
        else no window."""
        span = samples[start:end]
        mel = self.long_form_mel(span)
        timeline = TimelineMap([SpeechRegion(start, end)])
        if not first:
            options = replace(options, prefix=None)
        peaks = frame_peaks(span)
        duration = len(samples) / SAMPLE_RATE  # the file's, whose timeline the times are on
        return self.window_steps(mel, tokenizer, options, duration, peaks, timeline)

    def window_steps(
        self,
        mel: Tensor,
        tokenizer: Tokenizer,
        options: TranscriptionOptions,
        duration: float,
        peaks: np.ndarray | None = None,
        timeline: TimelineMap | None = None,
    ) -> LongForm:
        """The long-form loop over 30 s windows: yields a `WindowRequest` for each window it needs
        decoded, to be sent back its `WindowResult`, and then the window's final segments, timed
        within the audio's `duration` (`within_audio`).

        `peaks` (see `frame_peaks`) lets windows of digital silence be skipped undecoded.
        `timeline` maps the times of VAD-collected speech back to the original audio.
        The options' `prefix` begins the first window decoded only (a file's, as in
        faster-whisper's `transcribe`), not every window.
        """
        content_frames = mel.shape[-1] - N_FRAMES
        content_duration = content_frames * HOP_LENGTH / SAMPLE_RATE
        input_stride = self.input_stride

        seek_clips = clip_spans(options.clip_timestamps, FRAMES_PER_SECOND, content_frames)

        all_tokens: list[int] = []
        prompt_reset_since = 0
        remaining_prompt_length = self.checkpoint.config.n_text_ctx // 2 - 1
        initial_prompt_tokens: list[int] = []
        if options.initial_prompt is not None:
            prompt = options.initial_prompt
            initial_prompt_tokens = (
                tokenizer.encode(" " + prompt.strip()) if isinstance(prompt, str) else list(prompt)
            )
            all_tokens.extend(initial_prompt_tokens)
            remaining_prompt_length -= len(initial_prompt_tokens)

        segment_id = 1  # faster-whisper counts from 1 (openai-whisper's dicts from 0)
        last_speech_timestamp = 0.0
        clip_index = 0
        seek = seek_clips[0][0]
        while clip_index < len(seek_clips):
            clip_start, clip_end = seek_clips[clip_index]
            seek = max(seek, clip_start)
            if seek >= clip_end:
                clip_index += 1
                if clip_index < len(seek_clips):
                    seek = seek_clips[clip_index][0]
                continue
            time_offset = seek * HOP_LENGTH / SAMPLE_RATE
            window_end_time = (seek + options.window_frames) * HOP_LENGTH / SAMPLE_RATE
            segment_size = min(options.window_frames, content_frames - seek, clip_end - seek)
            segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
            if (
                peaks is not None
                and peaks[seek : seek + segment_size].max(initial=0.0) < SILENCE_PEAK
            ):
                # A deliberate departure from the reference, which hallucinates ("You") here.
                seek += segment_size
                continue
            if (sound := past_silence(peaks, seek, seek + segment_size)) > seek:
                seek = sound  # (a departure too: see past_silence)
                continue
            window = pad_or_trim(mel[:, seek : seek + segment_size], N_FRAMES)
            if options.carry_initial_prompt:
                ignored = max(len(initial_prompt_tokens), prompt_reset_since)
                prompt = initial_prompt_tokens + all_tokens[ignored:][-remaining_prompt_length:]
            else:
                prompt = all_tokens[prompt_reset_since:]
            result, audio_features = yield WindowRequest(window, prompt, tokenizer, options)
            if options.prefix is not None:
                options = replace(options, prefix=None)

            if is_no_speech(result, options):
                seek += segment_size  # fast-forward to the next window
                continue

            previous_seek = seek

            current, consumed, single_timestamp_ending = split_segments(
                tokenizer, result, seek, segment_size, input_stride
            )
            seek += consumed

            if options.word_timestamps:
                add_word_timestamps(
                    current,
                    self.model,
                    window_tokenizer(tokenizer, result),
                    audio_features,
                    segment_size,
                    self.alignment_heads,
                    options.prepend_punctuations,
                    options.append_punctuations,
                    last_speech_timestamp,
                )
                # Without timestamps a decode says nothing of where it stopped; in a window that
                # reached the end of the audio (or clip), going back to its last word's end left
                # the silence after it decoded alone: openai-whisper's tiny.en then hears "Thank
                # you." three times after JFK's last word.
                at_end = previous_seek + segment_size >= min(content_frames, clip_end)
                if not single_timestamp_ending and not (options.without_timestamps and at_end):
                    last_word_end = _last_word_end(current)
                    if last_word_end is not None and last_word_end > time_offset:
                        seek = round(last_word_end * FRAMES_PER_SECOND)
                threshold = options.hallucination_silence_threshold
                if threshold is not None:
                    skip_to = _skip_hallucinations(
                        current, threshold, time_offset, window_end_time, segment_duration,
                        content_duration, content_frames, last_speech_timestamp,
                        previous_seek, segment_size, single_timestamp_ending,
                    )  # fmt: skip
                    if skip_to is not None:
                        seek, restart = skip_to
                        if restart:
                            continue
                last_word_end = _last_word_end(current)
                if last_word_end is not None:
                    last_speech_timestamp = last_word_end

            for segment in current:  # instantaneous or empty segments carry no tokens
                if segment.start == segment.end or not segment.text.strip():
                    segment.text, segment.tokens, segment.words = "", [], []
            all_tokens.extend(t for segment in current for t in segment.tokens)
            if (
                not options.condition_on_previous_text
                or result.temperature > options.prompt_reset_on_temperature
            ):
                prompt_reset_since = len(all_tokens)  # a high-temperature window is no good context
            timed = [s if timeline is None else restore_times(s, timeline) for s in current]
            window_start = time_offset if timeline is None else timeline.original_time(time_offset)
            for segment in within_audio(timed, window_start, duration):
                if segment.text or options.keep_empty_segments:
                    segment.id = segment_id
                    segment_id += 1
                    yield segment


def locked(items: Iterator[T], lock: threading.RLock) -> Iterator[T]:
    """`items`, each one made while holding `lock`: a lazy transcription keeps other threads
    off the model while it runs, and not while its caller handles what it yielded."""
    while True:
        with lock:
            item = next(items, None)
        if item is None:
            return
        yield item


def with_progress(
    segments: Iterable[Segment], duration: float, name: str | None = None, shown: bool = True
) -> Iterator[Segment]:
    """`segments` as they come, with a bar on stderr of the seconds of audio done so far."""
    from tqdm import tqdm

    total = round(duration, 2)
    with tqdm(
        total=total,
        desc=name,
        file=sys.stderr,
        disable=not shown,
        bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}]",
    ) as bar:
        for segment in segments:
            bar.update(max(0.0, min(segment.end, total) - bar.n))
            yield segment
        bar.update(total - bar.n)


def past_silence(peaks: np.ndarray | None, start: int, end: int) -> int:
    """Where the sound begins in mel frames [start, end) (`peaks`: `frame_peaks`), if they
    begin with `LEADING_SILENCE_FRAMES` or more of digital silence; else `start`. A window begun
    in silence (after a silent window was skipped, say) times its first segment from within
    its first second (the model's max_initial_timestamp): up to 29 s before the speech; and
    its language, heard there, was the silence's ("en" for German after 35 s of it)."""
    if peaks is None:
        return start
    loud = peaks[start:end] >= SILENCE_PEAK
    # 0 where none is loud (silent windows are skipped whole) or there is no frame at all
    # (under 10 ms of audio: argmax of nothing was a ValueError)
    silent = int(np.argmax(loud)) if loud.size else 0
    return start + silent if silent >= LEADING_SILENCE_FRAMES else start


def leading_windows(mel: Tensor, count: int, start: int = 0) -> Iterator[Tensor]:
    """The first `count` 30 s windows of a long-form mel (the audio's, then 30 s of zeros) from
    frame `start` on, each padded to N_FRAMES; at least one, however short the audio."""
    content_frames = max(mel.shape[-1] - N_FRAMES, start + 1)
    for seek in range(start, content_frames, N_FRAMES)[:count]:
        yield pad_or_trim(mel[:, seek : seek + N_FRAMES], N_FRAMES)


def identical(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors hold the same values in the same shape, type and device."""
    return (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device) and torch.equal(a, b)


def window_tokenizer(tokenizer: Tokenizer, result: DecodingResult) -> Tokenizer:
    """The tokenizer of the language a window was decoded in (`multilingual`: its own)."""
    if result.language is None or result.language == tokenizer.language:
        return tokenizer
    return tokenizer.with_options(result.language, tokenizer.task)


def good_enough(result: DecodingResult, options: TranscriptionOptions) -> bool:
    """Whether a window's decode passes the fallback thresholds (or is judged silence)."""
    too_repetitive = (
        options.compression_ratio_threshold is not None
        and result.compression_ratio > options.compression_ratio_threshold
    )
    too_improbable = (
        options.log_prob_threshold is not None and result.avg_logprob < options.log_prob_threshold
    )
    silent = (
        options.no_speech_threshold is not None
        and result.no_speech_prob > options.no_speech_threshold
        and too_improbable
    )
    return silent or not (too_repetitive or too_improbable)


def best_of_failed(tried: list[DecodingResult], options: TranscriptionOptions) -> DecodingResult:
    """Where every temperature failed the thresholds: the most probable decode of those not too
    repetitive (else of all), at the last temperature (for prompt_reset_on_temperature), as
    faster-whisper keeps it. openai-whisper keeps the last, a sample at the highest temperature,
    which is often garbage (base translating Japanese: four segments to 24 s of a 5.4 s clip)."""
    threshold = options.compression_ratio_threshold
    varied = [r for r in tried if threshold is None or r.compression_ratio <= threshold]
    best = max(varied or tried, key=lambda r: r.avg_logprob)
    return replace(best, temperature=tried[-1].temperature)


def is_no_speech(result: DecodingResult, options: TranscriptionOptions) -> bool:
    """The no-speech skip: likely silence and not confidently decoded, or (faster-whisper's
    `log_prob_low_threshold`) decoded too improbably to keep, however likely speech.

    openai-whisper skips only when the final decode is improbable. We also skip when every
    temperature failed the thresholds (the result is not `good_enough`): what is left then is
    a random high-temperature sample, and on music or tones that sample is often a confident
    chant ("No, No, No, ...") which the reference would print. Speech windows are unaffected:
    their no-speech probability is low.
    """
    if options.no_speech_threshold is None:
        return False
    low = options.log_prob_low_threshold
    if low is not None and result.avg_logprob < low:
        return True
    if result.no_speech_prob <= options.no_speech_threshold:
        return False
    improbable = (
        options.log_prob_threshold is None or result.avg_logprob <= options.log_prob_threshold
    )
    return improbable or not good_enough(result, options)


def split_segments(
    tokenizer: Tokenizer,
    result: DecodingResult,
    seek: int,
    segment_size: int,
    input_stride: int = 2,
    keep_unfinished: bool = False,
) -> tuple[list[Segment], int, bool]:
    """Cut one window's tokens into segments at pairs of timestamp tokens.

    Returns the segments, how many mel frames of the window they consumed (the sequential
    loop re-decodes an unfinished last segment in the next window, unless `keep_unfinished`
    makes it a segment to the window's end), and whether the tokens ended on a lone timestamp.
    """
    tokens, timestamp_begin = result.tokens, tokenizer.timestamp_begin
    time_offset = seek * HOP_LENGTH / SAMPLE_RATE
    time_precision = input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per timestamp step
    window_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
    is_timestamp = [t >= timestamp_begin for t in tokens]
    single_timestamp_ending = is_timestamp[-2:] == [False, True]
    # Segment boundaries: the second of two consecutive timestamp tokens.
    consecutive = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]

    def segment(start: float, end: float, segment_tokens: list[int]) -> Segment:
        return _new_segment(tokenizer, seek, start, end, segment_tokens, result)

    if not consecutive:
        duration = window_duration
        timestamps = [t for t in tokens if t >= timestamp_begin]
        if timestamps and timestamps[-1] != timestamp_begin:
            duration = (timestamps[-1] - timestamp_begin) * time_precision
        return (
            [segment(time_offset, time_offset + duration, tokens)],
            segment_size,
            single_timestamp_ending,
        )

    segments = []
    last_slice = 0
    for current_slice in consecutive + ([len(tokens)] if single_timestamp_ending else []):
        sliced = tokens[last_slice:current_slice]
        start = time_offset + (sliced[0] - timestamp_begin) * time_precision
        end = time_offset + (sliced[-1] - timestamp_begin) * time_precision
        segments.append(segment(start, end, sliced))
        last_slice = current_slice
    if single_timestamp_ending:  # no speech after the last timestamp
        return segments, segment_size, True
    tail = tokens[last_slice:]
    if keep_unfinished and any(t < tokenizer.eot for t in tail):
        start = (
            time_offset + (tail[0] - timestamp_begin) * time_precision
            if is_timestamp[last_slice]
            else segments[-1].end
        )
        segments.append(segment(start, time_offset + window_duration, tail))
        return segments, segment_size, False
    # Resume at the start of the unfinished segment.
    return segments, (tokens[last_slice - 1] - timestamp_begin) * input_stride, False


def restore_times(segment: Segment, timeline: TimelineMap) -> Segment:
    """A segment of the speech-only audio, with times on the original audio's timeline. A word
    is mapped through the region of its middle (it never spans a silence cut out between
    two), and a segment with words spans them, as faster-whisper restores them."""
    for word in segment.words or []:
        region = timeline.region_of((word.start + word.end) / 2)
        word.start = round(timeline.original_time(word.start, region=region), 3)
        word.end = round(timeline.original_time(word.end, region=region), 3)
    if segment.words:
        segment.start, segment.end = segment.words[0].start, segment.words[-1].end
    else:
        segment.start = round(timeline.original_time(segment.start), 3)
        segment.end = round(timeline.original_time(segment.end, is_end=True), 3)
    return segment


def within_audio(segments: list[Segment], start: float, duration: float) -> list[Segment]:
    """A window's `segments` timed within the audio, of `duration` seconds (the window starts
    at `start`): every path's segments pass here once made (`window_steps`, the batched
    pipeline's windows), so none ends after the audio. Timestamp tokens come in 20 ms steps,
    and a window's last may point into its padding: the 1.095 s card's one segment ended at
    2.0 s (as openai-whisper's does), or batched, at 1.1 s. A segment with text that starts at
    or after the end is joined to the last one before it with text: the 0.96 s dev clip's
    " Good job." came at 1.0-2.0 s (its words lie at 0.72-0.88 s), and clamped alone it had no
    length, a cue no player shows; dropped (as the batched pipeline dropped it), its words were
    lost. With none before it, it holds all the window's words: it starts at its first word, or
    without word times, with the window."""
    joined: list[Segment] = []
    for segment in segments:
        if not segment.text or segment.start < duration:
            joined.append(segment)
            continue
        before = next((s for s in reversed(joined) if s.text), None)
        if before is None:
            heard = [w.start for w in segment.words or [] if w.start < duration]
            segment.start = heard[0] if heard else start
            joined.append(segment)
            continue
        before.text += segment.text
        before.tokens = before.tokens + segment.tokens
        before.end = max(before.end, segment.end)
        if segment.words is not None:
            before.words = (before.words or []) + segment.words
    for segment in joined:
        segment.start, segment.end = min(segment.start, duration), min(segment.end, duration)
        for word in segment.words or []:
            word.start, word.end = min(word.start, duration), min(word.end, duration)
    return joined


def _no_windows() -> LongForm:
    """The loop of audio with nothing to decode (VAD found no speech)."""
    yield from ()


def _new_segment(
    tokenizer: Tokenizer,
    seek: int,
    start: float,
    end: float,
    tokens: list[int],
    result: DecodingResult,
) -> Segment:
    return Segment(
        id=0,
        seek=seek,
        start=start,
        end=end,
        text=tokenizer.decode_text(tokens),
        tokens=tokens,
        avg_logprob=result.avg_logprob,
        compression_ratio=result.compression_ratio,
        no_speech_prob=result.no_speech_prob,
        temperature=result.temperature,
    )


def _last_word_end(segments: list[Segment]) -> float | None:
    words = [w for s in segments for w in (s.words or [])]
    return words[-1].end if words else None


_ANOMALY_PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


def _word_anomaly_score(word: Word) -> float:
    """High for words that are very short, very long or improbable: hallucination signs."""
    duration = word.end - word.start
    score = 1.0 if word.probability < 0.15 else 0.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def _is_segment_anomaly(segment: Segment | None) -> bool:
    if segment is None or not segment.words:
        return False
    words = [w for w in segment.words if w.word not in _ANOMALY_PUNCTUATION][:8]
    score = sum(_word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def _next_words_segment(segments: list[Segment]) -> Segment | None:
    return next((s for s in segments if s.words), None)


def _skip_hallucinations(
    current: list[Segment],
    threshold: float,
    time_offset: float,
    window_end_time: float,
    segment_duration: float,
    content_duration: float,
    content_frames: int,
    last_speech_timestamp: float,
    previous_seek: int,
    segment_size: int,
    single_timestamp_ending: bool,
) -> tuple[int, bool] | None:
    """openai-whisper's `hallucination_silence_threshold`: skip silence around likely
    hallucinations. Returns (new seek, whether to redo the window from there), or None.
    Drops the hallucinated segments from `current` in place."""
    seek: int | None = None
    if not single_timestamp_ending:
        last_word_end = _last_word_end(current)
        if last_word_end is not None and last_word_end > time_offset:
            remaining = window_end_time - last_word_end
            seek = (
                round(last_word_end * FRAMES_PER_SECOND)
                if remaining > threshold
                else previous_seek + segment_size
            )

    first = _next_words_segment(current)
    if first is not None and _is_segment_anomaly(first):
        gap = first.start - time_offset
        if gap > threshold:  # leading silence before a likely hallucination: skip it, redo
            return previous_seek + round(gap * FRAMES_PER_SECOND), True

    hal_last_end = last_speech_timestamp
    for i, segment in enumerate(current):
        if not segment.words:
            continue
        if _is_segment_anomaly(segment):
            following = _next_words_segment(current[i + 1 :])
            next_start = following.words[0].start if following else time_offset + segment_duration
            silence_before = (
                segment.start - hal_last_end > threshold
                or segment.start < threshold
                or segment.start - time_offset < 2.0
            )
            silence_after = (
                next_start - segment.end > threshold
                or _is_segment_anomaly(following)
                or window_end_time - segment.end < 2.0
            )
            if silence_before and silence_after:
                seek = round(max(time_offset + 1, segment.start) * FRAMES_PER_SECOND)
                if content_duration - segment.end < threshold:
                    seek = content_frames
                del current[i:]
                break
        hal_last_end = segment.end
    return (seek, False) if seek is not None else None


def transcribe_text(model: WhisperModel, audio: AudioInput, **options) -> str:
    """The whole transcript as one string (a convenience for tests and scripts)."""
    segments, _ = model.transcribe(audio, **options)
    return "".join(segment.text for segment in segments).strip()
