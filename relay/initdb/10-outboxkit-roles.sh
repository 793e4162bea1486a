#!/bin/sh
# Creates the outboxkit roles on first start of the compose PostgreSQL (the image runs the files
# in /docker-entrypoint-initdb.d once, when the data volume is empty, as the superuser).
#
#   outboxkit_owner     owns the outboxkit schema: `outboxkit migrate up` runs as this role
#   outboxkit_relay     the relay
#   outboxkit_app       the application writing outbox rows
#   outboxkit_consumer  consumers writing inbox rows
#
# Each password is read from a file (compose secrets in /run/secrets), never from argv or the
# environment of a long-running process. psql's :'var' quoting makes any character safe.
set -eu

secrets="${OUTBOXKIT_SECRETS_DIR:-/run/secrets}"
for role in owner relay app consumer; do
  if [ ! -s "$secrets/outboxkit_${role}_password" ]; then
    echo "missing or empty secret $secrets/outboxkit_${role}_password" >&2
    exit 1
  fi
done

export OUTBOXKIT_SECRETS_DIR="$secrets"
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v db="$POSTGRES_DB" <<'SQL'
\set owner_password `cat "$OUTBOXKIT_SECRETS_DIR/outboxkit_owner_password"`
\set relay_password `cat "$OUTBOXKIT_SECRETS_DIR/outboxkit_relay_password"`
\set app_password `cat "$OUTBOXKIT_SECRETS_DIR/outboxkit_app_password"`
\set consumer_password `cat "$OUTBOXKIT_SECRETS_DIR/outboxkit_consumer_password"`

CREATE ROLE outboxkit_owner LOGIN PASSWORD :'owner_password';
CREATE ROLE outboxkit_relay LOGIN PASSWORD :'relay_password';
CREATE ROLE outboxkit_app LOGIN PASSWORD :'app_password';
CREATE ROLE outboxkit_consumer LOGIN PASSWORD :'consumer_password';

-- Only these roles may connect; only the owner may create the schema.
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT, CREATE ON DATABASE :"db" TO outboxkit_owner;
GRANT CONNECT ON DATABASE :"db" TO outboxkit_relay, outboxkit_app, outboxkit_consumer;

-- PLACEHOLDER, deliberately empty: the grants on the outboxkit schema and its tables (which
-- role may read or write what) belong with the migrations that create those tables, so they
-- cannot drift from them. See `outboxkit migrate --help` and the security section of the docs.
-- Until they are applied the relay, application and consumer roles can connect but cannot use
-- the outboxkit tables.
SQL
