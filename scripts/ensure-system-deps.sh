#!/usr/bin/env bash
# Makes sure the machine has what the self-started services need: PostgreSQL server binaries,
# Java 17+ (java and keytool), Maven, and OpenSSL (certificates for the SASL_SSL dev Kafka).
# Installs missing ones from Debian's packages when run as root; otherwise says exactly what is
# missing.
set -euo pipefail

missing=()
pg_ok=false
for dir in "${OUTBOXKIT_PG_BINDIR:-}" "$(pg_config --bindir 2>/dev/null || true)" \
           /usr/lib/postgresql/15/bin /usr/lib/postgresql/16/bin /usr/lib/postgresql/17/bin; do
  if [ -n "$dir" ] && [ -x "$dir/postgres" ] && [ -x "$dir/initdb" ]; then pg_ok=true; break; fi
done
$pg_ok || missing+=(postgresql)
if ! command -v java >/dev/null 2>&1 || ! command -v keytool >/dev/null 2>&1; then
  missing+=(openjdk-17-jre-headless)
fi
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-venv)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "missing system packages: ${missing[*]}" >&2
  echo "install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}), or point" >&2
  echo "OUTBOXKIT_DATABASE_URL / OUTBOXKIT_KAFKA_BOOTSTRAP at services you already run." >&2
  exit 1
fi
