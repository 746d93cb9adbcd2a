"""Audio in: decode any container to 16 kHz mono float32, and the log-mel spectrogram.

The spectrogram matches openai-whisper's `log_mel_spectrogram` (same STFT, Slaney mel
filters, log10 clamp and dynamic-range squeeze), computed with torch on the model's device.
"""

from __future__ import annotations

import io
import math
import os
import re
import struct
import warnings
import wave
from collections.abc import Callable, Iterator
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from .errors import AudioError, AudioFileNotFoundError, AudioTooLongError, check_whole_number

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30  # seconds per window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100
MIN_STREAM_RATE, MAX_STREAM_RATE = 8000, 192000  # raw PCM a stream takes, in Hz

AudioInput = (
    str | os.PathLike | bytes | bytearray | memoryview | BinaryIO | np.ndarray | torch.Tensor
)
T = TypeVar("T", np.ndarray, torch.Tensor)


def decode_audio(
    input_file: str | os.PathLike | bytes | bytearray | memoryview | BinaryIO,
    sampling_rate: int = SAMPLE_RATE,
    split_stereo: bool = False,
    *,
    max_seconds: float | None = None,
    on_samples: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Decode a file, bytes or file object (any container FFmpeg reads, video included) to mono
    float32 at `sampling_rate` (16 kHz, Whisper's), or with `split_stereo` to its (left, right)
    channels, as faster-whisper's `decode_audio`. Packets that fail to decode are skipped with
    a warning, as the ffmpeg command line does, so a damaged or cut-off recording still gives
    the audio it holds. A stereo file whose channels cancel out in the mono mix (one is the
    other inverted) gives its louder channel instead, with a warning (`_cancelled_channel`).
    Without PyAV, only PCM WAV at `sampling_rate` is read (`read_pcm_wav`).
    `max_seconds`: refuse longer audio as soon as the decode passes it (a server's guard: a
    few MB of compressed silence decode to hours, 0.23 GB of samples an hour). `on_samples` is
    called with the count of samples decoded so far after each packet; what it raises stops the
    decode (a server's memory budget, shared by the requests decoding at once). `on_warning`
    takes what would be warned of (a cut-off file, skipped packets, a second audio stream) in
    place of `warnings.warn` (a corpus row records it: `catch_warnings` is not thread-safe)."""
    # PyAV reads 0 as the file's own rate, and a negative one failed as an unreadable file.
    check_whole_number("sampling_rate", sampling_rate)
    warn = on_warning or (lambda message: warnings.warn(message, stacklevel=3))  # our caller's
    if isinstance(input_file, os.PathLike):  # pathlib's, os.scandir's entries, ...
        input_file = os.fsdecode(input_file)
    name = input_file if isinstance(input_file, str) else "<audio bytes>"
    if isinstance(input_file, str):
        path = Path(input_file)
        if not path.exists():
            # Only a shell expands ~: open() and FFmpeg look for a folder named "~".
            tilde = name.startswith("~")
            hint = " (~ is not expanded here: pass os.path.expanduser(path))" if tilde else ""
            if path.is_symlink():  # exists() follows links: one to nowhere, or a loop of them
                hint = f" (a symbolic link to {os.readlink(path)!r}, which does not lead to one)"
            raise AudioFileNotFoundError(f"{name}: no such file; check the path{hint}")
        if path.is_dir():
            raise AudioError(f"{name}: a folder, not a file; pass an audio or video file")
        if path.is_file() and path.stat().st_size == 0:  # (a pipe has no size to check)
            raise AudioError(f"{name}: the file is empty (0 bytes); pass a complete audio file")
    elif isinstance(input_file, (bytes, bytearray, memoryview)):
        if len(input_file) == 0:
            raise AudioError("the audio bytes are empty; pass the bytes of an audio file")
        input_file = io.BytesIO(input_file)
    elif isinstance(input_file, io.TextIOBase):
        name = getattr(input_file, "name", "<text file object>")
        raise AudioError(f"{name}: opened in text mode; open audio files with 'rb'")
    elif isinstance(input_file, (np.ndarray, torch.Tensor)):
        raise AudioError(
            "decode_audio reads files: an array holds samples already; pass it to transcribe "
            "or load_audio as it is (16 kHz mono)"
        )
    elif not hasattr(input_file, "read"):
        raise AudioError(
            f"cannot read audio from a {type(input_file).__name__}; pass a path, bytes, "
            "a binary file object or a 16 kHz float array"
        )
    else:
        name = str(getattr(input_file, "name", "<audio file object>"))
        # FFmpeg probes from where the object stands but seeks in it from byte 0: one read
        # already (a second transcribe of it) failed as invalid data, one part-read decoded
        # from its start or not at all, as the container's probe went.
        position = _position(input_file)
        if position:
            raise AudioError(
                f"{name}: the file object is at byte {position}, not at its start (read "
                "already?); call its .seek(0) first, or pass the path or the bytes"
            )
    # A path or bytes is read again for what FFmpeg does not check (a WAV's or Ogg's cut-off
    # end, an MP4's missing index). Not a named pipe's path (bash's <(...)): opened again, it
    # waits for a writer for ever.
    is_file = isinstance(input_file, str) and os.path.isfile(input_file)
    rereadable = input_file if is_file or isinstance(input_file, io.BytesIO) else None
    try:
        import av  # imported here: PyAV is optional where audio comes in as arrays
    except ImportError:  # a slim install, e.g. a GPU box without FFmpeg's libraries
        return read_pcm_wav(input_file, name, sampling_rate, split_stereo, on_warning)

    # s16 like the ffmpeg command line that openai-whisper runs, so the samples agree with it.
    layout = "stereo" if split_stereo else "mono"
    resampler = av.AudioResampler(format="s16", layout=layout, rate=sampling_rate)
    chunks: list[np.ndarray] = []  # one small array per frame: appending is O(1), joined once
    n_packets = n_bad = n_samples = 0
    next_check = MEMORY_CHECK_SAMPLES
    channels = 2 if split_stereo else 1
    max_samples = math.inf if max_seconds is None else max_seconds * sampling_rate * channels
    energy = np.zeros(4)  # of the stereo frames, mixed to mono here: see _stereo_energy
    n_frames = 0
    try:
        with av.open(input_file, mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                kind = container.format.name.split(",")[0]  # "tty" for a text file: a clue
                raise AudioError(
                    f"{name}: no audio stream in it (read as {kind}); pass a file with sound"
                )
            stream = container.streams.audio[0]  # faster-whisper's choice
            promised = _header_seconds(container, stream)
            if len(container.streams.audio) > 1:  # the others are not heard: say so
                warn(
                    f"{name}: {len(container.streams.audio)} audio streams; transcribing the "
                    f"first only (stream #{stream.index}); to transcribe another, extract it "
                    "first (e.g. ffmpeg -i FILE -map 0:a:1 out.flac)"
                )
            for packet in _demuxed(container, stream):  # the last, empty one flushes the decoder
                if packet is None:  # one the demuxer could not read, at the end
                    n_bad += 1
                    continue
                n_packets += int(packet.size > 0)
                try:
                    frames = packet.decode()
                except av.error.InvalidDataError:
                    n_bad += 1
                    continue
                for frame in frames:
                    # every 8th frame: the same verdict at an eighth of the cost
                    if not split_stereo and n_frames % 8 == 0 and len(frame.layout.channels) == 2:
                        energy += _frame_energy(frame)
                    n_frames += 1
                    for out in resampler.resample(frame):
                        chunks.append(out.to_ndarray().reshape(-1))
                        n_samples += chunks[-1].size
                if n_samples > max_samples:
                    raise AudioTooLongError(_too_long(name, max_seconds))
                if on_samples is not None:
                    on_samples(n_samples)
                if n_samples >= next_check:  # hours of audio: will the samples fit in memory?
                    next_check = n_samples + MEMORY_CHECK_SAMPLES
                    _check_room(name, n_samples, sampling_rate * channels)
            chunks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
    except AudioError:
        raise
    except PermissionError:  # not "unreadable audio": the file may be fine
        raise AudioError(f"{name}: permission denied; check its permissions (ls -l)") from None
    except (av.error.FFmpegError, OSError, UnicodeDecodeError, ValueError) as error:
        # An MP4 whose index (moov, written last) is missing: FFmpeg says only "invalid data".
        invalid = isinstance(error, av.error.InvalidDataError)
        if invalid and rereadable is not None and _mp4_without_index(rereadable):
            raise AudioError(
                f"{name}: an MP4 without its index (the moov box, written last): the file is "
                "cut off, or its recording was not stopped properly; pass the whole file"
            ) from None
        if isinstance(error, av.error.EOFError):  # an Ogg or FLAC cut before its first audio
            raise AudioError(
                f"{name}: the file ends before its first whole audio packet (cut off?); pass "
                "the whole file"
            ) from None
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise AudioError(
            f"{name}: not a readable audio file ({reason}); pass a complete audio or video file"
        ) from None
    if not n_packets:  # a header alone: a recording stopped at once, or an empty stream
        raise AudioError(f"{name}: its audio stream is empty (0 s); pass a recording with sound")
    if not chunks:
        raise AudioError(f"{name}: no audio decodes from it; check that it plays, or re-encode it")
    skipped = f"skipped {n_bad} of {n_packets} audio packets that did not decode" if n_bad else ""
    held = n_samples / channels / sampling_rate
    if container.format.name == "wav":
        # FFmpeg sizes a WAV by the file, so a cut-off recording decodes without a complaint.
        promised = _wav_promised_seconds(rereadable) if rereadable is not None else None
        slack = 0.05  # the header counts the samples
    else:
        slack = 0.5 + 0.01 * (promised or 0)  # encoder delay and padding, MP4's priming
    # Ogg states no length (FFmpeg's is its last page's there): its end mark shows a cut.
    ogg = rereadable if container.format.name == "ogg" else None
    if promised is not None and promised > held + slack:  # a cut-off MP3, FLAC, WebM, WAV ...
        warn(_cut_off(name, promised, held, skipped))
    elif ogg is not None and not _ogg_ends_whole(ogg):
        warn(_cut_off(name, None, held, skipped))
    elif skipped:
        warn(f"{name}: {skipped} (the file may be damaged or cut off)")
    louder = _cancelled_channel(energy)
    if louder is not None:
        again = _rewound(input_file)
        warn(_cancelled(name, louder, again is not None))
        # Decoded again as two channels: kept on every stereo decode, they would cost each one
        # for a rare fault.
        if again is not None:
            chunks.clear()  # the mix, near-silence, is not held meanwhile
            both = decode_audio(again, sampling_rate, split_stereo=True, max_seconds=max_seconds,
                                on_samples=on_samples, on_warning=lambda _: None)  # fmt: skip
            # (What it warns of was warned of above.) A copy: the channel is a view into both,
            # which would hold twice its memory while the file is transcribed.
            return both[louder].copy()
    samples = np.concatenate(chunks, dtype=np.float32)  # straight to float32: no int16 copy
    samples *= 1.0 / 32768.0
    if split_stereo:  # s16 stereo comes interleaved: left, right, left, ...
        return samples[0::2], samples[1::2]
    return samples


def _demuxed(container: Any, stream: Any) -> Iterator[Any]:
    """`container.demux(stream)`, but where the demuxer fails on a packet after reading others
    (a raw AAC cut off inside a frame's header failed whole, its audio lost), None for it and
    an empty packet that flushes the decoder, as the demuxer's own last one does."""
    import av

    packets = container.demux(stream)
    n_read = 0
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            return
        except av.error.InvalidDataError:
            if not n_read:
                raise
            yield None
            flush = av.Packet()
            flush.stream = stream
            yield flush
            return
        n_read += 1
        yield packet


# A stereo recording whose mono mix has under this part of the RMS of its louder channel, and
# that channel above SILENT_RMS, is one whose channels cancel out when mixed: near-opposites
# (R = -L, a known wiring or phase fault). Its mix is near-silence, transcribed to nothing.
CANCELLED_MIX = 0.1
SILENT_RMS = 10 ** (-60 / 20)  # -60 dBFS


def _stereo_energy(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The sums of squares of two channels' float samples and of their mono mix (their mean,
    as FFmpeg mixes stereo to mono), and the count of samples: added up over a file."""
    mix = (left + right) / 2
    return np.array([left @ left, right @ right, mix @ mix, left.size])


def _frame_energy(frame: Any) -> np.ndarray:
    """`_stereo_energy` of a decoded stereo frame (planar or interleaved, integer or float
    samples as the codec gives them), in units of full scale."""
    data = frame.to_ndarray().astype(np.float64)
    if frame.format.name.startswith("u8"):  # unsigned (8-bit WAV): centred on 128, not 0
        data -= 128
    if not frame.format.name.startswith(("flt", "dbl")):
        data /= 2.0 ** (frame.format.bits - 1)
    left, right = data if frame.format.is_planar else data.reshape(-1, 2).T
    return _stereo_energy(left, right)


def _cancelled_channel(energy: np.ndarray) -> int | None:
    """The louder channel (0: left, 1: right) of a stereo recording whose mono mix cancels out,
    by its `_stereo_energy`; None where the mix is sound (or silence, or there was no stereo)."""
    left, right, mix, count = energy
    louder = max(left, right)
    if not count or louder < count * SILENT_RMS**2 or mix >= CANCELLED_MIX**2 * louder:
        return None
    return int(right > left)


def _cancelled(name: str, louder: int, read_again: bool = True) -> str:
    side = ("left", "right")[louder]
    then = (
        f"transcribing its {side} channel instead"
        if read_again
        else f"transcribing the mix: pass the file's path or bytes to have its {side} channel "
        "transcribed instead"
    )
    return (
        f"{name}: its two channels cancel out when mixed to mono (one is the other inverted: a "
        f"wiring or phase fault), which leaves near-silence; {then}"
    )


def _rewound(source: str | BinaryIO) -> str | BinaryIO | None:
    """`decode_audio`'s input, to be read again from its start; None where it cannot be (a
    pipe, read once)."""
    if isinstance(source, str):
        return source if os.path.isfile(source) else None
    try:
        if source.seekable():
            source.seek(0)  # its start: decode_audio refuses a file object that is not there
            return source
    except (AttributeError, OSError, ValueError):  # no seekable(), or closed
        pass
    return None


# A WAV's (format tag, bits a sample) as FFmpeg's raw formats (8-bit PCM is unsigned).
_WAV_FORMATS = {(1, 8): "u8", (1, 16): "s16le", (1, 24): "s24le", (1, 32): "s32le",
                (3, 32): "f32le", (3, 64): "f64le"}  # fmt: skip


class _Arriving:
    """A file-like `read` over `head` and then `read_more`, for FFmpeg (no seek: it reads the
    stream front to back) and `_wav_header`."""

    def __init__(self, head: bytes, read_more: Callable[[int], bytes]):
        self.head, self.read_more = head, read_more

    def read(self, n: int = -1) -> bytes:
        if self.head:
            taken, self.head = (self.head, b"") if n < 0 else (self.head[:n], self.head[n:])
            return taken
        return self.read_more(1 << 16 if n < 0 else n)

    def read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n and (more := self.read(n - len(data))):
            data += more
        return data


def _wav_header(name: str, source: _Arriving) -> tuple[str, int, int]:
    """Reads a WAV's chunks up to its samples; (FFmpeg's raw format, rate, channels)."""
    source.read_exactly(12)  # RIFF, size, WAVE
    form = None
    while len(chunk := source.read_exactly(8)) == 8:
        kind, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if kind == b"data":
            if form is None:
                break
            return form
        body = source.read_exactly(size + size % 2)  # chunks are padded to even sizes
        if kind == b"fmt " and len(body) >= 16:
            tag, channels, rate = struct.unpack("<HHI", body[:8])
            bits = struct.unpack("<H", body[14:16])[0]
            if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: its sub-format's
                tag = struct.unpack("<H", body[24:26])[0]
            if (tag, bits) not in _WAV_FORMATS:
                raise AudioError(f"{name}: a WAV of format {tag} at {bits} bits, which is not "
                                 "streamed; send PCM or float samples")  # fmt: skip
            form = (_WAV_FORMATS[tag, bits], rate, channels)
    raise AudioError(f"{name}: a WAV header without its format or samples; send a whole WAV")


def decode_arriving(
    name: str, head: bytes, read: Callable[[int], bytes], raw: tuple[str, int, int] | None = None
) -> Iterator[bytes]:
    """16 kHz mono s16le PCM of audio as it arrives: `head`, then what `read(n)` returns (what
    has arrived, up to n bytes; b"" at the end), as a pipe from a microphone gives it. A
    container FFmpeg reads front to back (WAV, MP3, ADTS AAC, FLAC, Ogg, WebM; not an MP4,
    whose index may come last), or with `raw` = (FFmpeg's PCM format, rate, channels) raw PCM.
    A PCM WAV's header is read here, its samples then streamed as raw PCM: FFmpeg's probe of
    a WAV held back its first 64 KB (2 s of 16 kHz audio, 8 s of a recorder's 8 kHz u8)."""
    source = _Arriving(head, read)
    wav = raw is None and head.startswith(b"RIFF") and head[8:12] == b"WAVE"
    if wav:
        raw = _wav_header(name, source)
    # Mono PCM is resampled here, but a WAV at a rate PcmResampler refuses goes to FFmpeg: it
    # reads any rate it can, and names a damaged header's (0 Hz) in its error
    if (
        raw is not None
        and raw[0] == "s16le"
        and raw[2] == 1
        and (not wav or MIN_STREAM_RATE <= raw[1] <= MAX_STREAM_RATE)
    ):
        resample = PcmResampler(raw[1], name)
        while data := source.read():
            if pcm := resample(data):
                yield pcm
        if pcm := resample.flush():
            yield pcm
        return
    av = _import_av(name)
    options = {"probesize": "32", "analyzeduration": "0"}  # start at once, not after seconds
    if raw is not None:
        options |= {"sample_rate": str(raw[1]), "ch_layout": f"{raw[2]}c"}
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    # A stereo stream whose channels cancel out in the mix (`_cancelled_channel`) is told of,
    # once, after a second of it: gone by, its audio cannot be decoded again as decode_audio
    # does, and it was transcribed to nothing without a word.
    energy, told = np.zeros(4), False
    try:
        with av.open(source, format=raw and raw[0], options=options) as container:
            if not container.streams.audio:
                raise AudioError(f"{name}: no audio stream in it; pass audio")
            for frame in container.decode(container.streams.audio[0]):
                if not told and len(frame.layout.channels) == 2:
                    energy += _frame_energy(frame)
                    louder = _cancelled_channel(energy)
                    if louder is not None and energy[3] >= frame.sample_rate:
                        warnings.warn(_cancelled(name, louder, read_again=False), stacklevel=2)
                        told = True
                for out in resampler.resample(frame):
                    yield out.to_ndarray().tobytes()
            for out in resampler.resample(None):
                yield out.to_ndarray().tobytes()
    except av.error.FFmpegError as error:
        raise AudioError(f"{name}: not audio FFmpeg can decode as it arrives ({error}); save "
                         "it to a file and pass the file") from None  # fmt: skip


def _import_av(name: str) -> Any:
    try:
        import av
    except ImportError:
        raise AudioError(f"{name}: decoding it needs PyAV (pip install av); or send raw 16 kHz "
                         "mono s16le PCM") from None  # fmt: skip
    return av


def whole_samples(carried: bytes, data: bytes) -> tuple[bytes, bytes]:
    """s16le bytes that arrive in pieces of any length: (the whole samples of `carried` +
    `data`, the odd byte left over, which goes before the next piece)."""
    data = carried + data
    odd = data[-1:] if len(data) % 2 else b""
    return data[: len(data) - len(odd)], odd


class PcmResampler:
    """Raw mono s16le PCM at `rate` Hz (8000-192000), in pieces of any length as they arrive
    (a live stream's), to 16 kHz mono s16le in whole samples: `resample(data)` returns what is
    ready, `flush()` the rest at the end. FFmpeg's resampler, the one files are decoded with; it
    carries its filter state from piece to piece, so the pieces join as one signal. At 16 kHz
    the bytes pass as they are, but for an odd byte, which waits for the next piece (PyAV is
    needed for other rates only)."""

    def __init__(self, rate: int, name: str = "<audio>"):
        # (a rate past an int32 was a traceback, 0 one too, and at 1 Hz every byte made
        # 8000 samples: hours of audio of a few kilobytes)
        if not MIN_STREAM_RATE <= rate <= MAX_STREAM_RATE:
            raise AudioError(f"{name}: raw PCM at {rate} Hz is not streamed; its rate must be "
                             f"from {MIN_STREAM_RATE} to {MAX_STREAM_RATE} Hz")  # fmt: skip
        self.rate, self._odd_byte, self._samples = rate, b"", 0
        self._resampler = None
        if rate != SAMPLE_RATE:
            self._av = _import_av(name)
            self._resampler = self._av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)

    def __call__(self, data: bytes) -> bytes:
        data, self._odd_byte = whole_samples(self._odd_byte, data)
        if self._resampler is None:
            return data
        samples = np.frombuffer(data, "<i2")
        if not samples.size:
            return b""
        frame = self._av.AudioFrame.from_ndarray(
            samples.reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate, frame.pts = self.rate, self._samples
        frame.time_base = Fraction(1, self.rate)
        self._samples += samples.size
        return self._resampled(frame)

    def flush(self) -> bytes:
        """The samples the resampler still holds (its filter's last few)."""
        return b"" if self._resampler is None else self._resampled(None)

    def _resampled(self, frame: Any) -> bytes:
        assert self._resampler is not None
        return b"".join(out.to_ndarray().tobytes() for out in self._resampler.resample(frame))


def _position(file: BinaryIO) -> int:
    """Where a seekable file object stands; 0 for a stream (a pipe, a socket) that can't say."""
    try:
        return file.tell() if file.seekable() else 0
    except (AttributeError, OSError, ValueError):  # no seekable(), or closed: av.open says so
        return 0


def read_pcm_wav(
    source: str | Path | BinaryIO,
    name: str = "<audio>",
    sampling_rate: int = SAMPLE_RATE,
    split_stereo: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """PCM WAV at `sampling_rate` (8, 16 or 32-bit, channels averaged; or its first two as
    (left, right), a mono file's twice) to float32 with the standard library's `wave`, for
    installs without PyAV. Anything else needs PyAV. A stereo file whose channels cancel out in
    the mono mix gives its louder channel, with a warning, as `decode_audio` does."""
    warn = on_warning or (lambda message: warnings.warn(message, stacklevel=4))  # our caller's
    try:
        with _open_wav(source) as wav:
            rate, channels, width = wav.getframerate(), wav.getnchannels(), wav.getsampwidth()
            n_frames = wav.getnframes()
            data = wav.readframes(n_frames)
    except (wave.Error, EOFError) as error:
        raise AudioError(
            f"{name}: not a PCM WAV file ({error}); without PyAV only 16 kHz PCM WAV can be "
            "read: install PyAV (pip install av) for other formats"
        ) from None
    dtype = {1: np.uint8, 2: np.dtype("<i2"), 4: np.dtype("<i4")}.get(width)
    if rate != sampling_rate or dtype is None:
        raise AudioError(
            f"{name}: a {rate} Hz {8 * width}-bit WAV; without PyAV only "
            f"{sampling_rate / 1000:g} kHz PCM WAV of 8, 16 or 32 bits can be read: install "
            "PyAV (pip install av), or convert it first"
        )
    whole = len(data) // (width * channels)  # a cut-off file can end inside a frame
    if whole < n_frames:
        warn(_cut_off(name, n_frames / rate, whole / rate))
    data = data[: whole * width * channels]
    samples = to_float32(np.frombuffer(data, dtype=dtype).reshape(-1, channels))
    if split_stereo:
        return samples[:, 0].copy(), samples[:, min(1, channels - 1)].copy()
    if channels == 2:
        louder = _cancelled_channel(_stereo_energy(*samples.T.astype(np.float64)))
        if louder is not None:
            warn(_cancelled(name, louder))
            return samples[:, louder].copy()
    return samples.mean(axis=1, dtype=np.float32)  # mono: each sample as it is


def _open_wav(source: str | Path | BinaryIO) -> wave.Wave_read:
    return wave.open(str(source) if isinstance(source, Path) else source, "rb")


def _cut_off(name: str, promised: float | None, held: float, skipped: str = "") -> str:
    """The warning for a file that holds less than it should; `promised` None: an Ogg file
    without its end-of-stream mark, which states no length."""
    also = f"; {skipped}" if skipped else ""
    if promised is None:
        return (
            f"{name}: the file holds {held:.2f} s and ends without its end-of-stream mark (it "
            f"looks cut off{also}); transcribing what is there: pass the whole file for the rest"
        )
    return (
        f"{name}: its header promises {promised:.2f} s but the file holds {held:.2f} s "
        f"(it may be cut off{also}); transcribing what is there"
    )


def _mp4_without_index(source: str | BinaryIO) -> bool:
    """Whether `source` is an MP4 (M4A, MOV) with its media data (mdat) but not its moov box,
    by its top-level boxes: as a download cut off or a recorder killed mid-file leaves it."""
    if isinstance(source, str):
        with open(source, "rb") as file:
            return _mp4_without_index(file)
    kinds = []
    size, offset = source.seek(0, os.SEEK_END), 0
    while offset + 8 <= size:
        source.seek(offset)
        box_size, kind = struct.unpack(">I4s", source.read(8))
        kinds.append(kind)
        if box_size == 1:  # a 64-bit size follows
            large = source.read(8)
            box_size = struct.unpack(">Q", large)[0] if len(large) == 8 else size
        elif box_size == 0:  # to the end of the file
            box_size = size - offset
        if box_size < 8:  # not boxes: some other damage
            return False
        offset += box_size
    return b"mdat" in kinds and b"moov" not in kinds


# The most bytes an Ogg page takes: its 27-byte header, 255 lacing values, 255 x 255 of data.
OGG_MAX_PAGE = 27 + 255 + 255 * 255


def _ogg_ends_whole(source: str | io.BytesIO) -> bool:
    """Whether an Ogg file's last whole page is marked end-of-stream, as encoders end every
    file. A cut-off one ends in a part of a page or at a page without the mark, and FFmpeg
    decodes it to what is there without a word."""
    if isinstance(source, io.BytesIO):
        with source.getbuffer() as view:  # (released: a BytesIO with a view can't resize)
            tail = bytes(view[-OGG_MAX_PAGE:])
    else:
        with open(source, "rb") as file:
            file.seek(max(0, os.path.getsize(source) - OGG_MAX_PAGE))
            tail = file.read()
    start = tail.rfind(b"OggS")
    while start >= 0:  # back from the end to the last whole page
        header = tail[start : start + 27]
        n_segments = header[26] if len(header) == 27 else 0
        lacing = tail[start + 27 : start + 27 + n_segments]
        end = start + 27 + n_segments + sum(lacing)
        if len(header) == 27 and header[4] == 0 and len(lacing) == n_segments and end <= len(tail):
            return bool(header[5] & 4)  # header type 4: the stream's last page
        start = tail.rfind(b"OggS", 0, start)
    return False


# Containers whose header counts the audio: FLAC's STREAMINFO, an MP3's Xing frame count (or,
# without one, a constant bitrate's length from the file's size), AIFF's COMM, MP4's moov,
# Matroska's (WebM's) Duration. Not ADTS AAC, whose length FFmpeg estimates from the bitrate
# (a whole file: 34.3 s for 33.1), nor Ogg, whose is that of its last page there.
COUNTED_IN_HEADER = {"flac", "mp3", "aiff", "mov", "matroska"}


def _header_seconds(container: Any, stream: Any) -> float | None:
    """The length of `stream` its header gives, where it counts it (the stream's own: a
    container's may be its video's, longer than the sound); else None."""
    kind = container.format.name.split(",")[0]
    if kind not in COUNTED_IN_HEADER:
        return None
    if kind == "matroska":
        # FFmpeg and mkvmerge tag each track with its DURATION; else the segment's Duration,
        # the audio's where nothing else is in it. A live WebM (a browser's MediaRecorder)
        # has neither: FFmpeg gives no length then, not a guess.
        tag = stream.metadata.get("DURATION", "")
        if match := re.fullmatch(r"(\d+):(\d\d):(\d\d(?:\.\d+)?)", tag):
            hours, minutes, seconds = match.groups()
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        only_audio = all(other.type == "audio" for other in container.streams)
        if not only_audio or container.duration is None:
            return None
        return container.duration / 1_000_000  # AV_TIME_BASE
    if stream.duration is None or stream.time_base is None:
        return None
    return float(stream.duration * stream.time_base)


def _wav_promised_seconds(source: str | Path | io.BytesIO) -> float | None:
    """The seconds a PCM WAV's header promises; None where `wave` can't read it (float WAV)
    or the size is a placeholder (a WAV written to a pipe says 0 or 0xFFFFFFFF bytes)."""
    try:
        if isinstance(source, io.BytesIO):
            source.seek(0)
        with _open_wav(source) as wav:
            size = wav.getnframes() * wav.getnchannels() * wav.getsampwidth()
            if not 0 < size < 0xFFFFFFFF - wav.getnchannels() * wav.getsampwidth():
                return None
            return wav.getnframes() / wav.getframerate()
    except (wave.Error, EOFError, OSError):
        return None


# Float samples past this peak are integer PCM cast to float (a 16-bit recording's run to
# 32767): their log-mel lies far outside what the model was trained on, and the transcript is
# garbage. Real float audio stays within [-1, 1], give or take a clipped overshoot.
MAX_FLOAT_PEAK = 32.0


NOT_FINITE = "the audio holds NaN or infinite samples; clean or re-decode it first"


def writable(array: np.ndarray) -> np.ndarray:
    """`array` C-contiguous (torch takes no negative strides: audio[::-1]) and writable: a
    read-only one (np.frombuffer's, a memory map opened "r", setflags(write=False)) is copied,
    as torch shares no read-only memory without a UserWarning of undefined behaviour, and a
    tensor view of it (pad_or_trim's) would hand back a writable array over read-only memory."""
    array = np.ascontiguousarray(array)
    return array if array.flags.writeable else array.copy()


def to_float32(audio: np.ndarray) -> np.ndarray:
    """Float arrays as they are (refused past MAX_FLOAT_PEAK); integer PCM (as wave/scipy read
    it) scaled to [-1, 1)."""
    kind = audio.dtype.kind
    if kind == "f":
        samples = audio.astype(np.float32, copy=False)
        # max and -min, not abs: no second array the size of the audio (NaN or inf show in it).
        peak = max(float(samples.max(initial=0.0)), -float(samples.min(initial=0.0)))
        if not np.isfinite(peak):
            raise AudioError(NOT_FINITE)
        if peak > MAX_FLOAT_PEAK:
            raise AudioError(
                f"float audio samples lie in [-1, 1], but these peak at {peak:.0f}, as integer "
                "PCM cast to float does; pass the integer array as it is, or divide it by 32768"
            )
        return samples
    if kind in "iu":
        half = float(2 ** (8 * audio.dtype.itemsize - 1))
        offset = half if kind == "u" else 0.0  # unsigned PCM (8-bit wav) is centred on 128
        return ((audio.astype(np.float64) - offset) / half).astype(np.float32)
    raise AudioError(
        f"audio arrays must hold real float or integer PCM samples, not {audio.dtype}; "
        "convert them to float32 first"
    )


MEMORY_CHECK_SAMPLES = 10 * 60 * SAMPLE_RATE  # how often a long decode checks for memory


def _check_room(name: str, n_samples: int, rate: int) -> None:
    """Refuse audio too long to hold: its samples are joined into one float32 array at the end
    (4 bytes each, beside the int16 chunks: 2), so the memory free must hold that and the next
    stretch's chunks. A longer file was killed by the OOM killer, not told."""
    free = available_memory()
    need = 4 * n_samples + 6 * MEMORY_CHECK_SAMPLES
    if free is not None and free < need:
        raise AudioTooLongError(
            f"{name}: too long to hold in memory ({n_samples / rate / 3600:.1f} h decoded, "
            f"{free / 1e9:.1f} GB left); split it, e.g. ffmpeg -i FILE -f segment "
            "-segment_time 3600 part%03d.flac, and transcribe the parts"
        )


def available_memory(cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes of memory the system can still give (Linux's MemAvailable), or less where the
    container's memory limit leaves less (`container_memory_left`); None where unknown."""
    free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    known = [n for n in (free, container_memory_left(cgroup)) if n is not None]
    return min(known) if known else None


def container_memory_left(cgroup: Path) -> int | None:
    """What a container's memory limit leaves (`docker run --memory`, a Kubernetes limit), as
    its cgroup (v2, else v1) at `cgroup` gives it: the limit less the memory used, the page
    cache that can be reclaimed not counted as used. None without a limit. MemAvailable is the
    host's in a container: past the limit the OOM killer ends the process all the same."""
    for limit_file, used_file, cache_key in (
        ("memory.max", "memory.current", "inactive_file"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "total_inactive_file"),
    ):
        try:
            text = (cgroup / limit_file).read_text().strip()
            limit = 1 << 62 if text == "max" else int(text)
            used = int((cgroup / used_file).read_text())
            stat = (cgroup / limit_file).with_name("memory.stat").read_text().split()
            cache = int(dict(zip(stat[::2], stat[1::2])).get(cache_key, "0"))
        except (OSError, ValueError):
            continue
        if limit >= 1 << 60:  # no limit: v2's "max", v1's 2**63 rounded to a page
            return None
        return max(0, limit - used + cache)
    return None


def _too_long(name: str, max_seconds: float) -> str:
    return f"{name}: longer than the limit of {max_seconds:g} s of audio; send it in parts"


def load_audio(
    audio: AudioInput,
    *,
    max_seconds: float | None = None,
    on_samples: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Any accepted input as a 1-D float32 array at 16 kHz. Arrays are taken to be 16 kHz mono.
    `max_seconds`: longer audio is refused (a file as soon as its decode passes the limit);
    `on_samples`, `on_warning`: `decode_audio`'s, for a file."""
    if isinstance(audio, torch.Tensor):
        tensor = audio.detach().cpu()
        audio = (tensor.float() if tensor.is_floating_point() else tensor).numpy()
    if isinstance(audio, np.ndarray):
        if isinstance(audio, np.ma.MaskedArray):  # its methods take other arguments
            raise AudioError("a masked array; fill its masked samples first: audio.filled(0.0)")
        check_mono(audio)
        check_integer_width(audio)
        samples = writable(to_float32(audio))
    else:
        samples = decode_audio(
            audio, max_seconds=max_seconds, on_samples=on_samples, on_warning=on_warning
        )
    if max_seconds is not None and samples.size > max_seconds * SAMPLE_RATE:
        raise AudioTooLongError(_too_long("the audio", max_seconds))
    if samples.size == 0:
        raise AudioError("the audio holds no samples (zero length); pass at least one sample")
    if not np.isfinite(samples).all():
        raise AudioError(NOT_FINITE)
    return samples


def check_mono(audio: np.ndarray) -> None:
    """Refuse a shape other than 1-D, saying which axis to average (channels: the short one)."""
    if audio.ndim == 1:
        return
    if audio.ndim == 2 and audio.size:
        axis = int(np.argmin(audio.shape))
        what = "samples, channels" if axis else "channels, samples"
        hint = f"average its channels first: audio.mean(axis={axis}) for [{what}]"
    elif audio.ndim == 0:
        hint = "pass a 1-D array of samples, not a single number"
    else:
        hint = "pass one recording's samples as a 1-D array"
    shape = tuple(audio.shape)
    raise AudioError(
        f"audio arrays must be 1-D mono at {SAMPLE_RATE} Hz, got shape {shape}; {hint}"
    )


def check_integer_width(audio: np.ndarray) -> None:
    """Refuse 16-bit PCM in a wider integer type (np.array of a list of ints is int64): scaled
    by its type's range it would be near-silence, -96 dB down, and decode to nothing. 32-bit
    PCM that quiet is inaudible anyway."""
    if audio.dtype.kind != "i" or audio.dtype.itemsize <= 2:
        return
    peak = max(int(audio.max(initial=0)), -int(audio.min(initial=0)))  # int(): no overflow
    if 0 < peak <= 32768:
        raise AudioError(
            f"{audio.dtype} samples that peak at {peak}: 16-bit PCM in a wider type, which "
            f"scaled as {8 * audio.dtype.itemsize}-bit PCM is near-silence; pass "
            "audio.astype(np.int16), or float samples in [-1, 1]"
        )


def pad_or_trim(array: T, length: int = N_SAMPLES, *, axis: int = -1) -> T:
    """Zero-pad or cut `array` (a tensor, or a numpy array as openai-whisper's takes) along
    `axis` to exactly `length`, as the encoder expects."""
    if isinstance(array, np.ndarray):
        return pad_or_trim(torch.from_numpy(writable(array)), length, axis=axis).numpy()
    size = array.shape[axis]
    if size > length:
        return array.narrow(axis, 0, length)
    if size < length:
        pad = [0, 0] * array.ndim
        pad[-2 * (axis % array.ndim) - 1] = length - size
        return F.pad(array, pad)
    return array


# Slaney's mel scale: linear below 1 kHz, logarithmic above.
_MEL_F_SP, _MEL_MIN_LOG_HZ, _MEL_LOGSTEP = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
_MEL_MIN_LOG_MEL = _MEL_MIN_LOG_HZ / _MEL_F_SP


class FeatureExtractor:
    """faster-whisper's `WhisperModel.feature_extractor`: the log-mel's constants, and called on
    16 kHz audio, its log-mel spectrogram [n_mels, frames] as a NumPy array (`padding` zero
    samples appended first, 160 as faster-whisper's default)."""

    def __init__(self, feature_size: int = 80):
        self.feature_size = feature_size
        self.sampling_rate, self.hop_length, self.n_fft = SAMPLE_RATE, HOP_LENGTH, N_FFT
        self.chunk_length, self.n_samples, self.nb_max_frames = CHUNK_LENGTH, N_SAMPLES, N_FRAMES
        self.time_per_frame = HOP_LENGTH / SAMPLE_RATE

    def __call__(
        self, waveform: np.ndarray, padding: int = 160, chunk_length: int | None = None
    ) -> np.ndarray:
        # chunk_length: faster-whisper's sets its window constants with it, not the output
        if chunk_length is not None:
            self.chunk_length, self.n_samples = chunk_length, chunk_length * SAMPLE_RATE
            self.nb_max_frames = self.n_samples // HOP_LENGTH
        return log_mel_spectrogram(waveform, self.feature_size, padding).numpy()


def _hz_to_mel(freq: float) -> float:
    if freq < _MEL_MIN_LOG_HZ:
        return freq / _MEL_F_SP
    return _MEL_MIN_LOG_MEL + np.log(freq / _MEL_MIN_LOG_HZ) / _MEL_LOGSTEP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    freqs = _MEL_F_SP * mels
    log_region = mels >= _MEL_MIN_LOG_MEL
    freqs[log_region] = _MEL_MIN_LOG_HZ * np.exp(
        _MEL_LOGSTEP * (mels[log_region] - _MEL_MIN_LOG_MEL)
    )
    return freqs


@cache
def mel_filters_numpy(n_mels: int) -> np.ndarray:
    """Slaney-normalised triangular mel filterbank [n_mels, N_FFT // 2 + 1] (librosa's defaults)."""
    fft_freqs = np.linspace(0, SAMPLE_RATE / 2, 1 + N_FFT // 2)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]  # equal area per filter
    return weights.astype(np.float32)


@cache
def _mel_filters(n_mels: int, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(mel_filters_numpy(n_mels)).to(device)


@cache
def _hann_window(device: torch.device) -> torch.Tensor:
    return torch.hann_window(N_FFT, device=device)


def log_mel_spectrogram(
    audio: AudioInput,
    n_mels: int = 80,
    padding: int = 0,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """Log-mel spectrogram [..., n_mels, n_frames] of 16 kHz audio (or of a file, as
    openai-whisper's), `padding` zero samples appended."""
    if not isinstance(audio, (np.ndarray, torch.Tensor)):
        audio = load_audio(audio)
    if isinstance(audio, np.ndarray):
        audio = writable(audio)
    audio = torch.as_tensor(audio, dtype=torch.float32)
    if device is not None:
        audio = audio.to(device)
    if padding > 0:
        audio = F.pad(audio, (0, padding))
    if audio.shape[-1] <= N_FFT // 2:
        # torch.stft's reflect padding needs more than half a frame of samples (openai-whisper
        # fails here): a few samples, such as the end of a file cut into 30 s windows, get zeros
        audio = F.pad(audio, (0, N_FFT // 2 + 1 - audio.shape[-1]))
    if audio.dim() == 1 and audio.shape[0] > MEL_CHUNK_FRAMES * HOP_LENGTH:
        log_spec = _long_log_mel(audio, n_mels)
    else:
        stft = torch.stft(
            audio, N_FFT, HOP_LENGTH, window=_hann_window(audio.device), return_complex=True
        )
        log_spec = _log_mel(stft[..., :-1], n_mels)  # the last frame dropped, as the reference's
    floor = log_spec.amax(dim=(-2, -1), keepdim=True) - 8.0  # keep an 80 dB dynamic range
    log_spec = torch.maximum(log_spec, floor, out=log_spec)
    return log_spec.add_(4.0).div_(4.0)


def _log_mel(stft: torch.Tensor, n_mels: int) -> torch.Tensor:
    """log10 of the mel energies of STFT frames [..., N_FFT // 2 + 1, frames]."""
    mel = _mel_filters(n_mels, stft.device) @ (stft.abs() ** 2)
    return torch.clamp(mel, min=1e-10).log10()


# Long audio's STFT runs this many frames (5 minutes) at a time: the whole file's complex
# spectrum and its powers would take ~1.2 GB an hour, these pieces ~0.1 GB at any length.
MEL_CHUNK_FRAMES = 5 * 60 * SAMPLE_RATE // HOP_LENGTH


def _long_log_mel(audio: torch.Tensor, n_mels: int) -> torch.Tensor:
    """`log_mel_spectrogram`'s frames before the floor, piece by piece: each frame is the same
    FFT of the same samples (the reflect padding at the ends, as torch.stft's center=True)."""
    length = audio.shape[0]
    n_frames = length // HOP_LENGTH  # 1 + length // hop, less the dropped last one
    log_spec = torch.empty(n_mels, n_frames, device=audio.device)
    for start in range(0, n_frames, MEL_CHUNK_FRAMES):
        stop = start + MEL_CHUNK_FRAMES
        if n_frames - stop < MEL_CHUNK_FRAMES // 2:  # no short last piece: a batch of one or two
            stop = n_frames  # FFTs may round the last bit otherwise than the whole file's batch
        # Frame f covers samples [f * hop - N_FFT / 2, f * hop + N_FFT / 2), reflected at the ends.
        lo, hi = start * HOP_LENGTH - N_FFT // 2, (stop - 1) * HOP_LENGTH + N_FFT // 2
        piece = audio[max(lo, 0) : min(hi, length)]
        piece = F.pad(piece[None, None], (max(-lo, 0), max(hi - length, 0)), mode="reflect")[0, 0]
        stft = torch.stft(piece, N_FFT, HOP_LENGTH, window=_hann_window(audio.device),
                          center=False, return_complex=True)  # fmt: skip
        log_spec[:, start:stop] = _log_mel(stft, n_mels)
        if stop == n_frames:
            break
    return log_spec
