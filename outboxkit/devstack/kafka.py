"""A single-node KRaft Apache Kafka broker from the Maven Central jars, run with the machine's Java.

The jars are fetched once with ``mvn`` (:mod:`outboxkit.devstack.kafka_jars`). The broker
is configured so idempotent producers and transactions work on one node, and auto topic creation
is off, as in production. Optionally clients must come in over SASL_SSL with SCRAM credentials
(and, if asked for too, OAUTHBEARER with Kafka's unsecured JWTs), or over SSL with a client
certificate.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from outboxkit.devstack.aio import run_coroutine
from outboxkit.devstack.files import write_private
from outboxkit.devstack.kafka_jars import KAFKA_VERSION as KAFKA_VERSION
from outboxkit.devstack.kafka_jars import kafka_libs as kafka_libs
from outboxkit.devstack.kafka_jars import maven_copy_dependencies as maven_copy_dependencies
from outboxkit.devstack.mtls import MutualTlsListener, listener_tls_props
from outboxkit.devstack.process import ManagedServer, ServiceProcess, _die_with_parent, free_port
from outboxkit.devstack.registry import make_registered_dir
from outboxkit.devstack.sasl import (
    OAUTHBEARER,
    SCRAM_SHA_512,
    OAuthBearerListener,
    SaslSslListener,
)
from outboxkit.devstack.tls import client_tls, make_broker_tls
from outboxkit.errors import DevStackError, OutboxkitError
from outboxkit.kafka import KafkaClients, resolve_client
from outboxkit.settings import KafkaClient, KafkaSettings

_STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

Security = Literal["plaintext", "sasl_ssl"]  # what DevStack and `outboxkit dev up` offer
BrokerSecurity = Literal["plaintext", "sasl_ssl", "ssl"]
_SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
# The broker logs in too, for every mechanism a listener enables: Kafka's built-in unsecured
# token needs a subject. Clients' tokens are checked by Kafka's default OAUTHBEARER validator,
# the unsecured one (no signature; only the expiry and the claims' form).
_OAUTH_LOGIN_MODULE = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required"
    ' unsecuredLoginStringClaim_sub="outboxkit-broker";'
)

_LOG4J2 = """rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.server.name = kafka.server.KafkaServer
logger.server.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
"""
# With reauth_ms: each (re-)authentication and each connection closed for an expired session is
# logged (the broker's metrics say the same, but only over JMX), so a test can count them; the
# thread's name ties the lines of one authentication together (one network thread runs it).
_LOG4J2_AUTH = """logger.auth.name = org.apache.kafka.common.network.Selector
logger.auth.level = DEBUG
logger.session.name = org.apache.kafka.common.security.authenticator.SaslServerAuthenticator
logger.session.level = DEBUG
logger.expired.name = kafka.network.Processor
logger.expired.level = DEBUG
"""


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise DevStackError(
            "Java 17+ is required to run the Kafka broker (apt-get install openjdk-17-jre-headless)"
        )
    return java


def _metadata_ok(settings: KafkaSettings) -> bool:
    """A real metadata request through the Kafka seam (whichever client is installed)."""
    quiet = settings
    if resolve_client(settings) is KafkaClient.CONFLUENT:  # aiokafka reads no librdkafka property
        quiet = settings.model_copy(update={"properties": {"log_level": SecretStr("0")}})

    async def probe() -> None:
        admin = KafkaClients(quiet, timeout=2.0).admin()
        try:
            await admin.describe_topic("__consumer_offsets")
        finally:
            await admin.close()

    try:
        run_coroutine(probe())
    except OutboxkitError:
        return False
    return True


class KafkaServer(ManagedServer):
    """One combined controller+broker node. ``stop``/``kill``/``start`` keep the log dirs.

    With ``security="sasl_ssl"`` clients connect to a SASL_SSL listener that requires SCRAM-SHA-512
    authentication, with a CA and broker certificate made at first start (see :attr:`sasl_ssl`).
    The broker keeps a PLAINTEXT listener on loopback for its own (inter-broker) traffic; it is
    :attr:`plaintext_bootstrap`, unauthenticated, meant for test set-up only. No authorizer is
    configured unless ``authorizer=True`` (with ``sasl_ssl`` only): then Kafka's own ACL
    authorizer runs, the SCRAM user may do only what ACLs grant it (none at start), and the
    loopback listener's anonymous principal, which the broker itself uses too, is a super user.

    ``oauthbearer=True`` (with ``sasl_ssl`` only) makes the same listener accept OAUTHBEARER too,
    with unsigned JWTs (see :attr:`oauthbearer`): any client can then name any principal, so it
    is for tests of that mechanism only, never the default.

    With ``security="ssl"`` clients connect to an SSL listener with ``ssl.client.auth=required``
    instead: a client certificate signed by the same CA, with its key unencrypted and encrypted,
    is made at first start too (see :meth:`mtls`); the PLAINTEXT loopback listener stays.

    ``reauth_ms`` (with ``sasl_ssl`` only) sets ``connections.max.reauth.ms`` (KIP-368) on that
    listener: no session lasts longer (an OAUTHBEARER one ends with its token even without it),
    and a connection used after its session ended is closed. The broker's log then records each
    (re-)authentication, with its token's expiry, and each such close (see :meth:`auth_log`).
    """

    log_name = "kafka.log"
    stop_timeout = 60.0

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        version: str = KAFKA_VERSION,
        security: BrokerSecurity = "plaintext",
        oauthbearer: bool = False,
        reauth_ms: int | None = None,
        authorizer: bool = False,
    ) -> None:
        if security not in ("plaintext", "sasl_ssl", "ssl"):
            raise ValueError(f"security must be 'plaintext', 'sasl_ssl' or 'ssl', not {security!r}")
        if oauthbearer and security != "sasl_ssl":
            raise ValueError("oauthbearer=True needs security='sasl_ssl'")
        if reauth_ms is not None and (security != "sasl_ssl" or reauth_ms <= 0):
            raise ValueError("reauth_ms needs security='sasl_ssl' and a positive number")
        if authorizer and security != "sasl_ssl":
            raise ValueError("authorizer=True needs security='sasl_ssl'")
        self.reauth_ms = reauth_ms
        self.authorizer = authorizer
        self.oauthbearer_enabled = oauthbearer
        self._dir_token: str | None = None
        if base_dir is None:
            base_dir, self._dir_token = make_registered_dir("outboxkit-kafka-")
        self.base_dir = Path(base_dir)
        self.version = version
        self.security: BrokerSecurity = security
        self.port = free_port()
        self.controller_port = free_port()
        self.sasl_ssl_port = free_port() if security == "sasl_ssl" else None
        self.ssl_port = free_port() if security == "ssl" else None
        self.sasl_username = "outboxkit"
        self._sasl_password = secrets.token_hex(24)
        self._store_password = secrets.token_hex(24)
        self._client = client_tls(self.base_dir / "tls", secrets.token_hex(24))
        self._service: ServiceProcess | None = None

    @property
    def bootstrap(self) -> str:
        """Where clients connect: the SASL_SSL or SSL listener when secured, else PLAINTEXT."""
        port = self.sasl_ssl_port or self.ssl_port
        return f"127.0.0.1:{port}" if port is not None else self.plaintext_bootstrap

    @property
    def plaintext_bootstrap(self) -> str:
        """The unauthenticated loopback listener (the broker's inter-broker listener)."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl(self) -> SaslSslListener:
        """Bootstrap, SCRAM user and CA file of the SASL_SSL listener (files exist once started)."""
        if self.sasl_ssl_port is None:
            raise DevStackError("this Kafka was started without security='sasl_ssl'")
        return SaslSslListener(
            bootstrap=self.bootstrap,
            username=self.sasl_username,
            password=self._sasl_password,
            ca_location=str(self.base_dir / "tls" / "ca.pem"),
        )

    @property
    def oauthbearer(self) -> OAuthBearerListener:
        """The SASL_SSL listener reached with OAUTHBEARER (needs ``oauthbearer=True``)."""
        if not self.oauthbearer_enabled:
            raise DevStackError("this Kafka was started without oauthbearer=True")
        return OAuthBearerListener(
            bootstrap=self.bootstrap,
            principal=self.sasl_username,
            ca_location=self.sasl_ssl.ca_location,
        )

    def mtls(self, *, encrypted_key: bool = False) -> MutualTlsListener:
        """The SSL listener requiring a client certificate (``security="ssl"``); with
        ``encrypted_key`` the client key is the password-protected copy."""
        if self.ssl_port is None:
            raise DevStackError("this Kafka was started without security='ssl'")
        client = self._client
        return MutualTlsListener(
            bootstrap=self.bootstrap,
            ca_location=str(self.base_dir / "tls" / "ca.pem"),
            certificate_location=str(client.certificate),
            key_location=str(client.encrypted_key if encrypted_key else client.key),
            key_password=client.key_password if encrypted_key else None,
        )

    def _write_config(self) -> Path:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.base_dir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "2000",
            "log.cleaner.backoff.ms": "1000",
        }
        if self.sasl_ssl_port is not None:
            props |= self._sasl_ssl_props()
        if self.ssl_port is not None:
            props |= self._ssl_props()
        path = self.base_dir / "server.properties"
        write_private(path, "".join(f"{k}={v}\n" for k, v in props.items()))
        log4j2 = _LOG4J2
        if self.reauth_ms is not None:
            log4j2 = log4j2.replace("[%d] %p", "[%d] [%t] %p") + _LOG4J2_AUTH
        (self.base_dir / "log4j2.properties").write_text(log4j2)
        return path

    def auth_log(self) -> str:
        """The broker's log so far (with ``reauth_ms``, its authentication lines too)."""
        path = self.base_dir / self.log_name
        return path.read_text(errors="replace") if path.exists() else ""

    def _sasl_ssl_props(self) -> dict[str, str]:
        tls = make_broker_tls(self.base_dir / "tls", self._store_password, java=_java())
        sasl = f"SASL_SSL://127.0.0.1:{self.sasl_ssl_port}"
        prefix = "listener.name.sasl_ssl."
        mechanisms, extra = SCRAM_SHA_512, {}
        if self.oauthbearer_enabled:
            mechanisms += f",{OAUTHBEARER}"
            extra[f"{prefix}oauthbearer.sasl.jaas.config"] = _OAUTH_LOGIN_MODULE
        if self.reauth_ms is not None:
            extra[f"{prefix}connections.max.reauth.ms"] = str(self.reauth_ms)
        if self.authorizer:
            # KRaft's ACL authorizer. ANONYMOUS is whoever uses the PLAINTEXT loopback listener:
            # the broker's own inter-broker and controller traffic, and test set-up.
            extra["authorizer.class.name"] = _STANDARD_AUTHORIZER
            extra["super.users"] = "User:ANONYMOUS"
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},{sasl},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},{sasl}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,"
            "CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": mechanisms,
            f"{prefix}scram-sha-512.sasl.jaas.config": _SCRAM_LOGIN_MODULE,
            **extra,
            **listener_tls_props(prefix, tls, "none"),
        }

    def _ssl_props(self) -> dict[str, str]:
        tls = make_broker_tls(
            self.base_dir / "tls", self._store_password, java=_java(), client=self._client
        )
        listener = f"SSL://127.0.0.1:{self.ssl_port}"
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},{listener},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},{listener}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:PLAINTEXT",
            **listener_tls_props("listener.name.ssl.", tls, "required"),
        }

    def _jvm(self, libs: Path, *main_and_args: str) -> list[str]:
        return [
            _java(),
            "-Xms256m",
            "-Xmx768m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.base_dir / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
            *main_and_args,
        ]

    def _format(self, libs: Path, config: Path) -> None:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # "--cluster-id=<id>": a random id may start with "-", which would read as an option.
        args = ["kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}"]
        args += ["-c", str(config)]
        if self.sasl_ssl_port is not None:
            # The SCRAM user is written into the cluster's first metadata, so it exists before
            # the broker serves anyone. Its password goes through a private Java argument file
            # rather than the command line, which other local users can read in /proc.
            scram = f"{SCRAM_SHA_512}=[name={self.sasl_username},password={self._sasl_password}]"
            args += ["--add-scram", scram]
        argfile = self.base_dir / "format.args"
        write_private(argfile, "".join(f'"{arg}"\n' for arg in args))
        try:
            result = subprocess.run(
                self._jvm(libs, f"@{argfile}"),
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
                preexec_fn=_die_with_parent,  # not left running by a SIGKILLed owner
            )
        finally:
            argfile.unlink(missing_ok=True)
        if result.returncode != 0:
            output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            output = output.replace(self._sasl_password, "***")
            raise DevStackError(f"formatting Kafka storage failed:\n{output}")

    def _ready(self) -> bool:
        plain = KafkaSettings.plaintext(self.plaintext_bootstrap)
        if not _metadata_ok(plain):
            return False
        if self.ssl_port is not None:
            return _metadata_ok(self.mtls().kafka_settings())
        if self.sasl_ssl_port is None or self.authorizer:
            # With the authorizer the SCRAM user may describe nothing until a test grants it;
            # the broker opens all its listeners together, so the loopback one answering is
            # enough.
            return True
        return _metadata_ok(self.sasl_ssl.kafka_settings())

    def start(self, timeout: float = 90.0) -> None:
        if self._service is None:
            libs = kafka_libs(self.version)
            config = self._write_config()
            if not (self.base_dir / "data" / "meta.properties").exists():
                self._format(libs, config)
            self._service = ServiceProcess(
                "kafka",
                self._jvm(libs, "kafka.Kafka", str(config)),
                self.base_dir / "kafka.log",
                self._ready,
                start_timeout=timeout,
                owned_dir=self.base_dir,
                dir_token=self._dir_token,
                secrets=(self._sasl_password, self._store_password),
            )
        self._service.start()
