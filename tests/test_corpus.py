"""The corpus job (`whisperforge batch`): inputs, the JSONL/Parquet journal, one process, and a
local Ray cluster (2 CPUs) whose rows must equal the one-process rows, with a bad file, a rerun
that does no work, and an actor killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    DEV_DIR,
    LONG_FILE,
    hub_cache_of_tiny_en,
    manifest,
    pcm_wav,
    plain_wer,
    plain_words,
)

from whisperforge import load_audio
from whisperforge.cli import main
from whisperforge.corpus import ROW_FIELDS, list_inputs, transcribe_corpus
from whisperforge.errors import WhisperforgeError

CLIPS = ("faster-whisper__hotwords.mp3", "mfa__61-70968-0000.flac", "openai-whisper__jfk.flac")
OPTIONS = {"beam_size": 1}  # greedy: the same on both sides of every comparison, and quick


def _clips() -> list[Path]:
    """Three short English clips: different voices, MP3 and FLAC."""
    return [DEV_DIR / name for name in CLIPS]


def _rows(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_path = {row["path"]: row for row in rows}
    assert len(by_path) == len(rows), "a path has more than one row"
    return by_path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A JSONL manifest: the clips, one of them also as a 16 kHz int16 .npy, and a corrupt file
    (relative paths, which are relative to the manifest's folder), each with a speaker and a
    reference text of its own."""
    from whisperforge import load_audio

    folder = tmp_path_factory.mktemp("corpus")
    clips = _clips()
    samples = load_audio(clips[0])
    np.save(folder / "first.npy", np.round(samples * 32768).clip(-32768, 32767).astype(np.int16))
    (folder / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really audio" * 50)
    names = [str(c) for c in clips] + ["first.npy", "corrupt.wav"]
    manifest = folder / "manifest.jsonl"
    rows = [{"audio": n, "speaker": i, "text": f"reference {i}"} for i, n in enumerate(names)]
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return manifest


def _carried(corpus: Path) -> dict[str, tuple]:
    """(speaker, reference text) of each file of the `corpus` manifest, by its path."""
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    return {row["audio"]: (row["speaker"], row["text"]) for row in rows}


@pytest.fixture(scope="module")
def local_rows(corpus, tmp_path_factory, tiny_en) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("local") / "out.jsonl"
    summary = transcribe_corpus(str(corpus), out, tiny_en, **OPTIONS)
    assert (summary.ok, summary.failed) == (len(_clips()) + 1, 1)
    return _rows(out)


def test_inputs(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/one.wav", "a/b/two.FLAC", "a/notes.txt", "three.npy"):
        (tmp_path / name).write_bytes(b"x")
    folder = [s.path for s in list_inputs(str(tmp_path))]
    assert folder == [str(tmp_path / n) for n in ("a/b/two.FLAC", "a/one.wav", "three.npy")]
    assert [s.path for s in list_inputs(str(tmp_path / "a" / "**" / "*.wav"))] == [
        str(tmp_path / "a/one.wav")
    ]
    listing = tmp_path / "a" / "files.txt"
    listing.write_text("# a comment\none.wav\n\nb/two.FLAC\none.wav\n")
    with pytest.warns(UserWarning, match="more than once"):  # relative to the list's folder
        sources = list_inputs(str(listing))  # and each file once
    assert [s.path for s in sources] == ["one.wav", "b/two.FLAC"]
    assert Path(sources[1].location) == tmp_path / "a" / "b" / "two.FLAC"

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": ["b/two.FLAC", "/abs/x.wav"]}), tmp_path / "a" / "m.parquet")
    sources = list_inputs(str(tmp_path / "a" / "m.parquet"))
    assert [s.location for s in sources] == [str(tmp_path / "a/b/two.FLAC"), "/abs/x.wav"]

    with pytest.raises(WhisperforgeError, match="no such file or folder"):
        list_inputs(str(tmp_path / "missing"))
    with pytest.raises(WhisperforgeError, match="the glob matches no files"):
        list_inputs(str(tmp_path / "*.mp3"))
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "notes.txt").write_text("not audio")
    with pytest.raises(WhisperforgeError, match="no audio files"):
        list_inputs(str(tmp_path / "texts"))
    (tmp_path / "bad.jsonl").write_text('{"file": "x.wav"}\n')
    with pytest.raises(WhisperforgeError, match="`path` or `audio` column"):
        list_inputs(str(tmp_path / "bad.jsonl"))
    assert list_inputs(tmp_path / "a") == list_inputs(str(tmp_path / "a"))  # a Path is a folder
    # A glob or list naming manifests and audio files (a list decoded the shards as audio).
    for spec in (str(tmp_path / "a" / "*.*"), [str(tmp_path / "a/m.parquet"), "x.wav"]):
        with pytest.raises(WhisperforgeError, match="manifests .*m.parquet.* and other files"):
            list_inputs(spec)
    # A manifest's rows: objects, each with a path (none skipped without a word).
    for lines, error in ((['{"path": "a.wav"}', '"b.wav"'], "line 2: not a JSON object"),
                         (['{"path": "a.wav"}', '{"path": null}'], "row 2: its `path` is None"),
                         (['{"path": "a.wav"}', '{"path": ""}'], "row 2"),
                         (['{"speaker": "x"}', '{"path": 3}'], "row 1: its `path` is None")):  # fmt: skip
        (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
        with pytest.raises(WhisperforgeError, match=error):
            list_inputs(str(tmp_path / "rows.jsonl"))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(WhisperforgeError, match="not a readable Parquet file"):
        list_inputs(str(tmp_path / "junk.parquet"))


def test_bad_output(corpus, tmp_path):
    with pytest.raises(WhisperforgeError, match=r"\.jsonl or \.parquet"):
        transcribe_corpus(str(corpus), tmp_path / "out.csv")
    with pytest.raises(WhisperforgeError, match="is the input"):
        transcribe_corpus(str(corpus), corpus)
    (tmp_path / "folder.parquet").mkdir()
    with pytest.raises(WhisperforgeError, match="is a folder"):  # before any transcription
        transcribe_corpus(str(corpus), tmp_path / "folder.parquet")
    with pytest.raises(ValueError, match="beam_size"):  # refused before any row: no empty OUT
        transcribe_corpus(str(corpus), tmp_path / "early.jsonl", beam_size=0)
    assert not (tmp_path / "early.jsonl").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(WhisperforgeError, match="file is a file, not a folder"):  # "File exists"
        transcribe_corpus(str(corpus), tmp_path / "file" / "out.jsonl")


def test_parquet_output_without_pyarrow_is_refused_first(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if pyarrow were missing
    with pytest.raises(WhisperforgeError, match="needs pyarrow"):  # not after the corpus
        transcribe_corpus(str(corpus), tmp_path / "out.parquet", model="no-such-model")
    assert not list(tmp_path.iterdir())


def test_local_rows(corpus, local_rows):
    clips = _clips()
    assert set(local_rows) == {str(c) for c in clips} | {"first.npy", "corrupt.wav"}
    bad = local_rows["corrupt.wav"]
    assert bad["error"] and bad["text"] is None and bad["segments"] == []
    for clip in clips:
        row = local_rows[str(clip)]
        assert row["error"] is None and row["language"] == "en" and row["text"]
        assert row["text"] == "".join(s["text"] for s in row["segments"]).strip()
        assert 0 < row["duration"] < 31 and set(row["timings"]) == {"decode", "transcribe"}
        assert row["language_probability"] == 1.0  # tiny.en: English, not detected
        for segment in row["segments"]:  # the figures to filter by, times to the millisecond
            assert -1.0 < segment["avg_logprob"] < 0.0 and 0 <= segment["no_speech_prob"] < 0.5
            assert 0.5 < segment["compression_ratio"] < 2.4 and segment["temperature"] == 0.0
            times = [segment["start"], segment["end"]] + [
                t for w in segment.get("words", []) for t in (w["start"], w["end"])
            ]
            assert times == [round(t, 3) for t in times]
    # The .npy holds the first clip's decoded samples: the same audio, the same text.
    assert local_rows["first.npy"]["text"] == local_rows[str(clips[0])]["text"]
    # The manifest's other columns, each row's own: its `text` prefixed (the row has one).
    assert all(set(row) == {*ROW_FIELDS, "speaker", "manifest_text"} for row in local_rows.values())
    carried = {path: (row["speaker"], row["manifest_text"]) for path, row in local_rows.items()}
    assert carried == _carried(corpus)


def _texts(rows: dict[str, dict]) -> dict[str, str | None]:
    return {path: row["text"] for path, row in rows.items()}


def test_a_rerun_with_other_settings_says_its_rows_are_kept(tiny_en, tmp_path):
    listing = tmp_path / "one.txt"
    listing.write_text(f"{_clips()[2]}\n")
    out = tmp_path / "out.jsonl"
    transcribe_corpus(str(listing), out, tiny_en, beam_size=1)
    assert json.loads(_rows(out)[str(_clips()[2])]["settings"])["beam_size"] == 1
    with pytest.warns(UserWarning, match="other settings"):
        summary = transcribe_corpus(str(listing), out, tiny_en, beam_size=2)
    assert summary.skipped == 1
    # An option the rows were made without counts too: their segments have no words.
    with pytest.warns(UserWarning, match="other settings"):
        transcribe_corpus(str(listing), out, tiny_en, beam_size=1, word_timestamps=True)
    with pytest.warns(UserWarning, match="other settings"):
        transcribe_corpus(str(listing), out, tiny_en, beam_size=1, language="en")
    with warnings.catch_warnings():  # the same settings (a default named or not): no warning
        warnings.simplefilter("error")
        transcribe_corpus(str(listing), out, tiny_en, beam_size=1, task="transcribe")


def test_cli_crash_resume_and_parquet(corpus, local_rows, tiny_en, tmp_path, capsys):
    """`whisperforge batch` killed (SIGKILL) once its first row is in OUT, which then also ends
    in a row cut off mid-write: the rerun keeps the written rows, drops the cut-off one and
    transcribes the rest; the result equals an uninterrupted run."""
    out = tmp_path / "out.jsonl"
    command = ["batch", str(corpus), "--output", str(out), "--device", "cpu", "--beam-size", "1"]
    job = subprocess.Popen(  # --batch-size 1: rows are written one by one, as files finish
        [sys.executable, "-m", "whisperforge", *command, "--batch-size", "1"],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while not (out.exists() and b"\n" in out.read_bytes()):
        assert job.poll() is None, job.stderr.read().decode()
        assert time.monotonic() < deadline, "no row after 300 s"
        time.sleep(0.02)
    job.kill()
    assert job.wait() == -signal.SIGKILL
    job.stderr.close()
    written = [json.loads(line) for line in out.read_text().splitlines(keepends=True)
               if line.endswith("\n")]  # fmt: skip
    assert 1 <= len(written) < len(local_rows), "killed mid-run"
    with open(out, "a") as f:
        f.write('{"path": "' + str(_clips()[-1])[:10])  # a row cut off by the crash

    failed_left = not any(row["error"] for row in written)
    assert main([*command, "--progress"]) == 1  # a file failed, in this run or the killed one
    err = capsys.readouterr().err
    assert f"files ({int(failed_left)} failed)" in err and "RTFx" in err  # the progress line
    earlier = "" if failed_left else " (1 of them failed)"
    assert f"{len(written)} already done{earlier};" in err  # the summary
    assert "1 file(s) failed" in err
    # A rerun with nothing to do still says that OUT holds a failed file, and exits 1.
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"{len(local_rows)} already done (1 of them failed)" in err
    assert "RTFx" not in err  # nothing transcribed: it said "0.0 s of audio in 0.0 s (RTFx 0.0)"
    rows = _rows(out)
    assert _texts(rows) == _texts(local_rows)
    assert [rows[row["path"]] for row in written] == written  # finished rows are kept as they are

    # --retry-errors: the failed file is tried again and still has one row.
    summary = transcribe_corpus(str(corpus), out, tiny_en, retry_errors=True, **OPTIONS)
    assert (summary.ok, summary.failed) == (0, 1)
    assert _rows(out).keys() == rows.keys()

    parquet = tmp_path / "out.parquet"
    listing = tmp_path / "two.txt"
    listing.write_text(f"{_clips()[1]}\n{corpus.parent / 'corrupt.wav'}\n")
    transcribe_corpus(str(listing), parquet, tiny_en, word_timestamps=True, **OPTIONS)
    import pyarrow.parquet as pq

    table = pq.read_table(parquet).to_pylist()
    assert not parquet.with_name("out.parquet.journal.jsonl").exists()
    # In the listing's order, though the corrupt file's row was written first.
    assert [Path(r["path"]).name for r in table] == [_clips()[1].name, "corrupt.wav"]
    texts = {Path(r["path"]).name: r["text"] for r in table}
    assert texts == {_clips()[1].name: local_rows[str(_clips()[1])]["text"], "corrupt.wav": None}
    words = [w for r in table for s in r["segments"] for w in s["words"]]
    assert words and all(w["start"] <= w["end"] for w in words)
    summary = transcribe_corpus(str(listing), parquet, tiny_en)  # seeded from the Parquet
    assert (summary.ok + summary.failed, summary.skipped) == (0, 2)
    assert pq.read_table(parquet).to_pylist() == table


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="pip install 'whisperforge[ray]'")
    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


def test_ray_matches_local_and_resumes(ray_cluster, corpus, local_rows, tmp_path):
    out = tmp_path / "ray.jsonl"
    summary = transcribe_corpus(
        str(corpus), out, "tiny.en", ray_address="local", files_per_task=2, **OPTIONS
    )
    assert (summary.ok, summary.failed) == (len(local_rows) - 1, 1)
    rows = _rows(out)
    assert _texts(rows) == _texts(local_rows)
    assert rows["corrupt.wav"]["error"] == local_rows["corrupt.wav"]["error"]
    assert {p: (r["speaker"], r["manifest_text"]) for p, r in rows.items()} == _carried(corpus)

    before = out.read_bytes()
    summary = transcribe_corpus(str(corpus), out, "tiny.en", ray_address="local", **OPTIONS)
    assert (summary.ok + summary.failed, summary.skipped) == (0, len(rows))
    assert out.read_bytes() == before  # no work at all


def test_ray_actors_decode_with_the_jobs_options(ray_cluster, option_run, tmp_path):
    """The decoding options reach the model actors: Ray's row equals the one-process row. So
    do a manifest row's own language and task: on tiny.en, rows marked de or translate are
    each that row's error (their files are never transcribed)."""
    hotwords, mfa, jfk = (str(c) for c in _clips())
    rows = [{"path": hotwords, "language": None}, {"path": mfa, "language": "de"},
            {"path": jfk, "task": "translate"}]  # fmt: skip
    listing = tmp_path / "manifest.jsonl"
    listing.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "ray.jsonl"
    transcribe_corpus(str(listing), out, "tiny.en", ray_address="local", **OPTIONS,
                      **PROMPTED_WITHOUT_VAD)  # fmt: skip
    written = _rows(out)
    ours, theirs = written[hotwords], option_run[0][hotwords]
    assert (ours["text"], ours["segments"]) == (theirs["text"], theirs["segments"])
    assert ours["settings"] == theirs["settings"]
    assert "English-only and cannot transcribe German" in written[mfa]["error"]
    assert "cannot translate" in written[jfk]["error"]


def test_a_parquet_shard_holding_its_audio_is_transcribed(ray_cluster, tiny_en, tmp_path):
    """Hugging Face datasets' Parquet shards hold each file in an `audio` struct, {"bytes":
    ..., "path": ...}: the job printed the row's 35 kB of bytes as "not a file's path". Each
    row is its file now, named by the struct's path (a name taken already, or none: by the
    shard's row), in one process and on Ray alike; a glob of shards reads them all. The bytes
    are read as files are decoded, not with the manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cards = [DEV_DIR / f"pocketsphinx__cards__00{n}.wav" for n in (1, 2, 3, 4)]
    held = [{"bytes": c.read_bytes(), "path": name} for c, name in
            zip(cards, ("cards.wav", "cards.wav", None))]  # fmt: skip
    (tmp_path / "beside.wav").write_bytes(cards[3].read_bytes())
    held.append({"bytes": None, "path": "beside.wav"})  # a file beside the shard, by its path
    held.append({"bytes": b"RIFF not audio", "path": "corrupt.wav"})
    listing = tmp_path / "train-00000-of-00001.parquet"
    speakers = list(range(len(held)))  # in row groups of 2 rows: read a group at a time
    pq.write_table(pa.table({"audio": held, "speaker": speakers}), listing, row_group_size=2)
    by_path = _rows_of_run([str(c) for c in cards], tmp_path / "files.jsonl", tiny_en)
    names = ["cards.wav", f"{listing}#2", f"{listing}#3", "beside.wav", "corrupt.wav"]
    for out, model, ray in ((tmp_path / "local.jsonl", tiny_en, None),
                            (tmp_path / "ray.jsonl", "tiny.en", "local")):  # fmt: skip
        summary = transcribe_corpus(str(listing), out, model, ray_address=ray, **OPTIONS)
        assert (summary.ok, summary.failed) == (4, 1)
        rows = _rows(out)
        assert [rows[n]["text"] for n in names[:4]] == [by_path[str(c)] for c in cards]
        assert [rows[n]["speaker"] for n in names] == speakers
        assert "not a readable audio file" in rows["corrupt.wav"]["error"]
    summary = transcribe_corpus(str(listing), tmp_path / "local.jsonl", tiny_en, **OPTIONS)
    assert (summary.skipped, summary.ok) == (5, 0)  # a rerun finds every row

    shards = tmp_path / "shards"
    shards.mkdir()
    for n, part in enumerate((held[:1], held[1:2])):  # a dataset's shards: cards.wav in both
        pq.write_table(pa.table({"audio": part}), shards / f"train-0000{n}-of-00002.parquet")
    with pytest.raises(WhisperforgeError, match=r"manifests .* as a glob in quotes"):
        transcribe_corpus(str(shards), tmp_path / "shards.jsonl", tiny_en, **OPTIONS)
    transcribe_corpus(str(shards / "*.parquet"), tmp_path / "shards.jsonl", tiny_en, **OPTIONS)
    rows = _rows(tmp_path / "shards.jsonl")
    assert {p: r["text"] for p, r in rows.items()} == {
        "cards.wav": by_path[str(cards[0])],
        f"{shards / 'train-00001-of-00002.parquet'}#1": by_path[str(cards[1])]}  # fmt: skip
    # The glob unquoted: the shell names the shards.
    transcribe_corpus(sorted(str(p) for p in shards.iterdir()), tmp_path / "listed.jsonl",
                      tiny_en, **OPTIONS)  # fmt: skip
    assert _rows(tmp_path / "listed.jsonl").keys() == rows.keys()


def test_a_shards_files_are_read_without_the_rest_of_its_audio_struct(tiny_en, tmp_path):
    """Listing a shard read every row's whole `audio` struct to find the files' names (2 GB of
    memory for a 540 MB shard, all of a glob's shards read before the first file was
    decoded), and decoding a file read its row's other fields too (a decoded `array`, ...).
    Only the names are read with the manifest now, and only a row group's bytes and paths as
    its files are decoded: Arrow's memory peaks below one row's `array`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cards = [DEV_DIR / f"pocketsphinx__cards__00{n}.wav" for n in (1, 2, 3)]
    minute = 60 * 16000
    samples = load_audio(LONG_FILE)[: len(cards) * minute]  # a minute each, beside the file
    held = [
        {"bytes": c.read_bytes(), "path": c.name, "array": samples[i * minute : (i + 1) * minute],
         "sampling_rate": 16000}
        for i, c in enumerate(cards)
    ]  # fmt: skip
    listing = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"audio": held}), listing, row_group_size=1)
    by_path = _rows_of_run([str(c) for c in cards], tmp_path / "files.jsonl", tiny_en)
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    before = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        summary = transcribe_corpus(str(listing), tmp_path / "out.jsonl", tiny_en, **OPTIONS)
    finally:
        pa.set_memory_pool(before)
    assert (summary.ok, summary.failed) == (3, 0)
    rows = _rows(tmp_path / "out.jsonl")
    assert {p: r["text"] for p, r in rows.items()} == {c.name: by_path[str(c)] for c in cards}
    assert pool.max_memory() < minute * 4 / 2, pool.max_memory()


