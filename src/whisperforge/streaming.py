"""Streaming transcription: feed audio as it arrives, get committed words that never change.

The policy is LocalAgreement-2 from ufal/whisper_streaming (Macháček et al., 2023). Each
update re-transcribes the audio buffer (the audio since the last trim point) with word
timestamps, prompted with the committed text that lies before the buffer. The words on which
the last two hypotheses agree (their longest common prefix) are committed; the rest of the
newest hypothesis is the tentative tail. Once the buffer is longer than `trim_s`, it is cut at
the end of a Whisper segment (or sentence) whose words are all committed, so memory and the
cost of an update stay bounded however long the stream runs.

Time is a clock you pass in; by default it is the audio received so far, which is what a
live stream's wall clock reads when compute is instantaneous. `replay()` feeds a recording
on a simulated clock, so tests and benchmarks are fast and give the same figures every run.

    stream = StreamingTranscriber(model, StreamingOptions(language="en"))
    for chunk in chunks:                     # float32 16 kHz arrays or s16le bytes, any size
        for event in stream.feed(chunk):
            print(event.committed_text, end="", flush=True)
    print(stream.finish().committed_text)

`commit()` ends an utterance (its words are committed at once) and `clear()` drops what is not
committed yet (OpenAI realtime's input_audio_buffer.commit and .clear; the server's WebSocket
takes both); the stream goes on after either.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .audio import SAMPLE_RATE, check_integer_width, check_mono, to_float32, whole_samples
from .decoding import compression_ratio
from .errors import InvalidOptionError, check_whole_number
from .results import Segment, Word

if TYPE_CHECKING:
    from .transcribe import WhisperModel

SENTENCE_END = (".", "?", "!", "。", "？", "！")
# Audio a stream's language is detected from, where it is not given (offline: 30 s).
DETECTION_S = 3.0
# The highest silence gate (dBFS): the dev set's quietest speech peaks at -30, its loudest at -3.
MAX_SILENCE_DB = -20.0


@dataclass(frozen=True)
class StreamingOptions:
    """How a stream is cut into updates and decoded.

    min_chunk_s: new audio needed before the next update; smaller means lower delay and more
        compute (each update re-transcribes the whole buffer).
    trim_s: once the buffer is longer than this, it is cut at a committed segment end
        (ufal's "segment" trimming; 15 s there too).
    max_buffer_s: hard cap on the buffer (Whisper sees 30 s at a time). Reached only when
        hypotheses keep disagreeing; then the tentative words that are `max_buffer_s - trim_s`
        old are committed without agreement, and the buffer is cut.
    prompt_chars: how much committed text before the buffer conditions the decoder.
    initial_prompt: text said to come before the stream (names and their spellings, the
        topic), as openai-whisper's `initial_prompt`: it conditions the decoder before the
        committed text, which takes its place once there are `prompt_chars` of it.
    silence_db: energy gate: new audio whose loudest 30 ms frame is below this (dBFS) costs
        no update, unless words are still tentative. None: every update is decoded. At most
        MAX_SILENCE_DB: above it, speech itself is taken for silence.
    max_compression_ratio: a decode whose text gzips better than this may be a decoding loop
        (Whisper's own threshold for repetitive output): it is decoded again unprompted, then
        in pieces, and a piece of under 2 * MIN_PIECE_S s that still repeats is left out.
    agreement: how many consecutive hypotheses must agree on a word before it is committed
        (LocalAgreement-n; 2 in ufal/whisper_streaming). 3 commits later and errs less.
    beam_size, temperature: decoding of each update; greedy at 0 keeps updates cheap and
        the stream deterministic.
    tail_log_prob_threshold: a buffer whose last segment was unfinished is decoded in two
        windows: the long-form loop decodes that segment's audio again on its own, often well
        under a second, where Whisper invents text ("devastated. The state of Kentucky is a
        very good candidate." in 0.14 s). Trailing segments of such a later window whose
        average log probability is below this (offline's `log_prob_threshold`: a decode it
        would not accept) are left out of the hypothesis; real speech comes back in the next
        update. None: keep them.
    """

    language: str | None = None
    task: str = "transcribe"
    min_chunk_s: float = 1.0
    trim_s: float = 15.0
    max_buffer_s: float = 30.0
    prompt_chars: int = 200
    initial_prompt: str | None = None
    silence_db: float | None = None
    max_compression_ratio: float | None = 2.4
    agreement: int = 2
    beam_size: int = 1
    temperature: float | tuple[float, ...] = 0.0
    tail_log_prob_threshold: float | None = -1.0

    def __post_init__(self) -> None:
        # The audio waiting for an update is held outside the buffer's cap: a min_chunk_s of
        # 1e9 held a server's stream's audio for ever (3.8 MB a minute), past its share.
        if not 0 < self.min_chunk_s <= self.max_buffer_s - self.trim_s:
            raise InvalidOptionError(
                f"min_chunk_s must be positive seconds, at most max_buffer_s - trim_s "
                f"({self.max_buffer_s - self.trim_s:g}), got {self.min_chunk_s}"
            )
        if self.task not in ("transcribe", "translate"):  # refused here, not at the first update
            raise InvalidOptionError(f"unknown task {self.task!r}; use transcribe or translate")
        for name, least in (("agreement", 2), ("beam_size", 1), ("prompt_chars", 0)):
            check_whole_number(name, getattr(self, name), minimum=least)
        # A gate near 0 dBFS took all speech (its loudest 30 ms lie at -30 to -3 dBFS on the
        # dev set) for silence: the stream gave no words, and no sign why.
        if self.silence_db is not None and not -math.inf < self.silence_db <= MAX_SILENCE_DB:
            raise InvalidOptionError(
                f"silence_db is the level in dBFS under which audio is silence, at most "
                f"{MAX_SILENCE_DB:g} (speech lies above it; -60 to -40 is usual), "
                f"got {self.silence_db}"
            )
        if self.initial_prompt is not None and not isinstance(self.initial_prompt, str):
            raise InvalidOptionError(
                f"initial_prompt must be text, e.g. 'ComfyUI, Subiaco', not {self.initial_prompt!r}"
            )
        if not 0 < self.trim_s < self.max_buffer_s <= 30:  # Whisper hears 30 s at a time
            raise InvalidOptionError(
                f"need 0 < trim_s < max_buffer_s <= 30, got trim_s={self.trim_s}, "
                f"max_buffer_s={self.max_buffer_s}"
            )


@dataclass
class StreamingEvent:
    """What one update changed.

    committed: words committed by this update, in order, with absolute times (seconds from
        the start of the stream). They never change; the stream's text is all events'
        committed words joined.
    tentative: the newest hypothesis after the committed text; replaced by the next event.
    time: the clock when the update finished (by default: seconds of audio received).
    final: the stream's last event; nothing is tentative any more.
    compute_s: wall seconds this update spent transcribing (0 when it was skipped).
    language: the stream's language code; None while a multilingual model's is still being
        detected (nothing is committed until it is).
    """

    committed: list[Word]
    tentative: list[Word]
    time: float
    final: bool = False
    compute_s: float = 0.0
    language: str | None = None

    @property
    def committed_text(self) -> str:
        return "".join(w.word for w in self.committed)

    @property
    def tentative_text(self) -> str:
        return "".join(w.word for w in self.tentative)

    def to_dict(self) -> dict:
        """The JSON the server sends for this event."""
        return {
            "type": "transcript.final" if self.final else "transcript.update",
            "committed_text": self.committed_text,
            "committed": [asdict(w) for w in self.committed],
            "tentative_text": self.tentative_text,
            "tentative": [asdict(w) for w in self.tentative],
            "time": round(self.time, 3),
            "language": self.language,
        }


class BufferTranscriber(Protocol):
    """Transcribes one buffer: (16 kHz audio, prompt, language or None) -> (segments with words,
    language). The seam through which the server routes updates into its model worker. One
    with an `is_multilingual` attribute says whether its model detects a language (True:
    detected from `DETECTION_S` of audio; False: English); without one, the language it
    returns with the first words is taken."""

    def __call__(
        self, audio: np.ndarray, prompt: str | None, language: str | None
    ) -> tuple[list[Segment], str]: ...


def model_transcriber(
    model: WhisperModel, task: str = "transcribe", beam_size: int = 1,
    temperature: float | tuple[float, ...] = 0.0,
) -> BufferTranscriber:  # fmt: skip
    """A `BufferTranscriber` that calls `model.transcribe` with word timestamps."""

    def run(
        audio: np.ndarray, prompt: str | None, language: str | None
    ) -> tuple[list[Segment], str]:
        segments, info = model.transcribe(
            audio, language=language, task=task, beam_size=beam_size, temperature=temperature,
            initial_prompt=prompt or None, word_timestamps=True,
        )  # fmt: skip
        return list(segments), info.language

    return run


def pcm16_to_float(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Raw signed 16-bit little-endian PCM to float32 in [-1, 1)."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


# A word whose loudest frame is this far under its buffer's loudest was not spoken (40 dB:
# a microphone's noise floor is 45-60 dB under speech; a soft last word, 10-30).
SILENT_WORD_DB = 40.0
# A decode that stops this long before its buffer's end, with audio after it at most
# SPEECH_DB under what it decoded, left speech out: that rest is decoded on its own. (Under a
# second or two is a last word cut off by the buffer's end, which the next update hears.)
REST_S = 2.0
SPEECH_DB = 20.0
# Whisper's no_speech_threshold: a window more likely silence than speech.
NO_SPEECH = 0.6
# A piece of a repetitive decode shorter than this is not split again (`_split`): its words
# are a decoding loop. Twice it is under 10 s, a sentence or two.
MIN_PIECE_S = 4.0


def peak_frame_db(samples: np.ndarray, frame: int = 480) -> float:
    """Loudness of the loudest 30 ms frame in dBFS (RMS); -inf for digital silence."""
    if samples.size == 0:
        return float("-inf")
    n = -(-samples.size // frame)
    padded = np.zeros(n * frame, dtype=np.float32)
    padded[: samples.size] = samples
    rms = np.sqrt(np.mean(padded.reshape(n, frame) ** 2, axis=1)).max()
    return float(20 * np.log10(rms)) if rms > 0 else float("-inf")


def _repetitive(words: Sequence[Word], threshold: float | None) -> bool:
    text = "".join(w.word for w in words)
    if threshold is None or len(text.encode()) < 40:  # short texts never compress well
        return False
    return compression_ratio(text) > threshold


def _shifted(segments: list[Segment], shift: float) -> list[Segment]:
    """Segments of audio that starts `shift` s into the buffer, in the buffer's time: a later
    window (its seek too, for `_without_improbable_tail`)."""
    return [
        replace(s, seek=s.seek + round(shift * 100), start=s.start + shift, end=s.end + shift,
                words=[replace(w, start=w.start + shift, end=w.end + shift)
                       for w in s.words or []])
        for s in segments
    ]  # fmt: skip


def _quietest(audio: np.ndarray, frame: int = 480) -> int:
    """The start of the quietest 30 ms frame in the middle half of `audio`: where to cut it
    into two pieces with no word cut in two (the pause between sentences, at best)."""
    if audio.size < 4 * frame:
        return audio.size // 2
    first, n = audio.size // 4 // frame, audio.size // 2 // frame
    frames = audio[first * frame : (first + n) * frame].reshape(n, frame)
    return (first + int(np.argmin(np.mean(frames**2, axis=1)))) * frame


def _without_unspoken_tail(words: list[Word], buffer: np.ndarray, offset: float) -> list[Word]:
    """Drop trailing words that were not spoken: those the alignment squeezed into no time at
    all (text the decoder ran ahead with: a word cut off by the buffer's end, which comes back
    with real timings once the audio holds it), and those over silence, whose loudest frame is
    `SILENT_WORD_DB` under the buffer's (`buffer` starts at `offset` s). Whisper ends a buffer
    of speech and then silence with a "Thank you." that offline decoding, whose windows see
    the silence whole, does not have; streams committed it."""
    if not words:
        return words
    loudest, end = peak_frame_db(buffer), len(words)
    while end:
        word = words[end - 1]
        start, stop = (round((t - offset) * SAMPLE_RATE) for t in (word.start, word.end))
        silent = peak_frame_db(buffer[max(start, 0) : stop]) < loudest - SILENT_WORD_DB
        if word.end - word.start >= 0.01 and not silent:
            break
        end -= 1
    return words[:end]


def _without_improbable_tail(segments: list[Segment], threshold: float | None) -> list[Segment]:
    """The segments with words, less the trailing ones that a later, short window decoded
    improbably (see `StreamingOptions.tail_log_prob_threshold`); at `finish()` too, since the
    end of a stream is where such windows invent text. The first window is always kept: on
    hard audio every decode of the buffer may be improbable, and dropping them all would
    commit nothing and let the hard cap cut the audio away. A later window that Whisper itself
    takes for no speech (`NO_SPEECH`) is left out too: 0.6 s after JFK's last word, prompted
    with his words, tiny.en decoded "Thank you." at -0.72 but no_speech_prob 0.74."""
    spoken = [s for s in segments if s.words]
    if threshold is None:
        return spoken
    while (
        len(spoken) > 1
        and spoken[-1].seek > spoken[0].seek
        and (spoken[-1].avg_logprob < threshold or spoken[-1].no_speech_prob > NO_SPEECH)
    ):
        spoken.pop()
    return spoken


_NOT_WORD = re.compile(r"[^\w']")


def _norm(word: str) -> str:
    """Words agree when they match up to case and punctuation ("so," == "So")."""
    return _NOT_WORD.sub("", word.lower())


class StreamingTranscriber:
    """LocalAgreement-2 over a trimmed audio buffer. Not thread-safe: one stream, one owner.

    model: a `WhisperModel` (or `whisperforge.load_model`'s), or any `BufferTranscriber`.
        Where `options.language` is None, a multilingual model's language is detected from
        the stream's first `DETECTION_S` of audio with words: nothing is committed before.
    clock: returns the current stream time in seconds; default: the audio received so far.
    """

    def __init__(
        self,
        model: WhisperModel | BufferTranscriber,
        options: StreamingOptions | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.options = options or StreamingOptions()
        openai_api = sys.modules.get("whisperforge.openai_api")  # (not imported: not one)
        if openai_api is not None and isinstance(model, openai_api.OpenAIWhisper):
            # `whisperforge.load_model`'s model: its openai-whisper `transcribe` returns a
            # dict, which failed the first update with "too many values to unpack".
            model = model.model
        if callable(model) and not hasattr(model, "transcribe"):
            self._transcribe: BufferTranscriber = model
        else:
            self._transcribe = model_transcriber(
                model, self.options.task, self.options.beam_size, self.options.temperature
            )  # type: ignore[arg-type]
        self.clock = clock or (lambda: self.received_s)
        self.language = self.options.language
        multilingual = getattr(model, "is_multilingual", None)
        if self.language is None and multilingual is False:
            self.language = "en"  # nothing to detect: words are committed from the start
        self._given_language = self.language  # what `clear` goes back to (None: detect it)
        self._detection_s = DETECTION_S if multilingual else 0.0
        self.committed: list[Word] = []  # everything committed, in order, absolute times
        self.finished = False
        self.updates = 0  # decoded updates, for cost accounting
        self._buffer = np.zeros(0, dtype=np.float32)  # audio from self._offset on
        self._offset = 0.0  # stream time of the buffer's first sample
        self._first_in_buffer = 0  # index of the first committed word that ends in the buffer
        self._pending: list[np.ndarray] = []  # received, not yet in the buffer
        self._pending_samples = 0
        self._received = 0  # samples received in all
        self._heard = 0  # samples received when the last hypothesis was made (or skipped)
        self._item_from = 0  # samples received at the last `commit` or `clear`
        self._odd_byte = b""  # half a PCM sample left over from an odd-sized bytes chunk
        self._tentative: list[Word] = []  # the last hypothesis minus what was committed
        self._older: list[list[Word]] = []  # hypotheses before it (LocalAgreement-n, n > 2)
        self._silent_updates = 0  # updates decoded since the audio went quiet
        self._heard_language: str | None = None  # the language of the last hypothesis

    # --- public -----------------------------------------------------------------------------

    @property
    def received_s(self) -> float:
        return self._received / SAMPLE_RATE

    @property
    def buffer_s(self) -> float:
        return self._buffer.size / SAMPLE_RATE

    @property
    def uncommitted_s(self) -> float:
        """Audio received since the last `commit` or `clear` (or the start)."""
        return (self._received - self._item_from) / SAMPLE_RATE

    @property
    def text(self) -> str:
        """All committed text so far."""
        return "".join(w.word for w in self.committed)

    def feed(self, audio: np.ndarray | bytes | bytearray | memoryview) -> list[StreamingEvent]:
        """Add audio (float32 16 kHz mono, or raw s16le bytes) of any length; returns the
        events of the update it triggered (none until `min_chunk_s` of new audio is in)."""
        if self.finished:
            raise InvalidOptionError("this stream is finished; start a new StreamingTranscriber")
        samples = self._to_samples(audio)
        if samples.size:
            self._pending.append(samples)
            self._pending_samples += samples.size
            self._received += samples.size
        if self._pending_samples < self.options.min_chunk_s * SAMPLE_RATE:
            return []
        event = self._update(final=False)
        return [event] if event is not None else []

    def finish(self) -> StreamingEvent:
        """End of stream: decode what is left and commit the whole last hypothesis."""
        if self.finished:
            raise InvalidOptionError("finish() was already called on this stream")
        event = self._update(final=True, ending=True)
        self.finished = True
        assert event is not None
        return event

    def commit(self) -> StreamingEvent:
        """End of an utterance (OpenAI's `input_audio_buffer.commit`): decode what has arrived
        and commit the whole hypothesis, as `finish` does, and go on. Its last words would
        otherwise stay tentative until the next utterance's audio agreed on them. The event is not
        `final`: the stream is not over. A language still being detected stays so (its words are
        committed as heard) until `DETECTION_S` of audio: fixed by a commit after 1.5 s of
        Spanish, it was Arabic, and the rest of the stream came out as nothing."""
        if self.finished:
            raise InvalidOptionError("this stream is finished; start a new StreamingTranscriber")
        event = self._update(final=True)
        assert event is not None
        self._item_from = self._received
        return replace(event, final=False)

    def clear(self, audio: np.ndarray | bytes | bytearray | memoryview | None = None) -> None:
        """Drop what has not been committed (OpenAI's `input_audio_buffer.clear`): the tentative
        words, and the audio received since the committed words (in the buffer, or waiting for
        an update); the stream goes on with the audio fed next. Committed words never change,
        so those committed since the last `commit` (by agreement) stay, and go on prompting the
        decoder. audio: what arrived just before the clear and goes with it, as `feed` takes
        it, not decoded (a `feed` of it could make an update and commit its words).

        The clock goes on: dropped audio counts in `received_s`, so the words that follow are
        timed where they are in all the audio the stream was fed. Half a sample of bytes waiting
        for its other byte is kept: a byte stream cut anywhere goes on after the clear. Where
        nothing is committed yet, a language detected from the dropped audio is detected
        again from what follows (it was heard in audio the client took back: noise, another
        speaker)."""
        if self.finished:
            raise InvalidOptionError("this stream is finished; start a new StreamingTranscriber")
        if audio is not None:
            self._received += self._to_samples(audio).size
        self._pending, self._pending_samples = [], 0
        self._buffer = np.zeros(0, dtype=np.float32)
        self._offset = self.received_s  # the next audio fed starts the buffer
        self._first_in_buffer = len(self.committed)  # all committed text is before it now
        self._heard = self._item_from = self._received
        self._tentative, self._older, self._silent_updates = [], [], 0
        if not self.committed:
            self.language, self._heard_language = self._given_language, None

    # --- one update -------------------------------------------------------------------------

    def _to_samples(self, audio: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
        if isinstance(audio, (bytes, bytearray, memoryview)):
            data, self._odd_byte = whole_samples(self._odd_byte, bytes(audio))
            return pcm16_to_float(data)
        samples = np.asarray(audio)
        check_mono(samples)  # saying which axis of a stereo array to average, as offline
        if samples.dtype == np.int64:
            # Only int64: no capture API gives 64-bit PCM, so quiet int64 samples are 16-bit
            # ones (np.array of a list of ints); a quiet chunk of a real int32 capture is common.
            check_integer_width(samples)
        return to_float32(samples)

    def _update(self, final: bool, ending: bool = False) -> StreamingEvent | None:
        """final: commit the whole hypothesis (`commit`, `finish`); ending: the stream ends
        (`finish`), so a language still being detected is fixed with what was heard."""
        new_audio = np.concatenate(self._pending) if self._pending else np.zeros(0, np.float32)
        self._pending, self._pending_samples = [], 0
        self._buffer = np.concatenate([self._buffer, new_audio])

        gate = self.options.silence_db
        if gate is not None and peak_frame_db(new_audio) < gate:
            # Silence costs nothing, except the two updates that settle words still tentative.
            self._silent_updates += 1
            if not self._tentative:  # nothing waits on this audio: drop it, keep 0.5 s
                self._cut(max(self._offset, self.received_s - 0.5))
                # (at the end, words a commit made as heard still fix the language)
                return self._event(self._commit([], ending), final, 0.0) if final else None
            if self._silent_updates > 2 and not final:
                # Two updates of silence did not settle them (hypotheses that keep changing
                # their last word): committed as they stand, as at the end of a stream, and the
                # silence dropped; kept, it grew the buffer for as long as the silence lasted.
                agreed, self._tentative, self._older = self._commit(self._tentative), [], []
                self._cut(max(self._offset, self.received_s - 0.5))
                self._heard = self._received
                return self._event(agreed, final, 0.0) if agreed else None
        else:
            self._silent_updates = 0
        if self._buffer.size == 0:  # (a `clear` with no audio since: as above)
            return self._event(self._commit([], ending), final, 0.0)
        if final and self.updates and self._heard == self._received:
            # The last hypothesis already covers all the audio: commit it as it stands. (Not
            # after an update that raised, Ctrl-C in its decode: its audio is in the buffer,
            # unheard.)
            agreed, self._tentative = self._commit(self._tentative, ending), []
            return self._event(agreed, final, 0.0)

        started = time.perf_counter()
        segments, language, hypothesis = self._decode()
        compute = time.perf_counter() - started
        self.updates += 1
        self._heard = self._received
        self._heard_language = language
        # Detected again at each update until there are words and DETECTION_S of audio (or the
        # stream ends), then fixed: fixed at the first words, 1 s of German was "en" and 1 s of
        # Spanish "ml". Until then nothing is committed: its words would be in that language.
        detecting = self.language is None
        heard = ending or self._buffer.size >= self._detection_s * SAMPLE_RATE
        if detecting and heard and any(s.words for s in segments):
            self.language, detecting = language, False
        # (A decoding loop is not in the hypothesis: `_decode` decoded its audio in pieces.)
        if final:  # (older hypotheses too: after a `commit` the stream goes on)
            agreed, self._tentative, self._older = hypothesis, [], []
        else:
            history = [*self._older, self._tentative][-(self.options.agreement - 1) :]
            full = len(history) == self.options.agreement - 1
            agreed = self._agreement(hypothesis, *history) if full and not detecting else []
            keep = self.options.agreement - 2  # older hypotheses the next update compares with
            self._older = [h[len(agreed) :] for h in history][len(history) - keep :] if keep else []
            self._tentative = hypothesis[len(agreed) :]
        # Trimmed after a final update too: a client that commits more often than min_chunk_s
        # makes no other updates, and its buffer would grow past Whisper's 30 s. The language
        # is fixed here only at the end: while it is being detected nothing is agreed, and an
        # update after a `commit` fixed it from its buffer, under DETECTION_S of audio.
        agreed = self._commit(agreed, ending) + self._trim(segments)
        return self._event(agreed, final, compute)

    def _event(self, committed: list[Word], final: bool, compute: float) -> StreamingEvent:
        return StreamingEvent(
            committed, list(self._tentative), self.clock(), final, compute, self.language
        )

    def _decode(self) -> tuple[list[Segment], str, list[Word]]:
        """The buffer's segments, language and hypothesis (its words after the committed ones).
        A hypothesis that is a decoding loop is decoded again without the prompt, which is what
        most often leads Whisper into one (openai-whisper, too, stops conditioning on its
        previous text after a window that looped at the low temperatures): commits at short
        pauses left "modify. merge. publish." in the prompt, 27 s of speech came out as
        "submit. submit. ...", a loop that is not used, and the stream's last 37 s had no words.
        One that loops unprompted too is decoded in pieces (`_split`)."""
        prompt = self._prompt()
        segments, language = self._transcribe(self._buffer, prompt, self.language)
        threshold = self.options.max_compression_ratio
        if prompt and _repetitive(self._hypothesis(segments), threshold):
            segments, language = self._transcribe(self._buffer, None, self.language)
        if _repetitive(self._hypothesis(segments), threshold):
            segments = self._split(0, self._buffer.size)
        # The rest after the decode that is kept (a looping one's was decoded to be thrown away)
        segments += self._decode_rest(segments)
        return segments, language, self._hypothesis(segments)

    def _split(self, start: int, stop: int) -> list[Segment]:
        """Segments of the buffer's samples `start:stop`, whose decode repeats itself too much
        (`max_compression_ratio`), decoded unprompted in two pieces cut at the quietest frame
        of its middle half; a piece that repeats too is split again, down to `MIN_PIECE_S`,
        under which its words are a decoding loop and left out. The text alone does not tell
        a loop ("submit." 112 times over 17 s) from speech that really repeats: JFK's 11 s
        said three times in 25 s gzips to 3.8, and was dropped with its audio (the stream
        had no words at all). A loop is the decoder's, not the audio's: a cut 40 ms later had
        none, while each piece of repeated speech decodes as itself. Offline keeps such a
        window's words too (after its temperature fallback, the most probable decode)."""
        cut = start + _quietest(self._buffer[start:stop])
        pieces: list[Segment] = []
        for a, b in ((start, cut), (cut, stop)):
            found, _ = self._transcribe(self._buffer[a:b], None, self.language)
            if _repetitive([w for s in found for w in s.words or []],
                           self.options.max_compression_ratio):  # fmt: skip
                found = self._split(a, b) if b - a >= 2 * MIN_PIECE_S * SAMPLE_RATE else []
            else:
                found = _shifted(found, a / SAMPLE_RATE)
            pieces += found
        return pieces

    def _decode_rest(self, segments: list[Segment]) -> list[Segment]:
        """Segments of the speech after the buffer's last word, where the decode stopped
        `REST_S` or more before its end: Whisper's end-of-text ends a window, and a buffer is
        one window. With the committed text "And so am I fellow Americans." as its prompt,
        tiny.en decoded 5.1 s of another speaker and then 8 s of JFK as the first speaker
        alone, every update, and the stream ended without JFK's words; unprompted, it hears
        both. So the rest is decoded from the last word's end, without a prompt; a later
        window, so an improbable one is left out (`tail_log_prob_threshold`)."""
        rest: list[Segment] = []
        start = 0  # (each pass starts past the last: the loop ends)
        while True:
            ends = [w.end for s in segments + rest for w in (s.words or [])]
            if not ends or round(max(ends) * SAMPLE_RATE) <= start:
                return rest
            start = round(max(ends) * SAMPLE_RATE)
            after = self._buffer[start:]
            if after.size < REST_S * SAMPLE_RATE:
                return rest
            level = peak_frame_db(after)
            if level == -math.inf or level < peak_frame_db(self._buffer[:start]) - SPEECH_DB:
                return rest  # silence or noise after the last word: nothing was left out
            more, _ = self._transcribe(after, None, self.language)
            rest += _shifted(more, start / SAMPLE_RATE)

    def _hypothesis(self, segments: list[Segment]) -> list[Word]:
        """A decode's words after those committed, in stream time, less an unspoken tail."""
        words = [
            Word(w.start + self._offset, w.end + self._offset, w.word, w.probability)
            for s in _without_improbable_tail(segments, self.options.tail_log_prob_threshold)
            for w in (s.words or [])
        ]  # fmt: skip
        return _without_unspoken_tail(self._after_committed(words), self._buffer, self._offset)

    def _prompt(self) -> str | None:
        """Committed text before the buffer (the buffer's own text will be decoded again),
        after the initial prompt while there is less than `prompt_chars` of it."""
        limit = self.options.prompt_chars
        parts, size, i = [], 0, self._first_in_buffer
        while i > 0 and size < limit:  # O(prompt), not O(stream)
            i -= 1
            parts.append(self.committed[i].word)
            size += len(parts[-1])
        before = "".join(reversed(parts))[-limit:]
        if len(before) < limit and self.options.initial_prompt:
            before = self.options.initial_prompt.strip() + " " + before.strip()
        return before.strip() or None

    def _commit(self, words: list[Word], fix_language: bool = True) -> list[Word]:
        """Append `words` to the committed text, each starting where the one before it ends at
        the earliest: words aligned in different hypotheses may overlap by a few frames.
        fix_language False (a `commit` mid-stream): a language still being detected stays so."""
        if (words or self.committed) and self.language is None and fix_language:
            # Words committed before DETECTION_S of audio (the stream ended, or its silence
            # settled them) are in the language of the hypothesis they came from: the stream's
            # language from now on (its final event told None with words committed). So are
            # those a `commit` committed, once the stream ends with no more words.
            self.language = self._heard_language
        end, done = self._committed_end(), []
        for word in words:
            start = max(word.start, end)
            done.append(Word(start, max(word.end, start), word.word, word.probability))
            end = done[-1].end
        self.committed.extend(done)
        return done

    def _committed_end(self) -> float:
        return self.committed[-1].end if self.committed else 0.0

    def _after_committed(self, words: list[Word]) -> list[Word]:
        """The hypothesis minus the words already committed.

        The buffer's committed words are decoded again at the start of every hypothesis.
        Align them by text (their timestamps move between updates); where the text no longer
        lines up, fall back to time as ufal's HypothesisBuffer.insert does: drop words whose
        middle lies before the last commit, then a repeat of the last committed words."""
        in_buffer = self.committed[self._first_in_buffer :]
        if not in_buffer:
            return words
        old, new = [_norm(w.word) for w in in_buffer], [_norm(w.word) for w in words]
        blocks = difflib.SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks()
        for a, b, size in reversed(blocks[:-1]):  # the last is a zero-size sentinel
            if a + size == len(old) and abs(words[b + size - 1].end - in_buffer[-1].end) < 1.0:
                return words[b + size :]
        last = in_buffer[-1].end
        rest = [w for w in words if (w.start + w.end) / 2 > last]
        for n in range(min(5, len(in_buffer), len(rest)), 0, -1):
            if old[-n:] == [_norm(w.word) for w in rest[:n]]:
                return rest[n:]
        return rest

    @staticmethod
    def _agreement(new: Sequence[Word], *previous: Sequence[Word]) -> list[Word]:
        """Longest common prefix of hypotheses, as the newest one spells it."""
        agreed = []
        for i, word in enumerate(new):
            key = _norm(word.word)
            if any(i >= len(p) or _norm(p[i].word) != key for p in previous):
                break
            agreed.append(word)
        return agreed

    def _trim(self, segments: Iterable[Segment]) -> list[Word]:
        """Keep the buffer short: cut at a committed segment end, else a committed sentence end;
        at the hard cap, commit old tentative words without agreement. Returns those words."""
        options = self.options
        if self.buffer_s <= options.trim_s:
            return []
        last = self._committed_end()
        ends = [self._offset + s.end for s in segments if s.words and self._offset + s.end <= last]
        in_buffer = self.committed[self._first_in_buffer :]
        sentences = [w.end for w in in_buffer if w.word.strip().endswith(SENTENCE_END)]
        cut = max(ends or sentences or [self._offset])
        # Not inside a committed word (its times are an older decode's, the segment's end the
        # newest's): its text stayed out of the prompt while its audio was cut away. Prompted
        # "...can do for" with the audio after "you", tiny.en heard "Ask what you can do for
        # your country" as "your country. Thank you.". Cut at its end: its text is in the prompt.
        cut = max([cut] + [w.end for w in in_buffer if w.start < cut < w.end])
        if cut > self._offset:
            self._cut(cut)
        if self.buffer_s + options.min_chunk_s <= options.max_buffer_s:
            return []
        # Hypotheses have disagreed for too long: settle the old part so the buffer fits Whisper.
        horizon = self._offset + self.buffer_s - options.trim_s
        forced = [w for w in self._tentative if w.end <= horizon]
        self._tentative = self._tentative[len(forced) :]
        self._older = []
        forced = self._commit(forced)
        self._cut(max(horizon, self._committed_end()))
        return forced

    def _cut(self, t: float) -> None:
        """Drop the buffer's audio before stream time `t`."""
        n = min(self._buffer.size, max(0, round((t - self._offset) * SAMPLE_RATE)))
        self._buffer = self._buffer[n:]
        self._offset += n / SAMPLE_RATE
        while (
            self._first_in_buffer < len(self.committed)
            and self.committed[self._first_in_buffer].end <= self._offset
        ):
            self._first_in_buffer += 1


# --- replay on a simulated clock ---------------------------------------------------------------


@dataclass
class ReplayResult:
    events: list[StreamingEvent]
    words: list[Word]  # the committed words, in order
    commit_times: list[float] = field(default_factory=list)  # clock when each word was committed
    updates: int = 0
    compute_s: float = 0.0
    duration_s: float = 0.0

    @property
    def text(self) -> str:
        return "".join(w.word for w in self.words).strip()

    @property
    def delays(self) -> list[float]:
        """Per word: clock at commit minus the word's end in the audio (the commit delay)."""
        return [t - w.end for w, t in zip(self.words, self.commit_times)]


def replay(
    model: WhisperModel | BufferTranscriber,
    audio: np.ndarray | bytes | bytearray | memoryview,
    chunk_s: float = 0.5,
    options: StreamingOptions | None = None,
    compute_aware: bool = False,
) -> ReplayResult:
    """Stream a recording as if it arrived live, `chunk_s` at a time, on a simulated clock.

    compute_aware=False: updates take no time; delays measure the policy alone, the same on
    any machine. compute_aware=True: the clock also advances by each update's measured
    compute, and audio that arrived meanwhile is fed at once (ufal's simulation), so delays
    include this machine's speed.
    """
    if not 0 < chunk_s < math.inf:
        raise InvalidOptionError(f"chunk_s must be positive seconds, got {chunk_s}")
    now = 0.0
    stream = StreamingTranscriber(model, options, clock=lambda: now)
    # As `feed` takes it (s16le bytes, a list, int16): sliced by samples below, bytes by their
    # length failed with a raw "'bytes' object has no attribute 'size'".
    audio = stream._to_samples(audio)
    events: list[StreamingEvent] = []
    fed = 0
    step = max(1, round(chunk_s * SAMPLE_RATE))
    while fed < audio.size:
        target = min(audio.size, max(fed + step, round(now * SAMPLE_RATE)))
        now = max(now, target / SAMPLE_RATE)
        chunk, fed = audio[fed:target], target
        started = time.perf_counter()
        new = stream.feed(chunk)
        if compute_aware:
            now += time.perf_counter() - started
            for event in new:
                event.time = now
        events.extend(new)
    started = time.perf_counter()
    last = stream.finish()
    if compute_aware:
        last.time = now + time.perf_counter() - started
    events.append(last)
    words = [w for e in events for w in e.committed]
    commit_times = [e.time for e in events for _ in e.committed]
    return ReplayResult(
        events=events,
        words=words,
        commit_times=commit_times,
        updates=stream.updates,
        compute_s=sum(e.compute_s for e in events),
        duration_s=audio.size / SAMPLE_RATE,
    )
