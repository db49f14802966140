"""A process-wide on/off switch for an optional fast path (the same bits either way)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Switch:
    """``on`` until a block of :meth:`off` (for comparisons, tests and benchmarks)."""

    def __init__(self) -> None:
        self.on = True

    @contextmanager
    def off(self) -> Iterator[None]:
        """Within the block ``on`` is False; the previous value comes back after it."""
        saved, self.on = self.on, False
        try:
            yield
        finally:
            self.on = saved
