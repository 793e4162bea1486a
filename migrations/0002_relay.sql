-- outboxkit 0002: relay leases (fencing tokens) and cross-process controls.

-- Fencing tokens come from one logged sequence, so a token only ever grows, even if a lease row
-- is deleted and re-created.
CREATE SEQUENCE relay_fencing_token_seq AS bigint;

-- One lease per (relay group, shard). Expiry is judged by the database clock (now()).
-- holder IS NULL means released: any standby may take it at once.
CREATE TABLE relay_lease (
    relay_group text NOT NULL,
    shard       integer NOT NULL,
    holder      text,
    token       bigint NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (relay_group, shard)
);

-- Emergency controls every relay of the group obeys within one poll interval.
CREATE TABLE relay_control (
    relay_group text PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    reason      text,
    changed_by  text,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