def test_a_shard_of_one_row_group_is_read_a_few_rows_at_a_time(tmp_path):
    """A shard written as one row group (pandas' and pyarrow's default: up to 1M rows, so a
    500 MB shard is one group) was read whole for its first file, every row's bytes made
    Python's at once, beside 3 times the shard in Arrow's memory. Its rows are read a few at
    a time now, in order on threads as decode threads ask for them, and backwards too: each
    row's own bytes, Python holding a small part of the shard at most."""
    import tracemalloc
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    from whisperforge.corpus import READ_AHEAD, ShardReader

    rng = np.random.default_rng(0)
    files = [rng.bytes(1 << 18) for _ in range(192)]  # incompressible, as audio nearly is
    held = [{"bytes": b, "path": f"{n}.flac"} for n, b in enumerate(files)]
    shard = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"audio": held, "id": range(len(held))}), shard)
    assert pq.ParquetFile(shard).metadata.num_row_groups == 1
    reader, rows, size = ShardReader(), range(len(files)), len(files) << 18

    def right(row: int) -> bool:
        return reader.read(f"{shard}#{row + 1}", row) == files[row]

    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    before = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        with ThreadPoolExecutor(READ_AHEAD) as threads:
            assert all(threads.map(right, rows))
        assert all(right(row) for row in (0, 150, 3))  # back, on, back
        python = tracemalloc.get_traced_memory()[1]
        reader = ShardReader()  # the last one's reader, mid-group, freed while its pool is
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(before)
    assert python < size / 2, python
    assert pool.max_memory() < size * 2, pool.max_memory()  # a page: its group's column, here


