"""The corpus job (`whisperforge batch`): inputs, the JSONL/Parquet journal, one process, and a
local Ray cluster (2 CPUs) whose rows must equal the one-process rows, with a bad file, a rerun
that does no work, and an actor killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import DEV_DIR, short_english_clips

from whisperforge.cli import main
from whisperforge.corpus import list_inputs, transcribe_corpus
from whisperforge.errors import WhisperforgeError


def _clips() -> list[Path]:
    """The first short English clip of each source (different voices and formats)."""
    firsts: dict[str, Path] = {}
    for clip in short_english_clips():
        firsts.setdefault(clip["audio"].split("__")[0], DEV_DIR / clip["audio"])
    return list(firsts.values())[:6]


def _rows(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_path = {row["path"]: row for row in rows}
    assert len(by_path) == len(rows), "a path has more than one row"
    return by_path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A JSONL manifest: the clips, one of them also as a 16 kHz int16 .npy, and a corrupt file
    (relative paths, which are relative to the manifest's folder)."""
    from whisperforge import load_audio

    folder = tmp_path_factory.mktemp("corpus")
    clips = _clips()
    samples = load_audio(clips[0])
    np.save(folder / "first.npy", np.round(samples * 32768).clip(-32768, 32767).astype(np.int16))
    (folder / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really audio" * 50)
    names = [str(c) for c in clips] + ["first.npy", "corrupt.wav"]
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"audio": n, "speaker": "?"}) + "\n" for n in names))
    return manifest


@pytest.fixture(scope="module")
def local_rows(corpus, tmp_path_factory, tiny_en) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("local") / "out.jsonl"
    summary = transcribe_corpus(str(corpus), out, tiny_en)
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
    sources = list_inputs(str(listing))  # relative to the list's folder, each path once
    assert [s.path for s in sources] == ["one.wav", "b/two.FLAC"]
    assert Path(sources[1].location) == tmp_path / "a" / "b" / "two.FLAC"

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": ["b/two.FLAC", "/abs/x.wav"]}), tmp_path / "a" / "m.parquet")
    sources = list_inputs(str(tmp_path / "a" / "m.parquet"))
    assert [s.location for s in sources] == [str(tmp_path / "a/b/two.FLAC"), "/abs/x.wav"]

    with pytest.raises(WhisperforgeError, match="no such file or folder"):
        list_inputs(str(tmp_path / "missing"))
    with pytest.raises(WhisperforgeError, match="no audio files"):
        list_inputs(str(tmp_path / "*.mp3"))
    (tmp_path / "bad.jsonl").write_text('{"file": "x.wav"}\n')
    with pytest.raises(WhisperforgeError, match="`path` or `audio` column"):
        list_inputs(str(tmp_path / "bad.jsonl"))


def test_bad_output(corpus, tmp_path):
    with pytest.raises(WhisperforgeError, match=r"\.jsonl or \.parquet"):
        transcribe_corpus(str(corpus), tmp_path / "out.csv")
    (tmp_path / "file").write_text("")
    with pytest.raises(WhisperforgeError, match="cannot write there"):
        transcribe_corpus(str(corpus), tmp_path / "file" / "out.jsonl")


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
    # The .npy holds the first clip's decoded samples: the same audio, the same text.
    assert local_rows["first.npy"]["text"] == local_rows[str(clips[0])]["text"]


def test_cli_local_resume_and_parquet(corpus, local_rows, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(corpus), "--output", str(out), "--local", "--device", "cpu"]) == 1
    assert "1 failed" in capsys.readouterr().err  # exit 1: a file failed; its row says why
    rows = _rows(out)
    assert {p: r["text"] for p, r in rows.items()} == {p: r["text"] for p, r in local_rows.items()}

    # A crash mid-row: the cut-off row is dropped and its file done again; nothing else is.
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-2]) + lines[-2][:20])
    summary = transcribe_corpus(str(corpus), out, "tiny.en", device="cpu")
    assert (summary.ok + summary.failed, summary.skipped) == (2, len(rows) - 2)
    assert _rows(out).keys() == rows.keys()

    # --retry-errors: the failed file is tried again and still has one row.
    summary = transcribe_corpus(str(corpus), out, "tiny.en", device="cpu", retry_errors=True)
    assert (summary.ok, summary.failed) == (0, 1)
    assert _rows(out).keys() == rows.keys()

    parquet = tmp_path / "out.parquet"
    listing = tmp_path / "two.txt"
    listing.write_text(f"{_clips()[1]}\n{corpus.parent / 'corrupt.wav'}\n")
    transcribe_corpus(str(listing), parquet, "tiny.en", device="cpu", word_timestamps=True)
    import pyarrow.parquet as pq

    table = pq.read_table(parquet).to_pylist()
    assert not parquet.with_name("out.parquet.journal.jsonl").exists()
    texts = {Path(r["path"]).name: r["text"] for r in table}
    assert texts == {_clips()[1].name: local_rows[str(_clips()[1])]["text"], "corrupt.wav": None}
    words = [w for r in table for s in r["segments"] for w in s["words"]]
    assert words and all(w["start"] <= w["end"] for w in words)
    summary = transcribe_corpus(str(listing), parquet, "tiny.en")  # seeded from the Parquet
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
    summary = transcribe_corpus(str(corpus), out, "tiny.en", ray_address="local", files_per_task=2)
    assert (summary.ok, summary.failed) == (len(local_rows) - 1, 1)
    rows = _rows(out)
    assert {p: r["text"] for p, r in rows.items()} == {p: r["text"] for p, r in local_rows.items()}
    assert rows["corrupt.wav"]["error"] == local_rows["corrupt.wav"]["error"]

    before = out.read_bytes()
    start = time.perf_counter()
    summary = transcribe_corpus(str(corpus), out, "tiny.en", ray_address="local")
    assert (summary.ok + summary.failed, summary.skipped) == (0, len(rows))
    assert time.perf_counter() - start < 2 and out.read_bytes() == before  # no work at all


def test_ray_actor_killed_mid_run(ray_cluster, corpus, local_rows, tmp_path):
    """SIGKILL the model actor once its first file is written: Ray restarts it and runs its
    unfinished calls again; the output still has exactly one row per file."""
    killed: list[str] = []

    def kill_once(row: dict) -> None:
        if not killed:
            killed.append(row["worker"])
            os.kill(int(row["worker"].rsplit(":", 1)[1]), signal.SIGKILL)

    out = tmp_path / "killed.jsonl"
    transcribe_corpus(
        str(corpus), out, "tiny.en", ray_address="local", files_per_task=1, on_row=kill_once
    )
    rows = _rows(out)
    assert {p: r["text"] for p, r in rows.items()} == {p: r["text"] for p, r in local_rows.items()}
    workers = {r["worker"] for r in rows.values()}
    assert killed and len(workers) == 2, "the restarted actor did the files after the kill"
