"""whisperforge: OpenAI Whisper speech recognition, reference-exact and fast."""

from .audio import decode_audio, load_audio
from .batched import BatchedInferencePipeline
from .checkpoints import available_models, download_model
from .errors import (
    AudioError,
    InvalidOptionError,
    ModelFormatError,
    ModelNotFoundError,
    WhisperforgeError,
)
from .openai_api import load_model
from .results import Segment, TranscriptionInfo, Word
from .transcribe import TranscriptionOptions, WhisperModel
from .writers import format_timestamp

__version__ = "0.1.0"
__all__ = [
    "AudioError",
    "BatchedInferencePipeline",
    "InvalidOptionError",
    "ModelFormatError",
    "ModelNotFoundError",
    "Segment",
    "TranscriptionInfo",
    "TranscriptionOptions",
    "WhisperModel",
    "WhisperforgeError",
    "Word",
    "available_models",
    "decode_audio",
    "download_model",
    "format_timestamp",
    "load_audio",
    "load_model",
]