def test_a_shard_rewritten_since_the_last_job_is_read_anew(tiny_en, tmp_path):
    """A process keeps the shard it last read a file from (its row groups, and the last one's
    files): a second job in the same process (or on the same Ray workers) over the shard
    written anew, as a dataset is regenerated, was given the old shard's files for the new
    rows (another file's text under a row's name, without a word), and a row past the old
    groups' sizes stopped the job with an IndexError. Each file is the shard's as it is now."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cards = [DEV_DIR / f"pocketsphinx__cards__00{n}.wav" for n in (1, 2, 3, 4, 5)]
    by_path = _rows_of_run([str(c) for c in cards], tmp_path / "files.jsonl", tiny_en)
    listing = tmp_path / "train-00000-of-00001.parquet"
    # More files in larger groups (rows 3 and 4 were given the files of rows 4 and 5, row 5
    # failed), then fewer in smaller groups (an IndexError).
    for run, (order, group) in enumerate((((0, 1, 2, 3), 2), ((4, 3, 2, 1, 0), 3), ((2, 0, 1), 1))):
        held = [{"bytes": cards[n].read_bytes(), "path": cards[n].name} for n in order]
        pq.write_table(pa.table({"audio": held}), listing, row_group_size=group)
        out = tmp_path / f"run{run}.jsonl"
        summary = transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
        assert (summary.ok, summary.failed) == (len(order), 0)
        texts = {p: r["text"] for p, r in _rows(out).items()}
        assert texts == {cards[n].name: by_path[str(cards[n])] for n in order}


def test_a_shard_of_the_files_bytes_alone_is_read_and_one_of_samples_refused(tiny_en, tmp_path):
    """A Parquet `audio` column of the files' bytes alone (no struct) was refused as "not a
    file's path", the row's bytes printed; each row is its file now. A column of decoded
    samples is refused saying what to store instead, not row by row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cards = [DEV_DIR / f"pocketsphinx__cards__00{n}.wav" for n in (1, 2)]
    shard = tmp_path / "bytes.parquet"
    pq.write_table(pa.table({"audio": pa.array([c.read_bytes() for c in cards])}), shard)
    transcribe_corpus(str(shard), tmp_path / "out.jsonl", tiny_en, **OPTIONS)
    by_path = _rows_of_run([str(c) for c in cards], tmp_path / "files.jsonl", tiny_en)
    rows = _rows(tmp_path / "out.jsonl")
    assert [rows[f"{shard}#{n}"]["text"] for n in (1, 2)] == [by_path[str(c)] for c in cards]
    samples = tmp_path / "samples.parquet"
    decoded = [{"array": [0.0, 0.1], "sampling_rate": 16000, "path": "a.wav"}]
    pq.write_table(pa.table({"audio": decoded}), samples)
    with pytest.raises(WhisperforgeError, match=r"holds decoded samples .* Audio\(decode=False\)"):
        transcribe_corpus(str(samples), tmp_path / "samples.jsonl", tiny_en, **OPTIONS)


