"""openai-whisper's Python API over `WhisperModel`, for code written against it:

    import whisperforge as whisper
    model = whisper.load_model("base")
    result = model.transcribe("audio.mp3")   # {"text", "segments", "language"}

Its option names (`logprob_threshold`, `sample_len`, `suppress_tokens="-1"`, `fp16`) and its
defaults (greedy decoding, one sample a temperature) are kept; the work is `WhisperModel`'s.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields, replace
from typing import Any, TextIO

import numpy as np
import torch

from .audio import N_FRAMES
from .decoding import DecodingOptions, DecodingResult
from .decoding import decode as decode_windows
from .decoding import detect_language as languages_of
from .errors import InvalidOptionError
from .model import ModelConfig
from .results import Segment
from .timing import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, TRANSLATED_WORD_TIMES
from .transcribe import TranscriptionOptions, WhisperModel, resolve_device, with_progress
from .writers import (
    DETECTING_LANGUAGE,
    WriterOptions,
    detected_language,
    expand_formats,
    openai_result,
    output_folder,
    output_paths,
    result_segments,
    timed_line,
    write,
    written_whole,
)

# openai-whisper's decode options that `TranscriptionOptions` names the same way.
SAME_NAMES = {
    "best_of", "beam_size", "patience", "prefix", "suppress_blank", "without_timestamps",
    "max_initial_timestamp",
}  # fmt: skip
# Its other decode options: the window's language and task, and these under other names.
OTHER_NAMES = {
    "task", "language", "length_penalty", "suppress_tokens", "sample_len", "fp16",
}  # fmt: skip


def load_model(
    name: str | os.PathLike,
    device: str | torch.device | None = None,
    download_root: str | None = None,
    in_memory: bool = False,
) -> OpenAIWhisper:
    """openai-whisper's `load_model`: a model name ("tiny.en", "base", "large-v3", ...), a
    model folder or an OpenAI `.pt` file, on `device` (CUDA when present). The weights are
    float16 on a GPU and float32 on the CPU, as openai-whisper's `fp16` default gives
    (`fp16=False` loads a float32 copy when first asked for); `in_memory` is accepted (the
    weights are always read into memory)."""
    del in_memory
    model = WhisperModel(name, device=str(device or "auto"), download_root=download_root)
    return OpenAIWhisper(model, (name, download_root))


class OpenAIWhisper:
    """A `WhisperModel` with openai-whisper's `transcribe` (see the module docstring); the
    `WhisperModel` is `model`. `source`: the name (or path) and download_root it was loaded
    from, for `fp16=False`'s float32 copy."""

    def __init__(
        self, model: WhisperModel, source: tuple[str | os.PathLike, str | None] | None = None
    ):
        self.model = model
        self.source = source
        self.float32_model: WhisperModel | None = None  # loaded at the first fp16=False

    def _model(self, fp16: bool) -> WhisperModel:
        """The model that decodes: openai-whisper's fp16=False computes in float32. A model
        loaded in 16 bits (a GPU's default) gets a float32 copy, loaded once from `source`,
        where openai-whisper holds float32 weights and casts them per call."""
        if fp16 or self.model.dtype == torch.float32:
            return self.model
        if self.source is None:
            warnings.warn(
                f"fp16=False has no effect: this model computes in {self.model.dtype} (chosen "
                f"when it loaded); for float32 load WhisperModel(..., compute_type='float32') "
                f"and wrap it in OpenAIWhisper",
                stacklevel=3,
            )
            return self.model
        with self.model.lock:
            if self.float32_model is None:
                name, download_root = self.source
                self.float32_model = WhisperModel(
                    name, str(self.model.device), compute_type="float32",
                    download_root=download_root,
                )  # fmt: skip
        return self.float32_model

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def is_multilingual(self) -> bool:
        return self.model.is_multilingual

    @property
    def dims(self) -> ModelConfig:
        """openai-whisper's `dims`: the architecture, in its field names."""
        return self.model.checkpoint.config

    @property
    def num_languages(self) -> int:
        """openai-whisper's count, from the vocabulary (99 for an English-only model too)."""
        return self.dims.n_vocab - 51765 - int(self.is_multilingual)

    @property
    def encoder(self) -> torch.nn.Module:
        """The plain network's encoder (openai-whisper's `model.encoder`)."""
        return self.model.model.encoder

    @property
    def decoder(self) -> torch.nn.Module:
        """The plain network's decoder (openai-whisper's `model.decoder`)."""
        return self.model.model.decoder

    def embed_audio(self, mel: torch.Tensor) -> torch.Tensor:
        """openai-whisper's: the encoder's output [B, 1500, d] for mels [B, n_mels, 3000], on
        the fast path where there is one; `decode` and `detect_language` take it too."""
        with self.model.lock:
            return self._features(self.model, mel)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The network's weights (`next(model.parameters()).device`, as scripts ask)."""
        return self.model.model.parameters()

    def eval(self) -> OpenAIWhisper:
        return self  # always in inference mode

    def to(self, *args: Any, **kwargs: Any) -> OpenAIWhisper:
        """`nn.Module.to`, as scripts call it on openai-whisper's model (`.to("cuda")`): a
        device other than the model's loads it again there, from `source`, in that device's
        default compute type, and the model is moved in place. A dtype changes nothing: as in
        openai-whisper, each call's `fp16` says what the model computes in."""
        devices = [a for a in (*args, kwargs.get("device")) if isinstance(a, (str, torch.device))]
        if not devices:
            return self
        device = resolve_device(str(devices[0]))
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device == self.model.device:
            return self
        if self.source is None:
            raise InvalidOptionError(
                f"this model was wrapped without its source, so it cannot move to {device}; "
                f"load it there: WhisperModel(..., device={str(device)!r})"
            )
        name, download_root = self.source
        with self.model.lock:
            self.model = WhisperModel(name, str(device), download_root=download_root)
            self.float32_model = None
        return self

    def cuda(self, device: int | str | torch.device | None = None) -> OpenAIWhisper:
        return self.to(f"cuda:{device}" if isinstance(device, int) else device or "cuda")

    def cpu(self) -> OpenAIWhisper:
        return self.to("cpu")

    def half(self) -> OpenAIWhisper:
        return self  # each call's fp16 (True unless asked) decides, as in openai-whisper

    def float(self) -> OpenAIWhisper:
        return self  # fp16=False computes in float32, as in openai-whisper

    def detect_language(self, mel: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """openai-whisper's: the likeliest language's token and every language's probability,
        for a mel [n_mels, 3000] (a dict) or each of a batch [B, n_mels, 3000] (a list)."""
        if not self.is_multilingual:
            raise ValueError("This model doesn't have language tokens so it can't perform lang id")
        mel = as_mel(mel)
        single = mel.ndim == 2
        with self.model.lock:
            features = self._features(self.model, mel)
            codes, probs = languages_of(self.model.model, self.model.tokenizer, features)
        tokens = torch.tensor([self.model.tokenizer.to_language_token(code) for code in codes])
        return (tokens[0], probs[0]) if single else (tokens, probs)

    def decode(
        self, mel: torch.Tensor, options: DecodingOptions | None = None, **changes: Any
    ) -> DecodingResult | list[DecodingResult]:
        """openai-whisper's `decode`: one 30 s window's mel [n_mels, 3000] (a result), or a
        batch [B, n_mels, 3000] (a list), with `options` and `changes` to them; task "lang_id"
        detects the language only (`language`, `language_probs`)."""
        options = replace(options or DecodingOptions(), **changes)
        mel = as_mel(mel)
        single = mel.ndim == 2
        model = self._model(options.fp16)
        with model.lock:
            features = self._features(model, mel)
            results = decode_windows(model.decode_model, model.tokenizer, features, options)
        for result, window_features in zip(results, features):
            result.audio_features = window_features  # openai-whisper's results hold them
        return results[0] if single else results

    def _features(self, model: WhisperModel, mel: torch.Tensor) -> torch.Tensor:
        """The encoder's output for a mel of 30 s windows [n_mels, 3000] or [B, n_mels, 3000];
        openai-whisper's way, the encoder's output itself [(B,) 1500, d] is taken as it is."""
        windows = mel[None] if mel.ndim == 2 else mel
        encoded = (self.dims.n_audio_ctx, self.dims.n_audio_state)
        if windows.ndim == 3 and tuple(windows.shape[1:]) == encoded:
            return windows.to(model.device, model.dtype)
        shape = (self.dims.n_mels, N_FRAMES)
        if windows.ndim != 3 or tuple(windows.shape[1:]) != shape:
            raise InvalidOptionError(
                f"expected a mel of shape {shape} (or a batch of them), got {tuple(mel.shape)}; "
                f"make it with log_mel_spectrogram(pad_or_trim(audio), n_mels={shape[0]})"
            )
        return model.encode(windows)

    def transcribe(
        self,
        audio: str | os.PathLike | np.ndarray | torch.Tensor,
        *,
        verbose: bool | None = None,
        temperature: float | Iterable[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        compression_ratio_threshold: float | None = 2.4,
        logprob_threshold: float | None = -1.0,
        no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True,
        initial_prompt: str | None = None,
        carry_initial_prompt: bool = False,
        word_timestamps: bool = False,
        prepend_punctuations: str = PREPEND_PUNCTUATIONS,
        append_punctuations: str = APPEND_PUNCTUATIONS,
        clip_timestamps: str | list[float] = "0",
        hallucination_silence_threshold: float | None = None,
        **decode_options: Any,
    ) -> dict[str, Any]:
        """openai-whisper's `transcribe`: its result dict. `verbose`: True prints each segment
        as it is decoded, False shows a progress bar, None neither. `decode_options` are its
        `DecodingOptions`: task, language, best_of, beam_size, patience, length_penalty,
        prefix (the first window's, as `WhisperModel.transcribe` takes it; openai-whisper forces
        it before the first timestamp of every window, which often ends the window at once;
        `decode` keeps openai-whisper's way), suppress_tokens (a "-1,..." string or ids),
        suppress_blank, without_timestamps, max_initial_timestamp, sample_len (tokens a window
        may sample), and fp16 (False: decode in float32, see `_model`)."""
        unknown = set(decode_options) - SAME_NAMES - OTHER_NAMES
        if unknown:
            raise TypeError(f"unknown decoding option(s): {', '.join(sorted(unknown))}")
        if word_timestamps and decode_options.get("task") == "translate":
            warnings.warn(TRANSLATED_WORD_TIMES, stacklevel=2)
        model = self._model(decode_options.get("fp16", True))
        options = {name: decode_options[name] for name in SAME_NAMES & set(decode_options)}
        options.setdefault("beam_size", 1)  # openai-whisper: greedy unless a beam is asked for
        options.setdefault("best_of", 1)
        transcription = TranscriptionOptions.from_arguments(
            temperature=temperature,
            compression_ratio_threshold=compression_ratio_threshold,
            log_prob_threshold=logprob_threshold,
            no_speech_threshold=no_speech_threshold,
            condition_on_previous_text=condition_on_previous_text,
            initial_prompt=initial_prompt,
            carry_initial_prompt=carry_initial_prompt,
            word_timestamps=word_timestamps,
            prepend_punctuations=prepend_punctuations,
            append_punctuations=append_punctuations,
            clip_timestamps=clip_timestamps,
            hallucination_silence_threshold=hallucination_silence_threshold,
            keep_empty_segments=True,
            suppress_tokens=decode_options.get("suppress_tokens", "-1") or None,  # "-1,..." too
            max_new_tokens=decode_options.get("sample_len"),
            nmt_length_penalty=decode_options.get("length_penalty"),
            **options,
        )
        language = decode_options.get("language")
        detect = language is None and model.is_multilingual
        if detect and verbose:  # openai-whisper's lines, word for word
            print(DETECTING_LANGUAGE)
        segments, info = model.transcribe_with(
            audio, transcription, language, decode_options.get("task", "transcribe")
        )
        if detect and verbose is not None:
            print(detected_language(info.language))
        done: list[Segment] = []
        for segment in with_progress(segments, info.duration, shown=verbose is False):
            done.append(segment)
            if verbose:
                print(timed_line(segment), flush=True)
        result = openai_result(done, info)
        if language is not None:
            result["language"] = language  # as openai-whisper gives it: as it was given
        return result


def as_mel(mel: Any) -> torch.Tensor:
    """A mel (or the encoder's output) as a tensor: a NumPy array (librosa's, or one saved with
    np.save) is taken as its values; it was a raw AttributeError (no `.to`) in the encoder."""
    if isinstance(mel, torch.Tensor):
        return mel
    if isinstance(mel, np.ndarray) and mel.dtype.kind in "fiu":
        return torch.from_numpy(np.array(mel, dtype=np.float32))  # a copy: read-only ones too
    raise InvalidOptionError(
        f"expected a mel as a torch tensor or a NumPy float array, got {type(mel).__name__}; "
        "make it with log_mel_spectrogram(pad_or_trim(audio))"
    )


def transcribe(
    model: OpenAIWhisper, audio: str | os.PathLike | np.ndarray | torch.Tensor, **options: Any
) -> dict[str, Any]:
    """openai-whisper's `whisper.transcribe(model, audio, ...)`: `OpenAIWhisper.transcribe`."""
    return model.transcribe(audio, **options)


def decode(
    model: OpenAIWhisper, mel: torch.Tensor, options: DecodingOptions | None = None, **changes: Any
) -> DecodingResult | list[DecodingResult]:
    """openai-whisper's `whisper.decode(model, mel, options)`."""
    return model.decode(mel, options, **changes)


def detect_language(model: OpenAIWhisper, mel: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """openai-whisper's `whisper.detect_language(model, mel)`."""
    return model.detect_language(mel)


class ResultWriter:
    """openai-whisper's `whisper.utils` writer of one format (`WriteSRT(output_dir)`, ...):
    `writer(result, audio_path, options=None, **options)` writes a `transcribe` result dict as
    `<output_dir>/<audio's name>.<extension>`, and `writer.write_result(result, file, options=None,
    **options)` writes it to an open text file. The options are the subtitle ones
    (max_line_width, max_line_count, highlight_words, max_words_per_line), read as
    openai-whisper reads them: a keyword's value, else the dict's (its other keys unread)."""

    extension: str

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = output_dir

    def __call__(
        self,
        result: Mapping[str, Any],
        audio_path: str | os.PathLike,
        options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        (path,) = output_paths(audio_path, output_folder(self.output_dir), [self.extension])
        with written_whole(path) as file:
            self.write_result(result, file, options, **kwargs)

    def write_result(
        self,
        result: Mapping[str, Any],
        file: TextIO,
        options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.extension == "json":  # the dict as it is, every key kept, as openai-whisper's
            json.dump(result, file)
            return
        options = options or {}
        read = {f.name: kwargs.get(f.name) or options.get(f.name) for f in fields(WriterOptions)}
        chosen = {**kwargs, **{name: value for name, value in read.items() if value}}
        info = {"language": result.get("language")}
        write(self.extension, result_segments(result), info, file, chosen)  # unknown: refused


class WriteTXT(ResultWriter):
    extension = "txt"


class WriteSRT(ResultWriter):
    extension = "srt"


class WriteVTT(ResultWriter):
    extension = "vtt"


class WriteTSV(ResultWriter):
    extension = "tsv"


class WriteJSON(ResultWriter):
    extension = "json"


RESULT_WRITERS = {writer.extension: writer for writer in (WriteTXT, WriteSRT, WriteVTT, WriteTSV,
                                                          WriteJSON)}  # fmt: skip


def get_writer(output_format: str, output_dir: str | os.PathLike) -> Callable[..., None]:
    """openai-whisper's `whisper.utils.get_writer`: one format's `ResultWriter`, or for "all"
    (txt, srt, vtt, tsv and json; or a list such as "srt,vtt") a function `writer(result,
    audio_path, options=None, **options)` that checks every target before it writes one."""
    formats = expand_formats(output_format)
    if len(formats) == 1:
        return RESULT_WRITERS[formats[0]](output_dir)

    def write_all(
        result: Mapping[str, Any],
        audio_path: str | os.PathLike,
        options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        output_paths(audio_path, output_folder(output_dir), formats)
        for name in formats:
            RESULT_WRITERS[name](output_dir)(result, audio_path, options, **kwargs)

    return write_all
