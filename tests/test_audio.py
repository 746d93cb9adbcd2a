"""Audio in: every container decodes to the same 16 kHz mono float32, bad input fails clearly,
and the log-mel spectrogram equals openai-whisper's."""

from __future__ import annotations

import io
import os
import re
import threading
import time
import tracemalloc
import warnings
import wave
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from conftest import DEV_DIR, JFK, LONG_FILE, manifest, pcm_wav, plain_words

from whisperforge.audio import (
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    decode_audio,
    load_audio,
    log_mel_spectrogram,
    mel_filters_numpy,
    pad_or_trim,
)
from whisperforge.errors import AudioError, AudioTooLongError, InvalidOptionError

JFK_SECONDS = 11.0


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return load_audio(JFK)


def best_correlation(a: np.ndarray, b: np.ndarray, max_lag: int = 2400) -> float:
    """Correlation of a and b at the lag that aligns them best (lossy codecs add a delay)."""
    from scipy.signal import correlate

    middle = a[max_lag : min(len(a), len(b)) - max_lag]
    scores = correlate(b[: len(middle) + 2 * max_lag], middle, mode="valid", method="fft")
    start = int(np.argmax(scores))  # b[start:] lines up with a[max_lag:]
    return float(np.corrcoef(middle, b[start : start + len(middle)])[0, 1])


def resample(x: np.ndarray, rate: int) -> np.ndarray:
    """Linear interpolation to `rate`: good enough to feed an encoder in a test."""
    t = np.arange(int(len(x) * rate / SAMPLE_RATE)) / rate
    return np.interp(t, np.arange(len(x)) / SAMPLE_RATE, x).astype(np.float32)


def encode(
    path: Path,
    samples: np.ndarray | None,
    codec: str = "aac",
    rate: int = SAMPLE_RATE,
    video: str | None = None,
) -> Path:
    """Write `samples` (16 kHz mono float) with PyAV as `codec` at `rate`, optionally with a
    small video stream `video` beside it (or alone, when samples is None)."""
    with av.open(str(path), mode="w") as out:
        vstream = None
        if video is not None:
            vstream = out.add_stream(video, rate=10)
            vstream.width, vstream.height, vstream.pix_fmt = 64, 48, "yuv420p"
            if video == "mjpeg":
                vstream.pix_fmt = "yuvj420p"
        if samples is not None:
            astream = out.add_stream(codec, rate=rate)
            astream.layout = "mono"
            pcm = (resample(samples, rate) * 32767).astype(np.int16)
            step = 1024
            for i in range(0, len(pcm), step):
                frame = av.AudioFrame.from_ndarray(pcm[None, i : i + step], "s16", "mono")
                frame.sample_rate, frame.pts, frame.time_base = rate, i, Fraction(1, rate)
                out.mux(astream.encode(frame))
            out.mux(astream.encode(None))
        if vstream is not None:
            for i in range(20):
                image = np.full((48, 64, 3), i * 10, dtype=np.uint8)
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts = i
                out.mux(vstream.encode(frame))
            out.mux(vstream.encode(None))
    return path


# --- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["openai-whisper__jfk.flac", "whisper.cpp__jfk.wav", "whisper.cpp__jfk.mp3"],
)
def test_jfk_decodes_alike_from_wav_flac_mp3(name: str, jfk: np.ndarray) -> None:
    audio = load_audio(DEV_DIR / name)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - JFK_SECONDS * SAMPLE_RATE) <= 0.005 * SAMPLE_RATE
    n = min(len(audio), len(jfk))
    assert np.corrcoef(audio[:n], jfk[:n])[0, 1] > 0.999
    assert np.abs(audio).max() <= 1.0


def test_aiff_decodes() -> None:
    audio = load_audio(DEV_DIR / "speech_recognition__french.aiff")
    record = next(r for r in manifest() if r["audio"] == "speech_recognition__french.aiff")
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) / SAMPLE_RATE - record["duration_s"]) < 0.05
    assert audio.std() > 0.01  # real sound, not silence


