"""The model worker: one thread that owns a `WhisperModel` and runs many transcriptions.

The server's requests, and `WhisperModel(num_workers=N)`'s `transcribe` calls from many
threads, become `Job`s on an `Engine`'s queue. The worker admits queued jobs into a `Backend`
whenever it has room and calls `Backend.step()` while any job is active:

    admit(job)  a job joins the running set (for continuous batching: at the next step)
    step()      advance every active job; finish the jobs that are done (set their futures)

`SequentialBackend` (`WhisperModel.transcribe`, `serve --batch-size 1`) runs one whole job per
step, so jobs are served one after another in arrival order: a request behind a 2-hour upload
waits for all of it.

`BatchedBackend` (the server's default: 16 windows on CUDA, 4 on the CPU; `serve --batch-size N`
with N > 1, and `WhisperModel(num_workers=N)`) is continuous batching at window granularity. Each active job
is its own long-form loop (`WhisperModel.long_form`: 30 s windows, seek to the last complete
segment, temperature fallback per window, the no-speech skip, conditioning on its previous
text), paused at the window it needs decoded. A step takes that window from every active job
(up to N), groups the windows that decode alike (language, task, beams, temperatures), and
decodes each group as one batch (`BatchedInferencePipeline.decode_requests`): one encoder pass
for all its mels, then one batched decode, every row after its own job's prompt, whose every
step reads the decoder's weights once for all requests (on CUDA the GPU runtime's batched
step), with the windows that fail the thresholds decoded again together one temperature up.
Each job then cuts its window into segments, advances its seek and, when its audio is done,
gets its answer: the same answer as `transcribe` alone. Jobs that arrive during a step join
at the next one. Joining in the middle of a window's decode, rather than between windows, would
need a prefill of the newcomer's prompt into free rows of the running runtime batch.
"""

from __future__ import annotations

import atexit
import math
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .audio import AudioInput
from .batched import BatchedInferencePipeline, decode_key
from .errors import InvalidOptionError
from .results import Segment, TranscriptionInfo
from .transcribe import locked

if TYPE_CHECKING:
    from .transcribe import (
        LongForm,
        PreparedAudio,
        TranscriptionOptions,
        WhisperModel,
        WindowRequest,
        WindowResult,
    )
    from .vad import VadOptions

GPU_BATCH_SIZE = 16  # windows decoded together on CUDA unless --batch-size says otherwise
# On the CPU too the requests in progress take turns a window at a time, so a short one is not
# held up behind a long one, and their windows decode together (8 clips at once: 19 s against
# 30 s one at a time, on the 2-core dev machine, beam 5; the same texts).
CPU_BATCH_SIZE = 4
IDLE_S = 30.0  # `ConcurrentTranscriber`'s worker thread ends after this long without work


@dataclass
class Job:
    """One transcription: audio, `WhisperModel.transcribe_with`'s arguments, and where results
    go. on_start is called (in the worker thread) with the `TranscriptionInfo` once the job runs,
    on_segment with each segment as it is final (for SSE, and lazy segments). The future gets
    (segments, info), or the exception that stopped the job.
    """

    # Prepared (`WhisperModel.prepare`: read, VAD, mel) in the caller's thread, or samples
    # decoded as they are (a stream's buffer).
    audio: np.ndarray | PreparedAudio
    options: TranscriptionOptions
    language: str | None = None
    task: str = "transcribe"
    on_segment: Callable[[Segment], None] | None = None
    on_start: Callable[[TranscriptionInfo], None] | None = None
    deadline: float = math.inf  # time.monotonic() after which nobody waits for the result
    future: Future = field(default_factory=Future)

    def abandon(self) -> None:
        """Nobody waits for the result any more (a client left, a request timed out): a queued
        job is dropped, a running one stops at its next window."""
        self.deadline = -math.inf
        if self.future.cancel():  # not started: its audio is let go now, not when the worker
            self.audio = np.empty(0, np.float32)  # (busy with a long job) drops it from the queue

    @property
    def abandoned(self) -> bool:
        return time.monotonic() > self.deadline


class Backend(Protocol):
    """The seam between the worker loop and the model (see the module docstring)."""

    capacity: int  # jobs that can be active at once

    def admit(self, job: Job) -> None: ...

    def step(self) -> None: ...

    @property
    def active(self) -> int: ...

    def stats(self) -> dict[str, Any]: ...

    def fail_step(self, error: BaseException) -> None:
        """`step` raised `error` (a bug): fail the jobs it was running."""


