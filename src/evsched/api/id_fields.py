"""Job and schedule ids at the HTTP edge: every id the fold accepts, and a 422 naming the field
for any other (``core.bounds``: at most ``MAX_ID_BYTES`` UTF-8 bytes, not characters)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from pydantic import AfterValidator, Field

from evsched.core.bounds import MAX_ID_BYTES, id_refusal

DESCRIPTION = f"1 to {MAX_ID_BYTES:,} UTF-8 bytes, as the fold keys it."


def _keyable(value: str) -> str:
    """``value`` if the fold would take it as an id; the refusal names the bound otherwise."""
    refusal = id_refusal("id", value)
    if refusal is not None:
        raise ValueError(refusal)
    return value


# maxLength (characters) documents the outer bound; the bytes are checked after it.
_Bounded = AfterValidator(_keyable)
JobId = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_BYTES, description=DESCRIPTION), _Bounded
]
ScheduleId = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_BYTES, description=DESCRIPTION), _Bounded
]
# A job id in a body (a workflow's parents).
JobIdField = Annotated[str, Field(min_length=1, max_length=MAX_ID_BYTES), _Bounded]
