"""Exceptions a user can act on. Every message says what went wrong and what to do."""


class WhisperforgeError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""


class AudioError(WhisperforgeError):
    """The audio could not be read, or holds no samples."""


class AudioTooLongError(AudioError):
    """The audio is longer than the caller's limit (`load_audio`'s max_seconds)."""


class ModelNotFoundError(WhisperforgeError):
    """A model name or path that resolves to nothing loadable."""


class ModelFormatError(WhisperforgeError):
    """A model folder or file that is incomplete or not a Whisper checkpoint."""


class InvalidOptionError(WhisperforgeError, ValueError):
    """An option value the model cannot honour (unknown language, translate on .en models, ...)."""
