"""OpenAI's Realtime API in transcription mode, as the server's streams speak it: the session a
`session.update` (or the beta `transcription_session.update`) configures, and server VAD turn
detection, which cuts the stream into items where the speaker pauses."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from .audio import MAX_STREAM_RATE, MIN_STREAM_RATE, SAMPLE_RATE
from .streaming import pcm16_to_float
from .vad import FRAME, StreamingVad, default_vad

OPENAI_RATE = 24000  # OpenAI's audio/pcm (beta: pcm16) is 24 kHz
MAX_PADDING_MS = 10_000  # the audio a stream holds back as prefix padding is bounded
# The models the beta transcription session names (the openai SDK's type allows no other).
BETA_MODELS = ("gpt-4o-transcribe", "gpt-4o-mini-transcribe", "whisper-1")


class SessionError(ValueError):
    """A session update the server will not carry out: its message, and the field it names."""

    def __init__(self, message: str, param: str | None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class ServerVad:
    """OpenAI's `server_vad` turn detection, with its defaults: speech starts at a frame whose
    speech probability is `threshold` or more (the item's audio starts `prefix_padding_ms`
    before it) and stops after `silence_duration_ms` of frames under it (0: at the first)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class Session:
    """What a stream's client may set with session.update (language and prompt: those of its
    `StreamingOptions`; model: the id said back)."""

    rate: int
    model: str
    language: str | None
    prompt: str | None
    turn_detection: ServerVad | None

    def ga(self) -> dict[str, Any]:
        """The session object of OpenAI's session.created and session.updated."""
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": self.rate},
                "transcription": {"model": self.model, "language": self.language,
                                  "prompt": self.prompt or ""},
                "turn_detection": self._turn_detection(),
                "noise_reduction": None,
            }},
            "include": [],
        }  # fmt: skip

    def beta(self) -> dict[str, Any]:
        """The session object of the beta transcription_session.updated, as the openai SDK's
        beta type takes it: that type requires a client_secret, which OpenAI gives a session
        made over REST only (none is made here): an empty one, expired; and it names OpenAI's
        models only: the loaded model's own id is said as whisper-1, the alias it serves."""
        model = self.model if self.model in BETA_MODELS else "whisper-1"
        return {
            "object": "realtime.transcription_session",
            "client_secret": {"value": "", "expires_at": 0},
            "input_audio_format": "pcm16",
            "input_audio_transcription": {"model": model, "language": self.language,
                                          "prompt": self.prompt or ""},
            "turn_detection": self._turn_detection(),
            "input_audio_noise_reduction": None,
            "include": [],
            "modalities": ["text"],
        }  # fmt: skip

    def _turn_detection(self) -> dict[str, Any] | None:
        vad = self.turn_detection
        return None if vad is None else {"type": "server_vad", **asdict(vad)}


def updated(session: Session, kind: str, body: Any, openai_rate: bool = False) -> Session:
    """`session` with what a `kind` event ("session.update", or the beta
    "transcription_session.update") sets: only the fields it has, as OpenAI's; a field this
    server does not heed is a SessionError naming it, not ignored as if it were heeded.
    openai_rate: the audio is OpenAI's 24 kHz only (/v1/realtime: OpenAI's clients refuse a
    session of another rate), not any rate the server can resample."""
    if kind == "transcription_session.update":
        return _updated_beta(session, body)
    body = _fields(body, "session", ("type", "audio", "include", "id", "object"))
    if body.get("type", "transcription") != "transcription":
        raise SessionError(f"session.type {body['type']!r}: this server serves transcription "
                           "sessions only; send 'transcription'", "session.type")  # fmt: skip
    _no_logprobs(body.get("include"), "session.include")
    audio = _fields(body.get("audio", {}), "session.audio", ("input",))
    where = "session.audio.input"
    audio_input = _fields(audio.get("input", {}), where,
                          ("format", "transcription", "turn_detection", "noise_reduction"))  # fmt: skip
    _no_noise_reduction(audio_input.get("noise_reduction"), f"{where}.noise_reduction")
    if "format" in audio_input:
        fmt = _fields(audio_input["format"], f"{where}.format", ("type", "rate"))
        if fmt.get("type", "audio/pcm") != "audio/pcm":
            raise SessionError(f"audio format {fmt['type']!r} is not supported; send "
                               "audio/pcm (16-bit mono PCM)", f"{where}.format.type",
                               "unsupported")  # fmt: skip
        rate = _rate(fmt.get("rate", OPENAI_RATE), f"{where}.format.rate", openai_rate)
        session = replace(session, rate=rate)
    if "transcription" in audio_input:
        session = _transcription(session, audio_input["transcription"], f"{where}.transcription")
    if "turn_detection" in audio_input:
        session = replace(session, turn_detection=_server_vad(audio_input["turn_detection"],
                                                              f"{where}.turn_detection"))  # fmt: skip
    return session


