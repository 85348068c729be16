"""The index of the committed write-ups (docs/reproductions/README.md's table, and the count of
those that hold in the project's README), generated from the write-ups themselves, so that no
line of the index disagrees with its write-up (issue #37).

Per reproduction (registry order): its name, paper and figure and what it simulates (from the
code), whether it holds (the write-up's "`holds` = ..."), and its one line: the write-up's
``**In one line.**`` paragraph, which a reproduction with a ``headline(rows)`` method writes from
its results. A write-up from before its reproduction had one keeps the line the index had for it,
marked "(by hand)" so a reader knows it is not checked against the write-up.

`inalab reproduce NAME --update-docs` rewrites both after refreshing NAME.md; the test suite
checks that the committed files equal what this module generates.
"""
from __future__ import annotations

import re
from pathlib import Path

BEGIN = "<!-- index: generated from the write-ups (inalab.reproduce.index); inalab reproduce --update-docs rewrites it -->"
END = "<!-- end of the generated index -->"
COUNT = re.compile(r"<!-- holds: generated -->(.*?)<!-- /holds -->")
HEADLINE = "**In one line.**"
BY_HAND = " (by hand)"
_HOLDS = re.compile(r"`holds` = (True|False)")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def write_up_facts(text: str) -> tuple[bool | None, str | None]:
    """(holds, one line) as a committed write-up states them (None where it does not)."""
    m = _HOLDS.search(text)
    line = next((ln[len(HEADLINE):].strip() for ln in text.splitlines() if ln.startswith(HEADLINE)), None)
    return (None if m is None else m.group(1) == "True"), line


def _old_lines(index_md: str) -> dict[str, str]:
    """The one lines of the index as it stands (the fallback for write-ups without one)."""
    out = {}
    for ln in index_md.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith("`"):
            out[cells[0].strip("`")] = cells[-1].removesuffix(BY_HAND.strip()).rstrip()
    return out


def rows(docs: Path) -> list[dict]:
    """One dict per registered reproduction: name, paper, figure, simulates, holds, line, hand."""
    from . import REPRODUCTIONS, paper_of

    index_md = (docs / "README.md").read_text()
    old = _old_lines(index_md)
    out = []
    for name, rep in REPRODUCTIONS.items():
        path = docs / f"{name}.md"
        holds, line = write_up_facts(path.read_text()) if path.exists() else (None, None)
        hand = line is None
        out.append({"name": name, "paper": paper_of(rep), "figure": getattr(rep, "figure", ""),
                    "simulates": getattr(rep, "simulates", ""), "holds": holds,
                    "line": line if line is not None else old.get(name, "-"), "hand": hand})
    return out


def table(docs: Path) -> str:
    lines = [BEGIN, "", "| name | paper, figure | simulates | holds (its write-up) | in one line |", "|---|---|---|---|---|"]
    for r in rows(docs):
        holds = "-" if r["holds"] is None else ("yes" if r["holds"] else "no")
        line = _cell(r["line"]) + (BY_HAND if r["hand"] and r["line"] != "-" else "")
        lines.append(f"| `{r['name']}` | {_cell(r['paper'] + ' ' + r['figure'])} | {_cell(r['simulates'])} | {holds} | {line} |")
    return "\n".join(lines + ["", END])


def count(docs: Path) -> str:
    rs = rows(docs)
    return f"{sum(bool(r['holds']) for r in rs)} of {len(rs)} hold in their write-ups"


def generated(docs: Path) -> dict[Path, str]:
    """What the index and the project README should read (path -> text)."""
    index = docs / "README.md"
    text = index.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{index}: no generated index between {BEGIN!r} and {END!r}")
    out = {index: text[:text.index(BEGIN)] + table(docs) + text[text.index(END) + len(END):]}
    readme = docs.parents[1] / "README.md"
    if readme.exists() and COUNT.search(readme.read_text()):
        out[readme] = COUNT.sub(lambda _m: f"<!-- holds: generated -->{count(docs)}<!-- /holds -->", readme.read_text())
    return out


def regenerate(docs: Path) -> list[Path]:
    """Rewrites the index and the README count; returns the files that changed (none where
    DOCS/README.md is missing or has no generated index, e.g. a folder of a few write-ups)."""
    changed = []
    index = docs / "README.md"
    if not index.exists() or BEGIN not in index.read_text():
        return changed
    for path, text in generated(docs).items():
        if path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed
