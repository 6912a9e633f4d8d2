"""Kafka ACLs as data, created with the admin protocol (``CreateAcls``) through aiokafka."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.admin import CreateAclsRequest

from evsched.errors import BrokerUnavailable, EvschedError

# Kafka's wire codes (org.apache.kafka.common.acl.AclOperation, resource.ResourceType/PatternType).
OPERATIONS = {
    "Read": 3,
    "Write": 4,
    "Create": 5,
    "Delete": 6,
    "Alter": 7,
    "Describe": 8,
    "ClusterAction": 9,
    "DescribeConfigs": 10,
    "AlterConfigs": 11,
    "IdempotentWrite": 12,
}
RESOURCE_TYPES = {"Topic": 2, "Group": 3, "Cluster": 4, "TransactionalId": 5}
_LITERAL, _PREFIXED = 3, 4
_ALLOW = 3


class AclRefused(EvschedError):
    """The cluster refused to create an ACL (no authorizer, or the caller may not alter ACLs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AclRule:
    """``principal`` may do ``operations`` on a resource (a name, or every name with a prefix)."""

    principal: str
    operations: tuple[str, ...]
    resource_type: str
    name: str
    prefixed: bool = False

    def __post_init__(self) -> None:
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if unknown or self.resource_type not in RESOURCE_TYPES:
            raise ValueError(f"unknown operation or resource type in {self!r}")

    @property
    def pattern(self) -> str:
        return "prefixed" if self.prefixed else "literal"


async def create_acls(
    bootstrap: str, rules: Iterable[AclRule], *, timeout_s: float = 30.0, **client_options: Any
) -> int:
    """Create an ALLOW binding for every operation of every rule; how many were created.

    ``client_options`` (TLS/SASL) are a principal allowed to alter the cluster's ACLs.
    """
    client = AIOKafkaClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=int(timeout_s * 1000),
        client_id="evsched-acls",
        **client_options,
    )
    created = 0
    try:
        async with asyncio.timeout(timeout_s):
            await client.bootstrap()
            for rule in rules:
                for operation in rule.operations:
                    await _create(client, rule, operation)
                    created += 1
    except KafkaError as exc:
        raise BrokerUnavailable(f"creating ACLs on {bootstrap} failed: {exc!r}") from exc
    except TimeoutError as exc:
        raise BrokerUnavailable(f"creating ACLs took more than {timeout_s} s") from exc
    finally:
        await client.close()
    return created


async def _create(client: AIOKafkaClient, rule: AclRule, operation: str) -> None:
    request = CreateAclsRequest(
        RESOURCE_TYPES[rule.resource_type],
        rule.name,
        _PREFIXED if rule.prefixed else _LITERAL,
        rule.principal,
        "*",
        OPERATIONS[operation],
        _ALLOW,
    )
    response = await client.send(client.get_random_node(), request)
    for code, message in response.creation_responses:
        if code != 0:
            detail = message or for_code(code).__name__
            raise AclRefused(f"{operation} on {rule.resource_type} {rule.name!r}: {detail}")
