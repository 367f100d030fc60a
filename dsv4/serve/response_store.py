"""Responses kept in memory for `previous_response_id` and `GET` / `DELETE /v1/responses/{id}` (`dsv4 serve
--responses-store N`).

Each stored response keeps its own turn only -- the messages its `input` added and its reply as an assistant
message -- and the id of the response it continued, so a conversation of many turns is stored once, not once per
turn. The history of a new turn is the chain of turns back to the first. The least recently used responses go first
when more than `capacity` are kept or their text exceeds `max_chars`; a chain with an evicted turn cannot be
continued (a 400 that says so). Nothing is written to disk: a restart forgets everything.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from .chat_bridge import RequestError

MAX_CHARS = 64 << 20  # stored message text, all responses together


@dataclass
class StoredResponse:
    parent: str | None       # the response this one continued
    messages: list[dict]     # this turn's chat messages: its input's, then the reply
    body: dict               # the response object as returned
    chars: int


class ResponseStore:
    def __init__(self, capacity: int, max_chars: int = MAX_CHARS):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"ResponseStore: capacity={capacity!r}; expected an integer >= 1")
        self.capacity, self.max_chars = capacity, max_chars
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, parent: str | None, messages: list[dict], body: dict) -> None:
        chars = len(json.dumps(messages, ensure_ascii=False))
        self._entries[response_id] = StoredResponse(parent, messages, body, chars)
        self.chars += chars
        while len(self._entries) > self.capacity or (self.chars > self.max_chars and len(self._entries) > 1):
            _, old = self._entries.popitem(last=False)
            self.chars -= old.chars

    def get(self, response_id: str) -> dict | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)
        return entry.body

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.chars -= entry.chars
        return entry is not None

    def history(self, response_id: str) -> list[dict]:
        """The chat messages of the conversation that ends with `response_id` (each turn's, oldest first); the whole
        chain counts as used now."""
        chain, at = [], response_id
        while at is not None:
            entry = self._entries.get(at)
            if entry is None:
                which = "" if at == response_id else f" (it continues {at!r}, which is not)"
                raise RequestError(f"previous_response_id: response {response_id!r} is not stored{which}; "
                                   "send the whole conversation in input", "previous_response_id")
            chain.append((at, entry))
            at = entry.parent
        chain.reverse()  # oldest first, so the newest ends up most recently used
        for entry_id, _ in chain:
            self._entries.move_to_end(entry_id)
        return [m for _, entry in chain for m in entry.messages]
