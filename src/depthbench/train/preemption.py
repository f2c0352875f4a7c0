"""Preemption: SIGTERM/SIGINT become a flag the training loop checks at each step,
so it checkpoints at the next step boundary and ends ``"preempted"``."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator


class Preemption:
    """SIGTERM/SIGINT set a flag the loop checks at each step boundary.

    A second SIGINT aborts at once (KeyboardInterrupt), as a user expects.
    Handlers are installed only from the main thread and restored on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None

    def _handle(self, signum, frame):
        del frame
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        print(f"\nreceived {signal.Signals(signum).name}: saving a checkpoint at the next step "
              "boundary (press Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Preemption]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
