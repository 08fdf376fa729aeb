"""Text of a generation as it streams: safe deltas, stop sequences cut out.

Each step's committed tokens are decoded with everything before them (a token alone may be half a character or
lose its leading space), and a delta goes out only up to what later tokens cannot change: not a trailing
replacement character (bytes of a character still to come), not a tail that could be the start of a stop sequence.
The text ends before the first stop sequence (OpenAI's semantics: the stop sequence is not returned).  The deltas
sent always add up to :attr:`text`.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.stops = tokenizer, stops
        self.tokens: list[int] = []
        self.sent = ""  # the text already handed out
        self.stopped = False  # a stop sequence was found: the text is final

    def _decoded(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def _cut(self, text: str) -> str:
        """``text`` up to its first stop sequence (marking the stream stopped when there is one)."""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            return text[: min(hits)]
        return text

    def push(self, tokens: list[int]) -> str:
        """Take a step's tokens; the new text that is safe to send now (may be empty)."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        text = self._cut(self._decoded())
        if not self.stopped:
            safe = len(text.rstrip("\ufffd"))
            for s in self.stops:  # hold back a tail that may grow into a stop sequence
                for k in range(min(len(s) - 1, safe), 0, -1):
                    if text[:safe].endswith(s[:k]):
                        safe -= k
                        break
            text = text[:safe]
        return self._send(text)

    def finish(self) -> str:
        """The rest of the text, at the end of the generation."""
        return self._send(self.text)

    @property
    def text(self) -> str:
        return self._cut(self._decoded())

    def _send(self, text: str) -> str:
        if not text.startswith(self.sent):  # a decoder that rewrote earlier text: nothing until it settles
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta
