"""One report of every reproduction: ``inalab reproduce all --report DIR`` (issue #20).

:func:`run_many` runs reproductions in parallel, each in its own process, and writes each one's
OUT/NAME.md, .png, .csv and .json as ``inalab reproduce NAME`` does; :func:`write_report` turns
the results into DIR/index.html (one self-contained page: a summary table, then per paper and
figure the paper's claim, our table, the figure, holds or not and the tolerance; figures
embedded as base64 PNG, no external CSS, JS or fonts) and DIR/report.json (the same content as
data, the figures' pixels aside).

Why a process pool of whole reproductions and not ``inalab.sweeps.run_points``: a sweep's unit
is one scenario handed to ``inalab.simulate``; a reproduction is Python code that builds its
own scenarios, usually runs them as its own sweep (``simulate_all`` -> ``run_points``, a pool
of its own), sometimes solves LPs or flow models and never simulates, then judges and plots
the rows. So the unit here is the reproduction, ``jobs`` of them at once (default: one per
CPU); a reproduction's inner sweep keeps its own pool, so the last long one still uses every
core while the short ones are done.

Each pool process leads a process group of its own, which its sweep's pool inherits: Ctrl-C at
a terminal reaches only the parent, which kills every reproduction's processes before it
returns (:mod:`inalab.stop`); nothing is left running.
"""
from __future__ import annotations

import base64
import html
import json
import os
import platform
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from . import DOCS_DIR, REPRODUCTIONS, default_seeds, get, paper_of, run_one, takes_seeds, update_docs, write_outcome

# (name, message): a child's progress line, read by the parent between results.
_QUEUE = None


def _init_child(queue) -> None:
    global _QUEUE
    _QUEUE = queue
    # A process group of its own, which this process's sweep pools inherit: a terminal's Ctrl-C
    # reaches only the parent, which then kills the group whole (nothing of it is orphaned).
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def _child(name: str, out: str, docs: Optional[str], seeds=None) -> dict:
    """Runs one reproduction in a pool process: its files written, its result as a dict
    (:meth:`Outcome.to_dict`, plus ``error`` None), or an error entry. Never raises."""
    progress = (lambda m: _QUEUE.put((name, str(m)))) if _QUEUE is not None else None
    return _run_entry(name, Path(out), None if docs is None else Path(docs), progress, seeds)


def _run_entry(name: str, out: Path, docs: Optional[Path], progress, seeds=None) -> dict:
    """``seeds`` apply if the reproduction takes seeds (else it runs without)."""
    t0 = time.monotonic()
    try:
        outcome = run_one(name, progress, seeds if takes_seeds(get(name)) else None)
        write_outcome(outcome, out)
        if docs is not None:
            update_docs(outcome, docs)
        return entry(outcome)
    except Exception as e:  # one reproduction's failure is a row of the report, not its end
        return error_entry(name, e, round(time.monotonic() - t0, 3), seeds, traceback.format_exc(limit=8))


def error_entry(name: str, e: BaseException, seconds: Optional[float], seeds=None, trace: Optional[str] = None) -> dict:
    """A report's entry for a reproduction that raised (``trace``: its traceback) or whose
    process died: no rows, ``holds`` None, ``error`` the exception, the seeds it was to run."""
    rep = get(name)
    planned = default_seeds(rep) if seeds is None or not takes_seeds(rep) else tuple(seeds)
    return {"name": name, "paper": paper_of(rep), "figure": getattr(rep, "figure", ""), "claim": rep.claim,
            "tolerance": getattr(rep, "tolerance", ""), "holds": None, "checks": None,
            "seeds": None if planned is None else list(planned), "columns": [], "rows": [],
            "writeup": "", "seconds": seconds, "files": {},
            "error": f"{type(e).__name__}: {e}", "traceback": trace, "png_base64": None}


def entry(outcome) -> dict:
    """A report's entry from a written :class:`Outcome`: its dict, ``error`` None, and the
    figure's PNG as base64."""
    d = outcome.to_dict()
    d["error"] = None
    d["png_base64"] = base64.b64encode(Path(outcome.files["png"]).read_bytes()).decode("ascii")
    return d


COMMITTED_REPORT = DOCS_DIR.parent / "report" / "report.json"  # the last full run, committed


