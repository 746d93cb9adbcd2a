"""VAD-batched transcription: the throughput mode that keeps temperature fallback.

Silero VAD finds the speech, neighbouring regions are packed into windows of at most 30 s,
and windows are decoded `batch_size` at a time, on the GPU runtime's batched step where there
is one. Windows from many files share batches (`transcribe_many`). Unlike faster-whisper's and
WhisperX's batched modes, a window that fails the fallback thresholds is not kept as is: it is
decoded again at the next temperature, batched with the other windows of its batch that failed.

By default windows are independent (no conditioning on previous text), which is what lets all
of them share batches. With `condition_on_previous_text=True` a file's windows are instead cut
into up to `batch_size` chains of consecutive windows, split at pauses; each chain runs
`transcribe`'s own long-form loop over its stretch of audio (seeking to the last complete
segment, prompted with the chain's previous text, fallback per window), and a batch takes the
window that each running chain waits for, every row with its own prompt. Only a chain's first
window goes without context; one chain is exactly the sequential `transcribe`.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from itertools import pairwise
from typing import TypeVar

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
from .decoding import DecodingResult, compression_ratio, decode
from .errors import InvalidOptionError, WhisperforgeError, check_whole_number
from .results import Segment, TranscriptionInfo
from .timing import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, add_word_timestamps
from .tokenizer import Tokenizer, normalize_language
from .transcribe import (
    SILENCE_PEAK,
    LongForm,
    TranscriptionOptions,
    WhisperModel,
    WindowRequest,
    WindowResult,
    best_of_failed,
    clip_spans,
    good_enough,
    is_no_speech,
    locked,
    options_of,
    parse_clip_timestamps,
    split_segments,
    window_tokenizer,
    with_progress,
    within_audio,
)
from .vad import (
    VAD_PARAMETERS_UNUSED,
    SpeechRegion,
    VadOptions,
    Window,
    detect_speech_many,
    pack_windows,
    vad_options_of,
)

# Batched mode's VAD: short pauses split regions, regions never exceed a window.
BATCHED_VAD = VadOptions(max_speech_duration_s=30, min_silence_duration_ms=160)
CPU_BATCH_SIZE = 8  # on the CPU a larger batch only costs memory: the cores are busy already
MAX_AUTO_BATCH_SIZE = 128  # turbo, 60 min: RTFx 2821 at 64, 3053 at 128, 3088 at 160 (H100)
# A window decoded only up to this many mel frames (1 s) before its end is done; more, and the
# rest is decoded as a window of its own.
MIN_CONTINUATION_FRAMES = 100
READ_AHEAD = 4  # threads decoding files and finding their speech for `transcribe_many`
R = TypeVar("R")


@dataclass
class FileTranscription:
    """One input of `transcribe_many`: its segments and info, or the error that stopped it."""

    index: int  # position in the input
    segments: list[Segment] = field(default_factory=list)
    info: TranscriptionInfo | None = None
    error: str | None = None


@dataclass(frozen=True)
class FileRequest:
    """An input of `transcribe_many` with a language or task of its own; None (or "") takes
    the call's."""

    audio: AudioInput
    language: str | None = None
    task: str | None = None


@dataclass
class _File:
    """A file in flight: its audio, its windows, and the segments of the windows decoded so far."""

    result: FileTranscription
    samples: np.ndarray
    windows: list[Window]
    tokenizer: Tokenizer
    remaining: int = 0  # windows not decoded yet
    # For each window, the packed window it continues (itself unless it is a continuation).
    roots: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.roots = list(range(len(self.windows)))

    def continue_window(self, index: int, window: Window) -> int:
        """Queue the rest of window `index` (decoded only up to a point) as a new window."""
        self.windows.append(window)
        self.roots.append(self.roots[index])
        self.remaining += 1
        return len(self.windows) - 1


def window_vad(vad: VadOptions, options: TranscriptionOptions) -> VadOptions:
    """The VAD options a batched transcription cuts windows with: speech no longer than a
    window (`chunk_length`, 30 s by default), as faster-whisper's batched `chunk_length` sets."""
    return replace(
        vad, max_speech_duration_s=min(vad.max_speech_duration_s, options.window_seconds)
    )