@pytest.mark.parametrize(
    ("suffix", "codec", "rate", "video"),
    [
        ("m4a", "aac", 44100, None),
        ("aac", "aac", 16000, None),
        ("ogg", "libopus", 48000, None),
        ("opus", "opus", 48000, None),
        ("mp4", "aac", 44100, "mpeg4"),
        ("mkv", "libopus", 48000, "mjpeg"),
    ],
)
def test_generated_containers_decode(
    tmp_path: Path, jfk: np.ndarray, suffix: str, codec: str, rate: int, video: str | None
) -> None:
    clip = jfk[: 3 * SAMPLE_RATE]
    path = encode(tmp_path / f"clip.{suffix}", clip, codec, rate, video)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - len(clip)) <= 0.1 * SAMPLE_RATE  # codec padding, a frame or two
    assert best_correlation(clip, audio) > 0.9


def test_a_second_audio_stream_is_named_in_a_warning(tmp_path: Path, jfk: np.ndarray) -> None:
    """Two audio streams (a film's languages, a call's two sides): the first is transcribed,
    as faster-whisper's, and a warning says the other was not heard."""
    clip = (jfk[: 2 * SAMPLE_RATE] * 32767).astype(np.int16)
    path = tmp_path / "two.mka"
    with av.open(str(path), mode="w") as out:
        streams = [out.add_stream("pcm_s16le", rate=SAMPLE_RATE, layout="mono") for _ in "ab"]
        for i in range(0, len(clip), 4000):
            for stream, pcm in zip(streams, (clip, np.zeros_like(clip))):
                frame = av.AudioFrame.from_ndarray(pcm[None, i : i + 4000], "s16", "mono")
                frame.sample_rate, frame.pts = SAMPLE_RATE, i
                out.mux(stream.encode(frame))
        for stream in streams:
            out.mux(stream.encode(None))
    with pytest.warns(UserWarning, match="2 audio streams; transcribing the first"):
        audio = load_audio(path)
    np.testing.assert_allclose(audio, clip / 32768, atol=1e-6)


def test_bytes_file_objects_and_paths_agree(jfk: np.ndarray) -> None:
    data = JFK.read_bytes()
    with open(JFK, "rb") as f:
        from_file = load_audio(f)
    for audio in (
        load_audio(data),
        load_audio(bytearray(data)),
        load_audio(io.BytesIO(data)),
        load_audio(str(JFK)),
        load_audio(next(e for e in os.scandir(DEV_DIR) if e.name == JFK.name)),  # os.PathLike
        from_file,
    ):
        np.testing.assert_array_equal(audio, jfk)


def test_arrays_and_tensors_pass_through() -> None:
    x = np.linspace(-0.5, 0.5, 1000)
    np.testing.assert_allclose(load_audio(x), x.astype(np.float32))
    assert load_audio(x.astype(np.float32)).dtype == np.float32
    np.testing.assert_allclose(load_audio(torch.from_numpy(x).to(torch.bfloat16)), x, atol=4e-3)
    # integer PCM, as `wave` or scipy read it, is scaled to [-1, 1)
    pcm = np.array([0, 16384, -32768], dtype=np.int16)
    np.testing.assert_array_equal(load_audio(pcm), [0.0, 0.5, -1.0])
    with pytest.raises(AudioError, match="holds samples already; pass it to transcribe"):
        decode_audio(x)  # type: ignore[arg-type]
    # views with negative or wide strides, which torch.from_numpy refuses
    for view in (x[::-1], np.stack([x, x], axis=1)[:, 0], x.astype(np.float32)[::-2]):
        np.testing.assert_array_equal(load_audio(view), view.astype(np.float32))
        assert pad_or_trim(view, 1200).shape == (1200,)
        np.testing.assert_array_equal(log_mel_spectrogram(view), log_mel_spectrogram(view.copy()))


def test_openai_transcribe_takes_a_bfloat16_tensor(tiny_en, jfk: np.ndarray) -> None:
    """openai-whisper's transcribe takes a torch tensor: one in bfloat16 (a model's dtype) failed
    with numpy's TypeError there, where the other entry points convert it (load_audio)."""
    from whisperforge.openai_api import OpenAIWhisper

    tensor = torch.from_numpy(jfk[: 3 * SAMPLE_RATE]).bfloat16()  # "And so my fellow Americans"
    words = plain_words(OpenAIWhisper(tiny_en).transcribe(tensor, temperature=0.0)["text"])
    reference = next(r["text"] for r in manifest() if r["audio"] == JFK.name)
    assert len(words.split()) >= 4 and plain_words(reference).startswith(words), words


