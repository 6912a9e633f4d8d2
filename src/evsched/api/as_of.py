"""Reads as of a point of the log (``?as_of=``): indexes rebuilt to that point, built once, cached.

An ``as_of`` is resolved to each partition's last offset (``adapters.kafka.log_cut``: a time maps
to each partition's last record appended at or before it). The indexes folded to exactly those
offsets are built by ``evsched rebuild --until P:OFFSET,...`` in a process of its own (the fold
is CPU-bound; the API's event loop goes on serving), into a directory under the cache root, and
kept for the next request resolving to the same offsets. The cache is bounded in entries and
bytes; the least recently read entry is evicted (closed, deleted). One build runs at a time;
at most ``max_pending`` wait their turn, more are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from evsched.adapters.clock import now_ms
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.log_cut import CutError, parse_cut, resolve_cut
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import Topics
from evsched.core.state import Status
from evsched.errors import EvschedError
from evsched.settings import Settings

log = structlog.get_logger("evsched.api")

# Each partition's last offset folded (inclusive; -1: none), in partition order.
Until = tuple[tuple[int, int], ...]


class BuildBusy(EvschedError):
    """Too many as-of indexes are being built or waiting: retry later."""


class BuildFailed(EvschedError):
    """The rebuild could not make the index (a trimmed log without a usable snapshot, ...)."""


@dataclass(slots=True, kw_only=True)
class PastIndexes:
    """The indexes of every partition folded up to ``until``: read-only once built."""

    until: Until
    indexes: dict[int, PartitionIndex]
    directory: Path | None = None
    size_bytes: int = 0
    _counts: dict[str, dict[Status, int]] | None = field(default=None, repr=False)

    def by_queue(self) -> dict[str, dict[Status, int]]:
        """Jobs by queue and status, counted once (the indexes never change)."""
        if self._counts is None:
            counts: dict[str, dict[Status, int]] = {}
            for index in self.indexes.values():
                for state in index.jobs():
                    statuses = counts.setdefault(state.queue, dict.fromkeys(Status, 0))
                    statuses[state.status] += 1
            self._counts = dict(sorted(counts.items()))
        return self._counts

    def close(self) -> None:
        for index in self.indexes.values():
            index.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


class PastSource(Protocol):
    """Where ``as_of`` reads come from (a twin in the unit tests folds a MemoryLog)."""

    async def resolve(self, text: str, partitions: int) -> Until:
        """The offsets ``text`` names; CutError when it names none that can be folded to."""
        ...

    async def indexes(self, until: Until, wait_s: float) -> PastIndexes | None:
        """The indexes folded to ``until``, or None when they are not built within ``wait_s``
        (the build goes on); BuildBusy, BuildFailed."""
        ...

    async def close(self) -> None: ...


class RebuiltIndexes:
    """``PastSource`` over the events topic: rebuilt by ``evsched rebuild`` in a child process."""

    def __init__(
        self,
        settings: Settings,
        *,
        root: Path | None = None,
        max_entries: int = 4,
        max_bytes: int = 2 << 30,
        max_pending: int = 4,
        processes: int = 1,
    ) -> None:
        self.settings = settings
        self._root = root
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self.processes = processes
        self._cache: OrderedDict[Until, PastIndexes] = OrderedDict()
        self._building: dict[Until, asyncio.Task[PastIndexes]] = {}
        self._turn = asyncio.Lock()
        self._made = 0

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="evsched-as-of-"))
        return self._root

    async def resolve(self, text: str, partitions: int) -> Until:
        cut = parse_cut(text)
        topic = Topics(self.settings.namespace).events
        async with KafkaPartitionLog(
            self.settings, topic, range(partitions), client_id="evsched-api-as-of"
        ) as reader:
            until = await resolve_cut(reader, range(partitions), cut, now_ms=now_ms())
        return tuple(sorted(until.items()))

    async def indexes(self, until: Until, wait_s: float) -> PastIndexes | None:
        found = self._cache.get(until)
        if found is not None:
            self._cache.move_to_end(until)
            return found
        task = self._building.get(until)
        if task is None:
            if len(self._building) >= self.max_pending:
                raise BuildBusy(
                    f"{len(self._building)} as-of indexes are being built or waiting: "
                    "retry later, or ask for one of those"
                )
            task = asyncio.create_task(self._build(until), name="evsched-as-of-build")
            self._building[until] = task
            task.add_done_callback(lambda _: self._building.pop(until, None))
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(task), wait_s)
        return None

    async def _build(self, until: Until) -> PastIndexes:
        async with self._turn:
            self._made += 1
            directory = self.root / f"as-of-{self._made:06d}"
            started = now_ms()
            document = await self._rebuild(until, directory)
            built = PastIndexes(
                until=until,
                indexes={p: PartitionIndex(directory / f"p{p:04d}", p) for p, _ in until},
                directory=directory,
                size_bytes=await asyncio.to_thread(_size, directory),
            )
            log.info(
                "as_of_built",
                until=",".join(f"{p}:{o}" for p, o in until),
                events=document.get("events"),
                ms=now_ms() - started,
                bytes=built.size_bytes,
            )
            self._keep(built)
            return built

    async def _rebuild(self, until: Until, directory: Path) -> dict[str, object]:
        spec = ",".join(f"{p}:{o}" for p, o in until)
        env = {
            **os.environ,
            "EVSCHED_KAFKA_BOOTSTRAP": self.settings.bootstrap,
            "EVSCHED_NAMESPACE": self.settings.namespace,
        }
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "evsched", "rebuild", "--until", spec, "--json"),
            *("--data-dir", str(directory), "--processes", str(self.processes)),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await process.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return _outcome(process.returncode, stdout, stderr, directory)

    def _keep(self, built: PastIndexes) -> None:
        """Cache ``built``; evict the least recently read entries past the bounds."""
        self._cache[built.until] = built
        while len(self._cache) > 1 and (
            len(self._cache) > self.max_entries
            or sum(e.size_bytes for e in self._cache.values()) > self.max_bytes
        ):
            _, evicted = self._cache.popitem(last=False)
            evicted.close()
            log.info("as_of_evicted", until=",".join(f"{p}:{o}" for p, o in evicted.until))

    async def close(self) -> None:
        for task in list(self._building.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, EvschedError):
                await task
        while self._cache:
            self._cache.popitem()[1].close()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def _outcome(code: int | None, stdout: bytes, stderr: bytes, directory: Path) -> dict[str, object]:
    """The rebuild's JSON document; BuildFailed with its reason when it made no index."""
    try:
        document = json.loads(stdout) if stdout.strip() else {}
    except ValueError:
        document = {}
    if code == 0 and isinstance(document, dict):
        return document
    shutil.rmtree(directory, ignore_errors=True)
    problems = [
        f"partition {p['partition']}: {p['problem']}"
        for p in (document.get("partitions") or [] if isinstance(document, dict) else [])
        if isinstance(p, dict) and p.get("problem")
    ]
    reason = "; ".join(problems) or stderr.decode(errors="replace").strip()[-500:]
    raise BuildFailed(f"the as-of index could not be built: {reason or f'exit code {code}'}")


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def resolved(until: Until) -> Mapping[str, int]:
    """``until`` as a JSON object: partition (as text) to the last offset folded."""
    return {str(p): o for p, o in until}


__all__ = ["BuildBusy", "BuildFailed", "CutError", "PastIndexes", "PastSource", "RebuiltIndexes"]