def test_a_shards_empty_file_is_its_error_not_a_missing_path(tmp_path):
    """A shard's row holding an empty file (bytes b"", its name beside) was read as the path
    its struct names, relative to the shard: "no such file" at a path that never existed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from whisperforge.corpus import decode

    shard = tmp_path / "shard.parquet"
    held = [{"bytes": b"", "path": "x.wav"}, {"bytes": _clips()[2].read_bytes(), "path": "a"}]
    pq.write_table(pa.table({"audio": held}), shard)
    empty, jfk = (decode(source) for source in list_inputs(str(shard)))
    assert empty.error is not None and "bytes are empty" in empty.error, empty.error
    assert jfk.error is None and jfk.duration == 11.0


def _rows_of_run(files: list[str], out: Path, model: Any) -> dict[str, str]:
    """The text of each of `files` transcribed by its path."""
    transcribe_corpus(files, out, model, **OPTIONS)
    return {path: row["text"] for path, row in _rows(out).items()}


def test_ray_actor_killed_mid_run(ray_cluster, corpus, local_rows, tmp_path):
    """SIGKILL the model actor once its first file is written: Ray restarts it and runs its
    unfinished calls again; the output still has exactly one row per file."""
    killed: list[str] = []

    def kill_once(row: dict) -> None:
        if not killed:
            killed.append(row["worker"])
            os.kill(int(row["worker"].rsplit(":", 1)[1]), signal.SIGKILL)

    out = tmp_path / "killed.jsonl"
    summary = transcribe_corpus(
        str(corpus), out, "tiny.en", ray_address="local", files_per_task=1, on_row=kill_once,
        **OPTIONS,
    )  # fmt: skip
    assert (summary.ok, summary.failed) == (len(local_rows) - 1, 1)
    rows = _rows(out)
    assert _texts(rows) == _texts(local_rows)
    workers = {r["worker"] for r in rows.values()}
    assert killed and len(workers) == 2, "the restarted actor did the files after the kill"


def test_ray_says_what_the_model_actor_refused(ray_cluster, tmp_path):
    """An unknown model, or a language an English-only model cannot transcribe, fails in the
    model actor: Ray passes the error on as text only, which was a raw traceback of Ray's;
    it is whisperforge's error again, what the command prints as one line."""
    from whisperforge.errors import InvalidOptionError, ModelNotFoundError

    one = str(_clips()[2])
    for model, options, error, match in (
        ("no-such-model", {}, ModelNotFoundError, "unknown model 'no-such-model'"),
        ("tiny.en", {"language": "de"}, InvalidOptionError, "English-only"),
    ):
        with pytest.raises(error, match=match):
            transcribe_corpus([one], tmp_path / "out.jsonl", model, ray_address="local", **options)
    assert not (tmp_path / "out.jsonl").exists()


def test_batch_command_translates_with_a_multilingual_model_only(tmp_path, capsys):
    command = ["batch", str(_clips()[2]), "--output", str(tmp_path / "t.jsonl"), "--task"]
    assert main([*command, "translate"]) == 1  # tiny.en, the default model
    assert "cannot translate" in capsys.readouterr().err
    # As `transcribe` (and openai-whisper) warn: word times follow the spoken words.
    assert main([*command, "translate", "--word-timestamps"]) == 1
    assert "warning: Word-level timestamps on translations" in capsys.readouterr().err


def test_batch_command_takes_the_files_of_a_glob_the_shell_expanded(local_rows, tmp_path, capsys):
    """`whisperforge batch recordings/*.wav --output out.jsonl`, the glob unquoted, was refused
    with "unrecognized arguments: recordings/b.wav ...": the shell's files are the corpus."""
    out, clips = tmp_path / "out.jsonl", [str(c) for c in _clips()[1:]]
    assert main(["batch", *clips, "--output", str(out), "--beam-size", "1"]) == 0
    rows = _rows(out)
    assert sorted(rows) == sorted(clips)
    assert all(rows[c]["text"] == local_rows[c]["text"] for c in clips)
    notes = tmp_path / "notes.txt"
    notes.write_text("not audio")
    assert main(["batch", clips[0], str(notes), "--output", str(tmp_path / "x.jsonl")]) == 1
    assert "notes.txt: of several INPUTs all are audio files, or all manifests" in (
        capsys.readouterr().err)  # fmt: skip


