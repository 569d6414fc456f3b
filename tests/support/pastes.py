"""Fixture files of real pasted text, read into blocks: the training-log pastes (tests/fixtures/logs/real) and the
NCCL ones (tests/fixtures/nccl). One layout for both: a block starts at ``=== name`` (a name of one word), its ``key: value`` headers and
``expect: ...`` lines follow, and ``--- verbatim`` starts its text, kept as pasted to the next block."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Block:
    name: str
    headers: dict[str, str] = field(default_factory=dict)
    expects: list[str] = field(default_factory=list)  # each ``expect:`` line's text, for the caller to read
    lines: list[str] = field(default_factory=list)

    @property
    def synthetic(self) -> bool:
        return self.headers.get("synthetic") == "yes"


def read_blocks(path: Path) -> list[Block]:
    blocks: list[Block] = []
    verbatim = False
    for raw in path.read_text(encoding="utf-8").split("\n"):
        if raw.startswith("=== ") and " " not in raw[4:].strip():  # a name is one word: "=== Report ===" is text
            blocks.append(Block(raw[4:].strip()))
            verbatim = False
        elif not blocks:
            continue  # the file's own header
        elif raw == "--- verbatim":
            verbatim = True
        elif verbatim:
            blocks[-1].lines.append(raw)
        elif raw.startswith("expect: "):
            blocks[-1].expects.append(raw[len("expect: ") :])
        elif ": " in raw:
            key, _, value = raw.partition(": ")
            blocks[-1].headers[key] = value
    for block in blocks:
        while block.lines and not block.lines[-1]:
            block.lines.pop()  # the blank line between blocks
    return blocks
