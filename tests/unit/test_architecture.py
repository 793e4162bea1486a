"""The seams hold: each engine is reached from one package, and importing the runtime stays lean.

Read from the source (``ast``), so a violation names the module and line:
- only ``outboxkit/kafka/`` imports a Kafka client library (verify reads back through it);
- only ``outboxkit/db/`` (and the dev tooling: ``devstack/``, ``pytest_plugin.py``, ``verify/``)
  connects to PostgreSQL, opens cursors, or executes SQL it wrote itself;
- only ``outboxkit/db/`` makes a SQLAlchemy engine (each one of ours never lets libpq prompt);
- no runtime module is much over 400 lines;
- ``import outboxkit, outboxkit.relay, outboxkit.inbox`` imports neither pytest nor the dev stack.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "outboxkit"
KAFKA_LIBRARIES = ("confluent_kafka", "aiokafka")
# The verify runner is dev tooling too: it reads PostgreSQL and Kafka back on its own, not
# through the seams whose behaviour it is there to check.
DEV_TOOLING = ("devstack/", "pytest_plugin.py", "verify/")
MAX_LINES = 400


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), filename=str(path))


def _imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif (
            isinstance(node, ast.Call)
            and _called_name(node).endswith("import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _called_name(call: ast.Call) -> str:
    """``a.b.c`` for a call of ``a.b.c(...)``; the attribute chain as written."""
    parts = []
    func: ast.expr = call.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _is_sql_text(node: ast.expr) -> bool:
    """An argument that is SQL written here: a literal, an f-string, a concatenation of those,
    or SQL built with ``text()``/``sql.SQL()``/``query()`` (the loader's text, run by hand)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return True
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _is_sql_text(node.left) or _is_sql_text(node.right)
    if isinstance(node, ast.Call):
        name = _called_name(node).split(".")[-1]
        if name in ("text", "SQL", "Composed", "query", "format", "encode"):
            return True
    return False


def _sql_violations(tree: ast.AST) -> Iterator[str]:
    names_from_psycopg: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("psycopg"):
            if node.module == "psycopg.sql":
                yield f"{node.lineno}: imports psycopg.sql (builds SQL)"
            for alias in node.names:
                if alias.name == "sql":
                    yield f"{node.lineno}: imports psycopg.sql (builds SQL)"
                names_from_psycopg.add(alias.asname or alias.name)
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("sqlalchemy")
        ):
            for alias in node.names:
                if alias.name == "text":
                    yield f"{node.lineno}: imports sqlalchemy.text"
        if not isinstance(node, ast.Call):
            continue
        name = _called_name(node)
        last = name.split(".")[-1]
        if name in (
            "psycopg.connect",
            "psycopg.AsyncConnection.connect",
            "psycopg.Connection.connect",
        ):
            yield f"{node.lineno}: {name}()"
        elif last == "connect" and name.split(".")[0] in names_from_psycopg:
            yield f"{node.lineno}: {name}() (psycopg)"
        elif last == "cursor":
            yield f"{node.lineno}: .cursor()"
        elif name in ("sa.text", "sqlalchemy.text", "text") or last == "exec_driver_sql":
            yield f"{node.lineno}: {name}()"
        elif last in ("execute", "executemany") and node.args and _is_sql_text(node.args[0]):
            yield f"{node.lineno}: .{last}() of SQL written here"


def _sql_allowed(relative: str) -> bool:
    return relative.startswith("db/") or relative.startswith(DEV_TOOLING)


def test_only_the_kafka_package_imports_a_kafka_client() -> None:
    found = [
        f"outboxkit/{_relative(path)}:{line}: {module}"
        for path in _modules()
        if not _relative(path).startswith("kafka/")
        for line, module in _imported_modules(_tree(path))
        if module.split(".")[0] in KAFKA_LIBRARIES
    ]
    assert found == [], "Kafka client imported outside outboxkit/kafka/:\n" + "\n".join(found)


