#!/usr/bin/env bash
# Makes sure the machine has what `make` and the self-started services need: Python 3 with the
# venv module (and its ensurepip), PostgreSQL server binaries, Java 17+ (java and keytool), Maven,
# and OpenSSL (certificates for the SASL_SSL dev Kafka).
# Installs missing ones from Debian's packages when run as root. Otherwise it says exactly what is
# missing, leaving out what only a service named by OUTBOXKIT_DATABASE_URL (PostgreSQL) or
# OUTBOXKIT_KAFKA_BOOTSTRAP (Java, Maven, OpenSSL) would need: such a service is not started here.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${VENV:-.venv}"
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac

base=() postgres=() kafka=()
pg_ok=false
for dir in "${OUTBOXKIT_PG_BINDIR:-}" "$(pg_config --bindir 2>/dev/null || true)" \
           /usr/lib/postgresql/15/bin /usr/lib/postgresql/16/bin /usr/lib/postgresql/17/bin; do
  if [ -n "$dir" ] && [ -x "$dir/postgres" ] && [ -x "$dir/initdb" ]; then pg_ok=true; break; fi
done
$pg_ok || postgres+=(postgresql)
if ! command -v java >/dev/null 2>&1 || ! command -v keytool >/dev/null 2>&1; then
  kafka+=(openjdk-17-jre-headless)
fi
command -v mvn >/dev/null 2>&1 || kafka+=(maven)
command -v openssl >/dev/null 2>&1 || kafka+=(openssl)
if ! command -v python3 >/dev/null 2>&1; then
  base+=(python3 python3-venv)
elif ! "$venv/bin/python" -m pip --version >/dev/null 2>&1 \
     && ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  # Debian's python3 comes without ensurepip: `python3 -m venv` would fail (the venv is made,
  # or made again after a run cut short left it without pip).
  base+=(python3-venv)
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  # Everything, even for a service given by a variable: the test suite's dev-stack and SASL_SSL
  # tests always start their own PostgreSQL and Kafka.
  missing=("${base[@]}" "${postgres[@]}" "${kafka[@]}")
  [ ${#missing[@]} -eq 0 ] && exit 0
  echo "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  exit 0
fi
[ -n "${OUTBOXKIT_DATABASE_URL:-}" ] && postgres=()
[ -n "${OUTBOXKIT_KAFKA_BOOTSTRAP:-}" ] && kafka=()
missing=("${base[@]}" "${postgres[@]}" "${kafka[@]}")
[ ${#missing[@]} -eq 0 ] && exit 0
echo "missing system packages: ${missing[*]}" >&2
echo "install them (Debian/Ubuntu: sudo apt-get install ${missing[*]})" >&2
if [ ${#postgres[@]} -gt 0 ] || [ ${#kafka[@]} -gt 0 ]; then
  echo "or point OUTBOXKIT_DATABASE_URL / OUTBOXKIT_KAFKA_BOOTSTRAP at services you already run." >&2
fi
exit 1
