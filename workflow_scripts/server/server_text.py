"""Incremental detokenization and stop-string matching for one request, as SGLang's detokenizer does it.

Byte-level BPE can end a step in the middle of a UTF-8 character; the decoder then yields U+FFFD. Until the
request finishes, such a trailing partial character is held back, and so is a tail that may still grow into a
stop string, so that the text shown only ever grows.
Stop strings are matched on the decoded text one token at a time, so a speculative step that commits several
tokens still stops at the first token that completes a stop string; the text is cut before the stop string
(unless `no_stop_trim`), the ids keep that token, as in SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"


class OutputText:
    """Cumulative output ids and text of one request."""

    def __init__(self, decode: Callable[[list[int]], str], stop_strs: Sequence[str] = (), no_stop_trim: bool = False):
        self._decode = decode
        self._stop_strs = tuple(stop_strs)
        self._max_stop_len = max((len(s) for s in self._stop_strs), default=0)
        self._no_stop_trim = no_stop_trim
        self._full = ""  # decoded text of all ids, possibly ending in a partial character
        self.output_ids: list[int] = []
        self.matched_stop: str | None = None
        self._stopped_text: str | None = None

    def extend(self, new_ids: Sequence[int]) -> str | None:
        """Append committed ids; returns the stop string they completed, if any (later ids are then dropped)."""
        if self.matched_stop is not None:
            return self.matched_stop
        if not self._stop_strs:
            self.output_ids.extend(new_ids)
            self._full = self._decode(self.output_ids)
            return None
        for token in new_ids:
            previous_len = len(self._full)
            self.output_ids.append(token)
            self._full = self._decode(self.output_ids)
            # A match must end in the new text; it may start up to len(stop)-1 chars before it.
            window_start = max(0, previous_len - self._max_stop_len + 1)
            hits = [(self._full.find(s, window_start), s) for s in self._stop_strs]
            hits = [(pos, s) for pos, s in hits if pos >= 0]
            if hits:
                pos, stop = min(hits)
                self.matched_stop = stop
                self._stopped_text = self._full[: pos + len(stop)] if self._no_stop_trim else self._full[:pos]
                return stop
        return None

    def text(self, finished: bool) -> str:
        """The text to show now. While the request runs: complete characters only, and not a tail that may yet
        become a stop string, so that the text shown only ever grows (incremental streaming sends deltas of it)."""
        if self._stopped_text is not None:
            return self._stopped_text
        if finished:
            return self._full
        shown = self._full.rstrip(REPLACEMENT_CHAR)
        return shown[: len(shown) - self._stop_prefix_len(shown)]

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        for n in range(min(self._max_stop_len - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self._stop_strs):
                return n
        return 0
