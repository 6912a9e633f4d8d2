"""``evsched rebuild``: fold the whole log into fresh indexes; with --verify, compare digests."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.log_cut import Cut, CutError, parse_cut, resolve_cut
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.adapters.proofs import KEY_ENV as NODE_KEY_ENV
from evsched.adapters.proofs import KEY_FILE_ENV as NODE_KEY_FILE_ENV
from evsched.adapters.proofs import NodeKeyring, node_keyring_from_env
from evsched.core.fold import FOLD_VERSION
from evsched.operator import rebuild_dirs
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.live_index import live_state, requires_proofs
from evsched.operator.rebuild import (
    BATCH_RECORDS,
    PartitionPlan,
    PartitionResult,
    cpu_rate,
    fold_rate,
    rebuild_all,
)
from evsched.operator.render import emit_json, err, out
from evsched.operator.session import Json, guarded, progress_bar
from evsched.settings import Settings

DEFAULT_REBUILD_DIR = Path("./evsched-data/rebuild")
# How far (in records) a live index may trail the log end and still be compared: a running node
# is always a little behind, and transaction markers take offsets too.
DEFAULT_MAX_BEHIND = 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A partition to rebuild: up to ``until``, and the live index's state there, if compared."""

    partition: int
    until: int
    log_end: int
    live: tuple[int, str] | None = None
    live_version: int | None = None


def _check_dirs(data_dir: Path, live_dir: Path | None, verify: bool, replace: bool) -> None:
    if verify and live_dir is None:
        raise typer.BadParameter(
            "--verify compares with a node's index: add --live-dir", param_hint="--verify"
        )
    if live_dir is not None and not live_dir.is_dir():
        raise typer.BadParameter(f"{live_dir} is not a directory", param_hint="--live-dir")
    if live_dir is not None and live_dir.resolve() == data_dir.resolve():
        raise typer.BadParameter(
            "the rebuild must not go into the live index", param_hint="--data-dir"
        )
    if data_dir.exists() and any(data_dir.iterdir()) and not replace:
        raise typer.BadParameter(
            f"{data_dir} is not empty (add --replace to delete it first)", param_hint="--data-dir"
        )
    if replace:
        try:
            rebuild_dirs.check_replaceable(data_dir)
        except rebuild_dirs.NotOurs as exc:
            raise typer.BadParameter(f"refusing to delete: {exc}", param_hint="--replace") from None


async def _log_ends(settings: Settings) -> dict[int, int]:
    """The end offset of every events partition, read_committed."""
    topic = Topics(settings.namespace).events
    count = await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
    partitions = range(count)
    async with KafkaPartitionLog(
        settings, topic, partitions, client_id="evsched-rebuild-plan"
    ) as log:
        return await log.end_offsets(partitions)


async def _cut_offsets(settings: Settings, cut: Cut, partitions: int) -> dict[int, int]:
    """Each partition's last offset as of ``cut``; a usage error saying why there is none."""
    topic = Topics(settings.namespace).events
    async with KafkaPartitionLog(
        settings, topic, range(partitions), client_id="evsched-rebuild-plan"
    ) as log:
        try:
            return await resolve_cut(log, range(partitions), cut, now_ms=now_ms())
        except CutError as exc:
            raise OperatorError(ExitCode.USAGE, f"--until: {exc}") from None


def _cut(until: str | None, verify: bool) -> Cut | None:
    if until is None:
        return None
    if verify:
        raise typer.BadParameter(
            "--verify rebuilds to the live index's offsets: leave out --until",
            param_hint="--until",
        )
    try:
        return parse_cut(until)
    except CutError as exc:
        raise typer.BadParameter(str(exc), param_hint="--until") from None


def _check_keys(live_dir: Path, partitions: list[int]) -> None:
    """A live index that requires proofs is compared only with a rebuild that checks them."""
    if node_keyring_from_env() is not None:
        return
    needing = [p for p in partitions if requires_proofs(live_dir, p)]
    if needing:
        raise OperatorError(
            ExitCode.USAGE,
            f"the live index of partition {needing[0]} requires proofs of role: set "
            f"{NODE_KEY_FILE_ENV} or {NODE_KEY_ENV} to the nodes' keys (docs/security.md) so the "
            "rebuild judges them as the node did",
        )


def _targets(
    ends: dict[int, int], live_dir: Path | None, cut: dict[int, int] | None = None
) -> list[Target]:
    """Rebuild to the live applied offset where a live index is compared, else to the cut's
    offset, else to the log end."""
    targets = []
    for partition, end in sorted(ends.items()):
        found = live_state(live_dir, partition) if live_dir is not None else None
        live = None if found is None else found[:2]
        until = live[0] if live is not None else end - 1 if cut is None else cut[partition]
        targets.append(
            Target(
                partition=partition,
                until=until,
                log_end=end,
                live=live,
                live_version=None if found is None else found[2],
            )
        )
    return targets


