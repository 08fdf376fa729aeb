"""Text of a generation as it streams: incremental deltas, stop sequences cut out.

Each step's tokens are decoded with the previous step's tokens before them (a token alone may be half a character
or lose its leading space): the delta is what the longer decode adds to the shorter one, as vLLM's incremental
detokenizer does, so a step costs the decode of two steps' tokens however long the generation.  Nothing is released
while the decode ends in a replacement character (bytes of a character still to come).  The text is the sum of the
deltas — the same for a streamed and a whole answer — and ends before the first stop sequence (OpenAI's semantics);
a streamed delta holds back a tail that may still grow into a stop sequence.  A step costs time linear in the new
text and the stop sequences' lengths, never in the length of the answer so far.
"""

from __future__ import annotations


def ends_table(stop: str) -> dict[str, list[int]]:
    """For each character, the lengths k (longest first, below ``len(stop)``) of the prefixes of ``stop`` that end
    with it: the only prefixes a text ending with that character can end with."""
    table: dict[str, list[int]] = {}
    for k in range(len(stop) - 1, 0, -1):
        table.setdefault(stop[k - 1], []).append(k)
    return table


def held_back(text: str, stop: str, table: dict[str, list[int]]) -> int:
    """The length of the longest proper prefix of ``stop`` that ``text`` ends with (text that may still grow into
    ``stop``): only the prefixes ending with ``text``'s last character are tried."""
    if not text:
        return 0
    for k in table.get(text[-1], ()):
        if text.endswith(stop[:k]):
            return k
    return 0


class TextStream:
    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.stops = tokenizer, stops
        self.tables = [ends_table(s) for s in stops]
        self.longest = max((len(s) for s in stops), default=0)
        self.tokens: list[int] = []
        self.prefix_offset = self.read_offset = 0  # tokens[prefix:read] decoded as context; read: released up to
        self.decoded = ""  # the text of tokens[:read_offset]
        self.scanned = 0  # characters of the text searched for stop sequences (a match may start in its last ones)
        self.sent = 0  # characters of the text already handed out
        self.stopped = False  # a stop sequence was found: the text is final

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _advance(self, final: bool) -> None:
        """Move the decoded text forward over the tokens not yet read (all of them when ``final``)."""
        if self.read_offset == len(self.tokens):
            return
        context = self._decode(self.tokens[self.prefix_offset:self.read_offset])
        text = self._decode(self.tokens[self.prefix_offset:])
        if (len(text) > len(context) and not text.endswith("\ufffd")) or final:
            self.decoded += text[len(context):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        start = max(0, self.scanned - self.longest + 1)  # only the new text, and what a match may start before it
        hits = [i for i in (self.decoded.find(s, start) for s in self.stops) if i >= 0]
        self.scanned = len(self.decoded)
        if hits:
            self.stopped = True
            self.decoded = self.decoded[: min(hits)]

    def push(self, tokens: list[int]) -> str:
        """Take a step's tokens; the new text that is safe to send now (may be empty)."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        self._advance(final=False)
        safe = len(self.decoded)
        if not self.stopped:
            for s, table in zip(self.stops, self.tables):  # hold back a tail that may grow into a stop sequence
                safe = min(safe, len(self.decoded) - held_back(self.decoded, s, table))
        return self._send(max(safe, self.sent))

    def finish(self) -> str:
        """The rest of the text, at the end of the generation."""
        if not self.stopped:
            self._advance(final=True)
        return self._send(len(self.decoded))

    @property
    def text(self) -> str:
        return self.decoded

    def _send(self, upto: int) -> str:
        delta, self.sent = self.decoded[self.sent:upto], upto
        return delta