def previous_run(report_dir: Optional[Path] = None) -> dict:
    """The wall times of an earlier report: REPORT_DIR/report.json if it has one, else the
    committed docs/report/report.json. ``{"seconds": {name: s}, "runs": {name: seeds run},
    "path", "generated", "command", "cpus", "jobs"}``; ``seconds`` empty and ``path`` None when
    there is none. An entry that names no seeds ran once (reports before seeds were recorded)."""
    paths = ([Path(report_dir) / "report.json"] if report_dir is not None else []) + [COMMITTED_REPORT]
    for path in paths:
        try:
            data = json.loads(path.read_text())
            seconds = {r["name"]: float(r["seconds"]) for r in data["reproductions"] if r.get("seconds") is not None}
            runs = {r["name"]: max(1, len(r.get("seeds") or ())) for r in data["reproductions"]}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return {"seconds": seconds, "runs": runs, "path": str(path), "generated": data.get("generated"), "command": data.get("command"),
                "cpus": (data.get("machine") or {}).get("cpus"), "jobs": data.get("jobs")}
    return {"seconds": {}, "runs": {}, "path": None, "generated": None, "command": None, "cpus": None, "jobs": None}


def previous_seconds(report_dir: Path) -> dict:
    """Each reproduction's wall time in an earlier report (this DIR's, else the committed
    docs/report/), to start the longest first."""
    return previous_run(report_dir)["seconds"]


def catalog(report_dir: Optional[Path] = None) -> dict:
    """Every reproduction, for ``inalab reproduce --list``: paper, figure, scale (what it
    simulates), default seeds (None: it takes none, ``no_seeds`` why) and ``expected_s``, its
    wall time in the last full run (:func:`previous_run`: ``source`` says which report, when,
    by what command on how many CPUs; None where that run did not have it) scaled from the
    seeds that run used to the default seeds (a run per seed: 1 seed then, 3 now, 3x)."""
    prev = previous_run(report_dir)
    source = {k: prev[k] for k in ("path", "generated", "command", "cpus", "jobs")}
    items = []
    for name in order(list(REPRODUCTIONS)):
        rep = REPRODUCTIONS[name]
        seeds = default_seeds(rep)
        took = prev["seconds"].get(name)
        expected = None if took is None else took / prev["runs"].get(name, 1) * len(seeds or (None,))
        items.append({"name": name, "paper": paper_of(rep), "figure": getattr(rep, "figure", ""),
                      "scale": getattr(rep, "simulates", None), "seeds": None if seeds is None else list(seeds),
                      "no_seeds": None if seeds is not None else getattr(rep, "no_seeds", "it takes no seed"),
                      "expected_s": expected})
    return {"source": source, "reproductions": items}


def run_many(names: list[str], out: Path, *, jobs: Optional[int] = None, docs: Optional[Path] = None,
             order_hint: Optional[dict] = None, on_progress: Optional[Callable[[str, str], None]] = None,
             on_done: Optional[Callable[[dict], None]] = None, seeds=None) -> list[dict]:
    """Runs ``names`` (``jobs`` at once, default one per CPU; slowest first by ``order_hint``,
    name -> seconds) writing each one's files into ``out`` (and its write-up into ``docs`` if
    given); returns their entries in ``names``' order. ``seeds`` apply to each that takes seeds
    (the others run without). ``on_progress(name, message)`` gets the reproductions' progress
    lines, ``on_done(entry)`` each result as it comes. Interrupted (Ctrl-C, or any exception
    while it waits), it kills every reproduction's processes before it raises."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    jobs = jobs or os.cpu_count() or 1
    hint = order_hint or {}
    todo = sorted(names, key=lambda n: -hint.get(n, float("inf")))  # unknown first: they may be long
    done: dict[str, dict] = {}
    if jobs <= 1 or len(todo) <= 1:
        for n in todo:
            done[n] = _run_entry(n, Path(out), docs, (lambda m, n=n: on_progress(n, m)) if on_progress else None, seeds)
            if on_done:
                on_done(done[n])
        return [done[n] for n in names]
    # fork, as the sweeps' pool: children start with inalab imported; each may fork its own
    # sweep pool (pool processes are not daemons, so they may).
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx, initializer=_init_child,
                             initargs=(q,)) as pool:
        pending = {pool.submit(_child, n, str(out), None if docs is None else str(docs), seeds): n for n in todo}
        try:
            _collect(pending, done, q, on_progress, on_done)
        except BaseException:
            # Leaving the `with` waits for the running reproductions (minutes): kill them and
            # their sweeps first, whole process groups.
            from ..stop import kill_trees

            kill_trees(list(getattr(pool, "_processes", None) or {}), include_roots=True)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    q.close()
    return [done[n] for n in names]


def _collect(pending: dict, done: dict, q, on_progress, on_done) -> None:
    """Waits for the futures of ``pending`` (future -> name), relaying progress lines."""
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, wait

    while pending:
        finished, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
        while True:
            try:
                name, msg = q.get_nowait()
            except queue_mod.Empty:
                break
            if on_progress:
                on_progress(name, msg)
        for f in finished:
            n = pending.pop(f)
            try:
                done[n] = f.result()
            except Exception as e:  # the process died (e.g. killed for memory)
                done[n] = error_entry(n, e, None, seeds)
            if on_done:
                on_done(done[n])


def order(names: list[str]) -> list[str]:
    """The report's order: by paper (in the registry's order of papers), then the registry's."""
    reg = list(REPRODUCTIONS)
    papers = list(dict.fromkeys(paper_of(REPRODUCTIONS[n]) for n in reg))
    return sorted(names, key=lambda n: (papers.index(paper_of(REPRODUCTIONS[n])), reg.index(n)))