def rebuild(
    *,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where the fresh indexes go (p0000, p0001, ...).")
    ] = DEFAULT_REBUILD_DIR,
    verify: Annotated[
        bool, typer.Option("--verify", help="Compare each digest with the live index's.")
    ] = False,
    live_dir: Annotated[
        Path | None, typer.Option("--live-dir", help="A node's --data-dir (opened read-only).")
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Delete --data-dir first; only a directory an earlier rebuild made, "
            "with no index open in another process.",
        ),
    ] = False,
    max_behind: Annotated[
        int,
        typer.Option(
            "--max-behind",
            min=0,
            help="--verify fails for a live index more records than this behind the log end.",
        ),
    ] = DEFAULT_MAX_BEHIND,
    processes: Annotated[
        int, typer.Option("--processes", min=1, help="Partitions rebuilt at once.")
    ] = os.cpu_count() or 1,
    batch_records: Annotated[
        int, typer.Option("--batch-records", min=1, help="Records per index write.")
    ] = BATCH_RECORDS,
    archive: Annotated[
        Path | None,
        typer.Option(
            "--archive",
            help="Fold each partition's archive (evsched archive --to) first, then the log "
            "after it: for a log that retention trimmed.",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="Fold only up to this point: a time (2026-12-07T14:02:00Z: every record "
            "appended then or before), P:OFFSET,... (each partition's last offset) or OFFSET "
            "(every partition's).",
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Fold the log (or, with --until, its start up to a point) into fresh indexes, one per
    partition; --verify compares digests.

    Ends with ``digest_match=<true|false> events_per_s=<N>``. --verify exits 1 on a digest
    mismatch, and when it compared nothing for a partition whose live index exists but is at
    offset -1 or more than --max-behind records behind the log end; each such partition is named.
    """
    _check_dirs(data_dir, live_dir, verify, replace)
    cut = _cut(until, verify)

    def main() -> ExitCode:
        settings = Settings.from_env()
        keyring = node_keyring_from_env()  # once, for every partition's fold
        # Outside any event loop: a rebuild in this process runs one of its own per partition.
        ends = asyncio.run(_log_ends(settings))
        untils = None if cut is None else asyncio.run(_cut_offsets(settings, cut, len(ends)))
        targets = _targets(ends, live_dir if verify else None, untils)
        if verify and live_dir is not None:
            _check_keys(live_dir, list(ends))
        if replace:
            rebuild_dirs.replace(data_dir)
        rebuild_dirs.mark(data_dir)
        plans = [
            _plan(settings, t, data_dir, batch_records, archive, keyring=keyring) for t in targets
        ]
        started = time.perf_counter()
        results = _run_plans(plans, processes, quiet=as_json)
        seconds = time.perf_counter() - started
        behind = max_behind if verify else None
        return _report(targets, results, seconds, behind, as_json, as_of=cut)

    guarded(main)


def _plan(
    settings: Settings,
    target: Target,
    data_dir: Path,
    batch_records: int,
    archive: Path | None,
    *,
    keyring: NodeKeyring | None,
) -> PartitionPlan:
    return PartitionPlan(
        archive=archive,
        keyring=keyring,
        bootstrap=settings.bootstrap,
        namespace=settings.namespace,
        partition=target.partition,
        until=target.until,
        directory=data_dir / f"p{target.partition:04d}",
        batch_records=batch_records,
    )


def _run_plans(
    plans: Sequence[PartitionPlan], processes: int, *, quiet: bool
) -> list[PartitionResult]:
    bar = progress_bar("rebuilding")
    tasks = {p.partition: bar.add_task(f"p{p.partition}", total=p.until + 1) for p in plans}

    def progress(counts: dict[int, int]) -> None:
        for partition, done in counts.items():
            if partition in tasks:
                bar.update(tasks[partition], completed=done)

    if not quiet:
        bar.start()
    try:
        return rebuild_all(plans, processes=processes, on_progress=progress)
    finally:
        bar.stop()


def _report(
    targets: list[Target],
    results: list[PartitionResult],
    seconds: float,
    max_behind: int | None,
    as_json: bool,
    *,
    as_of: Cut | None = None,
) -> ExitCode:
    """Print the outcome; with ``max_behind`` (--verify), whether every comparison held."""
    verify = max_behind is not None
    by_partition = {t.partition: t for t in targets}
    problems = {
        r.partition: problem
        for r in results
        if (verify or r.refused is not None)
        and (problem := _problem(r, by_partition[r.partition], max_behind)) is not None
    }
    compared = [r for r in results if by_partition[r.partition].live is not None]
    matched = verify and bool(compared) and not problems
    rate = fold_rate(results)
    if as_json:
        document = _document(by_partition, results, seconds, problems, matched if verify else None)
        emit_json({**document, "until": None if as_of is None else str(as_of)})
    else:
        out.print(_table(by_partition, results, verify))
        if as_of is not None:
            cut = ",".join(f"{t.partition}:{t.until}" for t in targets)
            out.print(f"as of {as_of}: offsets up to {cut} folded")
        for partition, problem in sorted(problems.items()):
            err.print(f"[red]partition {partition}:[/red] {problem}")
        if verify and not compared:
            err.print("[red]no partition compared:[/red] --live-dir holds no partition index")
        for r in results:
            if r.source != "log" and r.refused is None:
                out.print(
                    f"partition {r.partition}: the log is trimmed; rebuilt from the changelog's "
                    f"snapshot at offset {r.snapshot_offset} plus the log after it"
                )
        if verify:
            out.print(f"digest_match={'true' if matched else 'false'} events_per_s={rate}")
        else:
            out.print(f"events={sum(r.events for r in results)} events_per_s={rate}")
    failed = (verify and not matched) or any(r.refused is not None for r in results)
    return ExitCode.FAILED if failed else ExitCode.OK


def _problem(result: PartitionResult, target: Target, max_behind: int | None) -> str | None:
    """Why this partition's comparison does not hold, or None when it does (or has no live)."""
    if result.refused is not None:
        return f"not rebuilt: {result.refused}"
    if target.live is None or max_behind is None:
        return None
    live_offset, live_digest = target.live
    last = target.log_end - 1
    if live_offset < 0 and last >= 0:
        return f"the live index is at offset -1 (log end {target.log_end}): nothing compared"
    behind = last - live_offset
    if behind > max_behind:
        return (
            f"the live index (offset {live_offset}) is {behind} records behind the log end "
            f"{target.log_end}, more than --max-behind {max_behind}"
        )
    if (result.applied_offset, result.digest) != (live_offset, live_digest):
        return (
            f"digests differ at offset {live_offset}: rebuilt {result.digest[:16]} "
            f"(offset {result.applied_offset}), live {live_digest[:16]}{_cause(result, target)}"
        )
    return None


def _cause(result: PartitionResult, target: Target) -> str:
    """What is known to make the two indexes differ, as a clause ('' when nothing is)."""
    causes = []
    if target.live_version not in (None, FOLD_VERSION):
        causes.append(
            f"the live index was written by fold version {target.live_version}, this rebuild "
            f"by {FOLD_VERSION}"
        )
    if result.source != "log":
        causes.append(
            f"the log is trimmed: this rebuild is the changelog's snapshot at offset "
            f"{result.snapshot_offset} plus the log after it"
        )
    return f" ({'; '.join(causes)})" if causes else ""


def _document(
    targets: dict[int, Target],
    results: list[PartitionResult],
    seconds: float,
    problems: dict[int, str],
    matched: bool | None,
) -> dict[str, Any]:
    return {
        "events": sum(r.events for r in results),
        "events_per_s": fold_rate(results),
        "events_per_cpu_s": cpu_rate(results),
        "wall_s": round(seconds, 3),
        "digest_match": matched,
        "partitions": [
            _partition_json(r, targets[r.partition], problems.get(r.partition)) for r in results
        ],
    }


def _partition_json(result: PartitionResult, target: Target, problem: str | None) -> dict[str, Any]:
    live = target.live
    return {
        "partition": result.partition,
        "events": result.events,
        "applied_offset": result.applied_offset,
        "digest": result.digest,
        "log_end": target.log_end,
        "until": target.until,
        "fold_s": round(result.fold_s, 3),
        "digest_s": round(result.digest_s, 3),
        "live_applied_offset": None if live is None else live[0],
        "live_digest": None if live is None else live[1],
        "compared": live is not None,
        "source": result.source,
        "snapshot_offset": result.snapshot_offset,
        "problem": problem,
    }


def _table(targets: dict[int, Target], results: list[PartitionResult], verify: bool) -> Table:
    table = Table(
        "p", "events", "log end", "applied offset", "digest", "live offset", "live", "match"
    )
    for r in results:
        target = targets[r.partition]
        live = target.live
        if not verify:
            match = ""
        elif live is None:
            match = "[dim]no live index[/dim]"
        else:
            same = (r.applied_offset, r.digest) == live
            match = "[green]yes[/green]" if same else "[red]no[/red]"
        table.add_row(
            str(r.partition),
            str(r.events),
            str(target.log_end),
            str(r.applied_offset),
            r.digest[:16],
            "" if live is None else str(live[0]),
            "" if live is None else live[1][:16],
            match,
        )
    return table
