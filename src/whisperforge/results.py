"""What transcription returns: segments with optional words, and facts about the audio."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class _AsDict:
    def _asdict(self) -> dict:
        """faster-whisper's older NamedTuple method, which code written for it still calls."""
        return asdict(self)  # type: ignore[call-overload]


@dataclass
class Word(_AsDict):
    start: float
    end: float
    word: str
    probability: float


@dataclass
class Segment(_AsDict):
    """One transcribed segment (faster-whisper's fields and order)."""

    id: int
    seek: int  # mel frame where the segment's window started
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = field(default=None)
    temperature: float | None = None  # of the decode that made it


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float
    duration_after_vad: float
    all_language_probs: list[tuple[str, float]] | None
    transcription_options: object
    vad_options: object = None
