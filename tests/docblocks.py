"""The command blocks of the project's documents, each with where it runs.

Every ``sh`` block of README.md and docs/ carries, on the line before it, a comment
saying where its commands run (``<!-- run on: master -->``) or which test or CI step runs
them (``<!-- run by: tests/vagrant/test_vagrant.py -->``); the install guide's block of
site values is marked ``<!-- site values -->``. Tests take the blocks from the documents
themselves, so a command in a document is the command that is run.
"""

import dataclasses
import re

LANGUAGES = ("sh", "bash", "shell", "console")
_MARK_RE = re.compile(r"^<!--\s*(?:run (?P<kind>on|by):\s*(?P<where>[^>]+?)|"
                      r"(?P<values>site values))\s*-->$")


class BlockError(Exception):
    """A document's command block has no mark, or one naming no known place."""


@dataclasses.dataclass
class Block:
    path: str        # the document, as named in messages
    line: int        # the first command line, 1-based
    kind: str        # "on", "by" or "site values"
    where: str       # a place ("on"), paths of the tests that run it ("by"), or ""
    text: str


def blocks(text, path, places):
    """Every command block of document ``text`` (named ``path``), in order. A block
    without its mark, or run on a place not in ``places``, is a :class:`BlockError`."""
    lines = text.splitlines()
    found, index = [], 0
    while index < len(lines):
        if not lines[index].startswith("```"):
            index += 1
            continue
        language = lines[index][3:].strip()
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if language in LANGUAGES:
            before = next((lines[i].strip() for i in range(index - 1, -1, -1)
                           if lines[i].strip()), "")
            mark = _MARK_RE.match(before)
            if mark is None:
                raise BlockError(f"{path}:{index + 1}: a command block without a "
                                 "`<!-- run on: ... -->` or `<!-- run by: ... -->` mark: "
                                 "a test must run it")
            kind = "site values" if mark.group("values") else mark.group("kind")
            where = (mark.group("where") or "").strip()
            if kind == "on" and where not in places:
                raise BlockError(f"{path}:{index + 1}: unknown place {where!r} (one of "
                                 f"{', '.join(sorted(places))})")
            found.append(Block(path, index + 2, kind, where, "\n".join(lines[index + 1:end])))
        index = end + 1
    return found
