"""``outboxkit demo``: the guarantees shown under failure, then checked from the rows.

Concurrent writers, two relays (the active one SIGKILLed, the standby taking over), a consumer
killed between its database commit and its offset commit; a live view while it runs and a
verification table at the end (:mod:`outboxkit.demo.checks`).
"""

from outboxkit.demo.checks import Check
from outboxkit.demo.processes import Services
from outboxkit.demo.scenario import DemoError, DemoOptions, DemoResult, run_demo
from outboxkit.demo.writers import WritePlan

__all__ = ["Check", "DemoError", "DemoOptions", "DemoResult", "Services", "WritePlan", "run_demo"]
