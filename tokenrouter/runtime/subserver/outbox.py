"""Where a subserver's messages go: a step's outbox is a list of (destination, message) pairs, the destination
a peer model's name or `FRONTEND`. Apart from the scheduler (and torch), so that the process module, which the
launcher imports to start subservers, stays light."""

from __future__ import annotations

import msgspec

FRONTEND = "@frontend"  # destination of messages for the frontend (model names are identifiers)
Outbox = list[tuple[str, msgspec.Struct]]
