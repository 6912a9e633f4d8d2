"""The Kafka ACLs per evsched role (docs/security.md), as data a test applies and the docs print."""

from __future__ import annotations

from evsched.adapters.kafka.acls import AclRule
from evsched.adapters.kafka.atomic_batch import batch_id_prefix
from evsched.adapters.kafka.topics import Topics

# One SASL user per role; docs/security.md says what each may write and why.
ROLES = ("producer", "api", "node", "worker", "effects-reader", "operator")


def role_acls(namespace: str) -> list[AclRule]:
    """Every ALLOW rule the roles of ``namespace`` need, and nothing more."""
    names = Topics(namespace)
    events, effects, state = names.events, names.effects, names.state
    dispatch = f"{namespace}.dispatch."  # every queue's: Topics.dispatch names one

    def other(user: str, ops: str, kind: str, name: str, *, prefixed: bool = False) -> AclRule:
        return AclRule(
            principal=f"User:{user}",
            operations=tuple(ops.split()),
            resource_type=kind,
            name=name,
            prefixed=prefixed,
        )

    def topic(user: str, ops: str, name: str, *, prefixed: bool = False) -> AclRule:
        return other(user, ops, "Topic", name, prefixed=prefixed)

    batches = batch_id_prefix(namespace)  # atomic batches: one transaction each
    return [
        # Producers (services with the client library, `evsched enqueue/cancel/requeue`).
        topic("producer", "Read Write Describe", events),  # reads: the CLI waits for the verdict
        topic("producer", "Describe", dispatch, prefixed=True),  # which queues are declared
        other("producer", "Write Describe", "TransactionalId", batches, prefixed=True),
        # The API writes like a producer and folds <ns>.events into its read replica.
        topic("api", "Read Write Describe", events),
        topic("api", "Describe", dispatch, prefixed=True),
        topic("api", "Read Describe", state),  # a new replica restores from the changelog
        other("api", "Write Describe", "TransactionalId", batches, prefixed=True),
        # Nodes: the only principal that decides, dispatches and publishes effects.
        topic("node", "Read Write Describe DescribeConfigs", events),
        topic("node", "Write Describe DescribeConfigs", dispatch, prefixed=True),
        topic("node", "Write Describe DescribeConfigs", effects),
        topic("node", "Read Write Describe DescribeConfigs", state),  # the index's changelog
        other("node", "Read", "Group", names.node_group),
        # Which queues have a live worker: nodes list and describe the pools' groups.
        other("node", "Describe", "Group", f"{namespace}.workers.", prefixed=True),
        other("node", "Write Describe", "TransactionalId", f"{namespace}.node.", prefixed=True),
        # Workers: read their dispatch topics, write attempt events and read them back (a running
        # job's cancel reaches its handler); they check the base topics.
        topic("worker", "Read Describe DescribeConfigs", dispatch, prefixed=True),
        topic("worker", "Read Write Describe DescribeConfigs", events),
        topic("worker", "Describe DescribeConfigs", effects),
        topic("worker", "Describe DescribeConfigs", state),
        other("worker", "Read", "Group", f"{namespace}.workers.", prefixed=True),
        # Downstream services reading accepted effects, in groups of their own.
        topic("effects-reader", "Read Describe", effects),
        other("effects-reader", "Read", "Group", f"{namespace}.effects.", prefixed=True),
        # Operators: create and check topics, read the log (audit, export, rebuild, replay).
        topic("operator", "Create Read Describe DescribeConfigs", f"{namespace}.", prefixed=True),
    ]


def kafka_acls_command(rule: AclRule, *, bootstrap: str = "HOST:9093") -> list[str]:
    """The stock tool's command that creates ``rule``."""
    flag = {"Topic": "--topic", "Group": "--group", "TransactionalId": "--transactional-id"}
    command = [
        "kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", "admin.properties",
        "--add", "--allow-principal", rule.principal,
    ]  # fmt: skip
    for operation in rule.operations:
        command += ["--operation", operation]
    command += [flag[rule.resource_type], rule.name, "--resource-pattern-type", rule.pattern]
    return command


def acl_table(namespace: str) -> str:
    """The rules as the Markdown table docs/security.md shows (a test keeps them equal)."""
    rows = [
        "| principal | operations | resource | pattern |",
        "|---|---|---|---|",
    ]
    for rule in role_acls(namespace):
        rows.append(
            f"| `{rule.principal}` | {', '.join(rule.operations)} | "
            f"{rule.resource_type} `{rule.name}` | {rule.pattern} |"
        )
    return "\n".join(rows)
