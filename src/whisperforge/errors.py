"""Exceptions a user can act on. Every message says what went wrong and what to do."""

import numbers
import sys


class WhisperforgeError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""


class AudioError(WhisperforgeError, ValueError):
    """The audio could not be read, or holds no samples (a ValueError, as faster-whisper's bad
    input is)."""


class AudioFileNotFoundError(AudioError, FileNotFoundError):
    """No file at the path given (caught as `FileNotFoundError` too, as faster-whisper's)."""


class AudioTooLongError(AudioError):
    """The audio is longer than the caller's limit (`load_audio`'s max_seconds)."""


class ModelNotFoundError(WhisperforgeError):
    """A model name or path that resolves to nothing loadable."""


class ModelFormatError(WhisperforgeError):
    """A model folder or file that is incomplete or not a Whisper checkpoint."""


class InvalidOptionError(WhisperforgeError, ValueError):
    """An option value the model cannot honour (unknown language, translate on .en models, ...)."""


class UnknownLanguageError(InvalidOptionError, KeyError):
    """A language the tokenizer has no token for: a ValueError as our other bad options are,
    and a KeyError as openai-whisper's `Tokenizer.to_language_token` raises, so that a script's
    `except KeyError` still catches it."""

    __str__ = Exception.__str__  # the message as written, not KeyError's quoted repr


def check_whole_number(name: str, value: object, minimum: int = 1, hint: str = "") -> None:
    """Refuse `value` unless it is a whole number of at least `minimum`: 2.5 would be sliced on,
    "5" fails deep in the work with a bare TypeError, and True would pass as 1. `hint` is added
    after the rule (" (or None to pick one)")."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise InvalidOptionError(
            f"{name} must be a whole number of at least {minimum}{hint}, not {value!r}"
        )


def is_number(value: object) -> bool:
    """A real number, not a bool (True would pass as 1) or a string."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_probability(name: str, value: object) -> None:
    """Refuse `value` unless it is a number from 0 to 1 (a NaN compares false everywhere, which
    would switch the check it sets off)."""
    if not is_number(value) or not 0 <= value <= 1:  # type: ignore[operator]
        raise InvalidOptionError(f"{name} is a probability, 0 to 1, not {value!r}")


# What to do when a decode does not fit the GPU (torch raises its own error, not ours).
GPU_OUT_OF_MEMORY = (
    "the GPU ran out of memory; use a smaller beam_size or best_of (5 is the usual), fewer "
    "windows at once (batch_size), or a smaller model or compute_type (int8_float16)"
)


def is_out_of_memory(error: BaseException) -> bool:
    """torch's CUDA out-of-memory error, told apart without importing torch (where torch was
    never imported, nothing could have raised it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, torch.cuda.OutOfMemoryError)