def test_batch_command_reads_model_dir_and_fp16(local_rows, tmp_path, monkeypatch):
    """The model options `transcribe` honours, `batch` honours too: --model-dir is where a hub
    name is found (a cache holding tiny.en's files) and --fp16 False computes in float32."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache or nothing
    hub_cache_of_tiny_en(tmp_path / "models", "someone/tiny-en")
    out, jfk = tmp_path / "out.jsonl", str(_clips()[2])
    command = ["batch", jfk, "--output", str(out), "--model", "someone/tiny-en", "--beam-size",
               "1", "--model-dir", str(tmp_path / "models"), "--fp16", "False"]  # fmt: skip
    assert main(command) == 0
    row = _rows(out)[jfk]
    assert row["text"] == local_rows[jfk]["text"]
    assert json.loads(row["settings"])["compute_type"] == "float32"


def test_a_journal_line_that_is_not_utf8_is_redone_not_a_crash(tiny_en, tmp_path):
    """A torn or corrupted line in OUT (bytes that are not UTF-8, a row whose path is not a
    string) is not a row: the rerun transcribes what it lacks instead of raising
    UnicodeDecodeError."""
    jfk, other = str(_clips()[2]), str(_clips()[1])
    listing = tmp_path / "files.txt"
    listing.write_text(f"{jfk}\n")
    out = tmp_path / "out.jsonl"
    transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
    with open(out, "ab") as f:
        f.write(b'\x80\x81{"path": "torn\xe9\n{"path": 7}\n')
    listing.write_text(f"{jfk}\n{other}\n")
    summary = transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
    assert (summary.skipped, summary.ok) == (1, 1)
    lines = out.read_bytes().splitlines()
    rows = [json.loads(line) for line in lines if line.startswith(b'{"path": "/')]
    assert [r["path"] for r in rows] == [jfk, other] and all(r["text"] for r in rows)


def test_an_output_that_is_not_a_journal_is_refused_not_overwritten(tmp_path, capsys):
    """An OUT.jsonl that holds no rows of the job (a finished Parquet OUT renamed, another
    tool's file) had its tail cut at its last newline and rows appended: the Parquet file was
    destroyed. It is refused, untouched, before any model loads; a .parquet OUT that is not
    Parquet is refused saying what to do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    listing = tmp_path / "files.txt"
    listing.write_text(f"{_clips()[1]}\n")
    out = tmp_path / "out.jsonl"
    pq.write_table(pa.table({"path": ["a.wav"], "text": ["kept\n"]}), out)
    other = tmp_path / "notes.jsonl"
    other.write_text('{"note": "mine"}\n{"note": "no newline"}')
    for target in (out, other):
        before = target.read_bytes()
        command = ["batch", str(listing), "--output", str(target), "--model", "no-such-model"]
        assert main(command) == 1
        err = capsys.readouterr().err
        assert f"--output {target} holds no rows of a `whisperforge batch` job" in err, err
        assert "move it away" in err and target.read_bytes() == before
    bad = tmp_path / "out.parquet"
    bad.write_text('{"path": "a.wav"}\n')
    assert main(["batch", str(listing), "--output", str(bad), "--model", "no-such-model"]) == 1
    err = capsys.readouterr().err
    assert f"--output {bad}: not a readable Parquet file" in err and "move it away" in err, err


def test_a_journal_row_that_does_not_fit_parquet_is_named_before_the_job(tmp_path, capsys):
    """A .parquet OUT's journal row of other types (edited by hand, another tool's: a `file`
    that is a number) was a pyarrow traceback at the merge, once every file was transcribed;
    it is named before any file is, and the rerun without its line merges."""
    clip = str(_clips()[1])
    listing = tmp_path / "files.txt"
    listing.write_text(f"{clip}\n")
    out = tmp_path / "out.parquet"
    journal = tmp_path / "out.parquet.journal.jsonl"
    journal.write_text(json.dumps({"path": "old.wav", "file": 5, "text": "hi"}) + "\n")
    command = ["batch", str(listing), "--output", str(out), "--threads", "1", "--beam-size", "1"]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"{journal}: the row of old.wav does not fit the columns of {out}" in err, err
    assert "delete that line" in err and not out.exists()
    journal.write_text(json.dumps({"path": "old.wav", "text": "hi"}) + "\n")
    assert main(command) == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert [r["path"] for r in rows] == [clip, "old.wav"] and rows[0]["text"]


def test_a_file_is_one_row_however_it_is_named(tiny_en, tmp_path, monkeypatch):
    """a.wav, ./a.wav, a//a.wav, its absolute path and a path through a symlinked folder are one
    file: INPUT naming it twice transcribes it once (under its first name, with a warning), and
    a rerun that names it otherwise finds its row instead of writing a second one."""
    hotwords, mfa, jfk = _clips()
    (tmp_path / "audio").symlink_to(DEV_DIR)
    listing = tmp_path / "files.txt"
    listing.write_text(f"audio/{jfk.name}\n./audio/{jfk.name}\n{jfk}\naudio//{hotwords.name}\n")
    out = tmp_path / "out.jsonl"
    with pytest.warns(UserWarning, match="names 2 file"):
        summary = transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
    assert (summary.listed, summary.ok) == (2, 2)
    assert list(_rows(out)) == [f"audio/{jfk.name}", f"audio//{hotwords.name}"]

    listing.write_text(f"{hotwords}\n./audio/./{jfk.name}\n{mfa}\n")  # each file named otherwise
    summary = transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
    assert (summary.skipped, summary.ok) == (2, 1)
    rows = _rows(out)
    assert list(rows) == [f"audio/{jfk.name}", f"audio//{hotwords.name}", str(mfa)]
    assert all(row["text"] for row in rows.values())

    # A folder's rows are named as the rerun's folder names them; from another folder, the
    # row's file finds them (they were transcribed again, a second row each).
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / jfk.name).symlink_to(jfk)
    (folder / "gone.wav").symlink_to(tmp_path / "nowhere.wav")  # was left out without a word
    monkeypatch.chdir(tmp_path)
    summary = transcribe_corpus("folder", out, tiny_en, **OPTIONS)
    assert (summary.skipped, summary.ok, summary.failed) == (1, 0, 1)
    assert "a symbolic link to" in _rows(out)["folder/gone.wav"]["error"]
    monkeypatch.chdir(folder)
    summary = transcribe_corpus(".", out, tiny_en, **OPTIONS)
    assert (summary.skipped, summary.ok, summary.failed) == (2, 0, 0)


def test_a_cut_off_files_row_says_so(tiny_en, tmp_path):
    """A recording cut off mid-file transcribes what is there; its warning reached stderr only,
    and its row (text, no error) could not be told from a whole one's."""
    whole = pcm_wav(load_audio(DEV_DIR / "coqui-tts-ljspeech__LJ001-0002.wav"))
    (tmp_path / "cut.wav").write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out.parquet"
    with pytest.warns(UserWarning, match="may be cut off"):
        summary = transcribe_corpus(str(tmp_path / "cut.wav"), out, tiny_en, **OPTIONS)
    assert summary.ok == 1
    import pyarrow.parquet as pq

    (row,) = pq.read_table(out).to_pylist()
    assert row["error"] is None and row["text"] and "may be cut off" in row["warning"]


def test_a_ray_address_where_nothing_listens_is_refused_at_once(tmp_path):
    """A HOST:PORT with no Ray head (a typo in the port): `ray.init` retried it for many
    minutes, logging warnings; the command says so and exits 1, OUT not made."""
    pytest.importorskip("ray", reason="pip install 'whisperforge[ray]'")
    import socket

    with socket.socket() as unused:  # a port that nothing listens on once closed
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "whisperforge", "batch", str(_clips()[2]), "--output",
               str(out), "--ray-address", f"127.0.0.1:{port}"]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 1 and "nothing answers there" in run.stderr, run.stderr[-2000:]
    assert not out.exists()


