"""whisperforge: OpenAI Whisper speech recognition, reference-exact and fast."""

from .audio import decode_audio, load_audio
from .errors import (
    AudioError,
    InvalidOptionError,
    ModelFormatError,
    ModelNotFoundError,
    WhisperforgeError,
)
from .results import Segment, TranscriptionInfo, Word
from .transcribe import TranscriptionOptions, WhisperModel

__version__ = "0.1.0"
__all__ = [
    "WhisperModel",
    "TranscriptionOptions",
    "Segment",
    "Word",
    "TranscriptionInfo",
    "decode_audio",
    "load_audio",
    "WhisperforgeError",
    "AudioError",
    "ModelNotFoundError",
    "ModelFormatError",
    "InvalidOptionError",
]
