"""The schema files are the wire contract: they agree with the core's dataclasses and each other."""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Iterator
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from fastavro import parse_schema

from evsched.adapters.avro.registry import SchemaRegistry
from evsched.adapters.contract import load_schema_files
from evsched.core.events import EVENT_TYPES
from evsched.core.state import JobState, ScheduleState, TimelineEntry

EVENTS = load_schema_files("schemas")
HISTORY = load_schema_files("schemas", "history")
PROJECTIONS = load_schema_files("projections")
ALL_FILES = {
    **{f"schemas/{p}": s for p, s in EVENTS.items()},
    **{f"schemas/{p}": s for p, s in HISTORY.items()},
    **{f"projections/{p}": s for p, s in PROJECTIONS.items()},
}
PRIMITIVES = {str: "string", bytes: "bytes", bool: "boolean", int: "long", float: "double"}


def _json_default(value: Any) -> Any:
    """A Python default as Avro writes it in a schema's JSON."""
    if dataclasses.is_dataclass(value):
        return {f.name: _json_default(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, tuple):
        return [_json_default(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _python_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _assert_type_matches(avro: Any, hint: Any, where: str) -> None:
    origin = get_origin(hint)
    if origin is types.UnionType:
        (present,) = [arg for arg in get_args(hint) if arg is not types.NoneType]
        assert isinstance(avro, list) and len(avro) == 2 and avro[0] == "null", where
        _assert_type_matches(avro[1], present, where)
    elif origin is dict:
        assert get_args(hint) == (str, str), where
        assert avro == {"type": "map", "values": "string"}, where
    elif origin is tuple:
        assert avro["type"] == "array", where
        _assert_type_matches(avro["items"], get_args(hint)[0], where)
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        assert avro["type"] == "enum" and avro["name"] == hint.__name__, where
        assert avro["symbols"] == [member.value for member in hint], where
        assert avro.get("doc"), where
    elif dataclasses.is_dataclass(hint):
        _assert_record_matches(avro, hint)
    else:
        assert avro == PRIMITIVES[hint], f"{where}: {avro} is not {hint}"


def _assert_record_matches(schema: Any, cls: Any) -> None:
    """Same fields in the same order, matching types, defaults that equal the dataclass's, docs."""
    assert schema["type"] == "record" and schema["name"] == cls.__name__
    assert schema.get("doc"), f"{cls.__name__} has no doc"
    hints = get_type_hints(cls)
    fields = dataclasses.fields(cls)
    assert [f["name"] for f in schema["fields"]] == [f.name for f in fields], cls.__name__
    for avro_field, field in zip(schema["fields"], fields, strict=True):
        where = f"{cls.__name__}.{field.name}"
        assert avro_field.get("doc"), f"{where} has no doc"
        _assert_type_matches(avro_field["type"], hints[field.name], where)
        default = _python_default(field)
        if default is dataclasses.MISSING:
            assert "default" not in avro_field, where
        else:
            assert avro_field.get("default", dataclasses.MISSING) == _json_default(default), where


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda kind: kind.__name__)
def test_each_event_schema_mirrors_its_dataclass(kind: type[Any]) -> None:
    schema = EVENTS[f"{kind.__name__}.avsc"]

    assert schema["namespace"] == "evsched.events"
    _assert_record_matches(schema, kind)


@pytest.mark.parametrize("kind", [JobState, ScheduleState, TimelineEntry], ids=lambda k: k.__name__)
def test_each_projection_schema_mirrors_its_dataclass(kind: type[Any]) -> None:
    schema = PROJECTIONS[f"{kind.__name__}.avsc"]

    assert schema["namespace"] == "evsched.projections"
    _assert_record_matches(schema, kind)


def test_there_is_one_schema_file_per_event_kind_and_nothing_else() -> None:
    assert set(EVENTS) == {f"{kind.__name__}.avsc" for kind in EVENT_TYPES}


@pytest.mark.parametrize("path", sorted(ALL_FILES))
def test_each_file_parses_on_its_own(path: str) -> None:
    # A fresh table of named types per parse: a file leaning on another's definitions fails here.
    assert parse_schema(ALL_FILES[path], named_schemas={})


@pytest.mark.parametrize("path", sorted(HISTORY))
def test_fields_added_since_a_history_schema_have_defaults(path: str) -> None:
    old = HISTORY[path]
    current = EVENTS[f"{old['name']}.avsc"]
    old_names = {f["name"] for f in old["fields"]}
    added = [f for f in current["fields"] if f["name"] not in old_names]

    assert added, f"{path} is identical in fields to the current schema"
    assert all("default" in f for f in added), [f["name"] for f in added if "default" not in f]


def _named_types(schema: Any, namespace: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named type defined inline in ``schema``, by full name."""
    if isinstance(schema, list):
        for branch in schema:
            yield from _named_types(branch, namespace)
    elif isinstance(schema, dict):
        if schema["type"] in ("record", "enum"):
            namespace = schema.get("namespace", namespace)
            yield f"{namespace}.{schema['name']}", schema
        for field in schema.get("fields", ()):
            yield from _named_types(field["type"], namespace)
        for key in ("items", "values"):
            if key in schema:
                yield from _named_types(schema[key], namespace)


def test_a_named_type_reads_the_same_in_every_file_that_defines_it() -> None:
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for path, schema in ALL_FILES.items():
        for name, definition in _named_types(schema, ""):
            # A history file holds an older version of its own kind, by design.
            own_kind = "evsched.events." + path.rsplit("/", 1)[-1].split(".", 1)[0]
            if path.startswith("schemas/history/") and name == own_kind:
                continue
            comparable = {k: v for k, v in definition.items() if k != "namespace"}
            first = seen.setdefault(name, (path, comparable))
            assert first[1] == comparable, f"{name} differs between {first[0]} and {path}"


def test_the_registry_knows_every_current_and_history_schema() -> None:
    registry = SchemaRegistry.from_contract()

    assert len(registry.writers()) == len(EVENTS) + len(HISTORY)
    assert registry.kinds == {kind.__name__ for kind in EVENT_TYPES}