class SequentialBackend:
    """WhisperModel.transcribe, one job per step: correct everywhere, batched nowhere."""

    capacity = 1

    def __init__(self, model: WhisperModel):
        self.model = model
        self._jobs: deque[Job] = deque()

    @property
    def active(self) -> int:
        return len(self._jobs)

    def admit(self, job: Job) -> None:
        self._jobs.append(job)

    def stats(self) -> dict[str, Any]:
        return {"batched": False, "batch_size": 1}

    def fail_step(self, error: BaseException) -> None:
        pass  # `step` hands any error of its job to that job

    def step(self) -> None:
        # The job stays in `_jobs` while it runs: it is active (/health) until it is done, where
        # a running job was counted nowhere and a busy server looked idle.
        try:
            self._run(self._jobs[0])
        finally:
            self._jobs.popleft()

    def _run(self, job: Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return  # the client gave up while the job waited
        try:
            steps, info = self.model.long_form(job.audio, job.language, job.task, job.options)
            if job.on_start is not None:
                job.on_start(info)
            segments = []
            windows = self.model.decode_sequentially(_until_abandoned(steps, job))
            for segment in locked(windows, self.model.lock):
                segments.append(segment)
                if job.on_segment is not None:
                    job.on_segment(segment)
                if job.abandoned:  # nobody reads the rest of this window's segments either
                    windows.close()
                    raise TimeoutError("nobody waits for this transcription any more")
            job.future.set_result((segments, info))
        except BaseException as error:  # noqa: BLE001 -- handed to the waiting request
            job.future.set_exception(error)


def _until_abandoned(steps: LongForm, job: Job) -> LongForm:
    """A job's long-form loop, stopped at the next window it asks for once nobody waits for the
    job. Checked at each window, not each segment: a window of silence or music gives no segment,
    and a job left during such windows ran on through them, the worker deaf to everyone else."""
    sent: WindowResult | None = None
    try:
        while True:
            try:
                item = steps.send(sent)
            except StopIteration:
                return
            if job.abandoned and not isinstance(item, Segment):
                raise TimeoutError("nobody waits for this transcription any more")
            sent = yield item
    finally:
        steps.close()


@dataclass
class _Running:
    """A job in the batched backend: its long-form loop, paused at the window it waits for."""

    job: Job
    steps: LongForm
    info: TranscriptionInfo
    segments: list[Segment] = field(default_factory=list)
    request: WindowRequest | None = None


class BatchedBackend:
    """Continuous batching over the windows of all active jobs (see the module docstring)."""

    def __init__(self, model: WhisperModel, batch_size: int = GPU_BATCH_SIZE):
        self.model = model
        self.capacity = batch_size  # one window per active job: jobs = windows per step
        self._pipeline = BatchedInferencePipeline(model)  # its batched temperature fallback
        self._jobs: list[_Running] = []
        self.last_batch_windows = 0  # the largest batch of the last step
        self.max_batch_windows = 0
        self.windows = 0  # decoded since the start, in `batches` batches
        self.batches = 0

    @property
    def active(self) -> int:
        return len(self._jobs)

    def stats(self) -> dict[str, Any]:
        return {"batched": True, "batch_size": self.capacity,
                "last_batch_windows": self.last_batch_windows,
                "max_batch_windows": self.max_batch_windows,
                "windows": self.windows, "batches": self.batches}  # fmt: skip

    def admit(self, job: Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return  # the client gave up while the job waited
        try:
            with self.model.lock:  # language detection runs the model
                steps, info = self.model.long_form(job.audio, job.language, job.task, job.options)
        except BaseException as error:  # noqa: BLE001 -- handed to the waiting request
            job.future.set_exception(error)
            return
        if job.on_start is not None:
            job.on_start(info)
        running = _Running(job, steps, info)
        if self._advance(running, None):
            self._jobs.append(running)

    def fail_step(self, error: BaseException) -> None:
        for running in self._jobs:  # a step runs every active job
            running.steps.close()
            if not running.job.future.done():
                running.job.future.set_exception(error)
        self._jobs = []

    def step(self) -> None:
        with self.model.lock:  # no other thread's use of the model between the jobs' windows
            self._step()

    def _step(self) -> None:
        groups: dict[tuple, list[_Running]] = {}
        for running in self._jobs:
            if running.job.abandoned:  # nobody waits for it: spend no more
                running.steps.close()
                running.job.future.set_exception(TimeoutError("the request timed out"))
                continue
            assert running.request is not None
            groups.setdefault(decode_key(running.request), []).append(running)
        still: list[_Running] = []
        for group in groups.values():
            try:
                results = self._pipeline.decode_requests([running.request for running in group])
            except BaseException as error:  # noqa: BLE001 -- fails this batch's jobs, not the server
                for running in group:
                    running.steps.close()
                    running.job.future.set_exception(error)
                continue
            still += [running for running, r in zip(group, results) if self._advance(running, r)]
        self._jobs = still
        sizes = [len(group) for group in groups.values()]
        self.last_batch_windows = max(sizes, default=0)
        self.max_batch_windows = max(self.max_batch_windows, self.last_batch_windows)
        self.windows += sum(sizes)
        self.batches += len(sizes)

    def _advance(self, running: _Running, sent: WindowResult | None) -> bool:
        """Run a job's loop to the next window it needs; False once the job is finished."""
        job = running.job
        try:
            item = running.steps.send(sent)
            while isinstance(item, Segment):
                running.segments.append(item)
                if job.on_segment is not None:
                    job.on_segment(item)
                item = running.steps.send(None)
        except StopIteration:
            job.future.set_result((running.segments, running.info))
            return False
        except BaseException as error:  # noqa: BLE001 -- handed to the waiting request
            job.future.set_exception(error)
            return False
        running.request = item
        return True


def make_backend(model: WhisperModel, batch_size: int | None = None) -> Backend:
    """Batched (GPU_BATCH_SIZE windows on CUDA, CPU_BATCH_SIZE on the CPU, or `batch_size`),
    sequential with batch_size 1."""
    if batch_size is None:
        batch_size = GPU_BATCH_SIZE if model.device.type == "cuda" else CPU_BATCH_SIZE
    if batch_size < 1:
        raise InvalidOptionError(f"batch_size must be at least 1, got {batch_size}")
    return BatchedBackend(model, batch_size) if batch_size > 1 else SequentialBackend(model)


class QueueFull(Exception):
    pass


class Engine:
    """The worker thread that owns the model; `submit` is safe from any thread. With `idle_s`,
    the thread starts with the first job and ends after that long without one (the next
    `submit` starts another), so nothing holds the model while it is not used. `completed`
    counts the jobs finished (answered, failed or dropped)."""

    def __init__(self, backend: Backend, max_queue: int = 256, idle_s: float | None = None):
        self.backend = backend
        self.max_queue = max_queue
        self.idle_s = idle_s
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="whisperforge-engine", daemon=True)
        self._lock = threading.Lock()  # a job is never queued as the thread decides to end
        self._stopping = False
        self.completed = 0
        self._count_lock = threading.Lock()
        _ENGINES.add(self)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the worker after the step it is in; the jobs it was running fail."""
        self._stopping = True
        self._queue.put(None)  # wakes an idle worker
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> Future:
        with self._lock:
            if self._queue.qsize() >= self.max_queue:
                raise QueueFull
            self._queue.put(job)
            job.future.add_done_callback(self._count)
            if self.idle_s is not None and not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="whisperforge-engine", daemon=True
                )
                self._thread.start()
        return job.future

    def _count(self, _: Future) -> None:
        with self._count_lock:
            self.completed += 1

    def _run(self) -> None:
        backend = self.backend
        while not self._stopping:
            # Block only when idle; while jobs run, newcomers join between steps.
            while backend.active < backend.capacity:
                idle = backend.active == 0
                try:
                    job = self._queue.get(block=idle, timeout=self.idle_s if idle else None)
                except queue.Empty:
                    if not idle:
                        break
                    with self._lock:  # idle_s without work: end, unless a job just came
                        if self._queue.empty():
                            return
                    continue
                if job is None:  # `stop`
                    break
                if job.abandoned:
                    job.future.cancel()  # its request already timed out
                    continue
                backend.admit(job)
            if backend.active and not self._stopping:
                try:
                    backend.step()
                except Exception as error:  # noqa: BLE001 -- a bug fails its jobs, not the worker
                    backend.fail_step(error)
        backend.fail_step(RuntimeError("whisperforge's worker thread was stopped"))


# Every engine, so that their threads end before the interpreter does: a daemon thread that
# has run torch and still waits for work, or still decodes, at exit can abort the process as
# it finalizes ("terminate called without an active exception", half the runs with
# num_workers=2; every run with segments left unread). Each ends after the step it is in.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _stop_engines() -> None:
    for engine in list(_ENGINES):
        if engine.alive:
            engine.stop(timeout=60.0)


class ConcurrentTranscriber:
    """`WhisperModel(num_workers=N)`'s `transcribe` (and a model on several GPUs'): calls from
    up to N threads at once run as jobs of one worker thread per GPU, whose `BatchedBackend`
    decodes their windows together, where faster-whisper runs N decodes side by side (`_engine`
    picks the GPU). A call gets its info once its job starts (more calls wait their turn) and
    its segments as they are final; closing the segments early stops the job."""

    def __init__(self, models: list[WhisperModel], workers: int):
        self.engines = [
            Engine(BatchedBackend(model, workers), sys.maxsize, idle_s=IDLE_S) for model in models
        ]

    def transcribe(
        self,
        audio: AudioInput,
        options: TranscriptionOptions,
        language: str | None,
        task: str,
        vad_filter: bool,
        vad_parameters: VadOptions | dict | None,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        arrived: queue.SimpleQueue[Segment | None] = queue.SimpleQueue()
        started: Future[TranscriptionInfo] = Future()
        engine = self._engine()
        # Read, VAD and mel here, not on the worker the other calls' windows wait for.
        prepared = engine.backend.model.prepare(audio, options, vad_filter, vad_parameters)
        job = Job(
            prepared, options, language, task, on_segment=arrived.put, on_start=started.set_result
        )
        engine.submit(job)
        job.future.add_done_callback(lambda _: arrived.put(None))  # after its last segment
        try:
            while not wait([started, job.future], 1.0, FIRST_COMPLETED).done:
                _check_worker(engine, job)
            if not started.done():
                job.future.result()  # raises what stopped the job before it started
        except BaseException:
            job.abandon()  # interrupted while it waited (Ctrl-C): nobody will read it
            raise
        segments = JobSegments(_segments(engine, job, arrived), job)
        # Dropped unread (`info = model.transcribe(audio)[1]`), the generator never runs its
        # `finally`: the job stops when the segments are collected.
        weakref.finalize(segments, job.abandon)
        return segments, started.result()

    def _engine(self) -> Engine:
        """The first GPU's worker with room for another job, else the least busy: a second
        GPU's worker only takes what the first cannot batch (RESULTS, session 41: spread evenly
        over two GPUs, 16 calls of tiny.en or turbo ran slower than on one, each GPU batching
        half as many windows)."""
        load = [engine.backend.active + engine.queued for engine in self.engines]
        for engine, jobs in zip(self.engines, load):
            if jobs < engine.backend.capacity:
                return engine
        return self.engines[load.index(min(load))]


class JobSegments(Generator[Segment, None, None]):
    """A job's segments as the generator `transcribe` returns, whose `close()` stops the job
    even before the first segment: a plain generator not yet started runs no `finally`."""

    def __init__(self, segments: Generator[Segment, None, None], job: Job):
        self.segments, self.job = segments, job

    def send(self, value: None) -> Segment:
        return self.segments.send(value)

    def throw(self, *error: Any) -> Segment:
        return self.segments.throw(*error)

    def close(self) -> None:
        self.segments.close()
        self.job.abandon()


def _segments(
    engine: Engine, job: Job, arrived: queue.SimpleQueue
) -> Generator[Segment, None, None]:
    try:
        while True:
            try:
                segment = arrived.get(timeout=1.0)
            except queue.Empty:
                _check_worker(engine, job)
                continue
            if segment is None:
                break
            yield segment
        job.future.result()  # what stopped the job midway, if anything did
    finally:
        job.abandon()  # closed early: the worker drops the job at its next window


def _check_worker(engine: Engine, job: Job) -> None:
    """A job not done has a worker thread (it ends only with nothing queued or running); one
    that died of a bug would leave the caller waiting forever: say so instead."""
    if not job.future.done() and not engine.alive:
        raise RuntimeError("whisperforge's worker thread stopped; see the error it printed")
