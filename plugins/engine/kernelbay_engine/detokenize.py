"""Incremental text of one request: stable deltas for streaming and stop-string detection."""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"  # what decode() shows for the first bytes of a character split across tokens


class TextTracker:
    """Decodes a request's generated ids; holds back text that may still change or end in a stop string."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: tuple[str, ...]):
        self.decode = decode
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.emitted = 0
        """Characters of `text` already handed out as deltas."""

    def update(self, token_ids: Sequence[int]) -> bool:
        """Re-decode after a new token; True when a stop string appeared (the text is cut before it)."""
        self.text = self.decode(token_ids)
        cut = self._first_stop()
        if cut is not None:
            self.text = self.text[:cut]
            return True
        return False

    def delta(self, final: bool) -> str:
        """New stable text since the previous call (everything left when `final`)."""
        end = len(self.text)
        if not final:
            end -= self.holdback
            while end > self.emitted and self.text[end - 1] == REPLACEMENT_CHAR:
                end -= 1
        if end <= self.emitted:
            return ""
        piece, self.emitted = self.text[self.emitted : end], end
        return piece

    def _first_stop(self) -> int | None:
        hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None
