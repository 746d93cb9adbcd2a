"""openai-whisper's `whisper.utils` names that its scripts use, so that with
`import whisperforge as whisper`, `whisper.utils.get_writer("srt", ".")(result, "talk.flac")`
writes `talk.srt` as openai-whisper's would."""

from .openai_api import get_writer
from .writers import format_timestamp

__all__ = ["format_timestamp", "get_writer"]