def test_stereo_44k_wav_mixes_down_and_resamples(tmp_path: Path, jfk: np.ndarray) -> None:
    rate = 44100
    left = resample(jfk, rate)
    stereo = np.stack([left, 0.5 * left], axis=1)  # [samples, channels], interleaved below
    path = tmp_path / "stereo44k.wav"
    path.write_bytes(pcm_wav(stereo, rate))
    audio = load_audio(path)
    assert abs(len(audio) - len(jfk)) <= 2
    assert np.corrcoef(audio[: len(jfk)], jfk[: len(audio)])[0, 1] > 0.99
    # the mono mix is the mean of the channels: 0.75 of the left one
    assert audio.std() / jfk.std() == pytest.approx(0.75, rel=0.02)


def test_stereo_whose_channels_cancel_out_is_heard_from_one(
    tiny_en, tmp_path: Path, jfk: np.ndarray
) -> None:
    """A stereo recording whose right channel is its left inverted (a wiring or phase fault)
    mixes down to silence, and was transcribed to nothing without a word. Its louder channel
    is heard instead, with a warning, from a file, bytes or (without PyAV) `read_pcm_wav`; a
    stereo recording of one speaker a channel warns of nothing."""
    from whisperforge.audio import read_pcm_wav

    inverted = pcm_wav(np.stack([jfk, -jfk], axis=1))
    (tmp_path / "inverted.wav").write_bytes(inverted)
    for source in (tmp_path / "inverted.wav", inverted):
        with pytest.warns(UserWarning, match="channels cancel out .* its left channel instead"):
            audio = load_audio(source)
        assert np.array_equal(audio, jfk)
        assert audio.base is None  # its own samples, not a view holding both channels'
    with pytest.warns(UserWarning, match="channels cancel out"):
        segments, _ = tiny_en.transcribe(inverted, beam_size=1)
    texts = [s.text for s in segments]
    assert texts and texts == [s.text for s in tiny_en.transcribe(jfk, beam_size=1)[0]]
    with pytest.warns(UserWarning, match="channels cancel out"):
        assert np.array_equal(read_pcm_wav(io.BytesIO(inverted)), jfk)

    stereo = DEV_DIR / "faster-whisper__stereo_diarization.wav"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_audio(stereo)
        read_pcm_wav(stereo)


def test_8_bit_stereo_whose_channels_cancel_out_is_heard_from_one(
    tiny_en, tmp_path: Path, jfk: np.ndarray
) -> None:
    """8-bit WAV is unsigned, centred on 128: its channels' energy was taken about 0, not 128,
    so an inverted pair looked like two loud equal channels with a loud mix, and JFK as an
    8-bit inverted stereo WAV decoded to silence and was transcribed to nothing, no warning."""
    inverted = np.stack([jfk, -jfk], axis=1)
    path = tmp_path / "inverted8.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(1)
        wav.setframerate(16000)
        wav.writeframes(np.clip(np.round(inverted * 128) + 128, 0, 255).astype(np.uint8))
    with pytest.warns(UserWarning, match="channels cancel out .* its left channel instead"):
        audio = load_audio(path)
    assert np.array_equal(audio, decode_audio(path, split_stereo=True)[0])
    with pytest.warns(UserWarning, match="channels cancel out"):
        segments, _ = tiny_en.transcribe(str(path), beam_size=1)
    assert "ask not what your country can do for you" in "".join(s.text for s in segments)


def test_a_wav_from_a_named_pipe_is_transcribed(tiny_en, tmp_path: Path) -> None:
    """A WAV read from a named pipe (a FIFO; bash's <(...) passes /dev/fd/63) hung for ever:
    once decoded, its header was read again by the path, to check that the file was whole,
    and opening a pipe again waits for a writer that never comes."""
    fifo = tmp_path / "jfk.wav"
    os.mkfifo(fifo)
    data = (DEV_DIR / "whisper.cpp__jfk.wav").read_bytes()
    threading.Thread(target=fifo.write_bytes, args=(data,), daemon=True).start()
    texts: list[str] = []
    reader = threading.Thread(
        target=lambda: texts.extend(s.text for s in tiny_en.transcribe(str(fifo), beam_size=1)[0]),
        daemon=True,
    )
    reader.start()
    reader.join(60)
    if reader.is_alive():
        fifo.write_bytes(b"")  # the writer it waits for, so that it ends
        pytest.fail("a WAV from a named pipe: the decode waits for ever")
    assert "ask not what your country can do for you" in "".join(texts)