class BatchedInferencePipeline:
    """`BatchedInferencePipeline(model).transcribe(audio, batch_size=16)` like faster-whisper's."""

    def __init__(self, model: WhisperModel):
        self.model = model
        self._batch_ceiling: int | None = None  # lowered when a batch ran out of memory

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
        condition_on_previous_text: bool = False,
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
        vad_filter: bool = True,
        vad_parameters: VadOptions | dict | None = None,
        max_new_tokens: int | None = None,
        chunk_length: float | None = None,
        clip_timestamps: str | Iterable[float] | Iterable[dict] | None = None,
        hallucination_silence_threshold: float | None = None,
        batch_size: int | None = None,
        hotwords: str | None = None,
        language_detection_threshold: float = 0.5,
        language_detection_segments: int = 1,
        carry_initial_prompt: bool = False,
        log_prob_low_threshold: float | None = None,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """faster-whisper's batched `transcribe`, its arguments in its order; they mean what
        they mean in `WhisperModel.transcribe`. Three defaults differ from faster-whisper's:
        segments are timed within each window (its default is `without_timestamps=True`, a
        segment a window: pass it for that); `condition_on_previous_text=False`, which is what
        its batched mode does whatever it is given (True here conditions each chain of windows
        on the one before); and `batch_size=None` picks the largest batch that fits the
        device's free memory.

        The windows come from the VAD, or from `clip_timestamps` where given: faster-whisper's
        list of {"start": seconds, "end": seconds}, or `transcribe`'s seconds "start,end,...",
        each clip in windows of its own (the audio between clips is never decoded).
        With `vad_filter=False` and no clips, the audio is cut into 30 s windows as it is.
        `chunk_length`: windows (and the VAD's speech) of at most that many seconds."""
        # locals(): the arguments, before any other name is set here
        arguments = options_of(locals(), "batch_size", "clip_timestamps")
        options = self._options(language, task, batch_size, **arguments)
        return self.transcribe_with(
            audio, options, language, task, batch_size, clip_timestamps, vad_filter,
            vad_parameters, log_progress,
        )  # fmt: skip

    def transcribe_with(
        self,
        audio: AudioInput,
        options: TranscriptionOptions,
        language: str | None = None,
        task: str = "transcribe",
        batch_size: int | None = None,
        clip_timestamps: str | Iterable[float] | Iterable[dict] | None = None,
        vad_filter: bool = True,
        vad_parameters: VadOptions | dict | None = None,
        log_progress: bool = False,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """`transcribe` with its options made (`TranscriptionOptions.from_arguments`; note
        that batched transcription's default is `condition_on_previous_text=False`)."""
        self._check(language, task, batch_size)
        if vad_parameters is not None and not vad_filter:
            warnings.warn(VAD_PARAMETERS_UNUSED, stacklevel=3)  # transcribe's caller's line
        if isinstance(clip_timestamps, (str, list, tuple)) and not clip_timestamps:
            clip_timestamps = None  # faster-whisper's: no clips given, the VAD finds the speech
        vad = window_vad(vad_options_of(vad_parameters, BATCHED_VAD), options)
        size = batch_size or self.auto_batch_size()
        samples = load_audio(audio)
        seconds = options.window_seconds
        with self.model.lock:  # the VAD and the mel run on the model's device
            # info.vad_options: None where no VAD ran (faster-whisper's, and `transcribe`'s).
            used = vad if vad_filter and clip_timestamps is None else None
            if clip_timestamps is not None:  # each clip windowed alone: the gaps are left out
                clips = clip_regions(clip_timestamps, len(samples))
                windows = [w for clip in clips for w in pack_windows([clip], seconds)]
            else:
                windows = self._windows([samples], used, seconds)[0]
            file = self._open(0, samples, windows, language, task, options, used, size)
        info = file.result.info
        assert info is not None
        segments = locked(self._in_order(file, options, size), self.model.lock)
        return (with_progress(segments, info.duration) if log_progress else segments), info

    def _in_order(self, file: _File, options: TranscriptionOptions, size: int) -> Iterator[Segment]:
        """One file's segments in time order, each packed window's as soon as it and the ones
        before it are done (a window's continuation may be decoded batches later)."""
        parts: dict[int, list[Segment]] = {}
        open_chains = dict.fromkeys(range(len(file.windows)), 1)  # root -> windows pending
        next_root, number = 0, 1  # segment ids from 1, as faster-whisper's
        for _, index, window_segments, continued in self._decode(iter([file]), options, size):
            if index < 0:  # no speech: no windows
                return
            root = file.roots[index]
            parts.setdefault(root, []).extend(window_segments)
            open_chains[root] += int(continued) - 1
            while next_root in open_chains and open_chains[next_root] == 0:
                for segment in parts.pop(next_root, []):
                    segment.id, number = number, number + 1
                    yield segment
                next_root += 1

    def transcribe_many(
        self,
        audios: Iterable[AudioInput | FileRequest],
        language: str | None = None,
        task: str = "transcribe",
        batch_size: int | None = None,
        temperature: float | Iterable[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        vad_filter: bool = True,
        vad_parameters: VadOptions | dict | None = None,
        **options,
    ) -> Iterator[FileTranscription]:
        """Transcribe many files with their windows sharing batches; one result per input, in
        input order, as soon as the file is done. A file that cannot be read or transcribed
        yields a result with its `error`, and the others go on. Files are read lazily, a few
        ahead of the batches, so a corpus never sits in memory at once. The options are
        `transcribe`'s but `clip_timestamps` (one file's); `vad_filter=False` cuts each file
        every `chunk_length` (30) seconds as it is. An input given as a `FileRequest` may
        name its own language or task; a bad one is that file's error. Files of one language
        and task share batches, so give them one after another: a batch ends where the next
        window decodes otherwise."""
        options = self._options(language, task, batch_size, temperature, **options)
        vad = window_vad(vad_options_of(vad_parameters, BATCHED_VAD), options)
        used = vad if vad_filter else None
        size = batch_size or self.auto_batch_size()
        opened: deque[_File] = deque()

        def files() -> Iterator[_File]:
            # Audio decoding runs on threads (PyAV releases the GIL) a few files ahead, so it
            # overlaps the model's work on the batches; the VAD then runs on the files read so
            # far as one batch (its LSTM is as fast for several files as for one).
            inputs = enumerate(audios)
            with ThreadPoolExecutor(READ_AHEAD) as pool:
                ahead: deque[tuple[int, Future]] = deque()
                while True:
                    while len(ahead) < 2 * READ_AHEAD and (item := next(inputs, None)):
                        read = pool.submit(self._read, item[1], language, task)
                        ahead.append((item[0], read))
                    if not ahead:
                        return
                    group = [ahead.popleft()]  # the next file, and those already read after it
                    while ahead and ahead[0][1].done():
                        group.append(ahead.popleft())
                    for file in self._open_group(group, options, used, size):
                        opened.append(file)
                        yield file

        def finished() -> Iterator[FileTranscription]:
            while opened and opened[0].remaining == 0:
                result = opened.popleft().result
                # Continuations are decoded after later windows: put the segments in time order.
                result.segments.sort(key=lambda segment: segment.start)
                for number, segment in enumerate(result.segments, start=1):
                    segment.id = number
                yield result

        for file, _, window_segments, _ in locked(
            self._decode(files(), options, size), self.model.lock
        ):
            if file is not None:
                file.result.segments.extend(window_segments)
            yield from finished()
        yield from finished()

    # --- set-up ----------------------------------------------------------------------------

    def _options(
        self,
        language: str | None,
        task: str,
        batch_size: int | None,
        temperature: float | Iterable[float],
        **options,
    ) -> TranscriptionOptions:
        self._check(language, task, batch_size)
        return batched_options(temperature=temperature, **options)

    def _check(self, language: str | None, task: str, batch_size: int | None) -> None:
        if batch_size is not None:
            check_whole_number("batch_size", batch_size, hint=" (or None to pick one)")
        self.model.check_task(task)
        if language is not None:
            normalize_language(language, self.model.supported_languages)

    def _read(
        self, audio: AudioInput | FileRequest, language: str | None, task: str
    ) -> tuple[np.ndarray, str | None, str]:
        """A file's samples, language and task (its own where it names them, else the call's);
        its own are checked before its audio is read, so a bad one fails the file at once."""
        if isinstance(audio, FileRequest):
            language, task = audio.language or language, audio.task or task
            self._check(language, task, None)
            audio = audio.audio
        return load_audio(audio), language, task

    def _windows(
        self, audios: list[np.ndarray], vad: VadOptions | None, seconds: float
    ) -> list[list[Window]]:
        """Each file's speech packed into windows of up to `seconds`; without `vad`, its audio
        cut every `seconds`, less the windows of digital silence (left undecoded, as
        `transcribe` leaves them: Whisper hears "you" there). The VAD runs on the model's
        device: on a GPU its LSTM over whole files is one cuDNN call, ten times cheaper than on
        CPU threads."""
        if vad is not None:
            speech = detect_speech_many(audios, vad, str(self.model.device))
            return [pack_windows(regions, seconds) for regions in speech]
        return [
            [w for w in pack_windows([SpeechRegion(0, len(samples))], seconds)
             if np.abs(samples[w.start : w.end]).max(initial=0.0) >= SILENCE_PEAK]
            for samples in audios
        ]  # fmt: skip

    def _open_group(
        self,
        group: list[tuple[int, Future[tuple[np.ndarray, str | None, str]]]],
        options: TranscriptionOptions,
        vad: VadOptions | None,
        size: int,
    ) -> list[_File]:
        """Files read on threads (`_read`: samples, language, task), opened in input order with
        one VAD call for them all (none without `vad`); a file that could not be read or opened
        carries its error."""
        done: dict[int, _File] = {}
        read: list[tuple[int, tuple[np.ndarray, str | None, str]]] = []
        for index, reading in group:
            try:
                read.append((index, reading.result()))
            except (WhisperforgeError, OSError, ValueError) as error:
                done[index] = self._failed(index, error)
        audios = [samples for _, (samples, _, _) in read]
        speech = self._windows(audios, vad, options.window_seconds)
        for (index, (samples, language, task)), windows in zip(read, speech):
            try:
                done[index] = self._open(
                    index, samples, windows, language, task, options, vad, size
                )
            except (WhisperforgeError, OSError, ValueError) as error:
                done[index] = self._failed(index, error)
        return [done[index] for index, _ in group]

    def _failed(self, index: int, error: Exception) -> _File:
        """A file that could not be read or opened: its result carries the error."""
        result = FileTranscription(index, error=f"{type(error).__name__}: {error}")
        return _File(result, np.zeros(0, np.float32), [], self.model.tokenizer)

    def _open(
        self,
        index: int,
        samples: np.ndarray,
        windows: list[Window],
        language: str | None,
        task: str,
        options: TranscriptionOptions,
        vad: VadOptions | None,
        size: int,
    ) -> _File:
        """A read file ready to decode: its language known (detected on its first window), and
        with conditioning on, its windows joined into up to `size` chains."""
        model = self.model
        speech = sum(r.end - r.start for w in windows for r in w.regions) / SAMPLE_RATE
        language_probability, all_language_probs = 1.0, None
        if language is None:
            # No speech: none was heard (as `transcribe` tells it), unless the model knows one.
            language, language_probability = "en", float(not model.is_multilingual)
            if model.is_multilingual:  # a list still, as faster-whisper's (and `transcribe`'s)
                all_language_probs = [(language, language_probability)]
            if model.is_multilingual and windows:
                mels = self._mels(samples, windows[: options.language_detection_segments])
                language, language_probability, all_language_probs = model.language_of(
                    mels, options.language_detection_threshold
                )
        else:
            language = normalize_language(language, model.supported_languages)
        duration = len(samples) / SAMPLE_RATE
        shown = options.as_reported(model.tokenizer)
        info = TranscriptionInfo(
            language, language_probability, duration, speech, all_language_probs, shown, vad
        )
        tokenizer = model.tokenizer.with_options(language, task)
        result = FileTranscription(index, info=info)
        if options.condition_on_previous_text:
            windows = chains(windows, size)
        return _File(result, samples, windows, tokenizer, remaining=len(windows))

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

    # --- batches ---------------------------------------------------------------------------

    def auto_batch_size(self) -> int:
        """The largest batch the device's free memory holds (CPU: `CPU_BATCH_SIZE`). A window
        costs its encoder activations, its cross K,V for every decoder layer, and the self K,V
        of its rows (5 per window covers beam search and best-of)."""
        model = self.model
        if model.device.type != "cuda":
            return CPU_BATCH_SIZE
        cfg, size = model.checkpoint.config, model.dtype.itemsize
        encoder = 12 * cfg.n_audio_ctx * cfg.n_audio_state * size  # mel, qkv, 4x MLP, residual
        cross = cfg.n_text_layer * cfg.n_audio_ctx * 2 * cfg.n_text_state * size
        rows = 5 * cfg.n_text_layer * 2 * cfg.n_text_ctx * cfg.n_text_state * size
        free, _ = torch.cuda.mem_get_info(model.device)
        fits = int(0.8 * free // (encoder + cross + rows + (1 << 20)))
        return max(1, min(MAX_AUTO_BATCH_SIZE, fits))

    def _decode(
        self,
        files: Iterator[_File],
        options: TranscriptionOptions,
        size: int,
    ) -> Iterator[tuple[_File | None, int, list[Segment], bool]]:
        """(file, window index, its segments, whether it left a continuation) for every window
        of every file. Consecutive windows with the same language and task share batches. A
        window whose decode stopped before its end (Whisper ends a window at its last complete
        segment, leaving the sequential loop to seek there) goes on as a new window from that
        point, at the front of the next batch. A file without windows yields (None, -1, [],
        False) when it is reached, so callers can hand it out. With conditioning on, a file's
        windows are chains, each decoded by `_decode_chains`."""
        if options.condition_on_previous_text:
            yield from self._decode_chains(files, options, size)
            return
        continued: deque[tuple[_File, int]] = deque()

        def drain() -> Iterator[tuple[_File | None, int]]:
            while continued:
                yield continued.popleft()

        def queued() -> Iterator[tuple[_File | None, int]]:
            """Windows in order, continuations first; then (None, 0) asks for the batch in hand
            to run, until it leaves no continuation."""
            for file in files:
                if not file.windows:
                    yield file, -1
                for i in range(len(file.windows)):
                    yield from drain()
                    yield file, i
            while True:
                yield from drain()
                yield None, 0
                if not continued:
                    return

        def run(batch: list[tuple[_File, int]]):
            for file, i, segments, rest in self._decode_batch(batch, options):
                if rest is not None:
                    continued.append((file, file.continue_window(i, rest)))
                yield file, i, segments, rest is not None

        batch: list[tuple[_File, int]] = []
        for file, i in queued():
            if i < 0:
                yield None, -1, [], False
                continue
            if batch and (
                file is None
                or len(batch) >= min(size, self._batch_ceiling or size)
                or batch[0][0].tokenizer.sot_sequence != file.tokenizer.sot_sequence
            ):
                yield from run(batch)
                batch = []
            if file is not None:
                batch.append((file, i))

    def _decode_chains(
        self, files: Iterator[_File], options: TranscriptionOptions, size: int
    ) -> Iterator[tuple[_File | None, int, list[Segment], bool]]:
        """`_decode`'s tuples for files whose windows are chains: (file, chain, its segments so
        far, whether the chain goes on). Up to `size` chains run at once, from as many files as
        it takes; each round decodes the window that every running chain waits for."""
        waiting: deque[tuple[_File, int]] = deque()  # chains not started, in input order
        running: list[_Chain] = []
        while True:
            while len(running) < min(size, self._batch_ceiling or size):
                if not waiting:
                    file = next(files, None)
                    if file is None:
                        break
                    if not file.windows:
                        yield None, -1, [], False
                    waiting.extend((file, i) for i in range(len(file.windows)))
                    continue
                file, i = waiting.popleft()
                window = file.windows[i]
                steps = self.model.span_steps(  # a prefix begins a file's first chain only
                    file.samples, window.start, window.end, file.tokenizer, options, first=i == 0
                )
                chain = _Chain(file, i, steps)
                segments = chain.advance(None)
                if chain.request is not None:
                    running.append(chain)
                yield from chain.report(segments)
            if not running:
                return
            results = self.decode_requests([chain.request for chain in running])  # type: ignore[misc]
            still = []
            for chain, result in zip(running, results):
                segments = chain.advance(result)
                if chain.request is not None:
                    still.append(chain)
                yield from chain.report(segments)
            running = still

    def decode_requests(self, requests: list[WindowRequest]) -> list[WindowResult]:
        """Decode long-form loops' windows: those that decode alike (language, task, options)
        as one batch, each after its own prompt; on out-of-memory in halves (and the smaller
        size is remembered). The server's batched backend shares this."""
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(decode_key(request), []).append(index)
        results: list[WindowResult | None] = [None] * len(requests)
        for indices in groups.values():
            for index, result in zip(indices, self._decode_group([requests[i] for i in indices])):
                results[index] = result
        return results  # type: ignore[return-value]

    def _decode_group(self, requests: list[WindowRequest]) -> list[WindowResult]:
        def run(part: list[WindowRequest]) -> list[WindowResult]:
            features = self.model.encode(torch.stack([request.mel for request in part]))
            first = part[0]
            prompts = [request.prompt for request in part]
            results = self.decode_with_fallback(features, first.tokenizer, first.options, prompts)
            return list(zip(results, features))

        return [result for _, results in self._in_halves(requests, run) for result in results]

    def _in_halves(self, items: list, run: Callable[[list], R]) -> list[tuple[list, R]]:
        """[(items, run(items))]; on out-of-memory, the same for each half (and so on down), and
        the smaller batch size is remembered for the batches to come."""
        try:
            return [(items, run(items))]
        except torch.cuda.OutOfMemoryError:
            if len(items) == 1:
                raise
            torch.cuda.empty_cache()
            half = len(items) // 2
            self._batch_ceiling = half
            return self._in_halves(items[:half], run) + self._in_halves(items[half:], run)

    def _decode_batch(
        self, batch: list[tuple[_File, int]], options: TranscriptionOptions
    ) -> Iterator[tuple[_File, int, list[Segment], Window | None]]:
        """Decode a batch (in halves on out-of-memory) and cut each window into segments."""
        for part, (results, features) in self._in_halves(
            batch, lambda part: self._decode_windows(part, options)
        ):
            for (file, i), window_features, result in zip(part, features, results):
                file.remaining -= 1
                segments, rest = self._window_segments(
                    file, file.windows[i], window_features, result, options
                )
                yield file, i, segments, rest

    def _decode_windows(
        self, batch: list[tuple[_File, int]], options: TranscriptionOptions
    ) -> tuple[list[DecodingResult], torch.Tensor]:
        mels = torch.cat([self._mels(file.samples, [file.windows[i]]) for file, i in batch])
        features = self.model.encode(mels)
        tokenizer = batch[0][0].tokenizer
        prompt = prompt_of(tokenizer, options)
        if options.prefix is None:
            return self.decode_with_fallback(
                features, tokenizer, options, [prompt] * len(batch)
            ), features
        # The prefix begins a file's first window only, as in `transcribe`: begun again in every
        # window (and in the rest of one decoded short), its text came back every 30 s or less.
        results: list[DecodingResult | None] = [None] * len(batch)
        first = [k for k, (_, i) in enumerate(batch) if i == 0]
        others = [k for k in range(len(batch)) if k not in first]
        for rows, row_options in ((first, options), (others, replace(options, prefix=None))):
            if rows:
                decoded = self.decode_with_fallback(
                    features[rows], tokenizer, row_options, [prompt] * len(rows)
                )
                for k, result in zip(rows, decoded):
                    results[k] = result
        return results, features  # type: ignore[return-value]

    def decode_with_fallback(
        self,
        features: torch.Tensor,
        tokenizer: Tokenizer,
        options: TranscriptionOptions,
        prompts: list[list[int]],
    ) -> list[DecodingResult]:
        """Decode every window after its prompt; the ones failing the thresholds again, batched,
        one temperature up (those that fail at every one: `best_of_failed`)."""
        tried: list[list[DecodingResult]] = [[] for _ in range(features.shape[0])]
        results: list[DecodingResult | None] = [None] * features.shape[0]
        pending = list(range(features.shape[0]))
        for t in options.temperatures:
            decode_options = options.decoding_options(
                t, tokenizer.language or "en", tokenizer.task, []
            )
            decoded = decode(
                self.model.decode_model, tokenizer, features[pending], decode_options,
                [prompts[index] for index in pending],
            )  # fmt: skip
            still_pending = []
            for index, result in zip(pending, decoded):
                tried[index].append(result)
                if good_enough(result, options):
                    results[index] = result
                else:
                    still_pending.append(index)
            pending = still_pending
            if not pending:
                break
        for index in pending:
            results[index] = best_of_failed(tried[index], options)
        return results  # type: ignore[return-value]

    def _window_segments(
        self,
        file: _File,
        window: Window,
        features: torch.Tensor,
        result: DecodingResult,
        options: TranscriptionOptions,
    ) -> tuple[list[Segment], Window | None]:
        """A decoded window's segments on the file's timeline (numbered once in time order), and
        the rest of the window when its decode stopped short of the end."""
        if is_no_speech(result, options):
            return [], None
        seek = round(window.start / HOP_LENGTH)
        size = min(N_FRAMES, -(-(window.end - window.start) // HOP_LENGTH))
        segments, consumed, _ = split_segments(
            file.tokenizer, result, seek, size, keep_unfinished=True
        )
        # A decode may put timestamps past the window's audio, into its padding (a sampled
        # fallback especially): there the file's timeline would map them past later windows, or
        # a segment's start past its end. They end at the window's end; a segment left with no
        # length is dropped below (but past the file's end, joined to the one before it).
        window_end = (seek + size) * HOP_LENGTH / SAMPLE_RATE
        for segment in segments:
            segment.start, segment.end = (
                min(segment.start, window_end),
                min(segment.end, window_end),
            )
        rest = None
        if 0 < consumed and size - consumed >= MIN_CONTINUATION_FRAMES:
            start = window.start + consumed * HOP_LENGTH
            regions = tuple(r for r in window.regions if r.end > start)
            rest = Window(start, window.end, regions)
        if options.word_timestamps:
            tokenizer = window_tokenizer(file.tokenizer, result)
            add_word_timestamps(
                segments, self.model.model, tokenizer, features, size,
                self.model.alignment_heads, options.prepend_punctuations,
                options.append_punctuations,
            )  # fmt: skip
        duration = len(file.samples) / SAMPLE_RATE
        segments = within_audio(segments, window.start / SAMPLE_RATE, duration)
        for segment in segments:
            # faster-whisper's batched pipeline gives each segment its own text's ratio (the
            # window-level figure stays on the window's decode, where the fallback reads it).
            segment.compression_ratio = compression_ratio(segment.text)
        return [s for s in segments if s.start < s.end and s.text.strip()], rest


@dataclass
class _Chain:
    """A chain of a file's windows being decoded: its long-form loop, paused at the window it
    waits for (`request`; None once the loop is done)."""

    file: _File
    index: int  # the chain's place among the file's windows
    steps: LongForm
    request: WindowRequest | None = None

    def advance(self, sent: WindowResult | None) -> list[Segment]:
        """Run the loop to the next window it needs; the segments it finished on the way."""
        segments: list[Segment] = []
        try:
            item = self.steps.send(sent)
            while isinstance(item, Segment):
                segments.append(item)
                item = self.steps.send(None)
        except StopIteration:
            self.request = None
            return segments
        self.request = item
        return segments

    def report(self, segments: list[Segment]) -> Iterator[tuple[_File, int, list[Segment], bool]]:
        """`_decode`'s tuple for what the last advance gave; a finished chain always reports."""
        if self.request is None:
            self.file.remaining -= 1
            yield self.file, self.index, segments, False
        elif segments:
            yield self.file, self.index, segments, True


def batched_options(**options) -> TranscriptionOptions:
    """The batched pipeline's options from `transcribe_many`'s keywords (but language, task,
    batch size and VAD), checked: `transcribe`'s, whose default here is no conditioning."""
    # clip_timestamps: `transcribe`'s own argument (windows), not one for many files.
    accepted = {f.name for f in fields(TranscriptionOptions)} - {"temperatures", "clip_timestamps"}
    unknown = set(options) - accepted - {"temperature"}
    if unknown:
        raise InvalidOptionError(f"unknown option(s) for batched transcription: {sorted(unknown)}")
    options.setdefault("condition_on_previous_text", False)  # the throughput mode
    checked = TranscriptionOptions.from_arguments(**options)
    if (
        checked.hallucination_silence_threshold is not None
        and checked.word_timestamps
        and not checked.condition_on_previous_text
    ):  # faster-whisper's batched pipeline ignores it silently: say so
        warnings.warn(
            "hallucination_silence_threshold does nothing in the batched pipeline's windows "
            "decoded alone; with condition_on_previous_text=True each chain of windows runs "
            "transcribe's loop, which skips the silences; it is ignored",
            stacklevel=4,
        )
    return checked


def clip_regions(
    clips: str | Iterable[float] | Iterable[dict], n_samples: int
) -> list[SpeechRegion]:
    """The stretches of audio `clip_timestamps` names, in samples, within the audio: from
    faster-whisper's batched form ({"start": seconds, "end": seconds} each, as its 1.2.1 reads
    them) or from `transcribe`'s seconds "start,end,start,..." (an odd last start runs to the
    end)."""
    clips = list(clips) if not isinstance(clips, str) else clips
    if clips and all(isinstance(c, dict) for c in clips):
        try:
            clips = [float(c[key]) for c in clips for key in ("start", "end")]
        except (KeyError, TypeError, ValueError):
            raise InvalidOptionError(
                'clip_timestamps as dicts need "start" and "end" in seconds, e.g. '
                '[{"start": 0.0, "end": 3.5}]'
            ) from None
    spans = clip_spans(parse_clip_timestamps(clips), SAMPLE_RATE, n_samples)
    regions = [SpeechRegion(start, end) for start, end in spans]
    if any(r.start >= n_samples for r in regions):
        # Nothing there to transcribe, as faster-whisper. Sample numbers (what faster-whisper
        # before 1.2.1 took) land here too, far past the end: the warning says what they are.
        warnings.warn(
            f"clip_timestamps start past the end of the audio ({n_samples / SAMPLE_RATE:.2f} s): "
            'skipped; they are seconds, e.g. [{"start": 0.0, "end": 3.5}] or "0,3.5"',
            stacklevel=4,
        )
        regions = [r for r in regions if r.start < n_samples]
    if any(r.start >= r.end for r in regions):
        raise InvalidOptionError("clip_timestamps must each end at least a sample after they start")
    return regions


def chains(windows: list[Window], count: int) -> list[Window]:
    """Consecutive windows joined into `count` chains (fewer if there are fewer windows), of
    as equal a number of windows as can be; a chain spans from its first window's start to its
    last one's end, so chains meet only at pauses."""
    count = min(count, len(windows))
    if count == 0:
        return []
    bounds = [round(i * len(windows) / count) for i in range(count + 1)]
    return [
        Window(windows[a].start, windows[b - 1].end, sum((w.regions for w in windows[a:b]), ()))
        for a, b in pairwise(bounds)
    ]


def decode_key(request: WindowRequest) -> tuple:
    """Windows with equal keys decode alike but for their audio and prompt, so they share a
    batch: the same language and task and decoding options. Word timestamps come after the
    decode, and the initial prompt is in the prompt already, so those two may differ."""
    options = replace(request.options, word_timestamps=False, initial_prompt=None)
    return (request.tokenizer.sot_sequence, options)


def prompt_of(tokenizer: Tokenizer, options: TranscriptionOptions) -> list[int]:
    """The initial prompt's tokens, the same for every window."""
    if isinstance(options.initial_prompt, str):
        return tokenizer.encode(" " + options.initial_prompt.strip())
    return list(options.initial_prompt or [])
