"""whisperforge: OpenAI Whisper speech recognition, reference-exact and fast."""

# openai-whisper's `whisper.tokenizer.get_tokenizer` and `whisper.utils.get_writer`
from . import tokenizer, utils
from .audio import decode_audio, load_audio, log_mel_spectrogram, pad_or_trim
from .batched import BatchedInferencePipeline
from .checkpoints import available_models, download_model
from .decoding import DecodingOptions, DecodingResult
from .errors import (
    AudioError,
    InvalidOptionError,
    ModelFormatError,
    ModelNotFoundError,
    UnknownLanguageError,
    WhisperforgeError,
)

# openai-whisper's functions; `transcribe` names its function, as in openai-whisper's package,
# not the module (`from whisperforge.transcribe import ...` still reads the module).
from .openai_api import decode, detect_language, load_model, transcribe
from .results import Segment, TranscriptionInfo, Word
from .transcribe import TranscriptionOptions, WhisperModel
from .writers import format_timestamp

__version__ = "0.1.0"
__all__ = [
    "AudioError",
    "BatchedInferencePipeline",
    "DecodingOptions",
    "DecodingResult",
    "InvalidOptionError",
    "ModelFormatError",
    "ModelNotFoundError",
    "Segment",
    "TranscriptionInfo",
    "TranscriptionOptions",
    "UnknownLanguageError",
    "WhisperModel",
    "WhisperforgeError",
    "Word",
    "available_models",
    "decode",
    "decode_audio",
    "detect_language",
    "download_model",
    "format_timestamp",
    "load_audio",
    "load_model",
    "log_mel_spectrogram",
    "pad_or_trim",
    "tokenizer",
    "transcribe",
    "utils",
]
