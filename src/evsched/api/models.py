"""The HTTP shapes: request bodies checked at the edge, and views of jobs, timelines, schedules.

Times are RFC 3339 in UTC on the wire; the index keeps epoch milliseconds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StrictFloat,
    StrictInt,
    field_validator,
)

from evsched.adapters.payload import MAX_JSON_DEPTH, NotJson, decode_args, decode_json, deeper_than
from evsched.api.id_fields import JobIdField
from evsched.commands import MAX_AHEAD, MAX_KEY_CHARS, MAX_REASON_CHARS
from evsched.core.bounds import MAX_DURATION_MS, MAX_PARENTS
from evsched.core.events import RetryPolicy
from evsched.core.failures import category_of
from evsched.core.state import JobState, ScheduleState, Status, TimelineEntry, Verdict

INT64_MAX = 2**63 - 1
MAX_ATTEMPTS = 2**31 - 1
MAX_AHEAD_S = MAX_AHEAD.total_seconds()
_MIN_MS = int(datetime(1, 1, 2, tzinfo=UTC).timestamp() * 1000)
_MAX_MS = int(datetime(9999, 12, 30, tzinfo=UTC).timestamp() * 1000)


def _utf8(value: Any) -> Any:
    """Refuse strings that UTF-8 cannot carry (JSON's lone surrogates), anywhere in ``value``."""
    if isinstance(value, str):
        value.encode()
    elif isinstance(value, list):
        for item in value:
            _utf8(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _utf8(key)
            _utf8(item)
    return value


def _shallow(value: Any) -> Any:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH, before anything walks it recursively."""
    if deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _rfc3339_text(value: Any) -> Any:
    """Times come as RFC 3339 strings only (not the epoch numbers pydantic would also take)."""
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string, e.g. 2030-01-01T09:00:00Z")
    return value


def whole(value: Any) -> Any:
    """A JSON number without a fraction is an integer (JSON Schema's rule: 1.0 is one): as an
    int. Anything else goes on to the strict check (no 1.5, no true, no "1"). A field validator
    (mode="before"), so the document keeps the field's type and bounds as they are."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("names a parent twice")
    return values


Text = Annotated[str, AfterValidator(_utf8)]
Name = Annotated[Text, Field(min_length=1, max_length=MAX_KEY_CHARS)]
Queue = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="A declared queue (`GET /v1/queues`); another is a 422 `unknown_queue`.",
    ),
]
Reason = Annotated[Text, Field(max_length=2_000)]
# A control's reason (pause, resume, limits) is bounded by the events that carry it.
ControlReason = Annotated[Text, Field(max_length=MAX_REASON_CHARS)]
Args = Annotated[list[JsonValue], AfterValidator(_utf8), BeforeValidator(_shallow)]
Kwargs = Annotated[dict[str, JsonValue], AfterValidator(_utf8), BeforeValidator(_shallow)]
Labels = Annotated[dict[Annotated[str, Field(min_length=1)], str], AfterValidator(_utf8)]


# Strict: a JSON boolean or string is not a number here, whatever Python would make of it.
# int64 tells clients (and test generators) the width: past 2^53 a double cannot hold it.
Priority = Annotated[
    StrictInt, Field(ge=-INT64_MAX, le=INT64_MAX, json_schema_extra={"format": "int64"})
]
Attempts = Annotated[StrictInt, Field(ge=1, le=MAX_ATTEMPTS)]
Seconds = Annotated[StrictFloat, Field(gt=0, le=MAX_AHEAD_S)]
Delay = Annotated[StrictFloat, Field(ge=0, le=MAX_AHEAD_S)]
RunAt = Annotated[
    AwareDatetime,
    BeforeValidator(_rfc3339_text),
    Field(
        description="RFC 3339 with an offset, at most a year before and 10 years after the "
        "API's clock (else a 422 naming run_at).",
    ),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# In the OpenAPI document: delay_s and run_at are alternatives, so generated clients know it.
_NOT_BOTH_STARTS: dict[str, Any] = {"not": {"required": ["delay_s", "run_at"]}}
_ONE_START = ConfigDict(extra="forbid", json_schema_extra=_NOT_BOTH_STARTS)


def needs(field: str, kind: str, then: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema: when ``field`` is set (a ``kind``, not null), the body must match ``then``."""
    return {"if": {"required": [field], "properties": {field: {"type": kind}}}, "then": then}


# A waiting job's options make sense only with parents: the document says so, as the API does.
_WITH_PARENTS = {
    "required": ["after"],
    "properties": {"after": {"type": "array", "minItems": 1, "uniqueItems": True}},
}
_PERIOD = {"required": ["unique"], "properties": {"unique": {"const": "period"}}}
_ENQUEUE = ConfigDict(
    extra="forbid",
    json_schema_extra={
        **_NOT_BOTH_STARTS,
        "allOf": [
            needs("after_rule", "string", _WITH_PARENTS),
            needs("results_to_args", "string", _WITH_PARENTS),
            # unique "period" and its period go together.
            needs("unique_period_s", "number", _PERIOD),
            {
                "if": {"required": ["unique"], "properties": {"unique": {"const": "period"}}},
                "then": {
                    "required": ["unique_period_s"],
                    "properties": {
                        "unique_period_s": {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "maximum": MAX_AHEAD_S,
                        }
                    },
                },
            },
        ],
    },
)


_DEFAULT_RETRY = RetryPolicy()


class RetryRequest(_Request):
    """Exponential backoff between attempts; a field left out keeps evsched's default.
    ``initial_backoff_ms`` may not exceed ``max_backoff_ms`` (a 422 naming retry)."""

    initial_backoff_ms: Annotated[StrictInt, Field(ge=0, le=MAX_DURATION_MS)] = (
        _DEFAULT_RETRY.initial_backoff_ms
    )
    max_backoff_ms: Annotated[StrictInt, Field(ge=0, le=MAX_DURATION_MS)] = (
        _DEFAULT_RETRY.max_backoff_ms
    )
    multiplier: Annotated[StrictFloat, Field(ge=1.0, le=1000.0)] = _DEFAULT_RETRY.multiplier
    jitter: Annotated[StrictFloat, Field(ge=0.0, le=1.0)] = _DEFAULT_RETRY.jitter

    _whole = field_validator("initial_backoff_ms", "max_backoff_ms", mode="before")(whole)

    def policy(self) -> RetryPolicy:
        return RetryPolicy(**self.model_dump())


class EnqueueRequest(_Request):
    """A job of the task named ``task``; options left out take the task's or evsched's defaults."""

    model_config = _ENQUEUE

    _whole = field_validator("priority", "max_attempts", mode="before")(whole)

    task: Annotated[Name, Field(examples=["emails.send"])]
    args: Args = Field(default_factory=list, examples=[["buyer@example.com"]])
    kwargs: Kwargs = Field(default_factory=dict)
    queue: Queue | None = Field(None, description='Default: the task\'s queue, else "default".')
    delay_s: Delay | None = Field(None, description="Start no earlier than this many seconds.")
    run_at: RunAt | None = Field(None, description="RFC 3339 with an offset; not both.")
    priority: Priority | None = None
    max_attempts: Attempts | None = None
    timeout_s: Seconds | None = Field(None, description="Run-time limit of one attempt.")
    labels: Labels = Field(default_factory=dict)
    retry: RetryRequest | None = Field(None, description="Default: the task's retry policy.")
    retention_s: Delay | None = Field(
        None, description="Seconds the finished job stays readable (default: the namespace's)."
    )
    key_window_s: Delay | None = Field(
        None, description="Seconds after the job ends its Idempotency-Key still returns it."
    )
    unique: Literal["queued", "active", "period"] | None = Field(
        None,
        description="Another enqueue of the same task and args (or Idempotency-Key) gets this "
        "job (200, Evsched-Verdict: duplicate) while it is queued, queued or running, or for "
        "unique_period_s from its enqueue. Default: the task's.",
    )
    unique_period_s: Seconds | None = Field(None, description='The period of unique "period".')
    after: (
        Annotated[
            list[JobIdField],
            Field(max_length=MAX_PARENTS, json_schema_extra={"uniqueItems": True}),
            AfterValidator(_distinct),
        ]
        | None
    ) = Field(
        None,
        description="Job ids this job waits on (status waiting): it is released, or cancelled, "
        "by their ends according to after_rule. Written with one ChildRegistered per parent in "
        "one Kafka transaction.",
    )
    after_rule: Literal["all_succeeded", "all_finished", "any_succeeded"] | None = Field(
        None, description="With after: when the parents release the job (default all_succeeded)."
    )
    results_to_args: Literal["none", "append", "list"] | None = Field(
        None,
        description="With after: the parents' results go nowhere (default), each appended to "
        "args in after order, or as one more positional arg, their list.",
    )


class CancelRequest(_Request):
    reason: Reason = ""


class RequeueRequest(_Request):
    model_config = _ONE_START

    reason: Reason = ""
    delay_s: Delay | None = None
    run_at: RunAt | None = None
    rerun: bool = Field(
        default=False,
        description="Requeue a succeeded job too, to run it again (its result is cleared).",
    )


class ScheduleRequest(_Request):
    """A cron schedule that enqueues a job of ``task`` at each slot."""

    cron: Annotated[
        Text,
        Field(
            min_length=1,
            max_length=200,
            examples=["*/5 * * * *"],
            description="Five fields (minute hour day month weekday); one the cron parser "
            "refuses is a 422 naming cron.",
        ),
    ]
    timezone: Annotated[
        Text,
        Field(
            min_length=1,
            max_length=64,
            examples=["UTC", "Europe/Paris"],
            description="An IANA time zone the API's zone database knows (else a 422).",
        ),
    ] = "UTC"
    _whole = field_validator("priority", "max_attempts", mode="before")(whole)

    task: Annotated[Name, Field(examples=["reports.build"])]
    args: Args = Field(default_factory=list)
    kwargs: Kwargs = Field(default_factory=dict)
    queue: Queue | None = None
    priority: Priority | None = None
    max_attempts: Attempts | None = None
    timeout_s: Seconds | None = None
    labels: Labels = Field(default_factory=dict)
    catchup_window_s: Delay | None = Field(
        None,
        description="Missed slots within this many seconds fire one by one, older ones are "
        "skipped; default: missed slots collapse into one fire.",
    )
    max_jitter_s: Delay | None = Field(
        None, description="Each job runs up to this many seconds after its slot (deterministic)."
    )
    overlap: Literal["allow", "skip", "buffer"] | None = Field(
        None,
        description="While the previous fire's job is queued or running: allow (default) runs "
        "every fire, skip fires nothing, buffer runs one fire after it ends.",
    )


# --- views --------------------------------------------------------------------------------------


def at(ms: int) -> datetime:
    """Epoch milliseconds as an aware UTC datetime (clamped to what datetime can hold)."""
    return datetime.fromtimestamp(min(max(ms, _MIN_MS), _MAX_MS) / 1000, UTC)


def _maybe_at(ms: int | None) -> datetime | None:
    return None if ms is None else at(ms)


class Retry(BaseModel):
    initial_backoff_ms: int
    max_backoff_ms: int
    multiplier: float
    jitter: float


class LastError(BaseModel):
    type: str
    message: str
    retryable: bool
    category: str = Field(
        description="transient, permanent, timeout, cancelled, lost_worker, or a category the "
        "app maps exception classes to."
    )
    traceback: str | None = Field(None, description="The failed attempt's traceback, if kept.")


class Job(BaseModel):
    id: str
    status: Status
    task: str
    queue: str
    args: list[JsonValue] | None = Field(
        description="None when not an evsched JSON document, or nested deeper than "
        f"{MAX_JSON_DEPTH} levels (a foreign producer's; the timeline still lists the job)."
    )
    kwargs: dict[str, JsonValue] | None
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int
    token: int
    timeout_s: float
    retry: Retry
    enqueued_at: datetime
    updated_at: datetime
    partition: int
    lease_until: datetime | None
    worker_id: str | None
    idempotency_key: str | None
    labels: dict[str, str]
    schedule_id: str | None
    fire_at: datetime | None
    result: JsonValue | None
    last_error: LastError | None
    after: list[str] = Field(
        default_factory=list,
        description="The jobs this one waits on; its workflow: GET /v1/jobs/{id}/workflow.",
    )
    after_rule: str | None = Field(None, description="With after: the rule that releases it.")
    snoozes: int = Field(0, description="Times its handler snoozed this run (Snooze).")
    snoozed_until: datetime | None = Field(
        None, description="While a snooze holds the scheduled job: when it is due again."
    )

    @classmethod
    def of(cls, state: JobState) -> Job:
        args, kwargs = _arguments(state.args)
        error = state.last_error
        return cls(
            id=state.job_id,
            status=state.status,
            task=state.task,
            queue=state.queue,
            args=args,
            kwargs=kwargs,
            priority=state.priority,
            run_at=at(state.run_at),
            attempt=state.attempt,
            max_attempts=state.max_attempts,
            token=state.token,
            timeout_s=state.timeout_ms / 1000,
            retry=Retry(**_retry(state.retry)),
            enqueued_at=at(state.enqueued_at),
            updated_at=at(state.updated_at),
            partition=state.partition,
            lease_until=_maybe_at(state.lease_until),
            worker_id=state.worker_id,
            idempotency_key=state.idempotency_key,
            labels=state.labels,
            schedule_id=state.schedule_id,
            fire_at=_maybe_at(state.fire_at),
            result=_json(state.result),
            last_error=None
            if error is None
            else LastError(
                type=error.error_type,
                message=error.message,
                retryable=error.retryable,
                category=category_of(error),
                traceback=error.traceback,
            ),
            after=list(state.after),
            after_rule=state.after_rule if state.after else None,
            snoozes=state.snoozes,
            snoozed_until=_maybe_at(state.snoozed_until),
        )


def _arguments(data: bytes) -> tuple[list[JsonValue] | None, dict[str, JsonValue] | None]:
    """The job's args for a view; None for what is not JSON or nests too deep to render."""
    try:
        decoded = decode_args(data)
    except NotJson:
        return None, None
    if deeper_than(decoded.args, MAX_JSON_DEPTH) or deeper_than(decoded.kwargs, MAX_JSON_DEPTH):
        return None, None
    return list(decoded.args), decoded.kwargs


def _json(data: bytes | None) -> JsonValue | None:
    try:
        value: JsonValue = decode_json(data)
    except NotJson:
        return None
    return None if deeper_than(value, MAX_JSON_DEPTH) else value


def _retry(policy: Any) -> dict[str, Any]:
    return {
        "initial_backoff_ms": policy.initial_backoff_ms,
        "max_backoff_ms": policy.max_backoff_ms,
        "multiplier": policy.multiplier,
        "jitter": policy.jitter,
    }


class TimelineEvent(BaseModel):
    """One event of a job's (or schedule's) history, as the fold judged it."""

    partition: int
    offset: int
    log_at: datetime
    kind: str
    event_id: str
    source: str
    verdict: Verdict
    reason: str
    token: int | None
    status_after: Status | None

    @classmethod
    def of(cls, entry: TimelineEntry) -> TimelineEvent:
        return cls(
            partition=entry.partition,
            offset=entry.offset,
            log_at=at(entry.log_at),
            kind=entry.kind,
            event_id=entry.event_id,
            source=entry.source,
            verdict=entry.verdict,
            reason=entry.reason,
            token=entry.token,
            status_after=entry.status_after,
        )


class Timeline(BaseModel):
    id: str
    events: list[TimelineEvent]
    next_after: int | None = Field(
        default=None,
        description="Pass as ?after= for the next page of events; None: this page ends it.",
    )


class AsOf(BaseModel):
    """The point of the log an answer is as of (``?as_of=``)."""

    requested: str = Field(description="as_of as given.")
    offsets: dict[str, int] = Field(
        description="Each partition's last offset folded (-1: none): what as_of resolved to."
    )


class Building(BaseModel):
    """The as-of index is being built: ask again (same URL) after Retry-After seconds."""

    status: Literal["building"]
    as_of: AsOf
    message: str


class JobPage(BaseModel):
    jobs: list[Job]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; None: done.")
    scanned: int = Field(description="Jobs read from the index for this page (filters cost).")
    as_of: AsOf | None = Field(None, description="With ?as_of=: the point answered as of.")


class Schedule(BaseModel):
    id: str
    cron: str
    timezone: str
    task: str
    queue: str
    args: list[JsonValue] | None
    kwargs: dict[str, JsonValue] | None
    priority: int
    max_attempts: int
    timeout_s: float
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    last_job_id: str | None
    catchup_window_s: float | None = None
    max_jitter_s: float | None = None
    overlap: str | None = None

    @classmethod
    def of(cls, state: ScheduleState) -> Schedule:
        template = state.template
        args, kwargs = _arguments(template.args)
        return cls(
            id=state.schedule_id,
            cron=state.cron,
            timezone=state.timezone,
            task=template.task,
            queue=template.queue,
            args=args,
            kwargs=kwargs,
            priority=template.priority,
            max_attempts=template.max_attempts,
            timeout_s=template.timeout_ms / 1000,
            labels=template.labels,
            created_at=at(state.created_at),
            updated_at=at(state.updated_at),
            next_fire_at=_maybe_at(state.next_fire_at),
            last_fire_at=_maybe_at(state.last_fire_at),
            last_job_id=state.last_job_id,
            catchup_window_s=_seconds(state.catchup_window_ms),
            max_jitter_s=_seconds(state.max_jitter_ms),
            overlap=state.overlap,
        )


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


class SchedulePage(BaseModel):
    schedules: list[Schedule]
    next_cursor: str | None
    scanned: int


class Accepted(BaseModel):
    """The write's outcome is not known yet: poll ``Location`` for it.

    ``status`` says how far it got: ``acknowledged`` (the broker has it at ``partition`` and
    ``offset``; this replica has not applied it yet) or ``unconfirmed`` (the broker has not
    acknowledged it within the timeout, e.g. it is unreachable; it may still be written, so retry
    with the same Idempotency-Key rather than without one).
    """

    id: str
    status: Literal["acknowledged", "unconfirmed"]
    partition: int | None
    offset: int | None
    message: str


class QueueStats(BaseModel):
    total: int
    by_status: dict[Status, int]


class PartitionStats(BaseModel):
    partition: int
    applied_offset: int


class Stats(BaseModel):
    total: int
    by_status: dict[Status, int]
    by_queue: dict[str, QueueStats]
    partitions: list[PartitionStats]
    as_of: AsOf | None = Field(None, description="With ?as_of=: the point answered as of.")


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    lag: dict[str, int]
