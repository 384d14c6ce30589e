"""Is this report news? A pure decision over a node's last accepted (sequence, sent_at) and the incoming one.

Agents number their reports 1, 2, 3, ... and retry on failure, so the control plane sees duplicates and
out-of-order deliveries; an agent that restarts counts from the start again. The rule:

- first report from a node, or a higher sequence: NEW (apply it). Clocks are not consulted here, so a wall
  clock stepped back by NTP never silences a healthy agent;
- a sequence at or below the last one, sent *later* than the last accepted report: RESET (the agent restarted
  and its counter started over; apply it and remember the new, lower sequence);
- the same sequence sent at the same instant: DUPLICATE (a retry of what we already hold; acknowledge only);
- anything else (lower sequence, sent earlier): OUT_OF_ORDER (dropped, and the agent is told: a 409 that carries
  the last sequence, so an agent that restarted while its clock was behind its previous run's carries on past it).

The last ``sent_at`` is only trusted up to ``horizon`` (the control plane's clock plus the clock skew it accepts):
one later was written by a clock far ahead, before reports were held to the skew bound, and would hide every
restart until the agent's clock caught up with it. Past the horizon, a lower sequence is a RESET.

Known corner: a retry from before a restart that arrives after the reset carries a higher sequence and is
taken as NEW; the agent's very next report (lower sequence, later ``sent_at``) is a RESET and heals it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum


class Verdict(StrEnum):
    NEW = "new"
    RESET = "reset"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"

    @property
    def applies(self) -> bool:
        return self in (Verdict.NEW, Verdict.RESET)


def classify(
    *,
    last_sequence: int | None,
    last_sent_at: datetime | None,
    sequence: int,
    sent_at: datetime,
    horizon: datetime | None = None,
) -> Verdict:
    """Decide what to do with a report numbered ``sequence``, sent at ``sent_at``; a last ``sent_at`` later than
    ``horizon`` (None: no bound) is not trusted."""
    if last_sequence is None or last_sent_at is None or sequence > last_sequence:
        return Verdict.NEW
    if sent_at > last_sent_at or (horizon is not None and last_sent_at > horizon):
        return Verdict.RESET
    if sequence == last_sequence and sent_at == last_sent_at:
        return Verdict.DUPLICATE
    return Verdict.OUT_OF_ORDER