def _updated_beta(session: Session, body: Any) -> Session:
    body = _fields(body, "session", ("input_audio_format", "input_audio_transcription",
                                     "turn_detection", "input_audio_noise_reduction", "include",
                                     "modalities"))  # fmt: skip
    _no_logprobs(body.get("include"), "session.include")
    _no_noise_reduction(
        body.get("input_audio_noise_reduction"), "session.input_audio_noise_reduction"
    )
    if body.get("modalities") not in (None, ["text"]):
        raise SessionError("a transcription session's modalities are ['text']",
                           "session.modalities", "unsupported")  # fmt: skip
    if "input_audio_format" in body:
        if body["input_audio_format"] != "pcm16":
            raise SessionError(f"audio format {body['input_audio_format']!r} is not supported; "
                               "send pcm16", "session.input_audio_format", "unsupported")  # fmt: skip
        session = replace(session, rate=OPENAI_RATE)
    if "input_audio_transcription" in body:
        session = _transcription(session, body["input_audio_transcription"],
                                 "session.input_audio_transcription")  # fmt: skip
    if "turn_detection" in body:
        session = replace(session, turn_detection=_server_vad(body["turn_detection"],
                                                              "session.turn_detection"))  # fmt: skip
    return session


def _fields(body: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise SessionError(f"{where} must be an object", where)
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise SessionError(f"{where}.{unknown[0]} is not supported by this server; {where} "
                           f"takes {', '.join(known)}", f"{where}.{unknown[0]}",
                           "unknown_parameter")  # fmt: skip
    return body


def _no_noise_reduction(setting: Any, where: str) -> None:
    if setting is not None:
        raise SessionError("noise reduction is not supported; send null", where, "unsupported")


def _no_logprobs(include: Any, where: str) -> None:
    if include not in (None, []):
        raise SessionError("log probabilities are not returned; send no include", where,
                           "unsupported")  # fmt: skip


def _rate(rate: Any, where: str, openai_rate: bool) -> int:
    if isinstance(rate, bool) or not isinstance(rate, int):
        rate = 0
    if openai_rate and rate != OPENAI_RATE:
        raise SessionError(f"audio/pcm is {OPENAI_RATE} Hz here, as on OpenAI's Realtime API; "
                           f"send {OPENAI_RATE} (resample the audio to it), or stream other "
                           "rates to /v1/audio/stream", where, "unsupported")  # fmt: skip
    if not MIN_STREAM_RATE <= rate <= MAX_STREAM_RATE:
        raise SessionError(f"the rate must be a whole number of Hz from {MIN_STREAM_RATE} to "
                           f"{MAX_STREAM_RATE}, e.g. 24000", where)  # fmt: skip
    return rate


def _transcription(session: Session, body: Any, where: str) -> Session:
    if body is None:  # (OpenAI's way to turn transcription off: the one thing this server does)
        raise SessionError("transcription cannot be turned off on this server", where)
    body = _fields(body, where, ("model", "language", "prompt"))
    for name in body:
        if body[name] is not None and not isinstance(body[name], str):
            raise SessionError(f"{where}.{name} must be a string", f"{where}.{name}")
    return replace(session, model=body.get("model") or session.model,
                   language=body.get("language", session.language) or None,
                   prompt=body.get("prompt", session.prompt) or None)  # fmt: skip


def _server_vad(body: Any, where: str) -> ServerVad | None:
    if body is None:
        return None
    # create_response and interrupt_response are about responses, which a transcription
    # session makes none of; they change nothing here.
    body = _fields(body, where, ("type", "threshold", "prefix_padding_ms", "silence_duration_ms",
                                 "create_response", "interrupt_response", "idle_timeout_ms"))  # fmt: skip
    if body.get("type") != "server_vad":
        raise SessionError(f"turn detection {body.get('type')!r} is not supported; send "
                           "server_vad, or null for none", f"{where}.type", "unsupported")  # fmt: skip
    if body.get("idle_timeout_ms") is not None:
        raise SessionError("idle_timeout_ms is not supported; send null",
                           f"{where}.idle_timeout_ms", "unsupported")  # fmt: skip
    values: dict[str, Any] = {}
    for name, kind, least, most in (("threshold", float, 0.0, 1.0),
                                    ("prefix_padding_ms", int, 0, MAX_PADDING_MS),
                                    ("silence_duration_ms", int, 0, 60_000)):  # fmt: skip
        value = body.get(name)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (
            not number
            or not math.isfinite(value)
            or not least <= value <= most
            or (kind is int and value != int(value))
        ):
            raise SessionError(f"{name} must be {'a' if kind is float else 'a whole'} number from "
                               f"{least:g} to {most:g}", f"{where}.{name}")  # fmt: skip
        values[name] = kind(value)
    return ServerVad(**values)


@dataclass
class Turn:
    """One step of what a stream does with its audio under server VAD, in order: "drop" audio
    (silence before the speech and its padding, not decoded), "feed" it, speech "started" or
    "stopped" (at `sample`, of all the stream's audio; a stop holds the speech's audio not fed
    yet, to feed after the stop is said: said after its decode, it came a decode late)."""

    kind: str
    pcm: bytes = b""
    sample: int = 0

    @property
    def ms(self) -> int:
        return round(1000 * self.sample / SAMPLE_RATE)


class TurnDetector:
    """Server VAD over a stream's 16 kHz s16le audio in whole samples (`PcmResampler`'s):
    Silero's speech probability per 32 ms frame (`StreamingVad`: 1.9 ms a 100 ms append on one
    CPU thread). Outside speech the audio is held back, at most `prefix_padding_ms` of it, and
    the rest dropped: Whisper invents words in silence."""

    def __init__(self, options: ServerVad):
        self.options = options
        self.speaking = False
        self._vad: StreamingVad | None = None  # made in the first call's thread: loading Silero
        # blocked the server's event loop
        self._held = bytearray()  # s16le neither fed nor dropped yet, from sample `_base`
        self._base = self._frames = 0  # `_frames`: where the frames classified end
        self._silent = 0  # samples of silence since the last speech, while speaking

    def __call__(self, pcm: bytes) -> list[Turn]:
        self._held += pcm
        self._vad = self._vad or StreamingVad(default_vad())
        padding = self.options.prefix_padding_ms * SAMPLE_RATE // 1000
        silence = self.options.silence_duration_ms * SAMPLE_RATE // 1000
        turns: list[Turn] = []
        for prob in self._vad(pcm16_to_float(pcm)):
            frame, self._frames = self._frames, self._frames + FRAME
            if not self.speaking and prob >= self.options.threshold:
                start = max(self._base, frame - padding)
                turns += [self._take("drop", start), Turn("started", sample=start)]
                self.speaking, self._silent = True, 0
            elif self.speaking:
                self._silent = self._silent + FRAME if prob < self.options.threshold else 0
                # (at least one frame of silence: with silence_duration_ms 0, `>= 0` held at
                # every frame of speech, and 7 s of speech made 84 turns of 64 ms)
                if self._silent and self._silent >= silence:
                    turns.append(self._take("stopped", self._frames))
                    self.speaking = False
        if self.speaking:  # what follows is the speech's, until a stop says otherwise
            turns.append(self._take("feed", self._base + len(self._held) // 2))
        else:  # kept: the padding of speech that a frame to come may start
            turns.append(self._take("drop", self._frames - padding))
        return [t for t in turns if t.pcm or t.kind in ("started", "stopped")]

    def clear(self, pcm: bytes) -> bytes:
        """At a clear: the audio held back and `pcm` (which came just before the clear), to drop
        with the buffer; the detector starts over after them, not speaking."""
        data = bytes(self._held) + pcm
        self._base = self._frames = self._base + len(data) // 2
        self._held, self.speaking, self._silent = bytearray(), False, 0
        self._vad = None
        return data

    def _take(self, kind: str, end: int) -> Turn:
        """The held audio up to sample `end`, as a `kind` turn at `end`."""
        size = 2 * max(0, end - self._base)
        pcm = bytes(self._held[:size])
        del self._held[:size]
        self._base += len(pcm) // 2
        return Turn(kind, pcm, end)