def test_only_the_db_package_runs_sql() -> None:
    found = [
        f"outboxkit/{_relative(path)}:{violation}"
        for path in _modules()
        if not _sql_allowed(_relative(path))
        for violation in _sql_violations(_tree(path))
    ]
    assert found == [], "SQL run outside outboxkit/db/:\n" + "\n".join(found)


_ENGINE_MAKERS = (
    "create_engine",
    "create_async_engine",
    "engine_from_config",
    "async_engine_from_config",
)


def _engine_calls(tree: ast.AST) -> Iterator[str]:
    """Every mention of an engine maker: a call, an attribute (``sa.create_engine`` passed on)
    or an import (``from sqlalchemy import create_engine as make``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _ENGINE_MAKERS:
            yield f"{node.lineno}: .{node.attr}"
        elif isinstance(node, ast.Name) and node.id in _ENGINE_MAKERS:
            yield f"{node.lineno}: {node.id}"
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in _ENGINE_MAKERS:
                    yield f"{node.lineno}: imports {alias.name}"


def test_only_the_db_package_makes_engines() -> None:
    """The dev tooling too: ``verify`` and the demo connect through the same URL rules."""
    found = [
        f"outboxkit/{_relative(path)}:{violation}"
        for path in _modules()
        if not _relative(path).startswith("db/")
        for violation in _engine_calls(_tree(path))
    ]
    assert found == [], "SQLAlchemy engine made outside outboxkit/db/:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "sa.create_engine(url)",
        "create_async_engine(url, pool_size=1)",
        "from sqlalchemy import create_engine as make",
        "functools.partial(sqlalchemy.create_engine, url)",
        "sa.engine_from_config(options)",
    ],
)
def test_the_engine_scan_sees_every_form(source: str) -> None:
    assert list(_engine_calls(ast.parse(source))) != []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import confluent_kafka", {"confluent_kafka"}),
        ("from aiokafka.admin import AIOKafkaAdminClient", {"aiokafka.admin"}),
        ("def f():\n    import confluent_kafka.admin", {"confluent_kafka.admin"}),
        ("importlib.import_module('aiokafka')", {"aiokafka"}),
        ("from outboxkit.kafka import KafkaClients", {"outboxkit.kafka"}),
    ],
)
def test_the_import_scan_sees_every_form(source: str, expected: set[str]) -> None:
    assert {module for _, module in _imported_modules(ast.parse(source))} == expected


@pytest.mark.parametrize(
    "source",
    [
        "import psycopg\npsycopg.connect(url)",
        "from psycopg import AsyncConnection\nAsyncConnection.connect(url)",
        "with conn.cursor() as cur: pass",
        "conn.execute('SELECT 1')",
        "conn.execute(f'SELECT {x}')",
        "conn.execute(sa.text('SELECT 1'))",
        "conn.execute(query('relay', 'status', schema), {})",
        "from psycopg import sql\nconn.execute(sql.SQL('LISTEN {}').format(x))",
        "from sqlalchemy import text",
        "conn.exec_driver_sql('SELECT 1')",
    ],
)
def test_the_sql_scan_sees_every_form(source: str) -> None:
    assert list(_sql_violations(ast.parse(source)))


@pytest.mark.parametrize(
    "source",
    [
        "session.execute(sa.select(table))",  # SQLAlchemy Core/ORM on the user's own tables
        "db.run(conn, db.query('relay', 'status', schema), {})",
        "except psycopg.Error: pass",
        "isinstance(conn, psycopg.Connection)",
    ],
)
def test_the_sql_scan_allows_the_seam_and_orm_code(source: str) -> None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = ast.parse(f"try:\n    pass\n{source}")
    assert list(_sql_violations(tree)) == []


def test_no_runtime_module_is_much_over_400_lines() -> None:
    long = {
        f"outboxkit/{_relative(path)}": lines
        for path in _modules()
        if not _relative(path).startswith(DEV_TOOLING)
        and (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


_IMPORT_PROBE = """
import json, sys
import outboxkit, outboxkit.relay, outboxkit.inbox
print(json.dumps(sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("pytest", "_pytest") or m.startswith("outboxkit.devstack")
)))
"""


def test_importing_the_runtime_loads_neither_pytest_nor_the_dev_stack() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
