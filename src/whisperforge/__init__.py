"""whisperforge: OpenAI Whisper speech recognition, reference-exact and fast.

The names below are imported on first use, so `import whisperforge` and `whisperforge --help`
do not pay for torch's import (1.7 s of a 1.9 s `--help` before) and Ctrl-C works at once.
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module that defines it.
_EXPORTS = {
    "AudioError": "errors",
    "InvalidOptionError": "errors",
    "ModelFormatError": "errors",
    "ModelNotFoundError": "errors",
    "UnknownLanguageError": "errors",
    "WhisperforgeError": "errors",
    "BatchedInferencePipeline": "batched",
    "DecodingOptions": "decoding",
    "DecodingResult": "decoding",
    "Segment": "results",
    "TranscriptionInfo": "results",
    "Word": "results",
    "TranscriptionOptions": "transcribe",
    "WhisperModel": "transcribe",
    "available_models": "checkpoints",
    "download_model": "checkpoints",
    "decode_audio": "audio",
    "load_audio": "audio",
    "log_mel_spectrogram": "audio",
    "pad_or_trim": "audio",
    # openai-whisper's functions (`whisper.transcribe(model, audio)`)
    "decode": "openai_api",
    "detect_language": "openai_api",
    "load_model": "openai_api",
    "transcribe": "openai_api",
    "format_timestamp": "writers",
}
# Submodules that are names of openai-whisper's package too (`whisper.tokenizer.get_tokenizer`,
# `whisper.utils.get_writer`, `whisper.audio.SAMPLE_RATE`).
_SUBMODULES = ("audio", "decoding", "model", "tokenizer", "utils")

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


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})


class _Package(types.ModuleType):
    """`whisperforge.transcribe` is openai-whisper's function, as `whisper.transcribe` is, though
    a submodule shares its name: the import system sets each submodule on its package as it
    loads, which would hide the function once `whisperforge.transcribe` (the module) is imported.
    `from whisperforge.transcribe import WhisperModel` still reads the module."""

    @property
    def transcribe(self) -> Any:
        return globals().get("transcribe") or __getattr__("transcribe")

    @transcribe.setter
    def transcribe(self, value: Any) -> None:
        if not isinstance(value, types.ModuleType):
            globals()["transcribe"] = value


sys.modules[__name__].__class__ = _Package

if TYPE_CHECKING:  # what the names are, for type checkers and editors
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
    from .openai_api import decode, detect_language, load_model, transcribe
    from .results import Segment, TranscriptionInfo, Word
    from .transcribe import TranscriptionOptions, WhisperModel
    from .writers import format_timestamp
