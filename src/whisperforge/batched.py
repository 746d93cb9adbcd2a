"""VAD-batched transcription: the throughput mode that keeps temperature fallback.

Silero VAD finds the speech, neighbouring regions are packed into windows of at most 30 s,
and windows are decoded `batch_size` at a time. Unlike faster-whisper's and WhisperX's batched
modes, a window that fails the fallback thresholds is not kept as is: it is decoded again at
the next temperature, together with the other windows that failed. Windows are independent
(no conditioning on previous text), which is what lets them share a batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import fields

import numpy as np
import torch

from .audio import (
    HOP_LENGTH,
    N_FRAMES,
    SAMPLE_RATE,
    AudioInput,
    load_audio,
    log_mel_spectrogram,
    pad_or_trim,
)
from .decoding import DecodingResult, decode, detect_language
from .errors import InvalidOptionError
from .results import Segment, TranscriptionInfo
from .timing import add_word_timestamps
from .tokenizer import Tokenizer, normalize_language
from .transcribe import (
    TranscriptionOptions,
    WhisperModel,
    good_enough,
    is_no_speech,
    split_segments,
)
from .vad import VadOptions, Window, detect_speech, pack_windows

# Batched mode's VAD: short pauses split regions, regions never exceed a window.
BATCHED_VAD = VadOptions(max_speech_duration_s=30, min_silence_duration_ms=160)


class BatchedInferencePipeline:
    """`BatchedInferencePipeline(model).transcribe(audio, batch_size=16)` like faster-whisper's."""

    def __init__(self, model: WhisperModel):
        self.model = model

    def transcribe(
        self,
        audio: AudioInput,
        language: str | None = None,
        task: str = "transcribe",
        batch_size: int = 16,
        temperature: float | Iterable[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        vad_parameters: VadOptions | dict | None = None,
        **options,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """Options as `WhisperModel.transcribe` (beam_size, word_timestamps, thresholds, ...)."""
        model = self.model
        if batch_size < 1:
            raise InvalidOptionError("batch_size must be at least 1")
        known = {f.name for f in fields(TranscriptionOptions)}
        unknown = set(options) - known
        if unknown:
            raise InvalidOptionError(
                f"unknown option(s) for batched transcription: {sorted(unknown)}"
            )
        if task == "translate" and not model.is_multilingual:
            raise InvalidOptionError("this model is English-only and cannot translate")
        if language is not None:
            language = normalize_language(language, model.supported_languages)
        temperatures = (
            (temperature,) if isinstance(temperature, (int, float)) else tuple(temperature)
        )
        options["condition_on_previous_text"] = False  # windows are decoded side by side
        transcription_options = TranscriptionOptions(temperatures=temperatures, **options)
        if isinstance(vad_parameters, dict):
            vad_parameters = VadOptions(**{**BATCHED_VAD.__dict__, **vad_parameters})

        samples = load_audio(audio)
        duration = len(samples) / SAMPLE_RATE
        windows = pack_windows(detect_speech(samples, vad_parameters or BATCHED_VAD))
        speech = sum(r.end - r.start for w in windows for r in w.regions) / SAMPLE_RATE

        language_probability = 1.0
        if language is None:
            language = "en"
            if model.is_multilingual and windows:
                features = model.encode(self._mels(samples, windows[:1]))
                languages, probs = detect_language(model.model, model.tokenizer, features)
                language, language_probability = languages[0], probs[0][languages[0]]
        info = TranscriptionInfo(
            language,
            language_probability,
            duration,
            speech,
            None,
            transcription_options,
            vad_parameters,
        )
        tokenizer = model.tokenizer.with_options(language, task)
        return self._segments(samples, windows, tokenizer, transcription_options, batch_size), info

    def _mels(self, samples: np.ndarray, windows: list[Window]) -> torch.Tensor:
        n_mels = self.model.checkpoint.config.n_mels
        return torch.stack(
            [
                pad_or_trim(
                    log_mel_spectrogram(samples[w.start : w.end], n_mels, device=self.model.device),
                    N_FRAMES,
                )
                for w in windows
            ]
        )

    def decode_with_fallback(
        self,
        features: torch.Tensor,
        tokenizer: Tokenizer,
        options: TranscriptionOptions,
        prompt: list[int],
    ) -> list[DecodingResult]:
        """Decode every window; the ones failing the thresholds again, batched, one temperature up."""
        results: list[DecodingResult | None] = [None] * features.shape[0]
        pending = list(range(features.shape[0]))
        for i, t in enumerate(options.temperatures):
            decode_options = options.decoding_options(
                t, tokenizer.language or "en", tokenizer.task, prompt
            )
            last = i == len(options.temperatures) - 1
            decoded = decode(self.model.model, tokenizer, features[pending], decode_options)
            still_pending = []
            for index, result in zip(pending, decoded):
                results[index] = result
                if not (last or good_enough(result, options)):
                    still_pending.append(index)
            pending = still_pending
            if not pending:
                break
        return results  # type: ignore[return-value]

    def _segments(
        self,
        samples: np.ndarray,
        windows: list[Window],
        tokenizer: Tokenizer,
        options: TranscriptionOptions,
        batch_size: int,
    ) -> Iterator[Segment]:
        prompt: list[int] = []
        if isinstance(options.initial_prompt, str):
            prompt = tokenizer.encode(" " + options.initial_prompt.strip())
        elif options.initial_prompt:
            prompt = list(options.initial_prompt)
        segment_id = 0
        for first in range(0, len(windows), batch_size):
            batch = windows[first : first + batch_size]
            features = self.model.encode(self._mels(samples, batch))
            results = self.decode_with_fallback(features, tokenizer, options, prompt)
            for window, window_features, result in zip(batch, features, results):
                if is_no_speech(result, options):
                    continue
                seek = round(window.start / HOP_LENGTH)
                size = min(N_FRAMES, -(-(window.end - window.start) // HOP_LENGTH))
                segments, _, _ = split_segments(tokenizer, result, seek, size, keep_unfinished=True)
                if options.word_timestamps:
                    add_word_timestamps(
                        segments, self.model.model, tokenizer, window_features, size,
                        self.model.alignment_heads, options.prepend_punctuations,
                        options.append_punctuations,
                    )  # fmt: skip
                for segment in segments:
                    if segment.start == segment.end or not segment.text.strip():
                        continue
                    segment.id = segment_id
                    segment_id += 1
                    yield segment
