"""Every CLI command that connects to the database and returns (``relay run`` and
``inbox run`` do not end by themselves), for the tests that run them all with a bad URL."""

SHORT_COMMANDS = [
    ["relay", "status"],
    ["relay", "pause"],
    ["relay", "resume"],
    ["relay", "shards", "4"],
    ["outbox", "parked"],
    ["outbox", "retry", "--all"],
    ["outbox", "discard", "--all"],
    ["inbox", "show"],
    ["inbox", "stats"],
    ["inbox", "purge", "--older-than", "60", "--all-consumers"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "e"],
    [
        "inbox",
        "replay",
        "--consumer",
        "c",
        "--dead-letter-topic",
        "t",
        "--bootstrap",
        "127.0.0.1:1",
    ],
    ["migrate", "up"],
    ["migrate", "status"],
    ["migrate", "check"],
    ["migrate", "grants", "--app", "app", "--apply"],
    ["config", "show"],
]