def test_a_running_job_holds_its_output_and_ctrl_c_keeps_its_files(tmp_path, capsys):
    """Ctrl-C on a long job exited 130 without a word, a .parquet OUT not written: the command
    now says how many files are kept and where (the journal), and that a rerun goes on. While
    the job runs, a second one to the same OUT is refused at once: the two transcribed every
    file and wrote each row twice."""
    out = tmp_path / "out.parquet"
    listing = tmp_path / "files.txt"
    listing.write_text(f"{_clips()[2]}\n{LONG_FILE}\n")  # the 19-minute file: still running
    job = subprocess.Popen(
        [sys.executable, "-m", "whisperforge", "batch", str(listing), "--output", str(out),
         "--device", "cpu", "--beam-size", "1", "--batch-size", "1"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    journal = tmp_path / "out.parquet.journal.jsonl"
    deadline = time.monotonic() + 300
    while not (journal.exists() and journal.stat().st_size):
        assert job.poll() is None, job.stderr.read()
        assert time.monotonic() < deadline, "no row after 300 s"
        time.sleep(0.05)
    time.sleep(0.5)  # the row written is also counted (just after) before Ctrl-C comes
    rows = journal.read_text()
    other = tmp_path / "other.txt"  # a short job: without the lock it ran, and wrote to OUT
    other.write_text(f"{_clips()[1]}\n")
    assert main(["batch", str(other), "--output", str(out), "--beam-size", "1"]) == 1
    assert f"--output {out}: another job is writing it now" in capsys.readouterr().err
    assert journal.read_text() == rows and job.poll() is None
    job.send_signal(signal.SIGINT)
    assert job.wait(timeout=120) == 130
    err = job.stderr.read()
    job.stderr.close()
    assert f"interrupted: 1 file(s) done in this run are kept in {journal}" in err, err
    assert "rerun the same command" in err and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "files.txt", "other.txt", "out.parquet.journal.jsonl"]  # fmt: skip


def test_a_window_too_big_for_the_gpu_stops_the_job_saying_what_to_lower(
    tmp_path, monkeypatch, capsys
):
    """torch's CUDA out-of-memory error from a window alone (a batch is halved down to one
    first) stopped the job with torch's traceback: the command now says what to lower and that
    the rows done are kept, and a rerun goes on from there. The error is injected into the
    real pipeline's call, as torch raises it."""
    import torch

    from whisperforge.batched import BatchedInferencePipeline

    decode_windows = BatchedInferencePipeline._decode_windows
    calls = []

    def second_out_of_memory(self, batch, options):
        calls.append(len(batch))
        if len(calls) == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return decode_windows(self, batch, options)

    listing, out = tmp_path / "files.txt", tmp_path / "out.jsonl"
    jfk, hotwords = str(_clips()[2]), str(_clips()[0])
    listing.write_text(f"{jfk}\n{hotwords}\n")
    command = ["batch", str(listing), "--output", str(out), "--device", "cpu", "--beam-size",
               "1", "--batch-size", "1"]  # fmt: skip
    monkeypatch.setattr(BatchedInferencePipeline, "_decode_windows", second_out_of_memory)
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "error: the GPU ran out of memory; use a smaller beam_size" in err, err
    assert f"1 file(s) done in this run are kept in {out}" in err and "Traceback" not in err
    assert calls == [1, 1] and list(_rows(out)) == [jfk]

    monkeypatch.setattr(BatchedInferencePipeline, "_decode_windows", decode_windows)
    assert main(command) == 0
    rows = _rows(out)
    assert list(rows) == [jfk, hotwords] and rows[hotwords]["error"] is None
    assert "1 ok, 0 failed, 1 already done" in capsys.readouterr().err


def test_a_manifests_language_and_task_columns_are_read(tmp_path):
    """A manifest's `language` and `task` columns (JSONL, Parquet, CSV or TSV) are each file's
    own; an empty one (missing, null, "") is the job's, and case does not matter ("Translate"
    was an unknown task). They were ignored, with a warning (and a CSV was read as a list of
    paths, its header and every line a missing file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"audio": str(c), "language": language, "task": task, "speaker": "?"}
            for c, language, task in zip(_clips(), (" DE ", None, ""), ("Translate", "", None))]  # fmt: skip
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    for name, sep in (("m.csv", ","), ("m.tsv", "\t")):
        lines = [sep.join(("audio", "language", "task", "speaker"))]
        lines += [sep.join((r["audio"], r["language"] or "", r["task"] or "", "?")) for r in rows]
        (tmp_path / name).write_text("\ufeff" + "\n".join(lines) + "\n")  # Excel's BOM
    for name in ("m.jsonl", "m.parquet", "m.csv", "m.tsv"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sources = list_inputs(str(tmp_path / name))
        own = [(s.language, s.task) for s in sources]
        assert own == [("de", "translate"), (None, None), (None, None)]  # as written by hand


def test_a_manifests_nan_language_and_task_are_the_jobs(tmp_path):
    """NaN (pandas' missing value: a JSONL manifest's NaN, a Parquet column of numbers with
    none set) is an empty language or task, the job's: it was the language 'nan', and each
    such file failed with an unknown language."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    clip = str(_clips()[0])
    row = json.dumps({"audio": clip, "language": float("nan"), "task": float("nan")})
    (tmp_path / "m.jsonl").write_text(row + "\n")  # {..., "language": NaN, "task": NaN}
    columns = {"audio": [clip], "language": [float("nan")], "task": [float("nan")]}
    pq.write_table(pa.table(columns), tmp_path / "m.parquet")
    for name in ("m.jsonl", "m.parquet"):
        (source,) = list_inputs(str(tmp_path / name))
        assert (source.language, source.task) == (None, None), name


def test_a_manifests_other_columns_reach_parquet_over_older_rows(tiny_en, tmp_path):
    """A .parquet OUT holds the manifest's other columns, each of its values' type, after the
    rows' own; a rerun over rows written without them (by the whisperforge before, which
    dropped them: rows of the same files listed without columns) goes on, those rows keeping
    none. A column that would be refused at the merge (values of several types), or whose
    prefixed name is taken, stops the job before any file is transcribed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first, second = (str(DEV_DIR / f"pocketsphinx__cards__00{n}.wav") for n in (1, 2))
    out = tmp_path / "out.parquet"
    (tmp_path / "older.txt").write_text(f"{first}\n")
    transcribe_corpus(str(tmp_path / "older.txt"), out, tiny_en, **OPTIONS)
    listing = tmp_path / "manifest.jsonl"
    rows = [{"path": first, "speaker": 7, "split": "dev", "text": "ten of clubs"},
            {"path": second, "speaker": 8, "split": "test", "text": "four queen of clubs"}]  # fmt: skip
    listing.write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
    assert (summary.skipped, summary.ok) == (1, 1)
    table = pq.read_table(out)
    assert table.schema.names == [*ROW_FIELDS, "speaker", "split", "manifest_text"]
    assert table.schema.field("speaker").type == pa.int64()
    older, row = table.to_pylist()
    assert older["text"] and (older["speaker"], older["split"], older["manifest_text"]) == (
        None, None, None)  # fmt: skip
    assert (row["speaker"], row["split"], row["manifest_text"]) == (8, "test", rows[1]["text"])
    assert "queen" in row["text"].lower()

    rows[0]["speaker"] = "Ann"  # text and numbers in one column
    listing.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(WhisperforgeError, match="column `speaker` of INPUT's manifest"):
        transcribe_corpus(str(listing), tmp_path / "mixed.parquet", tiny_en, **OPTIONS)
    listing.write_text(json.dumps({"path": first, "text": "a", "manifest_text": "b"}) + "\n")
    with pytest.raises(WhisperforgeError, match="`text` would be carried .* rename one"):
        transcribe_corpus(str(listing), tmp_path / "taken.parquet", tiny_en, **OPTIONS)
    assert not list(tmp_path.glob("mixed*")) and not list(tmp_path.glob("taken*"))


def test_a_rows_language_is_recorded_as_its_code(tmp_path):
    """A row's settings hold its language's code: a manifest that said "Spanish" and now "es"
    (or "en-US" and now "en") asks for the same decoding, and its rerun warned that the rows
    were made with other settings."""
    from whisperforge.corpus import _settings_of

    clips = [str(c) for c in _clips()[:2]]
    settings = []
    for first, second in (("Spanish", "en-US"), ("es", "en")):
        listing = tmp_path / f"{first}.csv"
        listing.write_text(f"path,language\n{clips[0]},{first}\n{clips[1]},{second}\n")
        settings.append(_settings_of(list_inputs(str(listing)), "base", "default", {}))
    assert settings[0] == settings[1]
    assert json.loads(settings[0][clips[0]])["language"] == "es"
    listing.write_text(f"path,language\n{clips[0]},xx\n")  # a bad one as given: its row's error
    bad = _settings_of(list_inputs(str(listing)), "base", "default", {})[clips[0]]
    assert json.loads(bad)["language"] == "xx"


GERMAN = DEV_DIR / "picovoice-leopard__test_de.wav"


def test_each_row_is_transcribed_in_its_own_language_and_task(base, tmp_path):
    """On base, a job with --language en --task translate: the German clip's row, marked de
    and transcribe, is transcribed in German; its copy (one file is one row), marked only de,
    takes the job's translate: English. A bad value is that row's error (its file never read)
    and the others go on. A rerun of the same manifest is no change of settings; a row whose
    language the manifest has changed since is. Greedy at temperature 0: two windows."""
    (tmp_path / "copy.wav").write_bytes(GERMAN.read_bytes())
    rows = [{"path": str(GERMAN), "language": "de", "task": "transcribe"},
            {"path": "copy.wav", "language": "de", "task": ""},
            {"path": str(_clips()[0]), "language": "xx"},
            {"path": str(_clips()[1]), "task": "summarize"}]  # fmt: skip
    listing = tmp_path / "manifest.jsonl"
    listing.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out.jsonl"
    job = {"language": "en", "task": "translate", "temperature": 0.0, **OPTIONS}
    summary = transcribe_corpus(str(listing), out, base, **job)
    assert (summary.ok, summary.failed) == (2, 2)
    written = _rows(out)
    german, translated = written[str(GERMAN)], written["copy.wav"]
    assert german["language"] == translated["language"] == "de"
    reference = next(r["text"] for r in manifest() if r["audio"] == GERMAN.name)
    assert plain_wer(reference, german["text"]) < 0.5, german["text"]
    words = set(plain_words(translated["text"]).split())
    assert "the" in words and not words & (set(plain_words(reference).split()) - {"portal"})
    assert "unknown language 'xx'" in written[str(_clips()[0])]["error"]
    assert "unknown task 'summarize'" in written[str(_clips()[1])]["error"]
    settings = json.loads(german["settings"])  # the row's own, not the job's
    assert (settings["language"], settings.get("task", "transcribe")) == ("de", "transcribe")

    with warnings.catch_warnings():  # the same manifest and options: no other settings
        warnings.simplefilter("error")
        summary = transcribe_corpus(str(listing), out, base, **job)
    assert (summary.skipped, summary.ok + summary.failed) == (4, 0)
    listing.write_text(listing.read_text().replace('"de", "task": ""', '"fr", "task": ""'))
    with pytest.warns(UserWarning, match="other settings"):
        transcribe_corpus(str(listing), out, base, **job)


# --initial-prompt ComfyUI --no-vad-filter --without-timestamps, as the Python API spells them
PROMPTED_WITHOUT_VAD = {
    "initial_prompt": "ComfyUI",
    "vad_filter": False,
    "without_timestamps": True,
}


@pytest.fixture(scope="module")
def option_run(tmp_path_factory) -> tuple[dict[str, dict], list[str], str]:
    """`whisperforge batch` with decoding options `transcribe` has (they were not options of
    `batch`), over the hotwords clip and three clips joined into 63 s of speech (.npy): its
    rows, its command and the joined file's path."""
    from whisperforge import load_audio

    folder = tmp_path_factory.mktemp("options")
    joined = [DEV_DIR / n for n in ("openai-whisper__jfk.flac", "mfa__cold_corpus.wav",
                                    "mfa__acoustic_corpus.wav")]  # fmt: skip
    np.save(folder / "joined.npy", np.concatenate([load_audio(f) for f in joined]))
    listing = folder / "files.txt"
    listing.write_text(f"{folder / 'joined.npy'}\n{_clips()[0]}\n")
    out = folder / "out.jsonl"
    command = ["batch", str(listing), "--output", str(out), "--device", "cpu", "--beam-size", "1",
               "--initial-prompt", "ComfyUI", "--no-vad-filter", "--without-timestamps"]  # fmt: skip
    assert main(command) == 0
    return _rows(out), command, str(folder / "joined.npy")


def test_batch_command_takes_transcribes_decoding_options(option_run, local_rows, capsys):
    """--no-vad-filter: the audio cut every 30 s, not at the VAD's pauses; --without-timestamps:
    one segment a window, timed by it; --initial-prompt: the clip's name spelled as prompted
    (the same clip decoded without it misspells it). The row records each of them."""
    option_rows, command, joined = option_run
    row = option_rows[joined]
    starts = [s["start"] for s in row["segments"]]
    assert starts == [0.0, 30.0, 60.0] and all(s["text"].strip() for s in row["segments"])
    ends = [s["end"] for s in row["segments"]]
    assert ends[:2] == [30.0, 60.0] and abs(ends[2] - row["duration"]) < 0.02

    hotwords = str(_clips()[0])
    prompted, plain = option_rows[hotwords]["text"], local_rows[hotwords]["text"]
    assert "ComfyUI" in prompted and "ComfyUI" not in plain
    assert len(option_rows[hotwords]["segments"]) == 1
    settings = json.loads(row["settings"])
    assert settings | PROMPTED_WITHOUT_VAD | {"beam_size": 1} == settings

    # A rerun with another decoding option says that the rows were made otherwise.
    assert main(command) == 0
    assert "other settings" not in capsys.readouterr().err
    assert main([*command, "--initial-prompt", "Comfy"]) == 0
    assert "other settings" in capsys.readouterr().err


def test_rows_from_before_the_decoding_options_are_the_default_settings(tmp_path, capsys):
    """Rows of the command before it took decoding options (their settings named the default
    `task` and `beam_size`) are rows of the defaults, however the rerun spells them; another
    value is noticed."""
    jfk = str(_clips()[2])
    out = tmp_path / "out.jsonl"
    settings = {"beam_size": 5, "compute_type": "default", "model": "tiny.en", "task": "transcribe"}
    row = {"path": jfk, "language": "en", "duration": 11.0, "text": "(earlier)", "segments": [],
           "error": None, "timings": {"decode": 0.0, "transcribe": 0.0}, "worker": "",
           "settings": json.dumps(settings)}  # fmt: skip
    out.write_text(json.dumps(row) + "\n")
    command = ["batch", jfk, "--output", str(out)]
    defaults = ["--best-of", "5", "--temperature", "0", "--vad-filter", "True",
                "--no-condition-on-previous-text", "--suppress-tokens", "-1"]  # fmt: skip
    for spelled in ([], defaults):
        assert main([*command, *spelled]) == 0
        assert "other settings" not in capsys.readouterr().err
    for other in (["--temperature-increment-on-fallback", "none"], ["--vad-filter", "False"],
                  ["--chunk-length", "20"], ["--vad-parameters", '{"threshold": 0.6}']):  # fmt: skip
        assert main([*command, *other]) == 0
        assert "other settings" in capsys.readouterr().err, other
    assert _rows(out)[jfk] == row  # never transcribed again


UNBATCHED = "not available in `batch`"


@pytest.mark.parametrize(
    ("options", "error"),
    [(["--hallucination-silence-threshold", "2"], f"threshold: {UNBATCHED}"),
     (["--clip-timestamps", "0,5"], f"--clip-timestamps: {UNBATCHED}"),
     (["--no-vad-filter", "--vad-parameters", '{"threshold": 0.6}'], "no VAD runs"),
     (["--vad-parameters", '{"treshold": 0.6}'], "unknown vad_parameters"),
     (["--chunk-length", "45"], "chunk_length")],
)  # fmt: skip
def test_batch_command_refuses_what_the_batched_pipeline_cannot_do(options, error, tmp_path,
                                                                    capsys):  # fmt: skip
    """Options that `batch` cannot honour, or that make no sense together, are refused by name
    before any model loads, OUT not made: not taken and ignored."""
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(_clips()[2]), "--output", str(out), "--model", "none", *options]) == 1
    assert error in capsys.readouterr().err
    assert not out.exists()


