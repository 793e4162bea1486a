"""The demo's own Kafka is plaintext: security variables meant for another cluster are left
out (before, the demo started its broker and then failed on them: "SASL_SSL needs ...")."""

from __future__ import annotations

import pytest

from outboxkit.cli.demo import forget_other_kafka

pytestmark = pytest.mark.unit

SECURED = {
    "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "OUTBOXKIT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "OUTBOXKIT_KAFKA_SASL_USERNAME": "app",
    "OUTBOXKIT_KAFKA_SASL_PASSWORD": "s3cret-pw",
    "OUTBOXKIT_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem",
    "OUTBOXKIT_KAFKA_PROPERTIES": '{"sasl.oauthbearer.method": "oidc"}',
    "OUTBOXKIT_KAFKA_CLIENT": "aiokafka",
    "OUTBOXKIT_DATABASE_URL": "postgresql://u@h/d",
    "PATH": "/usr/bin",
}


def test_a_kafka_of_its_own_drops_another_clusters_settings_by_name() -> None:
    environ = dict(SECURED)
    dropped = forget_other_kafka(environ)
    assert dropped == [
        "OUTBOXKIT_KAFKA_PROPERTIES",
        "OUTBOXKIT_KAFKA_SASL_MECHANISM",
        "OUTBOXKIT_KAFKA_SASL_PASSWORD",
        "OUTBOXKIT_KAFKA_SASL_USERNAME",
        "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL",
        "OUTBOXKIT_KAFKA_SSL_CA_LOCATION",
    ]
    assert environ == {
        "OUTBOXKIT_KAFKA_CLIENT": "aiokafka",
        "OUTBOXKIT_DATABASE_URL": "postgresql://u@h/d",
        "PATH": "/usr/bin",
    }


def test_a_given_kafka_keeps_them() -> None:
    environ = {**SECURED, "OUTBOXKIT_KAFKA_BOOTSTRAP": "kafka:9093"}
    assert forget_other_kafka(environ) == []
    assert environ == {**SECURED, "OUTBOXKIT_KAFKA_BOOTSTRAP": "kafka:9093"}
