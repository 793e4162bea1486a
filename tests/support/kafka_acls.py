"""Granting Kafka ACLs on a test broker started with ``authorizer=True``.

ACLs are created over the broker's loopback PLAINTEXT listener, whose anonymous principal is a
super user there; the principal they are for is the SASL user the product's processes log in as.
Only tests use this: the product never creates ACLs.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from outboxkit.devstack import KafkaServer


@dataclass(frozen=True)
class Acl:
    """One allow rule: ``operations`` on the resource ``name`` (a prefix when ``prefixed``)."""

    resource: ResourceType
    name: str
    operations: tuple[AclOperation, ...]
    prefixed: bool = False


def topic(name: str, *operations: AclOperation, prefixed: bool = False) -> Acl:
    return Acl(ResourceType.TOPIC, name, operations, prefixed)


def group(name: str, *operations: AclOperation, prefixed: bool = False) -> Acl:
    return Acl(ResourceType.GROUP, name, operations, prefixed)


def transactional_id(name: str, *operations: AclOperation, prefixed: bool = False) -> Acl:
    return Acl(ResourceType.TRANSACTIONAL_ID, name, operations, prefixed)


def _admin(server: KafkaServer) -> AdminClient:
    return AdminClient({"bootstrap.servers": server.plaintext_bootstrap})


def _bindings(principal: str, acls: tuple[Acl, ...]) -> list[AclBinding]:
    return [
        AclBinding(
            acl.resource,
            acl.name,
            ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
            principal,
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for acl in acls
        for operation in acl.operations
    ]


def grant(server: KafkaServer, *acls: Acl, principal: str | None = None) -> None:
    """Allow ``acls`` to ``principal`` (the server's SASL user by default); waits until created."""
    who = f"User:{principal or server.sasl_username}"
    admin = _admin(server)  # kept referenced: a collected client fails its pending futures
    futures = admin.create_acls(_bindings(who, acls), request_timeout=30)
    for future in futures.values():
        future.result(timeout=30)


def revoke(server: KafkaServer, name: str, operation: AclOperation) -> None:
    """Take ``operation`` on topic ``name`` away from the server's SASL user (it must have it)."""
    binding = AclBindingFilter(
        ResourceType.TOPIC,
        name,
        ResourcePatternType.LITERAL,
        f"User:{server.sasl_username}",
        None,  # type: ignore[arg-type]  # any host
        operation,
        AclPermissionType.ALLOW,
    )
    admin = _admin(server)
    for future in admin.delete_acls([binding], request_timeout=30).values():
        assert future.result(timeout=30), f"no {operation} on {name} to revoke"


def may_write(server: KafkaServer, name: str) -> bool | None:
    """What the broker tells the server's SASL user about writing to topic ``name`` now (a
    grant or a revocation is applied asynchronously: wait for this before relying on it)."""
    from outboxkit.devstack.aio import run_coroutine
    from outboxkit.kafka.confluent_admin import ConfluentAdmin

    async def ask() -> bool | None:
        admin = ConfluentAdmin(server.sasl_ssl.kafka_settings(), timeout=10.0)
        try:
            return (await admin.may_write([name])).get(name)
        finally:
            await admin.close()

    return run_coroutine(ask())


def revoke_all(server: KafkaServer, principal: str | None = None) -> None:
    """Remove every ACL of ``principal`` (the server's SASL user by default)."""
    who = f"User:{principal or server.sasl_username}"
    match_all = AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]  # None matches any name; the stubs say str
        ResourcePatternType.ANY,
        who,
        None,  # type: ignore[arg-type]  # any host
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    admin = _admin(server)
    futures = admin.delete_acls([match_all], request_timeout=30)
    for future in futures.values():
        try:
            future.result(timeout=30)
        except KafkaException as error:  # pragma: no cover - reported with the ACL named
            raise AssertionError(f"could not remove the ACLs of {who}: {error}") from error