def test_a_parquet_manifests_dates_and_decimals_resume_into_parquet(tiny_en, tmp_path):
    """A Parquet manifest's dates and decimals reach OUT's rows as their text, and a rerun into
    the same .parquet OUT (a resume after Ctrl-C, or the manifest grown) goes on: it read the
    finished rows' text back beside the manifest's dates and refused the column as one of
    'values of several types', before any file."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    cards = [str(DEV_DIR / f"pocketsphinx__cards__00{n}.wav") for n in (1, 2)]
    listing, out = tmp_path / "manifest.parquet", tmp_path / "out.parquet"
    for paths in (cards[:1], cards):
        columns = {
            "path": paths,
            "recorded": [datetime.date(2024, 5, 1)] * len(paths),
            "gain": pa.array([decimal.Decimal("1.50")] * len(paths), pa.decimal128(4, 2)),
        }
        pq.write_table(pa.table(columns), listing)
        summary = transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
    assert (summary.skipped, summary.ok) == (1, 1)
    table = pq.read_table(out)
    assert table.select(["recorded", "gain"]).to_pylist() == [
        {"recorded": "2024-05-01", "gain": "1.50"}] * 2  # fmt: skip
    assert "queen" in table.to_pylist()[1]["text"].lower()


def test_a_manifest_column_parquet_cannot_hold_is_refused_before_the_job(tiny_en, tmp_path):
    """A JSONL manifest's column of empty objects ({} in every row) is a struct with no
    fields, which Parquet cannot write: the whole corpus was transcribed, then the merge
    failed with pyarrow's traceback, and every rerun again. Refused before any file, named."""
    card = DEV_DIR / "pocketsphinx__cards__001.wav"
    listing = tmp_path / "manifest.jsonl"
    listing.write_text(json.dumps({"path": str(card), "meta": {}}) + "\n")
    with pytest.raises(WhisperforgeError, match=r"column `meta` .* \.jsonl OUT"):
        transcribe_corpus(str(listing), tmp_path / "out.parquet", tiny_en, **OPTIONS)
    assert not list(tmp_path.glob("out*"))
    summary = transcribe_corpus(str(listing), tmp_path / "out.jsonl", tiny_en, **OPTIONS)
    assert summary.ok == 1 and _rows(tmp_path / "out.jsonl")[str(card)]["meta"] == {}


