"""`inalab reproduce all --report DIR` (one self-contained page of every reproduction) and where
`inalab reproduce NAME` writes: OUT only, the committed docs only with --update-docs (issue #20)."""
from __future__ import annotations

import json
import re

import pandas as pd
from typer.testing import CliRunner

import inalab.reproduce as reproduce_mod
from inalab.cli import app
from inalab.reproduce import REPRODUCTIONS

runner = CliRunner()
CHEAP = ["grid-motivating-example", "rina-incremental"]  # flow-level: under a second each


def _docs_state(name: str):
    """The committed write-ups' folder: its file names, and NAME.md's bytes and mtime."""
    d = reproduce_mod.DOCS_DIR
    md = d / f"{name}.md"
    return sorted(p.name for p in d.iterdir()), md.read_bytes(), md.stat().st_mtime_ns


def test_report_of_two(tmp_path):
    out, rep = tmp_path / "out", tmp_path / "report"
    r = runner.invoke(app, ["reproduce", "all", "--only", ",".join(CHEAP), "--jobs", "2", "--out", str(out),
                            "--report", str(rep), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["reproductions"] == 2 and summary["errors"] == 0
    assert summary["holds"] == {"grid-motivating-example": True, "rina-incremental": True}

    page = (rep / "index.html").read_text()
    # Self-contained: nothing fetched, figures inline.
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    srcs = re.findall(r"""<img[^>]*\ssrc="([^"]*)\"""", page)
    assert len(srcs) == 2 and all(s.startswith("data:image/png;base64,") for s in srcs)
    # The summary table at the top: one row per reproduction run, with holds and tolerance.
    top = page[page.index('<table class="summary">'):]
    top = top[:top.index("</table>")]
    body_rows = re.findall(r"<tr>(.*?)</tr>", top[top.index("<tbody>"):], re.S)
    assert len(body_rows) == 2
    assert page.index('<table class="summary">') < page.index('<section id="grid-motivating-example">')

    data = json.loads((rep / "report.json").read_text())
    assert data["summary"] == {"reproductions": 2, "hold": 2, "do_not_hold": 0, "errors": 0}
    assert [e["name"] for e in data["reproductions"]] == CHEAP  # by paper: GRID, then Rina
    for e, row in zip(data["reproductions"], body_rows):
        rp = REPRODUCTIONS[e["name"]]
        assert (e["claim"], e["tolerance"], e["figure"]) == (rp.claim, rp.tolerance, rp.figure)
        assert e["holds"] is True and e["error"] is None and e["rows"]
        assert e["name"] in row and ">yes<" in row and e["paper"] in row
        assert e["claim"].split(":")[0] in page
        # The same data as `inalab reproduce NAME` writes into OUT.
        single = json.loads((out / f"{e['name']}.json").read_text())
        assert single["rows"] == e["rows"] and single["holds"] == e["holds"]
        assert (out / f"{e['name']}.png").exists() and (out / f"{e['name']}.md").read_text() == e["writeup"]
        assert len(pd.read_csv(out / f"{e['name']}.csv")) == len(e["rows"])


def test_reproduce_writes_only_into_out(tmp_path):
    name = CHEAP[0]
    before = _docs_state(name)
    r = runner.invoke(app, ["reproduce", name, "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert _docs_state(name) == before  # docs/reproductions untouched
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [f"{name}.{x}" for x in ("csv", "json", "md", "png")]
    assert "holds: yes" in r.stdout and "tolerance:" in r.stdout


def test_update_docs_is_the_only_way_into_docs(tmp_path, monkeypatch):
    name = CHEAP[0]
    checkout = tmp_path / "checkout" / "docs" / "reproductions"
    checkout.mkdir(parents=True)
    (checkout / "README.md").write_text("# Reproductions\n")
    monkeypatch.setattr(reproduce_mod, "DOCS_DIR", checkout)
    r = runner.invoke(app, ["reproduce", name, "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in checkout.iterdir()) == ["README.md"]
    r = runner.invoke(app, ["reproduce", name, "--out", str(tmp_path / "o"), "--update-docs"])
    assert r.exit_code == 0, r.output
    fresh = (tmp_path / "o" / f"{name}.md").read_text()
    assert (checkout / f"{name}.md").read_text() == fresh
    # Notes written by hand below the marker survive a refresh; what is above it is regenerated.
    hand = f"{reproduce_mod.HAND_WRITTEN}\n\n**What a run taught.** Kept.\n"
    (checkout / f"{name}.md").write_text("stale generated text\n\n" + hand)
    r = runner.invoke(app, ["reproduce", name, "--out", str(tmp_path / "o"), "--update-docs"])
    assert r.exit_code == 0, r.output
    assert (checkout / f"{name}.md").read_text() == fresh + "\n" + hand


def test_committed_canary_write_ups_mark_their_hand_written_notes():
    # Their "On the PFC fabric" / "On the paper's network" sections and the earlier runs' are not
    # generated by the code: each follows the marker.
    for name in [n for n in reproduce_mod.REPRODUCTIONS if n.startswith("canary-")]:
        text = (reproduce_mod.DOCS_DIR / f"{name}.md").read_text()
        heading = next(h for h in ("**On the paper's network", "**On the PFC fabric") if h in text)
        assert text.count(reproduce_mod.HAND_WRITTEN) == 1 and text.index(reproduce_mod.HAND_WRITTEN) < text.index(heading), name


def test_update_docs_refused_outside_a_checkout(tmp_path, monkeypatch):
    # An installed wheel: parents[3] of the module is lib/python3.X, without docs/reproductions.
    monkeypatch.setattr(reproduce_mod, "DOCS_DIR", tmp_path / "lib" / "python3.11" / "docs" / "reproductions")
    r = runner.invoke(app, ["reproduce", CHEAP[0], "--out", str(tmp_path / "o"), "--update-docs"])
    assert r.exit_code == 2
    assert "--update-docs" in r.output and "source checkout" in r.output
    assert not (tmp_path / "o").exists() and not (tmp_path / "lib").exists()  # refused before running


def test_bad_options_name_the_option():
    r = runner.invoke(app, ["reproduce", "all", "--only", "grid-motivating-example,nope"])
    assert r.exit_code == 2 and "--only" in r.output and "'nope'" in r.output and "rina-incremental" in r.output
    r = runner.invoke(app, ["reproduce", "all", "--jobs", "0"])
    assert r.exit_code == 2 and "--jobs" in r.output and "at least 1" in r.output
    r = runner.invoke(app, ["reproduce", CHEAP[0], "--only", CHEAP[1]])
    assert r.exit_code == 2 and "--only" in r.output
    r = runner.invoke(app, ["reproduce", "nope"])
    assert r.exit_code == 2 and "all," in r.output


class _Broken:
    name, figure, claim, tolerance = "broken-example", "Fig. 0", "A claim.", "none"

    def run(self, progress):
        raise RuntimeError("this reproduction fails")


def test_a_failing_reproduction_is_a_row(tmp_path, monkeypatch):
    monkeypatch.setitem(REPRODUCTIONS, "broken-example", _Broken())
    out = tmp_path / "out"
    r = runner.invoke(app, ["reproduce", "all", "--only", f"broken-example,{CHEAP[0]}", "--jobs", "1", "--out", str(out)])
    assert r.exit_code == 1, r.output  # the report is written, the status says one failed
    data = json.loads((out / "report" / "report.json").read_text())  # --report's default: OUT/report
    by = {e["name"]: e for e in data["reproductions"]}
    assert by["broken-example"]["holds"] is None and "this reproduction fails" in by["broken-example"]["error"]
    assert by[CHEAP[0]]["holds"] is True and data["summary"]["errors"] == 1
    assert ">error<" in (out / "report" / "index.html").read_text()


def test_the_index_and_readme_are_generated_from_the_write_ups():
    # Issue #37: no line of docs/reproductions/README.md (nor the README's count) disagrees with
    # its write-up: the committed files are what inalab.reproduce.index generates.
    from inalab.reproduce import index

    for path, text in index.generated(reproduce_mod.DOCS_DIR).items():
        assert path.read_text() == text, f"{path} is stale: run inalab.reproduce.index.regenerate (or --update-docs)"


def test_the_index_takes_holds_and_the_line_from_each_write_up(tmp_path, monkeypatch):
    from inalab.reproduce import index

    docs = tmp_path / "docs" / "reproductions"
    docs.mkdir(parents=True)
    names = list(reproduce_mod.REPRODUCTIONS)
    old = f"| `{names[1]}` | x | y | yes | an old line |"
    (docs / "README.md").write_text(f"# R\n\n{index.BEGIN}\n\n{old}\n\n{index.END}\n\nafter\n")
    (tmp_path / "README.md").write_text("<!-- holds: generated -->0 of 0<!-- /holds -->\n")
    (docs / f"{names[0]}.md").write_text("x (`holds` = True; ...)\n\n**In one line.** from the results\n")
    (docs / f"{names[1]}.md").write_text("x (`holds` = False; ...)\n")
    assert set(index.regenerate(docs)) == {docs / "README.md", tmp_path / "README.md"}
    text = (docs / "README.md").read_text()
    assert f"| `{names[0]}` |" in text and "| yes | from the results |" in text
    # Without its own line the old one stays, marked, and holds is the write-up's.
    assert "| no | an old line (by hand) |" in text and text.endswith(f"{index.END}\n\nafter\n")
    assert "1 of " in (tmp_path / "README.md").read_text()
    assert index.regenerate(docs) == []  # idempotent