def write_report(entries: list[dict], report_dir: Path, *, wall_s: Optional[float] = None, jobs: Optional[int] = None,
                 command: str = "") -> dict:
    """Writes REPORT_DIR/index.html and REPORT_DIR/report.json from :func:`run_many`'s
    entries; returns the report (report.json's content)."""
    from .. import __version__

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    by_name = {e["name"]: e for e in entries}
    ordered = [by_name[n] for n in order(list(by_name))]
    summary = {"reproductions": len(ordered), "hold": sum(e["holds"] is True for e in ordered),
               "do_not_hold": sum(e["holds"] is False for e in ordered), "errors": sum(e["error"] is not None for e in ordered)}
    report = {"title": "inalab: every reproduction", "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "inalab": __version__, "command": command, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                                     "system": platform.system()},
              "jobs": jobs, "wall_s": None if wall_s is None else round(wall_s, 1), "summary": summary,
              "reproductions": [{k: v for k, v in e.items() if k not in ("png_base64", "files")} for e in ordered]}
    (report_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (report_dir / "index.html").write_text(_html(report, ordered))
    return report


# ------------------------------------------------------------------------------------------ HTML

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; margin-top: 2.2em; }
h3 { margin-top: 2em; } .meta { color: #666; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.yes { background: #dff3df; color: #145214; font-weight: bold; }
.no { background: #fbe3d9; color: #7a2200; font-weight: bold; }
.error { background: #f6d5d5; color: #800; font-weight: bold; }
.badge { padding: 0.1em 0.5em; border-radius: 0.3em; }
.claim { border-left: 4px solid #bbb; margin: 0.6em 0; padding: 0.2em 0.9em; background: #fafafa; }
.scroll { overflow: auto; max-height: 32em; } img { max-width: 100%; border: 1px solid #eee; }
details { margin: 0.6em 0; } summary { cursor: pointer; color: #345; }
pre { background: #f6f6f6; padding: 0.6em; overflow: auto; font-size: 0.85em; }
.writeup table { font-size: 0.8em; }
"""


def _esc(s) -> str:
    return html.escape("" if s is None else str(s))


def _verdict(e: dict) -> tuple[str, str]:
    if e.get("error"):
        return "error", "error"
    return ("yes", "yes") if e["holds"] else ("no", "no")


def _secs(s: float) -> str:
    return f"{s:.1f}" if s < 10 else f"{s:.0f}"


def _cell(v) -> str:
    if v is None:  # a missing value (NaN in the rows is null in report.json)
        return "<td>-</td>"
    if isinstance(v, bool):
        return f"<td>{_esc(v)}</td>"
    if isinstance(v, float):
        return f'<td class="num">{v:.4g}</td>'
    if isinstance(v, int):
        return f'<td class="num">{v}</td>'
    if isinstance(v, (list, dict)):  # a series: its values are in report.json
        return f"<td><i>{len(v)} values</i></td>"
    return f"<td>{_esc(v)}</td>"


def _rows_table(e: dict) -> str:
    """The rows (with several seeds their mean, what `holds` judged; each seed's are in report.json)."""
    rows = e.get("means") or e["rows"]
    cols = [c for c in e["columns"] if not e.get("means") or c != "seed"]
    head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in cols) + "</tr>" for r in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _markdown(text: str) -> str:
    """The write-up as HTML: markdown-it (a dependency of rich), raw HTML escaped."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # pragma: no cover - rich brings it
        return f"<pre>{_esc(text)}</pre>"
    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def _html(report: dict, entries: list[dict]) -> str:
    s = report["summary"]
    parts = [f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(report['title'])}</title><style>{_CSS}</style></head><body>
<h1>{_esc(report['title'])}</h1>
<p class="meta">inalab {_esc(report['inalab'])}, generated {_esc(report['generated'])}
{f"in {report['wall_s']:.0f} s wall" if report['wall_s'] is not None else ""} on {_esc(report['machine']['cpus'])} CPUs
({_esc(report['jobs'])} reproductions at once){f"; <code>{_esc(report['command'])}</code>" if report['command'] else ""}.
Each reproduction runs the paper's setup on inalab and checks whether our result shows the paper's shape
within the stated tolerance; results are computed on every run, never stored. The data: <code>report.json</code>.</p>
<p><b>{s['hold']}</b> of {s['reproductions']} hold, <b>{s['do_not_hold']}</b> do not{
f", <b>{s['errors']}</b> failed to run" if s['errors'] else ""}.</p>
<table class="summary"><thead><tr><th>paper</th><th>figure</th><th>reproduction</th><th>holds</th><th>tolerance</th>
<th>wall s</th></tr></thead><tbody>"""]
    for e in entries:
        cls, word = _verdict(e)
        secs = "" if e.get("seconds") is None else _secs(e["seconds"])
        parts.append(f'<tr><td>{_esc(e["paper"])}</td><td>{_esc(e["figure"])}</td>'
                     f'<td><a href="#{_esc(e["name"])}">{_esc(e["name"])}</a></td><td class="{cls}">{word}</td>'
                     f'<td>{_esc(e["tolerance"])}</td><td class="num">{secs}</td></tr>')
    parts.append("</tbody></table>")
    paper = None
    for e in entries:
        if e["paper"] != paper:
            paper = e["paper"]
            parts.append(f"<h2>{_esc(paper)}</h2>")
        cls, word = _verdict(e)
        parts.append(f'<section id="{_esc(e["name"])}"><h3>{_esc(e["paper"])} {_esc(e["figure"])}: '
                     f'<code>{_esc(e["name"])}</code> <span class="badge {cls}">holds: {word}</span></h3>')
        parts.append(f'<div class="claim"><b>The paper\'s claim.</b> {_esc(e["claim"])}</div>')
        parts.append(f"<p><b>Tolerance</b> (what <code>holds</code> checks): {_esc(e['tolerance'])}</p>")
        if "seeds" in e:
            seeds = "none (it takes no seed)" if e["seeds"] is None else ", ".join(map(str, e["seeds"])) + (
                "" if e.get("seeds_default", True) else " (the user's, <code>--seeds</code>)")
            parts.append(f"<p><b>Seeds</b>: {seeds}" + (" (the table is their mean; each seed's rows are in report.json)" if e.get("means") else "") + "</p>")
        if e.get("checks"):
            items = "".join(f'<li><code>{_esc(k)}</code>: <span class="badge {"yes" if v else "no"}">{"yes" if v else "no"}</span></li>'
                            for k, v in e["checks"].items())
            parts.append(f"<p>Checks:</p><ul>{items}</ul>")
        if e.get("error"):
            parts.append(f"<p class=\"error\">Failed to run: {_esc(e['error'])}</p>")
            if e.get("traceback"):
                parts.append(f"<details><summary>traceback</summary><pre>{_esc(e['traceback'])}</pre></details>")
            parts.append("</section>")
            continue
        if e.get("png_base64"):
            parts.append(f'<p><img alt="{_esc(e["name"])}" src="data:image/png;base64,{e["png_base64"]}"></p>')
        parts.append(f"<p><b>inalab's table</b> ({len(e.get('means') or e['rows'])} rows"
                     f"{', the mean over the seeds' if e.get('means') else ''}; {_secs(e['seconds'])} s wall):</p>{_rows_table(e)}")
        parts.append(f'<details><summary>The write-up (claim, setup, result, where and why they differ)</summary>'
                     f'<div class="writeup">{_markdown(e["writeup"])}</div></details></section>')
    parts.append("</body></html>\n")
    return "\n".join(parts)