def test_a_stream_whose_channels_cancel_out_is_told_of(jfk: np.ndarray) -> None:
    """Stereo arriving through a pipe (cat inverted.wav | whisperforge stream -) is decoded as
    it comes and cannot be read again for its louder channel: its mix, near-silence, was
    transcribed to nothing without a word. It is told of, once, saying what to pass instead;
    a stereo recording of one speaker a channel is not."""
    from whisperforge.audio import decode_arriving

    inverted = io.BytesIO(pcm_wav(np.stack([jfk, -jfk], axis=1)))
    head = inverted.read(44)
    with pytest.warns(UserWarning, match="channels cancel out .* path or bytes") as caught:
        pcm = b"".join(decode_arriving("stdin", head, inverted.read))
    assert len(caught) == 1
    assert np.abs(np.frombuffer(pcm, "<i2")).max() <= 1  # the mix, as FFmpeg makes it
    stereo = io.BytesIO((DEV_DIR / "faster-whisper__stereo_diarization.wav").read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert b"".join(decode_arriving("stdin", stereo.read(44), stereo.read))


def test_long_file_decodes_fast_and_lean() -> None:
    record = next(r for r in manifest() if r["audio"] == LONG_FILE.name)
    tracemalloc.start()
    start = time.perf_counter()
    audio = decode_audio(LONG_FILE)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert abs(len(audio) / SAMPLE_RATE - record["duration_s"]) < 0.1
    assert seconds < 10
    # the int16 frames plus the float32 result: 1.5x the output, never a second full copy
    assert peak < 1.8 * audio.nbytes


# --- bad input --------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


BAD_INPUTS: dict[str, Callable[[Path], object]] = {
    "missing path": lambda d: d / "nope.wav",
    "directory": lambda d: d,
    "empty file": lambda d: _write(d, "empty.wav", b""),
    "random bytes file": lambda d: _write(d, "noise.mp3", np.random.default_rng(0).bytes(200_000)),
    "flac cut in its header": lambda d: _write(d, "cut.flac", JFK.read_bytes()[:4096]),
    "text file": lambda d: _write(d, "notes.txt", b"this is not audio\n" * 50),
    "video only": lambda d: encode(d / "silent.mp4", None, video="mpeg4"),
    "empty bytes": lambda d: b"",
    "random bytes": lambda d: np.random.default_rng(1).bytes(10_000),
    "zero-length array": lambda d: np.zeros(0, dtype=np.float32),
    "2-D array": lambda d: np.zeros((16000, 2), dtype=np.float32),
    "NaN samples": lambda d: np.array([0.0, np.nan, 0.1], dtype=np.float32),
    "infinite samples": lambda d: np.array([0.0, np.inf], dtype=np.float32),
    "complex array": lambda d: np.zeros(10, dtype=np.complex64),
    "int16 PCM cast to float": lambda d: np.array([0, 1200, -25647, 3], dtype=np.float32),
    "text-mode file": lambda d: io.StringIO("RIFF...."),
    "not audio at all": lambda d: 12345,
    "~ in the path": lambda d: "~/no-such-folder-here/talk.wav",
    "a symbolic link loop": lambda d: _link_loop(d),
    "0-d array": lambda d: np.array(0.5, dtype=np.float32),
    "channels-first stereo": lambda d: np.zeros((2, 16000), dtype=np.float32),
    "masked array": lambda d: np.ma.masked_array(np.zeros(100), mask=np.arange(100) > 50),
    "int64 holding int16 PCM": lambda d: np.array([0, 1200, -25647, 3]),
    "int32 holding int16 PCM": lambda d: np.array([0, 32767, -32768], dtype=np.int32),
    "file object read already": lambda d: _read(io.BytesIO(JFK.read_bytes()), -1),
    "file object read partway": lambda d: _read(io.BytesIO(JFK.read_bytes()), 1000),
    "header-only WAV (0 frames)": lambda d: pcm_wav(np.zeros((0, 1))),
}

# What the message must say, where a cause is known: the way out.
BAD_INPUT_HINTS = {
    "~ in the path": r"os\.path\.expanduser",
    "a symbolic link loop": r"a symbolic link to .*b\.wav', which does not lead to one",
    "0-d array": "not a single number",
    "2-D array": r"audio\.mean\(axis=1\) for \[samples, channels\]",
    "channels-first stereo": r"audio\.mean\(axis=0\) for \[channels, samples\]",
    "masked array": r"audio\.filled",
    "int64 holding int16 PCM": r"peak at 25647: 16-bit PCM in a wider type.*astype\(np\.int16\)",
    "int32 holding int16 PCM": r"peak at 32768: 16-bit PCM",
    "file object read already": r"at byte 1152693, not at its start.*\.seek\(0\)",
    "file object read partway": r"at byte 1000, not at its start.*\.seek\(0\)",
    "header-only WAV (0 frames)": r"its audio stream is empty \(0 s\)",
}


def _link_loop(folder: Path) -> str:
    (folder / "a.wav").symlink_to(folder / "b.wav")
    (folder / "b.wav").symlink_to(folder / "a.wav")
    return str(folder / "a.wav")


def _read(file: io.IOBase, size: int) -> io.IOBase:
    file.read(size)
    return file


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_audio_error(tmp_path: Path, case: str) -> None:
    source = BAD_INPUTS[case](tmp_path)
    start = time.perf_counter()
    with pytest.raises(AudioError) as info:
        load_audio(source)  # type: ignore[arg-type]
    assert time.perf_counter() - start < 5
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    # every message says what to do, after the semicolon
    assert ";" in message, message
    assert re.search(BAD_INPUT_HINTS.get(case, ""), message), message
    # faster-whisper's bad input is a ValueError, its missing file a FileNotFoundError
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, FileNotFoundError) == (
        case in ("missing path", "~ in the path", "a symbolic link loop")
    )


