"""The deployment files in relay/ are checked here, offline, because no Docker engine or cluster
runs in the test suite: the Kubernetes manifests against the Kubernetes JSON schemas shipped by
``kubernetes-validate``, the compose file against the Compose specification's schema vendored by
``check-jsonschema``, and both for the security defaults a reviewer would otherwise have to
re-check by eye (least privilege, hardened containers, pinned images, metrics reachable only
where meant)."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from outboxkit.settings import (
    CONFIG_ENV,
    PREFIX,
    SCHEMA_ENV,
    SECRETS_DIR_ENV,
    ConsumerSettings,
    DatabaseSettings,
    KafkaSettings,
    RelaySettings,
    load_settings,
)

RELAY = Path(__file__).resolve().parents[2] / "relay"
K8S = RELAY / "k8s"
COMPOSE = RELAY / "compose.yaml"
DOCKERFILE = RELAY / "Dockerfile"
INITDB = RELAY / "initdb"

# The oldest Kubernetes the manifests are written for, and the newest the validator knows.
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())

METRICS_PORT = 9400
RELAY_ROLE = "outboxkit_relay"
OWNER_ROLE = "outboxkit_owner"
ROLES = ("outboxkit_owner", "outboxkit_relay", "outboxkit_app", "outboxkit_consumer")
# An exact release (x.y.z, optionally with a variant suffix) or a digest; never `latest` nor a
# moving line such as `3.11-slim`. PostgreSQL numbers its releases major.minor since version 10.
PINNED_TAG = re.compile(r"^v?\d+\.\d+\.\d+([-.][A-Za-z0-9.-]+)?$")
TWO_PART_RELEASES = {"postgres"}
TWO_PART_TAG = re.compile(r"^\d+\.\d+(-[A-Za-z0-9.-]+)?$")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _resources() -> list[dict[str, Any]]:
    """Everything the kustomize base deploys."""
    return [doc for name in _kustomization()["resources"] for doc in _documents(K8S / name)]


def _pod_specs(resources_: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in resources_:
        if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _by_name(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _resources() if d["kind"] == kind}


def _image_user() -> tuple[int, int]:
    """The numeric ``USER uid:gid`` of the Dockerfile's final stage."""
    users = re.findall(r"^USER\s+(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert users, "the relay image must not run as root: no USER in relay/Dockerfile"
    uid, _, gid = users[-1].partition(":")
    # Numeric, because Kubernetes' runAsNonRoot can only verify a numeric user.
    assert uid.isdigit(), f"USER {users[-1]}: not a numeric uid"
    assert gid.isdigit(), f"USER {users[-1]}: not a numeric gid"
    return int(uid), int(gid)


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _compose_schema() -> dict[str, Any]:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "compose-spec.json").read_text())


def _outboxkit_services() -> dict[str, dict[str, Any]]:
    """Compose services that run the outboxkit image (built from relay/Dockerfile)."""
    return {name: svc for name, svc in _compose()["services"].items() if "build" in svc}


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def _secret_names(pod: dict[str, Any]) -> set[str]:
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for container in _containers(pod):
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        names |= {s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s}
    return names


def _image_is_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return False  # untagged: `latest` by default
    pattern = TWO_PART_TAG if name in TWO_PART_RELEASES else PINNED_TAG
    return bool(pattern.match(tag))


# --- Kubernetes ---------------------------------------------------------------------------------


