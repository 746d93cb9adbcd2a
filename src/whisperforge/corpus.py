"""Corpus transcription: `whisperforge batch INPUT --output OUT`, in one process or on Ray.

INPUT is a folder (audio files by extension, recursive), a glob (of audio files, or of
manifests: a dataset's shards), a text file of paths, a Parquet, JSONL or CSV manifest (column
`path` or `audio`), or one audio file. A Parquet manifest's `audio` may hold the files
themselves, as Hugging Face datasets' shards do (`HeldFile`). Relative paths in a
list or manifest are relative to the list's folder. A row's `path` is the input's own name for
the file (as the list or manifest writes it). A manifest's `language` and `task` columns are
each file's own: where a row gives one it wins over the job's `language` and `task`, which are
the default for the rows that leave it empty (without either, the language is detected). A bad
value (an unknown language, a task other than transcribe and translate, a language or
translation the model cannot do) is that file's error, and the job goes on. (Checked per file,
not up front: the model that knows what it can do may be only on Ray's actors, and one bad row
of a large corpus should not stop the rest.) A manifest's other columns (speaker, split, id,
...) are carried into each file's row under their own names, those that name a field of the
row (a reference `text`) as `manifest_text` (`_carried`); the driver adds them as it writes a
row, so Ray's workers never see them. A file is one row however it is named: INPUT
naming it twice (a.wav and ./a.wav, its absolute path, a symlink) transcribes it once, under
its first name, with a warning; a rerun finds its row under another of its names too, a
relative one read from the same folder as before (the list's, or the current one).

OUT is written as an append-only JSONL journal, one row per file, flushed per row, so a crash
loses no finished row and a rerun skips every path already in it. Rows with an error are
skipped too (a corrupt file stays corrupt) unless `retry_errors`, which drops them from the
journal first so each path keeps exactly one row. Each row records the `settings` that made it
(model name or path, compute type, the options not at the batched pipeline's defaults, with the
file's own language and task); a rerun that would make a row done otherwise still skips it, and
warns that it does. A `.parquet` OUT is the journal `OUT.journal.jsonl` merged into Parquet
when the job ends, its rows in INPUT's order (the journal's are as files finished, grouped by
language); the journal is then removed (a rerun seeds it from the Parquet file). A job
that dies before the merge leaves the journal, and the rerun merges it. One job at a time
writes OUT (`OutputLock`): a second is refused before it loads a model.

Without `ray_address` everything runs in this process: files are decoded a few ahead on
threads and transcribed by `BatchedInferencePipeline.transcribe_many`, files of one language
and task one after another so that their windows share batches. With it, Ray Data
decodes files in CPU tasks and streams the arrays to a pool of model actors (one per GPU, or
`actors` CPU actors on a cluster without GPUs), each running `transcribe_many` on a batch of
files; the driver writes rows as they stream back. (Without GPUs the decode stage asks for the
actors' resources, so Ray Data fuses the two: each CPU actor decodes its own files.) A crashed
actor is restarted and its unfinished calls run again (Ray Data's default); rows already written
stay.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import glob
import inspect
import json
import logging
import math
import os
import re
import socket
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import errors
from .errors import (
    GPU_OUT_OF_MEMORY,
    AudioError,
    InvalidOptionError,
    WhisperforgeError,
    is_out_of_memory,
)
from .locks import lock_exclusive

if TYPE_CHECKING:
    from .batched import BatchedInferencePipeline, FileTranscription
    from .transcribe import WhisperModel

SAMPLE_RATE = 16000  # audio.SAMPLE_RATE, without importing torch here
AUDIO_EXTENSIONS = frozenset(
    {".wav", ".flac", ".mp3", ".m4a", ".ogg", ".oga", ".opus", ".webm", ".mp4", ".m4v", ".mkv",
     ".mka", ".mov", ".aac", ".wma", ".aif", ".aiff", ".amr", ".npy"}
)  # fmt: skip
MANIFEST_EXTENSIONS = frozenset({".parquet", ".jsonl", ".ndjson", ".csv", ".tsv"})
# A manifest's columns that set a file's own language and task (empty: the job's).
PER_FILE_COLUMNS = ("language", "task")
# An output row's fields, in the order of a .parquet OUT's columns; a manifest's other columns
# follow them.
ROW_FIELDS = ("path", "file", "language", "language_probability", "duration", "text",
              "segments", "error", "warning", "timings", "worker", "settings")  # fmt: skip
# Put before a manifest's column that has one of ROW_FIELDS' names (a reference `text`).
CARRIED_PREFIX = "manifest_"
READ_AHEAD = 4  # files decoded ahead of the model in one process
SHARD_BATCH = 16  # a Parquet shard's rows read at once (`ShardReader`): a few MB of files
MAX_DECODE_TASKS = 10_000  # Ray: one decode task per file, up to this many (then several each)
RAY_INSTALL_HINT = "pip install 'whisperforge[ray]'"
# A WhisperforgeError's last line in a traceback's text, as Ray passes a worker's error on
USER_ERROR_LINE = re.compile(r"^whisperforge\.errors\.(\w+): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Source:
    path: str  # the input's name for the file: the row's key
    location: str  # where to open it
    language: str | None = None  # its manifest row's, if any: wins over the job's
    task: str | None = None
    # Its manifest row's other columns (speaker, split, ...), by their names in OUT's row.
    columns: dict[str, Any] = field(default_factory=dict)
    # Where a Parquet manifest holds the file itself (`HeldFile`): its row there (from 0);
    # location is then SHARD#ROW (a row's own, for `_files`), and the file is read from SHARD.
    row: int | None = None


@dataclass
class Decoded:
    source: Source
    audio: np.ndarray | None
    error: str | None
    decode_s: float
    duration: float | None = None  # seconds of audio, once decoded
    warning: str | None = None  # what decoding it warned of (a cut-off file, ...), for its row


@dataclass
class Summary:
    listed: int  # files in INPUT
    skipped: int  # already in OUT
    skipped_failed: int = 0  # of those, rows that hold an error (kept unless --retry-errors)
    ok: int = 0
    failed: int = 0
    audio_s: float = 0.0
    wall_s: float = 0.0

    @property
    def rtfx(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        # A rerun skips the files an earlier run failed on: they are still not transcribed.
        earlier = f" ({self.skipped_failed} of them failed)" if self.skipped_failed else ""
        done = f"{self.ok} ok, {self.failed} failed, {self.skipped} already done{earlier}"
        if not self.audio_s:  # nothing transcribed (all done before): no speed to tell
            return done
        speed = f"(RTFx {self.rtfx:.1f})"
        return f"{done}; {audio_length(self.audio_s)} of audio in {self.wall_s:.1f} s {speed}"


def audio_length(seconds: float) -> str:
    """`seconds` in hours, minutes or seconds, whichever reads best."""
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


# --- INPUT -----------------------------------------------------------------------------------


def list_inputs(spec: str | Iterable[str]) -> list[Source]:
    """The files of INPUT (see the module's docstring), each once, in a stable order. A list
    of paths (Python) is taken as is."""
    return list(_listing(spec)[0].values())


def _listing(spec: str | Iterable[str]) -> tuple[dict[str, Source], Path | None]:
    """`list_inputs` by the file each names (`_unique`), and the folder its relative names are
    relative to (None: the current one), which is how a rerun reads the names of the rows
    already in OUT."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        sources, folder = _files_or_manifests([os.fspath(p) for p in spec], "the list")
        return _unique(sources), folder
    folder = None
    path = Path(spec).expanduser()
    if path.is_dir():
        # A link to nowhere too: its row says so (it was left out without a word).
        found = sorted(
            p for p in path.rglob("*") if _is_audio(p) and (p.is_file() or p.is_symlink())
        )
        sources = [Source(str(p), str(p)) for p in found]
    elif path.is_file():
        if _is_manifest(path):
            sources, folder = _manifest(path, set()), path.parent
        elif _is_audio(path):
            sources = [Source(spec, spec)]
        else:
            sources, folder = _path_list(path), path.parent
    elif glob.has_magic(spec):
        found = sorted(p for p in glob.glob(os.path.expanduser(spec), recursive=True))
        found = [p for p in found if os.path.isfile(p) or os.path.islink(p)]
        if not found:
            raise WhisperforgeError(f"INPUT {spec}: the glob matches no files; check the pattern")
        sources, folder = _files_or_manifests(found, f"INPUT {spec}: the glob")
    else:
        raise WhisperforgeError(
            f"INPUT {spec}: no such file or folder; pass a folder, a glob in quotes, a text file "
            "of paths, or a .parquet/.jsonl/.csv manifest"
        )
    if not sources:
        shard = (
            next((p for p in path.rglob("*") if _is_manifest(p)), None) if path.is_dir() else None
        )
        if shard is not None:  # a dataset's folder of Parquet shards
            raise WhisperforgeError(
                f"INPUT {spec}: no audio files in it, but manifests ({shard}); pass them as a "
                f"glob in quotes, e.g. '{path / ('**/*' + shard.suffix)}'"
            )
        raise WhisperforgeError(
            f"INPUT {spec}: no audio files in it (extensions read from folders: "
            f"{' '.join(sorted(AUDIO_EXTENSIONS))})"
        )
    return _unique(sources), folder


def _is_audio(path: Path) -> bool:
    return path.suffix.lower() in AUDIO_EXTENSIONS


def _is_manifest(path: Path) -> bool:
    return path.suffix.lower() in MANIFEST_EXTENSIONS


def _files_or_manifests(names: list[str], what: str) -> tuple[list[Source], Path | None]:
    """The files of a glob or list: audio files, or manifests (a dataset's shards) whose rows
    are the files, not both (a list mixing them had its shards decoded as audio)."""
    manifests = [Path(n) for n in names if _is_manifest(Path(n))]
    if manifests and len(manifests) < len(names):
        other = next(n for n in names if not _is_manifest(Path(n)))
        raise WhisperforgeError(
            f"{what} names manifests ({manifests[0]}) and other files ({other}); name the "
            "audio files or the manifests (a dataset's Parquet shards), not both"
        )
    return _manifests(manifests) if manifests else ([Source(n, n) for n in names], None)


def _manifests(paths: list[Path]) -> tuple[list[Source], Path | None]:
    """A dataset's shards (a glob of manifests): their rows, one shard after another, and the
    folder that relative names are relative to (None where the shards are in several)."""
    taken: set[str] = set()
    sources = [source for path in paths for source in _manifest(path, taken)]
    folders = {path.parent for path in paths}
    return sources, folders.pop() if len(folders) == 1 else None


def _unique(sources: list[Source]) -> dict[str, Source]:
    """Each file once, under its first name, by the file (`_files`): named twice (a.wav and
    ./a.wav, by its absolute path, through a symlink) it would be transcribed twice, into two
    rows."""
    kept: dict[str, Source] = {}
    again: list[Source] = []
    for source, file in zip(sources, _files(s.location for s in sources)):
        if kept.setdefault(file, source) is not source:
            again.append(source)
    if again:
        warnings.warn(
            f"INPUT names {len(again)} file(s) more than once (e.g. {again[0].path}): each "
            "file is transcribed once, into one row under its first name",
            stacklevel=4,
        )
    return kept


def _files(locations: Iterable[str]) -> list[str]:
    """The file each location names, one string however it is spelled: absolute, without
    ./ or //, symlinks resolved. A folder is resolved once (a corpus has few); a file only
    where it is a link (a stat each, not realpath's one per folder of the path)."""
    folders: dict[str, str] = {}
    files = []
    for location in locations:
        head, tail = os.path.split(os.path.abspath(os.path.expanduser(location)))
        if head not in folders:
            folders[head] = os.path.realpath(head)
        file = os.path.join(folders[head], tail)
        files.append(os.path.realpath(file) if os.path.islink(file) else file)
    return files


def _located(
    folder: Path,
    name: str,
    language: str | None = None,
    task: str | None = None,
    columns: dict[str, Any] | None = None,
) -> Source:
    return Source(name, str(folder / Path(name).expanduser()), language, task, columns or {})


def _path_list(listing: Path) -> list[Source]:
    try:
        lines = listing.read_text().splitlines()
    except UnicodeDecodeError:
        raise WhisperforgeError(
            f"INPUT {listing}: neither an audio file (by its extension) nor a text list of "
            "paths; rename it or pass the folder holding it"
        ) from None
    names = (line.strip() for line in lines)
    return [_located(listing.parent, n) for n in names if n and not n.startswith("#")]


def _manifest(listing: Path, taken: set[str]) -> list[Source]:
    """The files of a manifest's rows, each with its own language and task if it has them, and
    its other columns (`_carried`), every row with every column (None where it has none).
    `taken`: the names of the files held in the manifests read before (`HeldFile`), added to;
    a file held under a name already taken, or none, is named by its row, `MANIFEST#ROW`."""
    suffix = listing.suffix.lower()
    if suffix == ".parquet":
        rows = _parquet_rows(listing)  # a file that is not Parquet: refused there
    else:
        rows = _csv_rows(listing) if suffix in (".csv", ".tsv") else _jsonl_rows(listing)
    if not rows:
        raise WhisperforgeError(f"INPUT {listing}: the manifest has no rows")
    column = next((c for c in ("path", "audio") if any(c in row for row in rows)), None)
    if column is None:
        raise WhisperforgeError(f"INPUT {listing}: the manifest needs a `path` or `audio` column")
    carried = _carried(listing, rows)
    sources: list[Source] = []
    for number, row in enumerate(rows, 1):
        held = row.get("audio")
        path = row.get(column)
        if isinstance(path, HeldFile):
            path = path.name
        own = (_own(row.get(c)) for c in PER_FILE_COLUMNS)
        columns = {name: _as_json(row.get(c)) for c, name in carried.items()}
        if isinstance(held, HeldFile):
            if not isinstance(path, str) or not path.strip() or path in taken:
                path = f"{listing}#{number}"
            taken.add(path)
            sources.append(Source(path, f"{listing}#{number}", *own, columns, number - 1))
        elif isinstance(path, str) and path.strip():
            sources.append(_located(listing.parent, path, *own, columns))
        else:
            raise WhisperforgeError(
                f"INPUT {listing}, row {number}: its `{column}` is {_shown(row.get(column))}, "
                "not a file's path; fix or drop the row"
            )
    return sources


@dataclass(frozen=True)
class HeldFile:
    """A Parquet manifest's `audio` value that holds the file itself: Hugging Face datasets'
    Audio feature, a struct {"bytes": ..., "path": ...} (LibriSpeech, Common Voice, ...
    shards), `name` its path. Only names are read with the manifest: the bytes are read as
    each file is decoded (`ShardReader`), so a glob over a dataset's 60 GB of shards does not
    hold them in memory."""

    name: str | None


def _shown(value: Any, limit: int = 80) -> str:
    """`value`'s repr, cut to `limit` characters: a row's bytes were printed whole (200 kB)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_json(value: Any) -> Any:
    """A manifest's value as OUT's rows hold it once written: a Parquet manifest's dates,
    decimals, bytes, ... as their text (`Journal.write`'s default=str). Converted here, so
    that a .parquet OUT's check before the job sees the type its merge will: a rerun read the
    finished rows' dates back as text, beside the manifest's dates, and refused the column as
    one of several types. NaN and the infinities (a missing value, as pandas writes one) are
    null: JSON has no such numbers, and a JSONL OUT holding `NaN` was not JSON to its readers."""
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    text = json.dumps(value, ensure_ascii=False, default=str)
    return json.loads(text, parse_constant=lambda _: None)


def _carried(listing: Path, rows: list[dict]) -> dict[str, str]:
    """A manifest's columns that its files' rows in OUT carry (speaker, split, id, ...), each
    with its name there: its own, or CARRIED_PREFIX and its own where a row has a field of
    that name. Prefixed rather than refused: a manifest's reference `text` or its `duration`
    is common, and such manifests ran before their columns were carried. Not carried: the
    path (the row's `path`), `audio` (which may hold the audio itself), the language and task
    (the row's `settings` hold them), and a column without a name (a CSV's index)."""
    names = dict.fromkeys(k for row in rows for k in row if isinstance(k, str) and k.strip())
    carried = {}
    for name in names:
        if name in ("path", "audio", *PER_FILE_COLUMNS):
            continue
        carried[name] = CARRIED_PREFIX + name if name in ROW_FIELDS else name
        if carried[name] != name and carried[name] in names:
            raise WhisperforgeError(
                f"INPUT {listing}: its column `{name}` would be carried into OUT's rows as "
                f"`{carried[name]}` (the rows have a `{name}` of their own), but it has a "
                f"`{carried[name]}` column too; rename one of them"
            )
    return carried


def _own(value: Any) -> str | None:
    """A manifest row's language or task: None where it leaves it empty (missing, null, ""),
    else as lower-case text, as a hand-written "Translate" or "EN" means (checked where it is
    used: a bad one is that file's error). NaN is empty too: pandas' missing value, as a JSONL
    manifest may hold it and a Parquet one's column of numbers does (it was the language 'nan',
    each such file's error)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip().lower()
    return text or None


def _jsonl_rows(listing: Path) -> list[dict]:
    rows = []
    with open(listing) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise WhisperforgeError(f"INPUT {listing}, line {number}: {error}") from None
                if not isinstance(row, dict):
                    raise WhisperforgeError(
                        f'INPUT {listing}, line {number}: not a JSON object ({{"path": ...}})'
                    )
                rows.append(row)
    return rows


def _csv_rows(listing: Path) -> list[dict]:
    """The rows of a CSV (or, by its extension, tab-separated) manifest with a header line."""
    try:
        delimiter = "\t" if listing.suffix.lower() == ".tsv" else ","
        with open(listing, newline="", encoding="utf-8-sig") as f:  # -sig: Excel's BOM
            reader = csv.DictReader(f, delimiter=delimiter)
            names = [name for name in reader.fieldnames or [] if name.strip()]
            twice = next((name for name in names if names.count(name) > 1), None)
            if twice is not None:  # a row would hold the last one's value alone, the others lost
                raise WhisperforgeError(
                    f"INPUT {listing}: its header names the column `{twice}` more than once; "
                    "rename or drop all but one"
                )
            return list(reader)
    except (UnicodeDecodeError, csv.Error) as error:
        raise WhisperforgeError(
            f"INPUT {listing}: not a readable UTF-8 CSV file ({error})"
        ) from None


def _parquet_rows(listing: Path, manifest: bool = True) -> list[dict]:
    """The rows of a Parquet file. A `manifest`'s `audio` column is not read where it has a
    `path` (the audio itself, maybe: the path is what is read), but where it holds the files
    (a struct with their `bytes`, or the bytes alone), each row's is a `HeldFile`, by name
    only. One of decoded samples is refused: the job reads files."""
    pq = _pyarrow_parquet()
    import pyarrow as pa

    try:
        # ParquetFile's reads, not read_table's: asked for `audio.path`, read_table read the
        # whole struct, the files' bytes too (2 GB of memory to list a 540 MB shard).
        with pq.ParquetFile(listing) as file:
            schema = file.schema_arrow
            audio = schema.field("audio").type if "audio" in schema.names else pa.null()
            fields = _held_fields(audio) if manifest else None
            holds = fields is not None
            if manifest and not holds and "path" not in schema.names and _is_samples(audio):
                raise WhisperforgeError(
                    f"INPUT {listing}: its `audio` column holds decoded samples ({audio}), not "
                    "files; store the files' bytes (Hugging Face datasets: cast_column('audio', "
                    "Audio(decode=False)) before saving), or give a `path` column"
                )
            skipped = {"audio"} if manifest and ("path" in schema.names or holds) else set()
            read = [name for name in schema.names if name not in skipped]
            rows = file.read(columns=read).to_pylist()
            if holds:
                names = [None] * len(rows)
                if fields == ["bytes", "path"]:  # read apart: a `path` column has its name
                    names = [
                        (held or {}).get("path")
                        for held in file.read(columns=["audio.path"]).column(0).to_pylist()
                    ]
                for row, name in zip(rows, names):
                    row["audio"] = HeldFile(name)
        return rows
    except (pa.ArrowException, OSError) as error:
        raise WhisperforgeError(f"{listing}: not a readable Parquet file ({error})") from None


def _held_fields(audio: Any) -> list[str] | None:
    """What an `audio` column of this Arrow type holds of each file: its bytes alone (the
    column is the bytes, []), or in a struct, with its path; None: no files."""
    import pyarrow as pa

    if pa.types.is_binary(audio) or pa.types.is_large_binary(audio):
        return []
    if pa.types.is_struct(audio) and audio.get_field_index("bytes") >= 0:
        return [f for f in ("bytes", "path") if audio.get_field_index(f) >= 0]
    return None


def _is_samples(audio: Any) -> bool:
    """An `audio` column of decoded samples: lists of numbers, or a struct with an `array`."""
    import pyarrow as pa

    if pa.types.is_struct(audio):
        return audio.get_field_index("array") >= 0
    return pa.types.is_list(audio) or pa.types.is_large_list(audio)


class ShardReader:
    """The files a Parquet manifest holds (`HeldFile`), read a few rows at a time, in the
    order asked for: files are decoded in their shard's order (a few at once on threads, or a
    block of rows per Ray task), so each row is read about once. A row group is read in
    batches, not whole: a shard written as one group (pandas' and pyarrow's default, up to 1M
    rows) was read whole for its first file, at 6 times its size in memory (3 in Arrow's, its
    files made Python's at once). Arrow still reads a page whole, and pyarrow writes a group's
    column of files as one page (400 MB of 640 files): about twice that at its peak."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # The shard read last, as it was then (its path, inode, size and modification time):
        # one written anew since (a dataset regenerated between two jobs of one process, or
        # during a job) is read anew, not through its old row groups.
        self.shard: tuple[str, int, int, int] | None = None
        self.starts: list[int] = []  # the first row of each row group
        self.fields: list[str] | None = None  # `_held_fields` of its `audio` column
        self.index = -1  # the row group being read (-1: none), its next batches and their row
        self.batches: Iterator[list[Any]] = iter(())
        self.next = 0
        # The last two batches read (first row, their `audio` values): decode threads a few
        # files apart ask for rows a little out of order, across a batch's end too.
        self.kept: deque[tuple[int, list[Any]]] = deque(maxlen=2)

    def read(self, location: str, row: int) -> bytes | str:
        """The bytes of the file held at `row` of the shard `location` names (SHARD#ROW), or
        the path its struct gives where it holds no bytes (relative to the shard's folder)."""
        pq = _pyarrow_parquet()
        shard = location.rpartition("#")[0]
        changed = (
            f"{location}: {shard} has changed since the job listed it (it has no such row, or "
            "no `audio` struct of files now); rerun to list it again"
        )
        with self.lock:
            stat = os.stat(shard)
            key = (shard, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if key != self.shard:
                with pq.ParquetFile(shard) as file:
                    metadata, schema = file.metadata, file.schema_arrow
                sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
                self.shard, self.starts, self.index = key, np.cumsum([0, *sizes]).tolist(), -1
                self.fields = (
                    _held_fields(schema.field("audio").type) if "audio" in schema.names else None
                )
            if self.fields is None or not 0 <= row < self.starts[-1]:
                raise AudioError(changed)
            index = bisect.bisect_right(self.starts, row) - 1
            if index != self.index or row < (self.kept[0][0] if self.kept else self.next):
                # another group, or a row before those kept: its group is read from its start
                columns = [f"audio.{f}" for f in self.fields] or ["audio"]
                self.batches, self.next = _batches(shard, index, columns), self.starts[index]
                self.kept.clear()
            self.index = -1  # until the row is read: a read that fails starts over
            while self.next <= row:
                batch = next(self.batches, None)
                if batch is None:
                    raise AudioError(changed)
                self.kept.append((self.next, batch))
                self.next += len(batch)
            if self.next == self.starts[index + 1]:
                self.batches = iter(())  # the group read: its file closed
            self.index = index
            first, batch = next((f, b) for f, b in self.kept if f <= row < f + len(b))
            held = batch[row - first]
            held = (held if self.fields else {"bytes": held}) or {}  # the bytes alone: a struct's
        if held.get("bytes") is not None:  # b"" too: an empty file's error, not its path's
            return held["bytes"]
        if held.get("path"):
            return str(Path(shard).parent / held["path"])
        raise AudioError(f"{location}: the row holds no audio (no bytes, no path); drop the row")


def _batches(shard: str, index: int, columns: list[str]) -> Iterator[list[Any]]:
    """The `audio` values of a shard's row group `index`, SHARD_BATCH rows at a time, of its
    `columns` alone: the struct's bytes and path, not its other fields (a decoded `array`,
    ...), which may be larger than the files. As Python's values: Arrow's are not kept (its
    buffers outlived a test's memory pool, and Python crashed at exit)."""
    pq = _pyarrow_parquet()
    # Its pages read as they are decoded, not all of its column at once (pre_buffer's).
    with pq.ParquetFile(shard, pre_buffer=False, buffer_size=1 << 20) as file:
        for batch in file.iter_batches(
            SHARD_BATCH, row_groups=[index], columns=columns, use_threads=False
        ):
            yield batch.column(0).to_pylist()


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise WhisperforgeError(
            "Parquet needs pyarrow: pip install 'whisperforge[corpus]' (or use .jsonl)"
        ) from None
    return pq


# --- decoding --------------------------------------------------------------------------------


def read_audio(
    location: str | bytes, on_warning: Callable[[str], None] | None = None
) -> np.ndarray:
    """16 kHz mono float32, of a file or its bytes. `.npy` files hold 16 kHz samples (int16 or
    float) and are read with numpy, so corpora of arrays need no FFmpeg."""
    from .audio import load_audio  # torch is slow to import: only where audio is read

    if isinstance(location, bytes):
        return load_audio(location, on_warning=on_warning)
    if location.lower().endswith(".npy"):
        return load_audio(np.load(location, allow_pickle=False))
    return load_audio(location, on_warning=on_warning)


SHARDS = ShardReader()  # this process's


def decode(source: Source) -> Decoded:
    """A file's audio, or its error; what decoding it warned of is warned of and kept for its
    row (a cut-off recording transcribes what is there: its row says so)."""
    start = time.perf_counter()
    warned: list[str] = []
    try:
        held = source.location if source.row is None else SHARDS.read(source.location, source.row)
        audio, error = read_audio(held, warned.append), None
    except (WhisperforgeError, OSError, ValueError) as exc:
        audio, error = None, f"{type(exc).__name__}: {exc}"
    for message in warned:
        warnings.warn(message, stacklevel=2)
    duration = None if audio is None else audio.size / SAMPLE_RATE
    warning = "; ".join(warned) or None
    return Decoded(source, audio, error, time.perf_counter() - start, duration, warning)


def decode_ahead(sources: Iterable[Source], threads: int = READ_AHEAD) -> Iterator[Decoded]:
    """`decode` on threads a few files ahead (PyAV releases the GIL), in input order."""
    items = iter(sources)
    with ThreadPoolExecutor(threads) as pool:
        ahead: deque[Future[Decoded]] = deque()
        while True:
            while len(ahead) < threads and (source := next(items, None)) is not None:
                ahead.append(pool.submit(decode, source))
            if not ahead:
                return
            yield ahead.popleft().result()


# --- transcription ---------------------------------------------------------------------------


def transcribe_decoded(
    pipeline: BatchedInferencePipeline,
    decoded: Iterable[Decoded],
    batch_size: int | None,
    options: dict[str, Any],
    worker: str = "",
) -> Iterator[dict]:
    """One output row per decoded file (files that failed to decode included), as each is done,
    each file in its own language and task where its source has them. A file's `transcribe`
    time is the wall time since the previous file's result: files share batches, so that is
    its share of the model's time, not an isolated measurement."""
    from .batched import FileRequest

    fed: deque[Decoded] = deque()  # files handed to transcribe_many, whose results come in order
    failed: list[dict] = []

    def audios() -> Iterator[FileRequest]:
        for item in decoded:
            if item.audio is None:
                failed.append(make_row(item, None, 0.0, worker))
                continue
            fed.append(replace(item, audio=None))  # what its row needs, not its audio
            yield FileRequest(item.audio, item.source.language, item.source.task)

    last = time.perf_counter()
    for result in pipeline.transcribe_many(audios(), batch_size=batch_size, **options):
        now = time.perf_counter()
        yield from _drain(failed)
        yield make_row(fed.popleft(), result, now - last, worker)
        last = now
    yield from _drain(failed)


def _drain(rows: list[dict]) -> Iterator[dict]:
    while rows:
        yield rows.pop(0)


def make_row(
    item: Decoded, result: FileTranscription | None, transcribe_s: float, worker: str
) -> dict:
    info = result.info if result is not None else None
    error = item.error or (result.error if result is not None else None)
    segments = [] if result is None or error else result.segments
    rows = []
    for s in segments:
        # Times to the millisecond (sums of window offsets gave 12.340000000000002), and each
        # segment's figures to filter hallucinations by, as openai-whisper's thresholds do.
        row: dict[str, Any] = {
            "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
            "avg_logprob": round(s.avg_logprob, 4), "no_speech_prob": round(s.no_speech_prob, 4),
            "compression_ratio": round(s.compression_ratio, 3), "temperature": s.temperature,
        }  # fmt: skip
        if s.words is not None:
            row["words"] = [
                {"start": round(w.start, 3), "end": round(w.end, 3), "word": w.word,
                 "probability": round(w.probability, 4)}
                for w in s.words
            ]  # fmt: skip
        rows.append(row)
    return {
        "path": item.source.path,
        "language": info.language if info and not error else None,
        "language_probability": (
            round(info.language_probability, 4) if info and not error else None
        ),
        "duration": None if item.duration is None else round(item.duration, 3),
        "text": "".join(s.text for s in segments).strip() if not error else None,
        "segments": rows,
        "error": error,
        "warning": item.warning,
        "timings": {"decode": round(item.decode_s, 4), "transcribe": round(transcribe_s, 4)},
        "worker": worker,
    }


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _load_model(
    model: Any, device: str, compute_type: str, threads: int, download_root: str | None = None
) -> WhisperModel:
    from .transcribe import WhisperModel

    if isinstance(model, WhisperModel):
        return model
    if callable(model):
        return model()
    return WhisperModel(model, device=device, compute_type=compute_type, cpu_threads=threads,
                        download_root=download_root)  # fmt: skip


def run_local(
    sources: list[Source],
    model: Any,
    device: str = "auto",
    compute_type: str = "default",
    threads: int = 0,
    batch_size: int | None = None,
    options: dict[str, Any] | None = None,
    download_root: str | None = None,
) -> Iterator[dict]:
    """Rows for `sources`, transcribed in this process with the batched pipeline."""
    from .batched import BatchedInferencePipeline

    loaded = _load_model(model, device, compute_type, threads, download_root)
    pipeline = BatchedInferencePipeline(loaded)
    yield from transcribe_decoded(
        pipeline, decode_ahead(sources), batch_size, options or {}, _worker_name()
    )


# --- Ray -------------------------------------------------------------------------------------


def _import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise WhisperforgeError(f"--ray-address needs Ray: {RAY_INSTALL_HINT}") from None
    return ray


def _decode_batch(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """Ray Data CPU stage: paths in, 16 kHz float32 arrays out (empty where decoding failed);
    each file's own language and task ("": the job's) passed on."""
    files = zip(batch["path"], batch["location"], batch["row"])
    done = [decode(Source(str(p), str(loc), row=int(r) if r >= 0 else None)) for p, loc, r in files]
    return {
        "path": np.array([d.source.path for d in done]),
        "audio": [d.audio if d.audio is not None else np.zeros(0, np.float32) for d in done],
        "error": np.array([d.error or "" for d in done]),  # "": fine (a column without nulls)
        "warning": np.array([d.warning or "" for d in done]),
        "decode_s": np.array([d.decode_s for d in done]),
        "language": batch["language"],
        "task": batch["task"],
    }


class RayTranscriber:
    """Ray Data actor: one model, `transcribe_many` over each batch of decoded files."""

    def __init__(
        self,
        model: Any,
        device: str,
        compute_type: str,
        threads: int,
        batch_size: int | None,
        options: dict[str, Any],
        download_root: str | None = None,
    ):
        from .batched import BatchedInferencePipeline

        loaded = _load_model(model, device, compute_type, threads, download_root)
        self.pipeline = BatchedInferencePipeline(loaded)
        self.batch_size = batch_size
        self.options = options
        self.worker = _worker_name()

    def __call__(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        columns = zip(
            batch["path"], batch["audio"], batch["error"], batch["warning"], batch["decode_s"],
            batch["language"], batch["task"],
        )  # fmt: skip
        items = []
        for path, audio, error, warning, decode_s, language, task in columns:
            source = Source(str(path), "", str(language) or None, str(task) or None)
            if error:
                items.append(Decoded(source, None, str(error), decode_s))
            else:
                samples = np.asarray(audio, np.float32)
                seconds = samples.size / SAMPLE_RATE
                items.append(
                    Decoded(source, samples, None, decode_s, seconds, str(warning) or None)
                )
        rows = transcribe_decoded(self.pipeline, items, self.batch_size, self.options, self.worker)
        return {"row": np.array([json.dumps(r) for r in rows])}


def run_ray(
    sources: list[Source],
    model: Any,
    address: str,
    compute_type: str = "default",
    threads: int = 0,
    batch_size: int | None = None,
    options: dict[str, Any] | None = None,
    actors: int = 1,
    num_gpus_per_actor: float = 1.0,
    files_per_task: int = 16,
    num_cpus: int | None = None,
    download_root: str | None = None,
) -> Iterator[dict]:
    """Rows for `sources` from a Ray cluster, as they stream back. `address`: "local" starts
    Ray in this process (`num_cpus` of this machine), anything else is `ray.init`'s address.
    An already initialized Ray is used as it is."""
    ray = _import_ray()
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)
            else:
                _check_answers(address)
                ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as error:
            # e.g. "ray://..." without ray[client], or no cluster at the address
            raise WhisperforgeError(
                f"--ray-address {address}: Ray could not start or connect "
                f"({str(error).splitlines()[0]}); check the address (auto, local, HOST:PORT, or "
                "ray://HOST:PORT with pip install 'ray[client]')"
            ) from None
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the job prints its own progress line and summary
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # Its warning that progress bars are off, which the line above turned off: noise.
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if gpus > 0:  # decoding in 1-CPU tasks, overlapping the actors' GPU work
        size = max(1, int(gpus / num_gpus_per_actor))
        resources: dict[str, float] = {"num_gpus": num_gpus_per_actor}
        decode_cpus, device = 1, "cuda"
    else:  # a CPU-only cluster: `actors` actors, each with `threads` (default 1) cores
        size = actors
        threads = threads or 1
        resources = {"num_cpus": threads}
        # The same CPUs as an actor: Ray fuses decoding into the actors, so no decode task
        # waits for a CPU that the actors hold (`--threads` = every core would starve them).
        decode_cpus, device = threads, "cpu"
    # Absolute paths: Ray's workers may run in another folder (on a cluster: a shared disk).
    items = [
        {"path": s.path, "location": os.path.abspath(s.location), "language": s.language or "",
         "task": s.task or "", "row": -1 if s.row is None else s.row}
        for s in sources
    ]  # fmt: skip
    blocks = min(len(items), MAX_DECODE_TASKS)
    dataset = ray.data.from_items(items, override_num_blocks=blocks)
    dataset = dataset.map_batches(
        _decode_batch, batch_size=1, batch_format="numpy", num_cpus=decode_cpus
    )
    actor_arguments = {
        "model": model, "device": device, "compute_type": compute_type, "threads": threads,
        "batch_size": batch_size, "options": options or {}, "download_root": download_root,
    }  # fmt: skip
    dataset = dataset.map_batches(
        RayTranscriber,
        batch_size=files_per_task,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=size),
        fn_constructor_kwargs=actor_arguments,
        # Ray Data restarts a crashed actor and runs its unfinished calls again (its default;
        # `max_restarts` as a map_batches argument is deprecated since Ray 2.60).
        **resources,
    )
    try:
        for row in dataset.iter_rows():
            yield json.loads(row["row"])
    except Exception as error:
        cause = _user_error(error)
        if cause is None:
            raise
        raise cause from None  # the user's mistake (a bad option), not Ray's traceback


def _check_answers(address: str) -> None:
    """Refuse a HOST:PORT where nothing listens: `ray.init` would retry it for many minutes,
    logging warnings, before giving up."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or "://" in host:
        return  # auto, ray://...: Ray's own errors say what is wrong, at once
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as error:
        raise WhisperforgeError(
            f"--ray-address {address}: nothing answers there ({error.strerror or error}); start "
            "the cluster's head there (ray start --head), or check the address and port"
        ) from None


def _user_error(error: BaseException | None) -> WhisperforgeError | None:
    """The WhisperforgeError that a Ray task or actor failed with, through Ray's wrappers; or
    remade from their text, which is all that Ray 2.60 passes on (of an option refused in a
    task, or a model actor's constructor: an unknown model, an English-only one asked for
    German)."""
    seen, texts = set(), []
    while error is not None and id(error) not in seen:
        if isinstance(error, WhisperforgeError):
            return error
        seen.add(id(error))
        texts.append(str(error))
        error = getattr(error, "cause", None) or error.__cause__
    found = [m for text in texts for m in USER_ERROR_LINE.findall(text)]
    if not found:
        return None
    name, message = found[-1]  # the innermost: the error raised first
    kind = getattr(errors, name, None)
    is_ours = isinstance(kind, type) and issubclass(kind, WhisperforgeError)
    return kind(message) if is_ours else WhisperforgeError(message)


# --- OUT -------------------------------------------------------------------------------------


class OutputLock:
    """OUT held by one job at a time: two jobs appending to one journal each transcribed every
    file and wrote its row twice. An exclusive `flock` on `JOURNAL.lock`, taken without waiting
    (the second job is refused at once, before any model loads) and dropped by the kernel when
    the process dies, so a crashed job never leaves OUT locked. The file is removed on release.
    (Where `fcntl` is missing, Windows, nothing is locked.)"""

    def __init__(self, journal: Path, output: str | Path):
        self.path = journal.with_name(journal.name + ".lock")
        self.fd: int | None = None
        busy = WhisperforgeError(
            f"--output {output}: another job is writing it now; wait for that job to "
            "end (a rerun then skips the files it did), or write to another --output"
        )
        while True:
            fd = lock_exclusive(self.path, busy, os.O_RDWR | os.O_CREAT)
            if fd is None:
                return
            try:  # the file we locked may have been removed by a job releasing it meanwhile
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    self.fd = fd
                    return
            except FileNotFoundError:
                pass
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # before unlocking: no job locks a removed file
            os.close(self.fd)
            self.fd = None


class Journal:
    """OUT as an append-only JSONL journal (see the module's docstring)."""

    def __init__(
        self, output: str | Path, retry_errors: bool = False, carried: Iterable[dict] = ()
    ):
        """`carried`: the manifest's columns of each file (`Source.columns`), which a .parquet
        OUT's columns must hold too: checked now, not at the merge."""
        out = Path(output).expanduser()
        suffix = out.suffix.lower()
        if suffix not in (".jsonl", ".parquet"):
            raise WhisperforgeError(f"--output {output}: must end in .jsonl or .parquet")
        self.parquet = out if suffix == ".parquet" else None
        if self.parquet is not None:
            _pyarrow_parquet()  # missing: said now, not after the whole corpus is transcribed
        self.path = self.kept_in(out)
        if out.is_dir():  # found now, not after the whole corpus when the rows are merged
            raise WhisperforgeError(
                f"--output {output} is a folder; name a .jsonl or .parquet file"
            )
        above = next((p for p in out.parents if p.exists()), None)
        if above is not None and not above.is_dir():  # (the OSError said "File exists")
            raise WhisperforgeError(f"--output {output}: {above} is a file, not a folder; "
                                    "pick another path")  # fmt: skip

        def unwritable(error: OSError) -> WhisperforgeError:
            return WhisperforgeError(f"--output {output}: cannot write there "
                                     f"({error.strerror or error}); pick a writable path")  # fmt: skip

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.lock = OutputLock(self.path, output)
        except OSError as error:
            raise unwritable(error) from None
        try:
            self.created = not self.path.exists()  # removed again if no row comes
            rows = self._load()
            if retry_errors and any(r.get("error") for r in rows):
                rows = [r for r in rows if not r.get("error")]
                self._rewrite(rows)
            if self.parquet is not None:  # a row the merge would fail on: said before the job
                self._table(rows + list(carried))
            self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed in close()
        except OSError as error:
            self.lock.release()
            raise unwritable(error) from None
        except BaseException:  # Ctrl-C, or a row the merge would fail on: the lock goes too
            self.lock.release()
            raise
        self.done = {r["path"] for r in rows}
        # The file each row is of, resolved (rows before session 51 have none): a rerun from
        # another folder finds a folder's or glob's rows by it, not by names relative to where
        # it runs (it transcribed them all again, beside the old rows).
        self.files = {r["file"]: r["path"] for r in rows if isinstance(r.get("file"), str)}
        self.failed = {r["path"] for r in rows if r.get("error")}
        self.settings: dict[str, str | None] = {r["path"]: r.get("settings") for r in rows}
        self.written = 0

    @staticmethod
    def kept_in(output: str | Path) -> Path:
        """Where OUT's rows are while the job runs: OUT, or a .parquet OUT's journal."""
        out = Path(output).expanduser()
        return (
            out.with_name(out.name + ".journal.jsonl") if out.suffix.lower() == ".parquet" else out
        )

    def _load(self) -> list[dict]:
        if not self.path.exists() and self.parquet is not None and self.parquet.exists():
            try:
                rows = _parquet_rows(self.parquet, manifest=False)
            except WhisperforgeError as error:
                raise WhisperforgeError(
                    f"--output {error}; it is not a finished OUT of this command: move it away, "
                    "or pick another --output"
                ) from None
            self._rewrite(rows)  # seed the journal with the finished Parquet's rows
            return rows
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        rows = []
        for line in data[:complete].splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # not JSON, or not UTF-8 (a torn write, a bad sector)
                continue  # not a row of ours: its file (if any) is transcribed again
            if isinstance(row, dict) and isinstance(row.get("path"), str):
                rows.append(row)
        # A file with no row of ours (a Parquet OUT named .jsonl, another tool's file) is not
        # a journal: cutting its tail and appending to it destroyed it. Only a first row cut
        # off by a crash (each row starts so) is ours.
        if not rows and data.strip() and not (complete == 0 and data.startswith(b'{"path": ')):
            raise WhisperforgeError(
                f"--output {self.path} holds no rows of a `whisperforge batch` job (it is "
                "another file, not its JSONL journal); move it away, or pick another --output"
            )
        if complete < len(data):  # a row cut off by a crash: drop it, the file is redone
            with open(self.path, "r+b") as f:
                f.truncate(complete)
        return rows

    def _rewrite(self, rows: list[dict]) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        os.replace(temporary, self.path)

    def write(self, row: dict) -> None:
        # default=str: a Parquet manifest's dates, decimals, ... as their text
        self.file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        self.file.flush()  # a crash after this loses nothing
        self.done.add(row["path"])
        if "file" in row:
            self.files[row["file"]] = row["path"]
        self.written += 1

    def close(self, merge: bool = True, order: Iterable[str] = ()) -> None:
        """Close the journal; a .parquet OUT's is merged into it when `merge`, its rows in the
        input's `order` of paths (the journal's: as files finished, grouped by language)."""
        try:
            self.file.close()
            if self.created and not self.written and self.path.stat().st_size == 0:
                self.path.unlink()  # a job that stopped before its first row leaves no empty file
                return
            if merge and self.parquet is not None:
                self._merge(self.parquet, order)
        finally:
            self.lock.release()

    def _table(self, rows: list[dict]) -> Any:
        """`rows` as a .parquet OUT's table: its fixed columns, then the manifest's carried
        ones, each of the type its values have. A row that does not fit them (a journal line
        edited by hand, or another tool's) is named, and the job told to drop it, as is a
        carried column of values of several types; checked before any file is transcribed
        too: it was a pyarrow traceback once the whole corpus was done."""
        import pyarrow as pa

        word = pa.struct(
            [("start", pa.float64()), ("end", pa.float64()), ("word", pa.string()),
             ("probability", pa.float64())]
        )  # fmt: skip
        segment = pa.struct(
            [("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
             ("avg_logprob", pa.float64()), ("no_speech_prob", pa.float64()),
             ("compression_ratio", pa.float64()), ("temperature", pa.float64()),
             ("words", pa.list_(word))]
        )  # fmt: skip
        timings = pa.struct([("decode", pa.float64()), ("transcribe", pa.float64())])
        types = {
            "path": pa.string(), "file": pa.string(), "language": pa.string(),
            "language_probability": pa.float64(), "duration": pa.float64(), "text": pa.string(),
            "segments": pa.list_(segment), "error": pa.string(), "warning": pa.string(),
            "timings": timings, "worker": pa.string(), "settings": pa.string(),
        }  # fmt: skip
        schema = pa.schema([(name, types[name]) for name in ROW_FIELDS])
        for name in dict.fromkeys(k for row in rows for k in row if k not in types):
            column = [row.get(name) for row in rows]
            try:
                try:
                    values = pa.array(column)
                except OverflowError:  # integers past int64's: unsigned 64-bit ids, hashes
                    values = pa.array(column, type=pa.uint64())
            except (pa.ArrowException, TypeError, OverflowError) as error:
                raise WhisperforgeError(
                    f"the column `{name}` of INPUT's manifest (or of {self.path}'s rows) holds "
                    f"values of several types ({error}), which one Parquet column cannot; give "
                    "them one type (all text, or all numbers of 64 bits), or write a .jsonl OUT"
                ) from None
            column = pa.field(name, values.type)
            try:  # a type Arrow has and Parquet has not: objects with no fields ({}) in every row
                sink, one = pa.BufferOutputStream(), pa.schema([column])
                _pyarrow_parquet().ParquetWriter(sink, one).close()
            except pa.ArrowException as error:
                raise WhisperforgeError(
                    f"the column `{name}` of INPUT's manifest (or of {self.path}'s rows) cannot "
                    f"be written to Parquet ({error}); give its empty objects ({{}}) a field, "
                    "drop the column, or write a .jsonl OUT"
                ) from None
            schema = schema.append(column)
        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowException, TypeError):
            for row in rows:  # the first that does not fit, to name it
                try:
                    pa.Table.from_pylist([row], schema=schema)
                except (pa.ArrowException, TypeError) as error:
                    raise WhisperforgeError(
                        f"{self.path}: the row of {row.get('path')} does not fit the columns of "
                        f"{self.parquet} ({error}); delete that line (its file is transcribed "
                        "again) and rerun"
                    ) from None
            raise

    def _merge(self, target: Path, order: Iterable[str]) -> None:
        pq = _pyarrow_parquet()
        position = {path: i for i, path in enumerate(order)}
        # Rows of paths no longer listed (an earlier run's input) after the listed ones.
        rows = sorted(self._load(), key=lambda row: position.get(row["path"], len(position)))
        temporary = target.with_name(target.name + ".tmp")
        pq.write_table(self._table(rows), temporary)
        os.replace(temporary, target)
        self.path.unlink()  # the Parquet file now holds every row; a rerun seeds from it


# --- the job ---------------------------------------------------------------------------------


class Progress:
    """One line on stderr, rewritten in place: files, audio hours, RTFx."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.start = time.perf_counter()
        self.shown = 0.0

    def update(self, summary: Summary, final: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.shown < 0.5 and not final):
            return
        self.shown = now
        wall = now - self.start
        rtfx = summary.audio_s / wall if wall > 0 else 0.0
        line = (
            f"{summary.ok + summary.failed}/{self.total} files ({summary.failed} failed), "
            f"{audio_length(summary.audio_s)} of audio, RTFx {rtfx:.1f}"
        )
        print("\r" + line, end="\n" if final else "", file=sys.stderr, flush=True)


def transcribe_corpus(
    inputs: str | Iterable[str],
    output: str | Path,
    model: Any = "tiny.en",
    *,
    device: str = "auto",
    compute_type: str = "default",
    threads: int = 0,
    download_root: str | None = None,
    batch_size: int | None = None,
    retry_errors: bool = False,
    ray_address: str | None = None,
    ray_num_cpus: int | None = None,
    actors: int = 1,
    num_gpus_per_actor: float = 1.0,
    files_per_task: int = 16,
    progress: bool = False,
    on_row: Callable[[dict], None] | None = None,
    **options: Any,
) -> Summary:
    """Transcribe every file of `inputs` not yet in `output`; see the module's docstring.

    model: a name or path, a loaded `WhisperModel` (this process only), or a function that
    returns one (on Ray it must pickle: a module-level function); a name is looked for in
    `download_root` as `WhisperModel` does. options: as
    `BatchedInferencePipeline.transcribe_many` (language, word_timestamps, beam_size,
    initial_prompt, vad_filter, ...), checked before any model loads; a manifest row's own
    language and task win over `language` and `task`.
    on_row: called with each row once it is written.
    """
    start = time.perf_counter()
    by_file, folder = _listing(inputs)
    sources = list(by_file.values())
    files = {source.path: file for file, source in by_file.items()}
    same = isinstance(inputs, (str, os.PathLike)) and os.path.exists(output)
    if same and os.path.exists(inputs) and os.path.samefile(inputs, output):
        raise WhisperforgeError(f"--output {output} is the input; write to another file")
    settings = _settings_of(sources, model, compute_type, options)
    carried = {source.path: source.columns for source in sources}
    journal = Journal(output, retry_errors, [columns for columns in carried.values() if columns])
    try:  # OUT is locked now: unlocked whatever stops the job
        done = _rows_of(sources, files, journal, folder)
        # Rows made otherwise (another model, language, ...) are still skipped as done: say so.
        pairs = dict.fromkeys((journal.settings[row], settings[path]) for path, row in done.items())
        other = next((pair for pair in pairs if _differ(*pair)), None)  # a corpus has few pairs
        if other is not None:
            warnings.warn(
                f"--output {output} holds rows made with other settings ({other[0]}; now "
                f"{other[1]}): those files are skipped as done; write to another --output to "
                "transcribe them with these settings",
                stacklevel=2,
            )
        # Files of one language and task one after another: their windows share batches.
        todo = sorted(
            (s for s in sources if s.path not in done),
            key=lambda s: (s.language or "", s.task or ""),
        )
        if options.get("word_timestamps") and any(
            (s.task or options.get("task")) == "translate" for s in todo
        ):
            from .timing import TRANSLATED_WORD_TIMES  # openai-whisper's warning

            warnings.warn(TRANSLATED_WORD_TIMES, stacklevel=2)
        summary = Summary(
            listed=len(sources), skipped=len(sources) - len(todo),
            skipped_failed=sum(row in journal.failed for row in done.values()),
        )  # fmt: skip
        bar = Progress(len(todo), progress)
    except BaseException:
        journal.close(merge=False)
        raise
    finished = False
    try:
        if not todo:
            rows: Iterable[dict] = ()
        elif ray_address is None:
            rows = run_local(
                todo, model, device, compute_type, threads, batch_size, options, download_root
            )
        else:
            rows = run_ray(
                todo, model, ray_address, compute_type, threads, batch_size, options, actors,
                num_gpus_per_actor, files_per_task, ray_num_cpus, download_root,
            )  # fmt: skip
        for row in rows:
            if row["path"] in journal.done:
                continue  # a retried Ray task never repeats a row, but the journal makes sure
            path = row["path"]
            journal.write(row | {"file": files[path], "settings": settings[path]} | carried[path])
            summary.ok += row["error"] is None
            summary.failed += row["error"] is not None
            if row["error"] is None:  # the audio transcribed (RTFx): a failed file's is not
                summary.audio_s += row["duration"] or 0.0
            bar.update(summary)
            if on_row is not None:
                on_row(row)
        finished = True
    finally:
        # A failed job keeps its journal: the rerun merges it.
        journal.close(merge=finished, order=(s.path for s in sources))
        summary.wall_s = time.perf_counter() - start
        if summary.ok + summary.failed:
            bar.update(summary, final=True)
    return summary


def _rows_of(
    sources: list[Source], files: dict[str, str], journal: Journal, folder: Path | None
) -> dict[str, str]:
    """The path of the row in OUT of each source that has one: the source's own, or another
    name of the same file (./a.wav for a.wav, absolute for relative, through a symlink), found
    by the file the row records (`files`: each source's), else (an older row) by its name
    read as INPUT reads its own (relative to `folder`)."""
    rows = {s.path: s.path for s in sources if s.path in journal.done}
    others = [s for s in sources if s.path not in rows]
    unrecorded = journal.done - set(journal.files.values())
    by_file = dict(journal.files)
    if others and unrecorded:
        spelled = list(unrecorded)
        locations = (n if folder is None else _located(folder, n).location for n in spelled)
        by_file |= dict(zip(_files(locations), spelled))
    for source in others:
        if files[source.path] in by_file:
            rows[source.path] = by_file[files[source.path]]
    return rows


def _settings_of(
    sources: list[Source], model: Any, compute_type: str, options: dict[str, Any]
) -> dict[str, str]:
    """Each source's `_settings`, by path: the job's, with the file's own language and task
    where its manifest row gives them (so a rerun compares a row with what it would be now).
    The job's options are checked first, even for a corpus whose rows all name their own."""
    job = _settings(model, compute_type, options)
    made: dict[tuple[str | None, str | None], str] = {(None, None): job}  # a corpus has few
    for source in sources:
        own = (source.language, source.task)
        if own not in made:
            given = {"language": source.language, "task": source.task}
            file_options = options | {k: v for k, v in given.items() if v is not None}
            made[own] = _settings(model, compute_type, file_options)
    return {source.path: made[source.language, source.task] for source in sources}


def _language_code(language: str | None) -> str | None:
    """A manifest row's language as its code where it is one Whisper knows; else as given
    (that row's error says why)."""
    from .tokenizer import LANGUAGES, normalize_language

    if language is None:
        return None
    try:
        return normalize_language(language, list(LANGUAGES))
    except InvalidOptionError:
        return language


def _settings(model: Any, compute_type: str, options: dict[str, Any]) -> str:
    """What decides a row's text, as each row records it: the model (by name or path), the
    compute type and the options that are not the batched pipeline's defaults."""
    settings = {"compute_type": compute_type, **_changed_options(options)}
    if isinstance(model, (str, os.PathLike)):  # not a loaded model or a function making one
        settings["model"] = os.fspath(model)
    return json.dumps(settings, sort_keys=True, default=str)


def _changed_options(options: dict[str, Any]) -> dict[str, Any]:
    """`transcribe_many`'s keyword arguments that differ from its defaults, each in one form
    (temperature 0.0 as [0.0], suppress_tokens as a list, ...), as JSON values. They are
    checked on the way: a bad option is refused here, before any model loads."""
    from .batched import BatchedInferencePipeline, batched_options
    from .vad import vad_options_of

    # The call's own arguments, with their defaults; the others are TranscriptionOptions'.
    parameters = inspect.signature(BatchedInferencePipeline.transcribe_many).parameters
    call = {n: parameters[n].default for n in ("language", "task", "vad_filter", "vad_parameters")}
    vad_options_of(options.get("vad_parameters"))
    made = asdict(batched_options(**{k: v for k, v in options.items() if k not in call}))
    default = asdict(batched_options())
    changed = {k: v for k, v in options.items() if k in call and v != call[k]}
    if isinstance(changed.get("language"), str):
        # As its code: a manifest that spells it otherwise since ("Spanish" for "es", "en-US"
        # for "en"; rows recorded so too) asks for the same decoding, and warned of other
        # settings.
        changed["language"] = _language_code(changed["language"])
    for name, value in made.items():
        if value != default[name]:
            changed["temperature" if name == "temperatures" else name] = value
    return json.loads(json.dumps(changed, default=str))


def _differ(recorded: str | None, settings: str) -> bool:
    """Whether a row was made with other settings, each side's options read as
    `_changed_options` reads them: an option a row names at its default value (as rows before
    this form named the command's `task` and `beam_size`) is no difference. The model counts
    only where both sides name it (a loaded one is unnamed)."""
    if recorded is None:  # a row of an older whisperforge
        return False
    theirs, ours = _read_settings(recorded), _read_settings(settings)
    unknown = set() if "model" in theirs and "model" in ours else {"model"}
    return any(theirs.get(k) != ours.get(k) for k in (theirs.keys() | ours.keys()) - unknown)


def _read_settings(settings: str) -> dict[str, Any]:
    """A row's settings, its options as `_changed_options` gives them."""
    read = json.loads(settings)
    kept = {k: read.pop(k) for k in ("model", "compute_type") if k in read}
    try:
        return kept | _changed_options(read)
    except (WhisperforgeError, ValueError, TypeError):  # not options of ours: as they are
        return kept | read


# --- the command -----------------------------------------------------------------------------

BATCH_EPILOG = """\
INPUT: a folder (audio files by extension, recursive), a glob in quotes, a text file of paths,
  audio files (one, or several: a glob the shell expanded, recordings/*.wav), or a
  .parquet/.jsonl/.csv/.tsv manifest with a `path` or `audio` column (a CSV's in its
  header line; relative paths are relative to the list's folder); .npy files hold 16 kHz
  samples. A manifest's `language` (en, de, pt-BR, ...) and `task` (transcribe, translate)
  columns are each file's own: a row's value wins over --language and --task, which are the
  default for rows that leave it empty (missing, null or ""). A bad value (an unknown
  language, another task, German on an English-only model) is that row's error; the other
  files go on. Its other columns (speaker, split, ...) are carried into each file's row under
  their own names; one named as a field of the row below (a reference `text`, `duration`)
  is prefixed: manifest_text.
OUT: .jsonl, written row by row as files finish, or .parquet, merged from OUT.journal.jsonl at
  the end. One row per file: path (as INPUT names it), file (its absolute path, links
  resolved: how a rerun from another folder finds it), language, language_probability,
  duration, text, segments (start, end, text, avg_logprob, no_speech_prob, compression_ratio,
  temperature, words), error, warning (what decoding it warned of: a cut-off file, ...), timings, worker, settings
  (the model and its compute type, the options not at their defaults, the row's own language
  and task included, as a JSON string; a rerun that would make a done row otherwise warns).
  timings: seconds decoding the file, and from the previous row to this one (files share
  batches: a file finished in the same batch as the one before shows about 0).
Rerunning with the same OUT skips the files already in it, failed ones too unless
  --retry-errors; the exit status is 1 while OUT holds a failed file of INPUT.

The decoding options are `transcribe`'s; --hallucination-silence-threshold and
  --clip-timestamps are not available here (the sequential loop's, and one file's).

examples:
  whisperforge batch recordings/ --output out.jsonl
  whisperforge batch calls/ --output out.jsonl --initial-prompt "Acme, Zorbix" --no-vad-filter
  whisperforge batch manifest.parquet --output out.parquet --model base --language de
  whisperforge batch voices.jsonl --output out.jsonl --model base  # rows name their language
  whisperforge batch 'data/**/*.flac' --output out.jsonl --ray-address auto
"""


def add_batch_parser(commands: Any) -> None:
    """`whisperforge batch`, for cli.py."""
    from .cli import (
        _add_model_options,
        _positive_float,
        _positive_int,
        add_decoding_options,
        short_usage,
    )

    b = commands.add_parser(
        "batch",
        help="transcribe a corpus into one JSONL/Parquet file, resumable; on Ray if asked",
        usage=short_usage("INPUT [INPUT ...] --output OUT"),
        description="Transcribe many files with the batched pipeline (VAD-cut windows of many "
        "files share batches), in this process or over a Ray cluster's GPUs.",
        epilog=BATCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("input", metavar="INPUT", nargs="+",
                   help="folder, glob, list of paths or manifest; or audio files (as a shell "
                   "expands a glob left unquoted)")  # fmt: skip
    b.add_argument("--output", required=True, metavar="OUT", help=".jsonl or .parquet")
    b.add_argument("--retry-errors", action="store_true",
                   help="transcribe again the files whose rows in OUT hold an error")  # fmt: skip
    b.add_argument("--progress", action="store_true",
                   help="show the progress line even when stderr is not a terminal")  # fmt: skip
    decode = add_decoding_options(b, batched=True)
    decode.add_argument("--batch-size", metavar="N", type=_positive_int, default=None,
                        help="windows per batch (default: as many as fit the GPU's free "
                        "memory, up to 128; 8 on the CPU)")  # fmt: skip
    ray = b.add_argument_group(f"Ray (needs: {RAY_INSTALL_HINT})")
    ray.add_argument("--local", action="store_true",
                     help="run in this process (the default without --ray-address)")  # fmt: skip
    ray.add_argument("--ray-address", metavar="ADDRESS", default=None,
                     help="auto (a running cluster), ray://HOST:PORT, or local (start Ray "
                     "here)")  # fmt: skip
    ray.add_argument("--num-gpus-per-actor", metavar="N", type=_positive_float, default=1.0,
                     help="GPUs per model actor; 0.5 puts two on a GPU (default: 1)")  # fmt: skip
    ray.add_argument("--actors", metavar="N", type=_positive_int, default=1,
                     help="model actors on a cluster without GPUs (default: 1)")  # fmt: skip
    ray.add_argument("--files-per-task", metavar="N", type=_positive_int, default=16,
                     help="files an actor transcribes per call (default: %(default)s)")  # fmt: skip
    _add_model_options(b)
    b.set_defaults(run=run_batch)


def _kept(output: str, written: list[str], rerun: str = "the same command") -> str:
    """What a stopped job leaves: the rows of the files it did, where, and how to go on."""
    return (
        f"{len(written)} file(s) done in this run are kept in {Journal.kept_in(output)}; "
        f"rerun {rerun} to transcribe the rest"
    )


def run_batch(args: Any) -> int:
    # --fp16 False and the decoding options, as `transcribe` reads them
    from .cli import (
        _compute_type,
        _error,
        sequential_only,
        transcription_arguments,
        vad_arguments,
    )

    if args.local and args.ray_address:
        raise WhisperforgeError("--local and --ray-address contradict each other; drop one")
    inputs = args.input[0] if len(args.input) == 1 else args.input
    # `batch recordings/*.wav`, `batch shards/*.parquet`: the files of a glob the shell expanded
    if len(args.input) > 1:
        kind = _is_manifest if _is_manifest(Path(args.input[0])) else _is_audio
        other = next((p for p in args.input if not kind(Path(p))), None)
        if other is not None:
            raise WhisperforgeError(
                f"INPUT {other}: of several INPUTs all are audio files, or all manifests (as a "
                "shell expands a glob), and this is not one; pass one folder, glob in quotes, "
                "list or manifest"
            )
    # Options the batched pipeline cannot honour: refused, not ignored.
    if args.clip_timestamps != "0":
        raise InvalidOptionError(
            "--clip-timestamps: not available in `batch` (clip timestamps are one file's); drop "
            "it, or use `whisperforge transcribe`"
        )
    unbatched = sequential_only(args)
    if unbatched:
        raise InvalidOptionError(
            f"{', '.join(unbatched)}: not available in `batch`, whose batched pipeline decodes "
            "each file's windows independently; drop it, or use `whisperforge transcribe`"
        )
    # (Translated word times are warned of per file, in transcribe_corpus: a manifest row may
    # translate where the job does not.)
    options = transcription_arguments(args, batched=True) | vad_arguments(args, batched=True)
    written: list[str] = []
    try:
        summary = transcribe_corpus(
            inputs, args.output, args.model, device=args.device,
            compute_type=_compute_type(args), threads=args.threads,
            download_root=args.model_dir, batch_size=args.batch_size,
            retry_errors=args.retry_errors, ray_address=args.ray_address, actors=args.actors,
            num_gpus_per_actor=args.num_gpus_per_actor, files_per_task=args.files_per_task,
            progress=args.progress or sys.stderr.isatty(), language=args.language,
            task=args.task, on_row=lambda row: written.append(row["path"]), **options,
        )  # fmt: skip
    except KeyboardInterrupt:
        # Ctrl-C on a long job: say that its rows are kept (a .parquet OUT's only in its
        # journal until the merge), not an exit without a word.
        print(f"\ninterrupted: {_kept(args.output, written)}", file=sys.stderr)
        return 130
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        # One window that does not fit even alone (batches that do not fit are halved): every
        # file would fail the same way, so the job stops, saying what to lower.
        kept = _kept(args.output, written, "with less asked of the GPU")
        _error(f"{GPU_OUT_OF_MEMORY}; {kept}")
        return 1
    print(f"{args.output}: {summary.line()}", file=sys.stderr)
    failed = summary.failed + summary.skipped_failed
    if failed:
        print(
            f"{failed} file(s) failed: their rows in {args.output} hold the error; "
            "rerun with --retry-errors to try them again",
            file=sys.stderr,
        )
        return 1  # OUT lacks their text, whichever run failed them
    return 0
