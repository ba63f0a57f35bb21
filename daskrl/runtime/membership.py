"""Workers joining and leaving, as the scheduler reports them to the driver.

:class:`MembershipPlugin` runs on the scheduler and publishes every worker that joins or
leaves on :data:`MEMBERSHIP_TOPIC`; the driver's :class:`Membership` takes those reports,
so it checks the workers its replicas are pinned to as often as it likes without asking
the scheduler.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

MEMBERSHIP_TOPIC = "daskrl-membership"
"""The scheduler event topic on which :class:`MembershipPlugin` reports workers."""


class Membership:
    """Workers that joined and left, in the order they were reported.

    Each report advances a cursor; :meth:`left_since` answers from what was reported, so a
    driver checks its pinned workers as often as it likes without asking the scheduler.
    A worker restarted at its old address still counts as left after the cursor taken
    before its restart (its state went with it).

    Examples
    --------
    >>> m = Membership()
    >>> before = m.cursor()
    >>> m.on_event((0.0, {"action": "remove-worker", "worker": "tcp://a:1"}))
    >>> m.left_since(before), m.left_since(m.cursor())
    ({'tcp://a:1'}, set())
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._count = 0
        self._left: dict[str, int] = {}  # address -> the count at its last departure
        self._joined: dict[str, int] = {}  # address -> the count at its last arrival

    def cursor(self) -> int:
        """How many reports (joins, departures, subscriptions) came so far."""
        with self._changed:
            return self._count

    def left_since(self, cursor: int) -> set[str]:
        """Addresses of the workers that left after ``cursor``."""
        with self._changed:
            return {addr for addr, at in self._left.items() if at > cursor}

    def joined_since(self, cursor: int) -> set[str]:
        """Addresses of the workers that joined after ``cursor`` and are still there.

        Examples
        --------
        >>> m = Membership()
        >>> before = m.cursor()
        >>> m.on_event((0.0, {"action": "add-worker", "worker": "tcp://b:1"}))
        >>> m.joined_since(before), m.joined_since(m.cursor())
        ({'tcp://b:1'}, set())
        """
        with self._changed:
            return {addr for addr, at in self._joined.items()
                    if at > cursor and self._left.get(addr, -1) < at}

    def wait(self, cursor: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a report after ``cursor``; whether one came."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count > cursor, timeout=timeout)

    def on_event(self, event: tuple[float, Mapping[str, Any]]) -> None:
        """Take one ``(timestamp, message)`` event of :data:`MEMBERSHIP_TOPIC`."""
        _, msg = event
        with self._changed:
            self._count += 1
            if msg.get("action") == "remove-worker":
                self._left[str(msg["worker"])] = self._count
            elif msg.get("action") == "add-worker":
                self._joined[str(msg["worker"])] = self._count
            self._changed.notify_all()


class MembershipPlugin(SchedulerPlugin):
    """Reports every worker that joins or leaves on :data:`MEMBERSHIP_TOPIC`.

    The scheduler calls these hooks as it adds and removes workers; clients that subscribe
    to the topic (``Client.subscribe_topic``) hear of a lost worker as soon as the
    scheduler does.
    """

    name = "daskrl-membership"
    idempotent = True  # one per scheduler, shared by every driver connected to it

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """Report a joining worker."""
        scheduler.log_event(MEMBERSHIP_TOPIC, {"action": "add-worker", "worker": worker})

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        """Report a leaving worker (closed, lost or retired)."""
        scheduler.log_event(MEMBERSHIP_TOPIC, {"action": "remove-worker", "worker": worker})