def test_the_kustomize_base_lists_every_manifest_but_no_example_secret() -> None:
    kustomization = _kustomization()
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    for name in listed:
        assert (K8S / name).is_file(), f"kustomization.yaml lists {name}, which does not exist"
    expected = {p.name for p in _manifest_files() if not p.name.endswith(".example.yaml")}
    assert set(listed) == expected
    # Applying the base must never overwrite a real Secret with a placeholder password.
    assert not [d for d in _resources() if d["kind"] == "Secret"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_each_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    documents = _documents(path)
    assert documents
    problems = []
    for doc in documents:
        # strict: unknown fields (a misspelt securityContext key) are errors, not ignored.
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:  # its str() prints the whole schema
            where = ".".join(str(p) for p in exc.path)
            problems.append(f"{doc['kind']} {where}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_the_kubernetes_validation_rejects_a_misspelt_field() -> None:
    deployment = copy.deepcopy(_by_name("Deployment")["outboxkit-relay"])
    context = deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    context["readOnlyRootFileSystem"] = context.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_every_container_is_hardened_and_runs_as_the_image_user() -> None:
    uid, gid = _image_user()
    pods = list(_pod_specs(_resources()))
    assert {name for name, _ in pods} == {"outboxkit-relay", "outboxkit-migrate"}
    for name, pod in pods:
        assert pod.get("automountServiceAccountToken") is False, name
        pod_context = pod.get("securityContext", {})
        for container in _containers(pod):
            where = f"{name}/{container['name']}"
            context = {**pod_context, **container.get("securityContext", {})}
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("runAsNonRoot") is True, where
            assert context.get("runAsUser") == uid, where
            assert context.get("runAsGroup") == gid, where
            assert context.get("privileged", False) is False, where
            assert context.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not context.get("capabilities", {}).get("add"), where
            assert context.get("seccompProfile") == {"type": "RuntimeDefault"}, where
            # A read-only root still needs a writable /tmp.
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, where


def test_every_container_has_resource_requests_and_a_memory_limit() -> None:
    for name, pod in _pod_specs(_resources()):
        for container in _containers(pod):
            requests = container.get("resources", {}).get("requests", {})
            limits = container.get("resources", {}).get("limits", {})
            assert {"cpu", "memory"} <= requests.keys(), name
            assert "memory" in limits, name
    relay = _by_name("Deployment")["outboxkit-relay"]["spec"]["template"]["spec"]["containers"][0]
    limit_mib = int(relay["resources"]["limits"]["memory"].removesuffix("Mi"))
    # The limit is derived from the caps the container sets: the measured peak RSS formula
    # (90 MiB + shards x 5 x max_batch_bytes, docs/relay.md) plus a 25 % margin fits in it.
    env = {e["name"]: e.get("value") for e in relay["env"]}
    shards = int(env["OUTBOXKIT_RELAY_MAX_SHARDS_PER_PROCESS"])
    batch_mib = int(env["OUTBOXKIT_RELAY_MAX_BATCH_BYTES"]) / 2**20
    assert (90 + shards * 5 * batch_mib) * 1.25 <= limit_mib
    from outboxkit.settings import RelaySettings

    for variable in ("OUTBOXKIT_RELAY_MAX_SHARDS_PER_PROCESS", "OUTBOXKIT_RELAY_MAX_BATCH_BYTES"):
        field = variable.removeprefix("OUTBOXKIT_RELAY_").lower()
        assert field in RelaySettings.model_fields, variable  # a real setting, not a comment


def test_the_migrate_job_and_the_relay_use_different_secrets() -> None:
    pods = dict(_pod_specs(_resources()))
    relay = _secret_names(pods["outboxkit-relay"])
    migrate = _secret_names(pods["outboxkit-migrate"])
    assert relay == {"outboxkit-relay"}
    assert migrate == {"outboxkit-migrate"}
    # The example creates both, with the role each part is meant to run as.
    examples = {d["metadata"]["name"]: d for d in _documents(K8S / "secret.example.yaml")}
    assert examples.keys() == relay | migrate
    users = {
        name: urlsplit(doc["stringData"]["database-url"]).username for name, doc in examples.items()
    }
    assert users == {"outboxkit-relay": RELAY_ROLE, "outboxkit-migrate": OWNER_ROLE}


def test_the_example_urls_show_a_percent_encoded_password() -> None:
    for doc in _documents(K8S / "secret.example.yaml"):
        password = urlsplit(doc["stringData"]["database-url"]).password
        assert password
        assert re.fullmatch(r"([A-Za-z0-9._~-]|%[0-9A-Fa-f]{2})+", password)


def test_images_are_pinned_and_agree_with_the_kustomization() -> None:
    images = [c["image"] for _, pod in _pod_specs(_resources()) for c in _containers(pod)]
    assert images
    for image in images:
        assert _image_is_pinned(image), image
    (override,) = _kustomization()["images"]
    assert {f"{override['name']}:{override['newTag']}"} == set(images)


def test_the_relay_opens_its_metrics_port_and_probes_healthz() -> None:
    pod = _by_name("Deployment")["outboxkit-relay"]["spec"]["template"]["spec"]
    relay = pod["containers"][0]
    env = _env(relay)
    assert env["OUTBOXKIT_RELAY_METRICS_HOST"]["value"] == "0.0.0.0"
    assert env["OUTBOXKIT_RELAY_METRICS_PORT"]["value"] == str(METRICS_PORT)
    ports = {p["name"]: p["containerPort"] for p in relay["ports"]}
    assert ports["metrics"] == METRICS_PORT
    for probe in ("readinessProbe", "livenessProbe"):
        get = relay[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        assert get["port"] in ("metrics", METRICS_PORT), probe


def test_the_relay_settings_in_the_manifests_are_ones_the_relay_reads() -> None:
    known = {CONFIG_ENV, SCHEMA_ENV, SECRETS_DIR_ENV}
    for model in (DatabaseSettings, KafkaSettings, RelaySettings, ConsumerSettings):
        prefix = str(model.model_config.get("env_prefix", ""))
        known |= {(prefix + field).upper() for field in model.model_fields}
    for name, pod in _pod_specs(_resources()):
        for container in _containers(pod):
            for var in _env(container):
                if var.startswith(PREFIX):
                    assert var in known, f"{name}: {var} is not a relay setting"


def test_the_configmap_references_resolve_and_its_relay_toml_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configmap = _by_name("ConfigMap")["outboxkit-relay"]
    relay = _by_name("Deployment")["outboxkit-relay"]["spec"]["template"]["spec"]
    for container in relay["containers"]:
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                assert ref["name"] == "outboxkit-relay"
                assert ref["key"] in configmap["data"]
    toml = tmp_path / "relay.toml"
    toml.write_text(configmap["data"]["relay.toml"])
    tomllib.loads(toml.read_text())
    _service_env(monkeypatch)
    assert load_settings(toml).relay.group == "default"


def _service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP", "k:9092")


def test_the_example_toml_still_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    _service_env(monkeypatch)
    assert load_settings(RELAY / "relay.example.toml").relay.metrics_port == METRICS_PORT


# --- Compose ------------------------------------------------------------------------------------


def test_the_compose_file_validates_against_the_compose_specification() -> None:
    schema = _compose_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = [
        f"{'.'.join(str(p) for p in err.absolute_path)}: {err.message}"
        for err in jsonschema.Draft202012Validator(schema).iter_errors(_compose())
    ]
    assert not errors, "\n".join(errors)


def test_the_compose_validation_rejects_a_misspelt_field() -> None:
    document = _compose()
    document["services"]["relay-a"]["readonly"] = document["services"]["relay-a"].pop("read_only")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(_compose_schema()).validate(document)


def test_compose_hardens_the_outboxkit_containers() -> None:
    uid, gid = _image_user()
    services = _outboxkit_services()
    assert set(services) == {"migrate", "relay-a", "relay-b"}
    for name, svc in services.items():
        assert svc.get("read_only") is True, name
        assert svc.get("cap_drop") == ["ALL"], name
        assert not svc.get("cap_add"), name
        assert svc.get("privileged", False) is False, name
        assert svc.get("user") == f"{uid}:{gid}", name
        assert any(t.split(":")[0] == "/tmp" for t in svc.get("tmpfs", [])), name
    for name, svc in _compose()["services"].items():
        assert "no-new-privileges:true" in svc.get("security_opt", []), name


def test_compose_images_are_pinned() -> None:
    for name, svc in _compose()["services"].items():
        assert "image" in svc, f"{name}: name the image (and tag what `build` produces)"
        assert _image_is_pinned(svc["image"]), f"{name}: {svc['image']}"
    for line in re.findall(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), re.MULTILINE):
        assert _image_is_pinned(line), f"relay/Dockerfile: FROM {line}"


def test_compose_runs_no_outboxkit_process_as_the_superuser_and_puts_no_password_in_a_url() -> None:
    compose = _compose()
    users = {}
    for name, svc in _outboxkit_services().items():
        url = svc["environment"]["OUTBOXKIT_DATABASE_URL"]
        parts = urlsplit(url)
        assert parts.password is None, f"{name}: a password in the URL"
        assert "PGPASSWORD" in " ".join(svc["entrypoint"]), name
        users[name] = parts.username
        # Each process gets its own role's password and nothing else.
        assert svc["secrets"] == [f"{parts.username}_password"], name
    assert users == {"migrate": OWNER_ROLE, "relay-a": RELAY_ROLE, "relay-b": RELAY_ROLE}
    superuser = compose["services"]["postgres"]["environment"]["POSTGRES_USER"]
    assert superuser not in users.values()


def test_compose_creates_the_roles_in_the_postgres_init_script() -> None:
    postgres = _compose()["services"]["postgres"]
    assert "./initdb:/docker-entrypoint-initdb.d:ro" in postgres["volumes"]
    scripts = sorted(INITDB.iterdir())
    assert scripts
    text = "\n".join(p.read_text() for p in scripts)
    for role in ROLES:
        assert re.search(rf"CREATE ROLE {role} LOGIN PASSWORD :'\w+'", text), role
        assert f"{role}_password" in postgres["secrets"], role
    # Passwords come from files through psql variables, never spelled out in the script.
    assert not re.search(r"PASSWORD\s+'", text)


def test_compose_opens_metrics_on_loopback_only_and_checks_healthz() -> None:
    for name, svc in _outboxkit_services().items():
        if name == "migrate":
            continue
        env = svc["environment"]
        assert env["OUTBOXKIT_RELAY_METRICS_HOST"] == "0.0.0.0", name
        assert int(env["OUTBOXKIT_RELAY_METRICS_PORT"]) == METRICS_PORT, name
        for port in svc["ports"]:
            host_ip, _, rest = port.partition(":")
            assert host_ip == "127.0.0.1", f"{name}: {port} is published on every interface"
            assert rest.split(":")[1] == str(METRICS_PORT), name
        check = " ".join(svc["healthcheck"]["test"])
        assert f"127.0.0.1:{METRICS_PORT}/healthz" in check, name
        assert svc["deploy"]["resources"]["limits"]["memory"] == "544M", name


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("python:3.11.14-slim-bookworm", True),
        ("apache/kafka:4.1.1", True),
        ("postgres:15.14-bookworm", True),
        ("outboxkit-relay:0.1.0", True),
        ("registry.example.com:5000/outboxkit-relay@sha256:" + "0" * 64, True),
        ("python:3.11-slim", False),
        ("postgres:15", False),
        ("postgres:15-bookworm", False),
        ("outboxkit-relay:latest", False),
        ("outboxkit-relay", False),
        ("registry.example.com:5000/outboxkit-relay", False),
    ],
)
def test_the_pinning_rule(image: str, pinned: bool) -> None:
    assert _image_is_pinned(image) is pinned