@pytest.mark.parametrize("rate", [0, -1, 16000.5, "16000"])
def test_decode_audio_refuses_a_sampling_rate_that_is_not_one(rate: object) -> None:
    """0 gave the file's own rate, a negative one blamed the file ("not a readable audio")."""
    with pytest.raises(InvalidOptionError, match="sampling_rate must be a whole number"):
        decode_audio(JFK, sampling_rate=rate)  # type: ignore[arg-type]


def test_integer_pcm_arrays_and_a_float_overshoot_are_taken(jfk: np.ndarray) -> None:
    """The peak check refuses PCM cast to float, not the arrays around it: integer PCM is
    scaled, and float audio a little past full scale (a clipped overshoot) stays as it is."""
    pcm = np.round(jfk * 32767).astype(np.int16)
    np.testing.assert_allclose(load_audio(pcm), jfk, atol=1 / 32767)
    # 32-bit PCM at its full scale, and silence in any width (the 16-bit-in-int64 check spares it)
    np.testing.assert_allclose(load_audio(pcm.astype(np.int32) << 16), jfk, atol=1 / 32767)
    assert not load_audio(np.zeros(100, dtype=np.int64)).any()
    loud = (jfk * (1.5 / np.abs(jfk).max())).astype(np.float32)
    assert np.abs(load_audio(loud)).max() == pytest.approx(1.5)


