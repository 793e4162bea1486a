"""Self-started PostgreSQL and Apache Kafka for tests, demos and benchmarks (no Docker needed)."""

from outboxkit.devstack.kafka import KAFKA_VERSION, KafkaServer, kafka_libs
from outboxkit.devstack.mtls import MutualTlsListener
from outboxkit.devstack.postgres import PostgresServer
from outboxkit.devstack.sasl import OAuthBearerListener, SaslSslListener
from outboxkit.devstack.stack import DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV, DevStack

__all__ = [
    "DATABASE_URL_ENV",
    "KAFKA_BOOTSTRAP_ENV",
    "KAFKA_VERSION",
    "DevStack",
    "KafkaServer",
    "MutualTlsListener",
    "OAuthBearerListener",
    "PostgresServer",
    "SaslSslListener",
    "kafka_libs",
]
