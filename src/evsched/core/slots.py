"""Generated constructors and copies of the fold's frozen dataclasses, filling slots directly.

A frozen dataclass's __init__ sets each field with ``object.__setattr__``, which looks the field up
by name every time: that was most of the fold's time. The functions generated here call each slot's
own setter instead, and make exactly what the constructor or ``dataclasses.replace`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

from evsched.core.state import JobState, TimelineEntry


def slot_filler(cls: type[Any], params: str, value_of: Callable[[str], str]) -> Callable[..., Any]:
    """A function ``fill(params)`` making a ``cls`` by filling its slots, like its __init__.

    ``value_of(field)`` is the expression (over ``params``) each field is set to. ``cls`` has no
    ``__post_init__`` and no init-only fields (checked here), so the object is exactly what the
    constructor would make.
    """
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields(cls)):
        raise TypeError(f"{cls.__name__} must be a plain dataclass to have its slots filled")
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for f in fields(cls):
        env[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        env[f"_default_{f.name}"] = f.default
    body = "".join(f"    _set_{f.name}(new, {value_of(f.name)})\n" for f in fields(cls))
    source = f"def fill({params}):\n    new = _new(_cls)\n{body}    return new\n"
    exec(compile(source, f"<fill {cls.__name__}({params})>", "exec"), env)  # noqa: S102
    fill: Callable[..., Any] = env["fill"]
    return fill


def keywords(cls: type[Any]) -> str:
    """The parameters of ``cls.__init__``; a field with a default factory must be passed."""
    return "*, " + ", ".join(
        f.name if f.default is MISSING else f"{f.name}=_default_{f.name}" for f in fields(cls)
    )


new_state: Callable[..., JobState] = slot_filler(JobState, keywords(JobState), str)
# A timeline entry by position, every field given: the fold makes one per event.
entry_of: Callable[..., TimelineEntry] = slot_filler(
    TimelineEntry, ", ".join(f.name for f in fields(TimelineEntry)), str
)
_STATE_FIELDS = frozenset(f.name for f in fields(JobState))


def state_replacer(names: tuple[str, ...]) -> Callable[..., JobState]:
    """``replacer(old, *values, recent, at)``: ``old`` with ``names`` and the step's marks set.

    Generating one costs a compile: callers keep the ones they made. A misspelt field name
    raises ``AttributeError``.
    """
    unknown = set(names) - _STATE_FIELDS
    if unknown:
        raise AttributeError(f"JobState has no fields {sorted(unknown)}")
    # The marks of every step win over a change of the same field, as they did in replace().
    replaced = {**{n: n for n in names}, "recent_event_ids": "_recent", "updated_at": "_at"}
    params = ", ".join(("_old", *names, "_recent", "_at"))
    replacer: Callable[..., JobState] = slot_filler(
        JobState, params, lambda name: replaced.get(name, f"_old.{name}")
    )
    return replacer