def test_cut_off_recording_keeps_what_it_holds(jfk: np.ndarray) -> None:
    data = JFK.read_bytes()
    cut_off = r"promises 11.00 s but the file holds 5.43 s \(it may be cut off; skipped 1 of"
    with pytest.warns(UserWarning, match=cut_off):
        audio = load_audio(data[: len(data) // 2])
    assert 0.4 * len(jfk) < len(audio) < 0.6 * len(jfk)
    np.testing.assert_array_equal(audio[:SAMPLE_RATE], jfk[:SAMPLE_RATE])


def test_a_cut_off_mp3_or_aiff_is_said_to_be_and_a_whole_aac_is_not(tmp_path: Path) -> None:
    """An MP3 (its Xing frame count) or AIFF cut off mid-file decoded to what it held without
    a word. The length of raw AAC is FFmpeg's guess from its bitrate (34.3 s for a whole 33.1 s
    file): not taken for a promise."""
    for name, seconds in (("whisper.cpp__jfk.mp3", 11.0), ("speech_recognition__french.aiff",
                                                            2.53)):  # fmt: skip
        data = (DEV_DIR / name).read_bytes()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_audio(data)
        with pytest.warns(UserWarning, match=f"promises {seconds:.2f} s but the file holds"):
            load_audio(data[: len(data) // 2])
    out = io.BytesIO()
    with av.open(out, "w", format="adts") as container:
        stream = container.add_stream("aac", rate=SAMPLE_RATE, layout="mono")
        pcm = np.round(np.tile(load_audio(JFK), 3) * 32767).astype(np.int16)
        for start in range(0, len(pcm), 1024):
            frame = av.AudioFrame.from_ndarray(pcm[None, start : start + 1024], "s16", "mono")
            frame.sample_rate, frame.pts = SAMPLE_RATE, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_audio(out.getvalue())) / SAMPLE_RATE == pytest.approx(33, abs=0.2)


def test_cut_off_wav_warns_and_a_piped_one_does_not(tmp_path: Path, jfk: np.ndarray) -> None:
    """FFmpeg sizes a WAV by its file: a recording cut off mid-write decoded without a word.
    A WAV written to a pipe promises 0xFFFFFFFF bytes, a placeholder: no warning there."""
    path = tmp_path / "jfk.wav"
    path.write_bytes(pcm_wav(jfk))
    data = path.read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) // 2 + 1])  # mid-sample, too
    for cut in (tmp_path / "cut.wav", data[: len(data) // 2 + 1]):
        with pytest.warns(UserWarning, match="promises 11.00 s but the file holds 5.50 s"):
            audio = load_audio(cut)
        np.testing.assert_allclose(audio, jfk[: len(audio)], atol=1 / 32767)
    piped = bytearray(data)
    piped[4:8] = piped[40:44] = (0xFFFFFFFF).to_bytes(4, "little")  # RIFF and data sizes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_audio(bytes(piped))) == len(jfk)
        assert len(load_audio(path)) == len(jfk)


def whole_and_cut(path: Path) -> tuple[bytes, bytes]:
    """The file's bytes, and their first 60%: a recording cut off mid-write or mid-download."""
    data = path.read_bytes()
    return data, data[: len(data) * 6 // 10]


def assert_no_warning(audio: Path | bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_audio(audio)


@pytest.mark.parametrize(("codec", "rate"), [("libopus", 48000), ("flac", SAMPLE_RATE)])
def test_a_cut_off_ogg_warns_and_a_whole_one_does_not(
    tmp_path: Path, jfk: np.ndarray, codec: str, rate: int
) -> None:
    """Ogg states no length (FFmpeg's is its last page's), so a cut-off Opus or Ogg FLAC
    decoded to what it held without a word. Its last page, marked end-of-stream, is missing:
    cut inside a page, or at one."""
    path = encode(tmp_path / "jfk.ogg", jfk[: 4 * SAMPLE_RATE], codec, rate)
    data, cut = whole_and_cut(path)
    at_a_page = data[: data.rfind(b"OggS")]
    for whole in (path, data):
        assert_no_warning(whole)
    (tmp_path / "cut.ogg").write_bytes(cut)
    for part in (cut, at_a_page, tmp_path / "cut.ogg"):
        with pytest.warns(UserWarning, match=r"holds \d\.\d\d s and ends without its end-of-st"):
            audio = load_audio(part)
        assert 1.5 * SAMPLE_RATE < len(audio) < 4 * SAMPLE_RATE
    first_audio_page = [page.start() for page in re.finditer(b"OggS", data)][2]  # two headers
    with pytest.raises(AudioError, match="ends before its first whole audio packet"):
        load_audio(data[: first_audio_page + 100])


@pytest.mark.parametrize(("name", "codec", "rate"), [("jfk.webm", "libopus", 48000),
                                                     ("jfk.mka", "aac", SAMPLE_RATE)])  # fmt: skip
def test_a_cut_off_matroska_warns_and_a_whole_one_does_not(
    tmp_path: Path, jfk: np.ndarray, name: str, codec: str, rate: int
) -> None:
    """Matroska's Duration (or a track's DURATION tag) comes first, so it is there in a cut-off
    WebM, which decoded to what it held without a word. A whole one states a little more than
    it decodes to (the last block's length, AAC's priming): no warning."""
    path = encode(tmp_path / name, jfk[: 4 * SAMPLE_RATE], codec, rate)
    data, cut = whole_and_cut(path)
    assert_no_warning(data)
    with pytest.warns(UserWarning, match=r"promises 4.0\d s but the file holds 2.\d\d s"):
        load_audio(cut)


def test_a_raw_aac_cut_off_inside_a_frame_keeps_what_it_holds(
    tmp_path: Path, jfk: np.ndarray
) -> None:
    """Raw (ADTS) AAC states no length; a frame cut short is what shows. Cut inside a frame's
    7-byte header, the demuxer could fail, and the whole file failed with it; cut inside its
    data, the decoder fails on it. Both keep the audio before, with a warning."""
    path = encode(tmp_path / "jfk.aac", jfk[: 4 * SAMPLE_RATE])
    data = path.read_bytes()
    with av.open(str(path)) as container:
        starts = [packet.pos for packet in container.demux() if packet.size]
    start = starts[len(starts) * 6 // 10]
    # 4 bytes into the header of a frame after the last (each starts as the first does)
    for part, seconds in ((data + data[:4], 4.1), (data[: start + 100], 2.4)):
        with pytest.warns(UserWarning, match=r"skipped 1 of \d+ audio packets .* cut off"):
            audio = load_audio(part)
        assert len(audio) / SAMPLE_RATE == pytest.approx(seconds, abs=0.1)


def test_a_cut_off_mp4_is_said_to_be(tmp_path: Path, jfk: np.ndarray) -> None:
    """An M4A's index (moov) comes last: cut off, FFmpeg said only "invalid data". One with its
    index first (faststart) states its length, and a cut one is warned of."""
    path = encode(tmp_path / "jfk.m4a", jfk[: 4 * SAMPLE_RATE])
    data, cut = whole_and_cut(path)
    assert_no_warning(data)
    (tmp_path / "cut.m4a").write_bytes(cut)
    for part in (cut, tmp_path / "cut.m4a"):
        with pytest.raises(AudioError, match=r"an MP4 without its index \(the moov box"):
            load_audio(part)
    faststart = tmp_path / "faststart.m4a"
    with (
        av.open(str(path)) as whole,
        av.open(str(faststart), "w", options={"movflags": "+faststart"}) as out,
    ):
        stream = out.add_stream_from_template(whole.streams.audio[0])
        for packet in whole.demux(whole.streams.audio[0]):
            if packet.dts is not None:  # (not the flushing packet)
                packet.stream = stream
                out.mux(packet)
    data = faststart.read_bytes()
    assert_no_warning(data)
    with pytest.warns(UserWarning, match=r"promises 4.0\d s but the file holds 2.\d\d s"):
        load_audio(data[: len(data) * 6 // 10])


def test_a_matroska_video_longer_than_its_sound_is_not_cut_off(
    tmp_path: Path, jfk: np.ndarray
) -> None:
    """The segment's Duration is the video's (2 s here), not the sound's (1 s): the audio
    track's DURATION tag is taken. A live WebM (a browser's MediaRecorder) states no length."""
    assert_no_warning(encode(tmp_path / "v.mkv", jfk[:SAMPLE_RATE], "aac", video="mpeg4"))
    live = io.BytesIO()
    with av.open(live, "w", format="webm", options={"live": "1"}) as out:
        stream = out.add_stream("libopus", rate=48000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 48000), np.int16), "s16", "mono")
        frame.sample_rate = 48000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    assert_no_warning(live.getvalue())


# --- spectrogram ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_equal_openai(n_mels: int) -> None:
    import whisper

    assets = Path(whisper.__file__).parent / "assets" / "mel_filters.npz"
    with np.load(assets) as f:
        reference = f[f"mel_{n_mels}"]
    ours = mel_filters_numpy(n_mels)
    assert ours.shape == reference.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("padding", [0, N_SAMPLES])
def test_log_mel_equals_openai(jfk: np.ndarray, n_mels: int, padding: int) -> None:
    import whisper.audio

    reference = whisper.audio.log_mel_spectrogram(torch.from_numpy(jfk), n_mels, padding)
    ours = log_mel_spectrogram(jfk, n_mels, padding)
    assert ours.shape == reference.shape == (n_mels, (len(jfk) + padding) // 160)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)


def test_pad_or_trim() -> None:
    mel = torch.ones(80, 1234)
    assert pad_or_trim(mel, N_FRAMES).shape == (80, N_FRAMES)
    assert pad_or_trim(mel, N_FRAMES)[:, 1234:].abs().sum() == 0
    assert pad_or_trim(torch.ones(N_SAMPLES + 5)).shape == (N_SAMPLES,)


def test_long_audio_mel_comes_in_pieces_equal_to_the_whole(monkeypatch):
    """Past MEL_CHUNK_FRAMES the STFT runs piece by piece (bounded memory): the same bits."""
    from whisperforge import audio

    speech = np.tile(load_audio(JFK), 12)[:-77]  # 2 min, not a whole number of frames
    whole = log_mel_spectrogram(speech, 80, N_SAMPLES)
    for frames in (3000, 4321):  # pieces of 30 s, and ones that end mid-word
        monkeypatch.setattr(audio, "MEL_CHUNK_FRAMES", frames)
        assert torch.equal(log_mel_spectrogram(speech, 80, N_SAMPLES), whole)


def test_audio_past_max_seconds_is_refused_while_decoding():
    with pytest.raises(AudioError, match="limit of 5 s"):
        load_audio(JFK, max_seconds=5)  # an 11 s file
    with pytest.raises(AudioError, match="limit of 5 s"):
        load_audio(np.zeros(16000 * 6, np.float32), max_seconds=5)
    assert load_audio(JFK, max_seconds=12).size == load_audio(JFK).size


def test_audio_too_long_for_the_memory_left_is_refused(monkeypatch):
    """Hours of audio past what memory holds: a clear error that says to split the file, where
    the process was killed by the OOM killer. Here the system is told 50 MB are left: the
    19-minute file's samples (73 MB as float32) do not fit, and are refused at 10 minutes."""
    import whisperforge.audio

    monkeypatch.setattr(whisperforge.audio, "available_memory", lambda: 50_000_000)
    with pytest.raises(AudioTooLongError, match=r"too long to hold in memory \(0\.2 h.*split"):
        decode_audio(LONG_FILE)
    monkeypatch.setattr(whisperforge.audio, "available_memory", lambda: 500_000_000)
    assert decode_audio(LONG_FILE).size == pytest.approx(1142.472 * SAMPLE_RATE, abs=SAMPLE_RATE)


def test_available_memory_heeds_a_containers_limit(tmp_path):
    """In a container MemAvailable is the host's: a server sized its audio memory by it could
    pass the container's limit (docker --memory) and be killed. Its cgroup's limit, less what
    is used and cannot be reclaimed, bounds it (v2's files, else v1's)."""
    from whisperforge.audio import available_memory, container_memory_left

    host = available_memory(tmp_path)  # no cgroup files: the host's figure
    assert host is not None and host > 300_000_000
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("600000000\n")
    (tmp_path / "memory.stat").write_text("anon 400000000\ninactive_file 100000000\n")
    assert container_memory_left(tmp_path) is None  # no limit
    (tmp_path / "memory.max").write_text("800000000\n")
    assert container_memory_left(tmp_path) == 300_000_000
    assert available_memory(tmp_path) == 300_000_000
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("600000000\n")
    (v1 / "memory" / "memory.stat").write_text("cache 1\ntotal_inactive_file 200000000\n")
    assert container_memory_left(v1) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1000000000\n")
    assert container_memory_left(v1) == 600_000_000


def test_read_only_audio_is_copied_not_aliased_nor_warned_about(tiny_en):
    """A read-only array (np.frombuffer's, a memory map opened "r") was handed to torch as it
    was: a UserWarning of undefined behaviour on every path, load_audio gave it back read-only,
    and pad_or_trim gave a writable array over the read-only memory."""
    audio = load_audio(JFK)[: 3 * 16000]
    frozen = np.frombuffer(audio.tobytes(), np.float32)
    assert not frozen.flags.writeable
    loaded = load_audio(frozen)
    assert loaded.flags.writeable and not np.shares_memory(loaded, frozen)
    cut = pad_or_trim(frozen, 16000)
    assert cut.flags.writeable and not np.shares_memory(cut, frozen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        segments, _ = tiny_en.transcribe(frozen, vad_filter=True)
        assert "fellow Americans" in "".join(segment.text for segment in segments)
