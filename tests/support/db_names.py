"""The database a test's URL names (the dev stack's URLs carry libpq options after a '?')."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit


def database_of(url: str) -> str:
    return unquote(urlsplit(url).path.lstrip("/"))
