"""``python -m outboxkit.relay run ...``: the same as ``outboxkit relay ...``."""

from outboxkit.cli.relay import relay

if __name__ == "__main__":
    relay(prog_name="python -m outboxkit.relay")