def test_a_csv_manifest_naming_a_column_twice_is_refused(tiny_en, tmp_path):
    """A CSV header with a name twice (two `speaker` columns, pasted from two sheets) gave each
    row the last one's value alone: the first column's values were lost from OUT without a
    word. Refused before any file, by name; unnamed columns (indexes) may repeat."""
    card = DEV_DIR / "pocketsphinx__cards__001.wav"
    listing = tmp_path / "manifest.csv"
    listing.write_text(f",,path,speaker,speaker\n0,0,{card},Ann,Bob\n")
    with pytest.raises(WhisperforgeError, match="names the column `speaker` more than once"):
        transcribe_corpus(str(listing), tmp_path / "out.jsonl", tiny_en, **OPTIONS)
    listing.write_text(f",,path,speaker\n0,0,{card},Ann\n")
    transcribe_corpus(str(listing), tmp_path / "out.jsonl", tiny_en, **OPTIONS)
    row = _rows(tmp_path / "out.jsonl")[str(card)]
    assert row["speaker"] == "Ann" and "clubs" in row["text"] and "" not in row


def test_a_manifests_missing_numbers_are_null_in_the_rows(tiny_en, tmp_path):
    """A Parquet manifest's NaN (a missing value, as pandas writes one) went into a JSONL OUT's
    rows as `NaN`, which is not JSON: strict readers (jq, JavaScript, Go) refused the file. It
    is null there, in lists too, and in a .parquet OUT."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def strict(line: str) -> dict:
        return json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in {line}"))

    listing = tmp_path / "manifest.parquet"
    columns = {"path": [str(DEV_DIR / "pocketsphinx__cards__001.wav")], "snr": [float("nan")],
               "gains": pa.array([[1.5, float("inf")]])}  # fmt: skip
    pq.write_table(pa.table(columns), listing)
    transcribe_corpus(str(listing), tmp_path / "out.jsonl", tiny_en, **OPTIONS)
    (row,) = [strict(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert row["snr"] is None and row["gains"] == [1.5, None] and "clubs" in row["text"]
    transcribe_corpus(str(listing), tmp_path / "out.parquet", tiny_en, **OPTIONS)
    (row,) = pq.read_table(tmp_path / "out.parquet").select(["snr", "gains"]).to_pylist()
    assert row == {"snr": None, "gains": [1.5, None]}


def test_a_manifests_unsigned_64_bit_ids_reach_parquet(tiny_en, tmp_path):
    """Integers past int64's range (unsigned 64-bit ids or hashes, a Parquet manifest's uint64)
    made Arrow's type inference overflow: an OverflowError traceback before the job, for a
    .parquet OUT. They are a uint64 column; past that too, the column is named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    card = str(DEV_DIR / "pocketsphinx__cards__001.wav")
    listing, out = tmp_path / "manifest.jsonl", tmp_path / "out.parquet"
    listing.write_text(json.dumps({"path": card, "hash": 2**64 - 1}) + "\n")
    transcribe_corpus(str(listing), out, tiny_en, **OPTIONS)
    table = pq.read_table(out)
    assert table.schema.field("hash").type == pa.uint64()
    (row,) = table.to_pylist()
    assert row["hash"] == 2**64 - 1 and "clubs" in row["text"]
    listing.write_text(json.dumps({"path": card, "hash": 2**64}) + "\n")
    with pytest.raises(WhisperforgeError, match="column `hash` of INPUT's manifest"):
        transcribe_corpus(str(listing), tmp_path / "past.parquet", tiny_en, **OPTIONS)
