"""Schemas outside the compiled subset are refused, and the codec then keeps fastavro for them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from evsched.adapters import avro
from evsched.adapters.avro.codegen import Unsupported
from evsched.adapters.avro.reader import compile_reader
from evsched.adapters.avro.registry import parse_contract_schema
from evsched.adapters.avro.writer import compile_writer
from evsched.core.state import JobError


@pytest.mark.parametrize(
    "field_type",
    [
        "int",
        "float",
        {"type": "fixed", "name": "F", "size": 2},
        ["string", "null"],
        ["null", "string", "long"],
        ["null", {"type": "array", "items": "string"}],
    ],
    ids=str,
)
def test_schemas_outside_the_compiled_subset_are_unsupported(field_type: Any) -> None:
    schema = parse_contract_schema(
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": field_type}]}, "R"
    )

    with pytest.raises(Unsupported):
        compile_writer(schema)
    with pytest.raises(Unsupported):
        compile_reader(schema, _holder(field_type))


def test_a_field_name_that_is_not_an_identifier_is_never_compiled() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "x)\nimport os\n(", "type": "long"}],
    }
    with pytest.raises(Unsupported):
        compile_writer(schema)


def test_a_class_that_is_not_a_plain_slotted_dataclass_is_not_compiled() -> None:
    @dataclasses.dataclass
    class Unslotted:
        x: int

    schema = parse_contract_schema(
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}, "R"
    )
    with pytest.raises(Unsupported):
        compile_reader(schema, Unslotted)
    with pytest.raises(Unsupported):
        compile_reader(schema, JobError)
    with pytest.raises(Unsupported):
        compile_reader(schema, int)


def test_unsupported_records_fall_back_to_fastavro_in_the_codec() -> None:
    schema = parse_contract_schema(
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}]}, "R"
    )
    assert avro._fast_writer(schema, b"") is avro._refuse_write
    assert avro._fast_reader(schema, _holder("int")) is avro._refuse_read
    with pytest.raises(Exception, match="no compiled"):
        avro._refuse_write(None)
    with pytest.raises(Exception, match="no compiled"):
        avro._refuse_read(b"", 0)


def _holder(field_type: Any) -> type[Any]:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class R:
        x: Any

    return R
