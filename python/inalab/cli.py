"""The ``inalab`` command: simulate scenarios, list the shipped ones, run the demo.

Human output goes to stdout as rich tables; progress bars and messages go to stderr, so that
with ``--json`` the last line of stdout is the summary object. A bad scenario prints one line
``error: <field>: <message>`` on stderr and exits with status 2.

Exit statuses: 0 the run completed, 1 it could not be carried out, 2 bad input, 3 a job failed
or did not finish, 130/143 Ctrl-C/SIGTERM; docs/results.md ("Exit statuses",
``inalab.columns.EXIT_STATUSES``) says each in full.
"""
from __future__ import annotations

import json
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from . import __version__, simulate as run_simulation
from .config import ConfigError, shipped_scenarios
from .results import COMPUTE_BOUND_SHARE, Result

app = typer.Typer(
    name="inalab", help="Simulate in-network aggregation for distributed ML training.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
out_console = Console()
err_console = Console(stderr=True)

EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_INCOMPLETE = 3

JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the summary as one JSON line on stdout.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write result.json, summary.json and CSV tables here.")]


@contextmanager
def interruptible(what: str, on_stop=None):
    """Ctrl-C and SIGTERM stop the body at once (:func:`inalab.stop.on_signals`: every process
    below this one is killed; the simulator checks for signals between event batches). Says
    what was interrupted, lets ``on_stop(exc)`` print what was done (``exc.result``: a
    simulation's partial :class:`Result`, when there is one) and exits 130 (SIGINT) or 143
    (SIGTERM)."""
    import signal

    from .stop import Interrupted, on_signals

    try:
        with on_signals():
            yield
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
        err_console.print(f"interrupted by {name}: {what} stopped", markup=False, highlight=False, soft_wrap=True)
        if on_stop is not None:
            on_stop(e)
        raise typer.Exit(128 + signum) from None


def _run(scenario: str, seed: Optional[int], as_json: bool, pcap=None, out: Optional[Path] = None) -> Result:
    def stopped(e: KeyboardInterrupt) -> None:
        partial = getattr(e, "result", None)
        if partial is not None:  # what was simulated until the interrupt, saved too with --out
            _report(partial, as_json, out)

    try:
        with interruptible(f"simulating {scenario}", stopped):
            return run_simulation(scenario, seed=seed, progress=not as_json, pcap=pcap)
    except ConfigError as e:
        raise _exit(e) from None
    except OSError as e:
        raise _exit(e, EXIT_ERROR) from None


PcapOpt = Annotated[Optional[Path], typer.Option(
    "--pcap", help="Write pcapng captures here, one file per capture point (docs/runtime.md, 'Packet captures').")]
PcapAtOpt = Annotated[Optional[str], typer.Option(
    "--pcap-at", help="Capture points, comma-separated: a node (h3: all its links), NODE:PORT (s0:2) or A-B (s0-s1). "
                      "Default: every host.")]
PcapJobOpt = Annotated[Optional[int], typer.Option("--pcap-job", help="Only packets of this job id. Default: every packet.")]
PcapWindowOpt = Annotated[Optional[str], typer.Option(
    "--pcap-window", help="START,END: only packets leaving their port in this window (durations, e.g. 0,5ms). Default: the whole run.")]


def _said(message: str) -> None:
    """A line on stderr that names files: never wrapped, so that a path stays whole to copy."""
    err_console.print(message, markup=False, highlight=False, soft_wrap=True)


def _compact_table(text: list[str], numbers: list[str]) -> Table:
    """A table that fits 80 columns: no vertical rules, text columns first (folded, never cut
    with an ellipsis, when a cell is too long), then right-aligned number columns that never wrap
    (break a long header with "\\n" instead)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in text:
        table.add_column(name, overflow="fold")
    for name in numbers:
        table.add_column(name, no_wrap=True, justify="right")
    return table


def _column_chunks(header: list[str], cells: list[list[str]], width: int, keep: int = 1) -> list[list[int]]:
    """Column indexes in groups whose tables fit `width` characters, each group led by the first
    `keep` columns (the rows' names), as pandas wraps a wide frame. A column too wide for any
    group gets one of its own (and its cells fold)."""
    from rich.cells import cell_len

    def need(i: int) -> int:  # a column's width on screen and the two spaces between columns
        return max([cell_len(header[i])] + [cell_len(row[i]) for row in cells]) + 2

    lead = list(range(min(keep, len(header))))
    chunks, current, used = [], [], sum(need(i) for i in lead)
    for i in range(len(lead), len(header)):
        if current and used + need(i) > width:
            chunks.append(lead + current)
            current, used = [], sum(need(j) for j in lead)
        current.append(i)
        used += need(i)
    return chunks + [lead + current] if current or not chunks else chunks


def _wide_table(rows: pd.DataFrame, console: Console) -> list[Table]:
    """A frame too wide for the console as tables of column groups that fit (numbers
    right-aligned, floats to 4 significant digits; text is never read as markup, and a cell
    wider than the console folds rather than being cut)."""
    import pandas as pd
    from rich.text import Text

    header = [str(c) for c in rows.columns]
    numeric = [pd.api.types.is_numeric_dtype(rows[c]) and not pd.api.types.is_bool_dtype(rows[c]) for c in rows.columns]
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r] for r in rows.itertuples(index=False)]
    tables = []
    for chunk in _column_chunks(header, cells, console.width):
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for i in chunk:
            table.add_column(Text(header[i]), overflow="fold", justify="right" if numeric[i] else "left")
        for r in cells:
            table.add_row(*[Text(r[i]) for i in chunk])
        tables.append(table)
    return tables


def _short(v: float) -> str:
    """A number in at most 6 characters, 4 significant digits where they fit (a table cell)."""
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}" if v >= 1 else f"{v:.3f}" if v >= 0.01 else f"{v:.2g}"


# The legend under a run's job table: what its rate and share columns are.
LEGEND = {"algbw": "algbw: tensor bytes allreduced per worker / JCT (compute included for training)",
          "busbw": "busbw: algbw x 2(n-1)/n, NCCL's bus bandwidth",
          "comm": "comm: share of the JCT with an allreduce outstanding"}


def _outcome_words(result: Result) -> str:
    """The header's word for how the run went: "completed" only when every job finished and
    every flow ended; else what did not (e.g. "1 job failed, 2 unfinished at the stop time")."""
    if result.outcome == "interrupted":
        return "interrupted"
    lossy = sum(f.get("status") == "lossy" for f in result.raw.get("flows", []))
    if result.ok:
        return "completed" + (f"; {lossy} flow{'s' * (lossy != 1)} lost packets" if lossy else "")
    jobs = result.raw.get("jobs", [])
    failed = sum(j["status"] == "failed" for j in jobs)
    unfinished = sum(j["status"] == "unfinished" for j in jobs)
    flows = sum(not f.get("finished", True) for f in result.raw.get("flows", []))
    why = {"stop_time": "at the stop time", "idle": "(stalled)"}.get(result.raw.get("stopped_by"), "")
    parts = [f"{failed} job{'s' * (failed != 1)} failed"] if failed else []
    if unfinished:
        parts.append(f"{unfinished}{' job' + 's' * (unfinished != 1) if not failed else ''} unfinished {why}".rstrip())
    if flows:
        parts.append(f"{flows} flow{'s' * (flows != 1)} unfinished {why}".rstrip())
    return ", ".join(parts)


def _report(result: Result, as_json: bool, out: Optional[Path]) -> None:
    if out is not None:
        for path in result.save(out):
            _said(f"wrote {path}")
    if as_json:
        print(json.dumps(result.summary()), flush=True)
        return
    s = result.summary()
    state = _outcome_words(result)
    style = "" if result.ok else "[red]" if result.outcome == "failed" else "[yellow]"
    how = f"({style}{state}{'[/]' if style else ''})"
    if "emulation" in result.raw:
        out_console.print(f"[bold]{s['scenario']}[/]: emulated {s['sim_time_s']:.6g} s {how} "
                          f"in {s['wall_s']:.2f} s wall, seed {s['seed']}")
    else:
        out_console.print(
            f"[bold]{s['scenario']}[/]: simulated {s['sim_time_s']:.6g} s {how} "
            f"in {s['wall_s']:.2f} s wall, {s['events']:,} events, seed {s['seed']}"
        )
    if s["jobs"]:
        # Columns that say something for these jobs only: a status when one did not finish (the
        # header says "completed" otherwise), busbw for allreduce benchmarks, comm for training.
        status_col = any(not j["finished"] for j in s["jobs"])
        busbw_col = any(j.get("kind") == "allreduce" for j in s["jobs"])
        comm_col = any(j.get("kind") != "allreduce" for j in s["jobs"])
        table = _compact_table(["job", "scheme"] + ["status"] * status_col,
                               ["workers", "iters", "JCT\nms", "iter\nms", "algbw\nGbps"] + ["busbw\nGbps"] * busbw_col
                               + ["comm"] * comm_col)
        dash = lambda v, f: "-" if v is None else f(v)  # noqa: E731
        for j in s["jobs"]:
            comm = dash(j.get("comm_share"), lambda v: f"{v:.0%}")
            status = {"finished": "finished", "failed": "[red]failed[/]"}.get(j["status"], f"[yellow]{j['status']}[/]")
            iters = str(j["iterations"]) if j["finished"] else f"{j['iterations']}/{j.get('iterations_planned', '?')}"
            cells = [j["name"], j["scheme"]] + [status] * status_col + [
                str(j["workers"]), iters, dash(j["jct_s"], lambda v: _short(v * 1e3)),
                dash(j["mean_iteration_s"], lambda v: _short(v * 1e3)), dash(j["goodput_gbps"], lambda v: f"{v:.2f}")]
            cells += [dash(j.get("busbw_gbps") if j.get("kind") == "allreduce" else None, lambda v: f"{v:.2f}")] * busbw_col
            cells += [f"[yellow]{comm}[/]" if j.get("compute_bound") else comm] * comm_col
            table.add_row(*cells)
        out_console.print(table)
        shown = ["algbw"] + ["busbw"] * busbw_col + ["comm"] * comm_col
        out_console.print("; ".join(LEGEND[k] for k in shown) + " (docs/results.md)", style="dim", markup=False, highlight=False)
        for line in s["problems"]:
            out_console.print(line, style="red" if ": failed" in line else "yellow", markup=False, highlight=False)
        bound = [j["name"] for j in s["jobs"] if j.get("compute_bound")]
        if bound:
            out_console.print(
                f"[yellow]compute-bound[/] (comm, the share of the JCT with communication outstanding, below "
                f"{COMPUTE_BOUND_SHARE:.0%}: no network or INA scheme can save more than that share): "
                f"{', '.join(bound)}. A job's compute_scale < 1 models a faster GPU.", highlight=False)
    if s["flows"]:
        f = s["flows"]
        mib = lambda b: f"{b / 2**20:.4g} MiB"  # noqa: E731
        fct = "" if f["max_fct_s"] is None else f"; the last ended {f['max_fct_s'] * 1e3:.4g} ms after its start"
        out_console.print(
            f"{f['count']} flows: {f['delivered']} delivered whole, {f['lossy']} lost packets (flows do not retransmit), "
            f"{f['unfinished']} unfinished; {mib(f['bytes_received'])} of {mib(f['bytes'])} arrived "
            f"({f['delivered_fraction']:.1%}){fct}; flows.csv (--out) has each", highlight=False)
        if not s["jobs"]:
            for line in s["problems"]:
                out_console.print(line, style="yellow", markup=False, highlight=False)
    if s["conservation_holds"] is False:
        err_console.print("[red]warning:[/] packet conservation does not hold; see result.json")


def _exit_for(result: Result) -> None:
    """Exit 3 (``EXIT_INCOMPLETE``) unless the run completed."""
    if not result.ok:
        raise typer.Exit(EXIT_INCOMPLETE)


@app.command()
def simulate(
    scenario: Annotated[str, typer.Argument(help="A scenario TOML file, or the name of a shipped scenario.")],
    as_json: JsonOpt = False,
    out: OutOpt = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Override the scenario's seed.")] = None,
    pcap: PcapOpt = None,
    pcap_at: PcapAtOpt = None,
    pcap_job: PcapJobOpt = None,
    pcap_window: PcapWindowOpt = None,
) -> None:
    """Simulate SCENARIO and print its jobs' completion times. Exits 0 when every job finished
    and every flow ended, 3 when one failed or did not finish (each named, with why), 2 for a
    bad scenario, 130/143 when stopped by Ctrl-C/SIGTERM (what was done is printed)."""
    capture = None
    if pcap is not None:
        from .capture import Capture

        try:
            capture = Capture.from_cli(pcap, pcap_at, pcap_job, pcap_window)
        except ConfigError as e:
            raise _exit(e) from None
    elif any(v is not None for v in (pcap_at, pcap_job, pcap_window)):
        err_console.print("error: --pcap-at, --pcap-job and --pcap-window need --pcap DIR", highlight=False)
        raise typer.Exit(EXIT_CONFIG)
    result = _run(scenario, seed, as_json, capture, out)
    for c in result.raw.get("captures") or []:
        _said(f"wrote {c['path']} ({c['packets']:,} packets)")
    _report(result, as_json, out)
    _exit_for(result)


@app.command()
def emulate(
    scenario: Annotated[str, typer.Argument(help="A scenario TOML file, or the name of a shipped scenario.")],
    as_json: JsonOpt = False,
    out: OutOpt = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Override the scenario's seed.")] = None,
    logs: Annotated[Optional[Path], typer.Option("--logs", help="Keep every process's output here (default: deleted).")] = None,
    shaper: Annotated[str, typer.Option("--shaper", help="tc (namespaces, root), user (loopback, no privileges) or auto.")] = "auto",
    pcap: Annotated[Optional[Path], typer.Option("--pcap", help="Each switch writes SWITCH.pcapng here: every datagram it receives and sends (docs/runtime.md, 'Packet captures').")] = None,
) -> None:
    """Run SCENARIO's jobs for real: a software switch per switch, real workers and PS, with the
    scenario's link rates (network namespaces and tc as root, else shaped in user space; docs/emulation.md)."""
    from .emulation import EmulationError
    from .emulation import emulate as run_emulation

    try:
        with interruptible(f"emulating {scenario} (its processes are stopped)"):
            result = run_emulation(scenario, seed=seed, progress=True, keep_logs=logs, shaper=shaper, pcap=pcap)
    except ConfigError as e:
        raise _exit(e) from None
    except EmulationError as e:
        raise _exit(e, EXIT_ERROR) from None
    _report(result, as_json, out)
    if not as_json:
        em = result.raw["emulation"]
        err_console.print(f"links shaped by {em['shaping']}" + ("" if em["link_delay_emulated"] else " (link delay not emulated: no netem)"),
                          highlight=False)
    _exit_for(result)


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="A result directory or result.json (e.g. simulated).")],
    b: Annotated[Path, typer.Argument(help="Another one (e.g. emulated).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the tables as JSON on stdout.")] = False,
) -> None:
    """Put two results side by side, job by job and link by link, with the relative difference (B - A) / A
    ("new" where A is 0 and B is not, "-" where there is none; null in --json)."""
    from .comparison import change_text, compare as side_by_side, number_text

    try:
        tables = side_by_side(a, b)
    except (FileNotFoundError, json.JSONDecodeError, KeyError) as e:
        raise _exit(e) from None
    if as_json:
        print(json.dumps({k: json.loads(v.to_json(orient="records")) for k, v in tables.items()}))
        return
    jobs = tables["jobs"]
    table = Table("job", "JCT ms (A)", "JCT ms (B)", "B vs A")
    for _, r in jobs.iterrows():
        table.add_row(str(r["name"]), number_text(r.get("jct_s_a") * 1e3 if r.get("jct_s_a") is not None else None, "{:.3f}"),
                      number_text(r.get("jct_s_b") * 1e3 if r.get("jct_s_b") is not None else None, "{:.3f}"),
                      change_text(r.get("jct_s_a"), r.get("jct_s_b"), r.get("jct_s_rel")))
    out_console.print(table)
    links = tables["links"]
    if not links.empty:
        lt = Table("link", "bytes (A)", "bytes (B)", "B vs A")
        for _, r in links.iterrows():
            lt.add_row(f"{r['src']}->{r['dst']}", number_text(r.get("tx_bytes_a")), number_text(r.get("tx_bytes_b")),
                       change_text(r.get("tx_bytes_a"), r.get("tx_bytes_b"), r.get("tx_bytes_rel")))
        out_console.print(lt)


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(help="A sweep file (TOML): base scenario, [vary] and [zip] fields, seeds (docs/sweeps.md).")],
    out: Annotated[Path, typer.Option("--out", help="The Parquet dataset's directory (a rerun of the same sweep skips the points done).")],
    workers: Annotated[Optional[int], typer.Option("--workers", help="Local processes (default: one per CPU).")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="Run on Ray instead: local (start one here), auto (the running cluster) or a cluster address.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Delete the points of another sweep found in --out first (default: refuse).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a summary as one JSON line, no progress bar.")] = False,
) -> None:
    """Simulate every combination of a sweep file's varied fields and seeds, in parallel; one row per
    job per point. Exits 0 when every point's run completed, 3 when one failed, did not finish or
    raised (counted by reason), 2 for a bad sweep file (every point is checked first)."""
    from .sweeps import WorkerDied, load, summarize
    from .sweeps import sweep as run_sweep

    _check_workers(workers)

    def stopped(_e) -> None:
        try:
            done = summarize(load(out))
        except Exception:  # nothing readable written yet
            return
        _said(f"{done['points']} points were done and stay in {out}; the same command resumes the sweep")

    try:
        with interruptible(f"the sweep {file}", stopped):
            df = run_sweep(file, out, workers=workers, ray=ray, progress=not as_json, overwrite=overwrite)
    except ConfigError as e:
        raise _exit(e) from None
    except WorkerDied as e:
        raise _exit(e, EXIT_ERROR) from None
    summary = {"out": str(out), **summarize(df)}
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        counts = ", ".join(f"{n} {k}" for k, n in summary["by_status"].items())
        out_console.print(f"{summary['points']} points ({counts}), {summary['rows']} rows in {out}", markup=False, highlight=False,
                          soft_wrap=True)
        for r in summary["reasons"][:5]:
            err_console.print(f"  {r['points']} {r['status']}: {r['error']}", markup=False, highlight=False, soft_wrap=True)
        if len(summary["reasons"]) > 5:
            err_console.print(f"  ... and {len(summary['reasons']) - 5} other reasons (the dataset's error column)", highlight=False)
    if summary["not_ok"]:
        raise typer.Exit(EXIT_INCOMPLETE)


@app.command()
def bench(
    out: Annotated[Optional[Path], typer.Option("--out", help="Where to write bench.parquet/.csv (one row per scenario, scheme and seed), "
                                                "summary.csv, heatmap.png, index.html and points/ (a rerun skips the runs done). "
                                                "Required but with --list.")] = None,
    scale: Annotated[str, typer.Option("--scale", help="small (about 16-24 hosts, the whole matrix in minutes on 2 cores) or paper "
                                       "(about a thousand hosts, hours).")] = "small",
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per cell, 1..N.")] = 3,
    only: Annotated[Optional[str], typer.Option("--only", help="Only these scenarios, comma-separated (names as `--list` gives them).")] = None,
    schemes: Annotated[Optional[str], typer.Option("--schemes", help="Only these schemes (cells), comma-separated.")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Local processes (default: one per CPU).")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="Run on Ray instead: local, auto or a cluster address.")] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the scenarios and the schemes, and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary (one row per scenario and scheme) as one JSON line, no progress bar.")] = False,
) -> None:
    """Run every INA design and baseline on the same suite of scenarios (one job network-bound,
    multi-tenancy with scarce memory, congestion, partial deployment, heterogeneous links, a
    switch failing, stragglers): one table, a heatmap of goodput normalised to ring and an HTML
    page. A cell that cannot run, or a run that did not finish, is a row saying why (data, exit
    0); exits 3 when a run raised (status "error": a failure of inalab's, not a result), 2 for
    a bad option."""
    from . import bench as suite

    def listed(text: Optional[str]) -> Optional[list[str]]:
        return [t.strip() for t in text.split(",") if t.strip()] if text else None

    _check_workers(workers)

    try:
        if list_:
            for name, path in suite.scenario_files(scale).items():
                out_console.print(f"{name}: {tomllib.loads(path.read_text()).get('description', '')}", markup=False, highlight=False, soft_wrap=True)
            for cell, doc in suite.CELL_DOCS.items():
                out_console.print(f"  scheme {cell}: {doc}", markup=False, highlight=False, soft_wrap=True)
            return
        if out is None:
            raise ConfigError("--out", "required: the directory to write the table, the figure and the page into")
        with interruptible("the bench"):
            table = suite.run(scale, out, seeds=seeds, only=listed(only), schemes=listed(schemes), workers=workers, ray=ray,
                              progress=not as_json)
    except ConfigError as e:
        raise _exit(e) from None
    if as_json:
        print(suite.summarize(table).to_json(orient="records"), flush=True)
    else:
        counts = ", ".join(f"{n} {k}" for k, n in table.status.value_counts().items())
        out_console.print(f"{len(table)} runs ({counts}); {out / 'index.html'}", markup=False, highlight=False, soft_wrap=True)
        for name in dict.fromkeys(table.scenario):
            out_console.print(f"  {name}: {suite.mechanism(table, name)}", markup=False, highlight=False, soft_wrap=True)
    errors = table[table.status == "error"]
    for r in errors.itertuples():
        err_console.print(f"error: {r.scenario} / {r.scheme} / seed {r.seed}: {r.reason}", markup=False, highlight=False, soft_wrap=True)
    if len(errors):
        raise typer.Exit(EXIT_INCOMPLETE)


@app.command()
def scenarios(
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as one JSON array on stdout: name, format, "
                                          "for, jobs, description, path.")] = False,
) -> None:
    """List every scenario shipped with inalab, each usable by name with the commands in its "for"
    column (analyze and plan take a simulate scenario's job with a parameter server; --job picks
    one of several)."""
    from .analysis.scenario import catalog

    try:
        rows = catalog()
    except ConfigError as e:
        raise _exit(e) from None
    if as_json:
        print(json.dumps(rows), flush=True)
        return
    table = Table()
    # Names whole, never cut: each is what a command takes.
    table.add_column("name", no_wrap=True, min_width=max(len(r["name"]) for r in rows))
    table.add_column("for")
    table.add_column("description")
    for r in rows:
        uses = ", ".join(r["for"])
        if len(r["jobs"]) > 1:
            uses += f" (--job {' | '.join(r['jobs'])})"
        table.add_row(r["name"], uses, r["description"])
    out_console.print(table)


@app.command()
def demo(
    as_json: JsonOpt = False,
    out: Annotated[Path, typer.Option("--out", help="Where to write demo.png and the result files.")] = Path("out"),
) -> None:
    """SwitchML vs ATP vs parameter server vs ring allreduce: four ResNet50 jobs of 4 workers, one per
    rack of a 20-host, 100 Gbps leaf-spine (the shipped scenario demo); prints their completion and
    iteration times and writes OUT/demo.png."""
    from .plots import demo_figure

    result = _run("demo", None, as_json, out=out)
    with shipped_scenarios()["demo"].open("rb") as f:
        description = tomllib.load(f).get("description")
    figure = demo_figure(result, out / "demo.png", title=f"demo: {description}" if description else None)
    _report(result, as_json, out)
    _said(f"wrote {figure}")
    _exit_for(result)


@app.command()
def version() -> None:
    """Print the versions of the package and of the simulator extension."""
    from . import _core

    print(f"inalab {__version__} (simulator {_core.version()})")


# ---------------------------------------------------------------- flow-level analysis (docs/analysis.md)


def _check_workers(workers: Optional[int]) -> None:
    """``--workers``: at least 1 when given (exit 2 naming the option)."""
    if workers is not None and workers < 1:
        err_console.print(f"error: --workers: must be at least 1, got {workers}", highlight=False)
        raise typer.Exit(EXIT_CONFIG)


def _say(e: Exception) -> None:
    """Prints ``error: <e>`` on stderr as it is (no markup, no wrapping)."""
    err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)


def _exit(e: Exception, code: int = EXIT_CONFIG) -> typer.Exit:
    """Says ``e`` and returns the exit to raise: ``code`` (default: what the user gave is wrong)."""
    _say(e)
    return typer.Exit(code)


def _notes(notes: list[str]) -> None:
    """What the flow model did not use of a simulate scenario, one ``note:`` line each on stderr."""
    for note in notes:
        err_console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)


ScenarioArg = Annotated[str, typer.Argument(
    help="A scenario TOML file or a shipped scenario's name (`inalab scenarios`), in either format: an analysis "
         "scenario (grid-fig1) or a simulate scenario, whose job with a parameter server is analysed.")]
JobOpt = Annotated[Optional[str], typer.Option(
    "--job", help="A simulate scenario's job to analyse, by name, where several have a parameter server.")]


@app.command()
def analyze(
    scenario: ScenarioArg,
    as_json: JsonOpt = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Override the scenario's seed.")] = None,
    job: JobOpt = None,
) -> None:
    """Flow-level model of SCENARIO: common sending rate and aggregation rates of every scheme."""
    from .analysis import analyze as run_analysis

    notes: list[str] = []
    try:
        a = run_analysis(scenario, seed=seed, job=job, notes=notes)
    except ConfigError as e:
        _notes(notes)
        raise _exit(e) from None
    _notes(notes)
    if as_json:
        print(json.dumps(a.to_dict()), flush=True)
        return
    table = _compact_table(["scheme"], ["rate\nGbps", "LP\nbound\nGbps", "switch\nagg\nGbps", "PS agg\nGbps",
                                        "INA\nswitches", "max\nlink\nutil"])
    table.add_column("bottleneck")
    for _, r in a.summary.iterrows():
        lp = r.get("lp_rate_gbps")
        table.add_row(r["scheme"], f"{r['rate_gbps']:.5g}", "-" if lp is None or lp != lp else f"{lp:.5g}",
                      f"{r['switch_aggregation_gbps']:.5g}", f"{r['ps_aggregation_gbps']:.5g}", str(r["switches_used"]),
                      f"{r['max_link_utilization']:.3g}", str(r["bottleneck"]))
    out_console.print(f"[bold]{a.name}[/]: {int(a.summary['workers'].iloc[0])} workers; rate = the common sending "
                      "rate of every worker, at which the plan fits every capacity", highlight=False)
    out_console.print(table)
    if a.plan is not None:
        v, b = a.plan.violations, a.plan.bounds
        lam, feasible = a.plan.lp.rate, a.plan.result.extra["feasible_rate_gbps"]
        x = a.plan.result.extra
        if feasible < lam * (1 - 1e-9):
            how = (f"at that rate the plan loads processing {v['processing']:.3g}x (Theorem 5 bound "
                   f"{b['processing']:.3g}), the PS ingress {v['bandwidth']:.3g}x (Theorem 6 bound {b['bandwidth']:.3g}) "
                   f"and links {v['link']:.3g}x its capacity, so it runs at {feasible:.5g} Gbps, the rate above")
        else:
            how = "the plan fits every capacity at that rate"
        found = (f" The plan: the best integral one found, by {x['method']} (one R-GRIA draw: {x['r_gria_rate_gbps']:.5g} "
                 f"Gbps; MILP {x['milp']}; {x['plan_seconds']:.2g} s)." if "method" in x else "")
        out_console.print(f"GRID's LP bound: {lam:.5g} Gbps, the relaxation's lambda (R-GRIA's rounded lambda equals it, "
                          f"Theorem 7; LP solved in {a.plan.lp.seconds:.3f} s); {how}.{found}", highlight=False)
    if a.bom is not None:
        out_console.print(f"BOM (Rina): {a.bom['throughput_gbps']:.6g} Gbps per worker ({a.bom['bottleneck']})")


@app.command()
def plan(
    scheme: Annotated[str, typer.Argument(help="The planner; only grid.")],
    scenario: ScenarioArg,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the routing policy JSON here.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Override the scenario's seed.")] = None,
    trials: Annotated[Optional[int], typer.Option("--trials", help="R-GRIA roundings to draw (default: the scenario's rounding_trials, 16); the best plan among them, the baselines, their local improvements and (small instances) the MILP is kept.")] = None,
    job: JobOpt = None,
) -> None:
    """Compute a GRID routing policy (aggregation node, path and rate per worker) as JSON: the best
    integral plan found (R-GRIA draws, the baselines on GRID's data plane, local moves, and for small
    instances the exact MILP). Rates (rate_gbps) are those at which the plan fits every capacity;
    lp_rate_gbps is the LP bound; search says which method won and the gap to the bound."""
    from .analysis import load_analysis
    from .analysis.grid import plan_grid_best

    if scheme != "grid":
        err_console.print(f"error: scheme: unknown planner {scheme!r}; allowed values: grid", markup=False)
        raise typer.Exit(EXIT_CONFIG)
    notes: list[str] = []
    try:
        sc = load_analysis(scenario, job=job, notes=notes)
        if seed is not None:
            sc = sc.model_copy(update={"seed": seed})
        policy = plan_grid_best(sc.problem(), sc.seed, trials or sc.rounding_trials)
    except ConfigError as e:
        _notes(notes)
        raise _exit(e) from None
    _notes(notes)
    text = policy.to_json()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        p = policy.policy()
        q = p["search"]
        _said(f"wrote {out}: rate {p['rate_gbps']:.5g} Gbps per worker (LP bound {p['lp_rate_gbps']:.5g}, the plan "
              f"{100 * q['lp_gap']:.3g} % below it; found by {q['method']}; MILP {q['milp']}; "
              f"{policy.result.extra['plan_seconds']:.2g} s)")
    else:
        print(text, flush=True)


@app.command()
def reproduce(
    name: Annotated[Optional[str], typer.Argument(help="Reproduction name; all (every one, in parallel, into one report); list (as --list). An unknown one lists them.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result (with all: the report's summary; with --list: the list) as one JSON line last on stdout.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Where to write NAME.md (the write-up), NAME.png, NAME.csv (the rows) and NAME.json.")] = Path("out"),
    update_docs: Annotated[bool, typer.Option("--update-docs", help="Also refresh the committed write-up docs/reproductions/NAME.md of the source checkout "
                                              "(the whole file, except what follows its hand-written marker line: review with git diff). Refused when inalab "
                                              "does not run from a source checkout. Default: docs are never written.")] = False,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write one self-contained HTML page, DIR/index.html, and DIR/report.json of the "
                                                    "reproductions run (default with all: OUT/report; with a NAME: none).")] = None,
    only: Annotated[Optional[str], typer.Option("--only", help="With all: only these reproductions, comma-separated (e.g. a quick report).")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", help="With all: reproductions run at once, each in its own process (default: one per CPU).")] = None,
    seeds: Annotated[Optional[str], typer.Option("--seeds", help="Run on these seeds, comma-separated (e.g. 11,12,13), instead of the reproduction's "
                                                  "default (--list shows it): the simulations' scenario seed, or R-GRIA's rounding seed for the "
                                                  "flow-level GRID ones. With several, the rows get a seed column and holds is judged on their "
                                                  "mean. Refused by a reproduction that takes no seed; with all, applied to every one that takes "
                                                  "seeds.")] = None,
    list_: Annotated[bool, typer.Option("--list", help="List every reproduction: its paper, figure, scale (hosts simulated), default seeds "
                                         "and expected wall time (the last full run's, from docs/report/report.json, or --report DIR's).")] = False,
) -> None:
    """Run a paper reproduction: its table, claim, tolerance and whether it holds; writes OUT/NAME.md,
    .png, .csv and .json (never the docs, unless --update-docs). NAME all runs every one into a report;
    --list (or NAME list) lists them with their scale, seeds and expected time. Ctrl-C or SIGTERM stops
    it at once (no process is left) and exits 130 or 143."""
    from .reproduce import REPRODUCTIONS, get, parse_seeds, run_one, seeds_for, source_docs_dir, update_docs as write_docs, write_outcome

    def usage(option: str, message: str) -> typer.Exit:
        err_console.print(f"error: {option}: {message}", markup=False, highlight=False, soft_wrap=True)
        return typer.Exit(EXIT_CONFIG)

    if list_ and name not in (None, "list"):
        raise usage("--list", f"lists every reproduction; give no NAME (got {name!r})")
    if list_ or name == "list":
        from .reproduce.report import catalog

        cat = catalog(report)  # the expected times: --report DIR's report.json, else the committed one
        if as_json:
            print(json.dumps(cat), flush=True)
            return

        def secs(v: Optional[float]) -> str:
            return ("-" if v is None else f"{v:.2f} s" if v < 1 else f"{v:.1f} s" if v < 10 else f"{v:.0f} s" if v < 120
                    else f"{v / 60:.0f} min")

        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for col, wrap in (("paper", False), ("figure", True), ("reproduction", False), ("scale", True), ("seeds", False)):
            table.add_column(col, no_wrap=not wrap, overflow="fold")
        table.add_column("expected", no_wrap=True, justify="right")
        for r in cat["reproductions"]:
            table.add_row(r["paper"], r["figure"], r["name"], r["scale"] or "-",
                          "none" if r["seeds"] is None else ",".join(map(str, r["seeds"])), secs(r["expected_s"]))
        out_console.print(table)
        src = cat["source"]
        if src["path"] is None:
            _said("expected: no earlier full run found (docs/report/report.json); `inalab reproduce all` records one")
            return
        path = Path(src["path"])
        try:
            path = path.relative_to(Path.cwd())
        except ValueError:
            pass
        known = [r["expected_s"] for r in cat["reproductions"] if r["expected_s"] is not None]
        at_once = f", {src['jobs']} reproductions at once" if src.get("jobs") else ""
        out_console.print(f"expected: each one's wall time in the last full run, {path} (generated {src['generated']} "
                          f"by `{src['command']}` on {src['cpus']} CPUs{at_once}), per seed that run used times the "
                          f"default seeds shown; {sum(known) / 60:.0f} min summed. With N seeds expect about N times "
                          "the one-seed time. Seeds \"none\": it takes no seed (--seeds is refused).",
                          markup=False, highlight=False, soft_wrap=False)
        return
    if name is None:
        raise usage("name", f"give a reproduction's name, all or list; allowed values: all, list, {', '.join(REPRODUCTIONS)}")
    if name != "all" and name not in REPRODUCTIONS:
        raise usage("name", f"unknown reproduction {name!r}; allowed values: all, list, {', '.join(REPRODUCTIONS)}")
    if name != "all" and only is not None:
        raise usage("--only", "only with NAME all")
    if jobs is not None and (name != "all" or jobs < 1):
        raise usage("--jobs", "only with NAME all" if name != "all" else f"must be at least 1, got {jobs}")
    try:
        chosen = None if seeds is None else parse_seeds(seeds, "--seeds")
        if name != "all":
            seeds_for(get(name), chosen, "--seeds")  # a reproduction that takes no seed refuses them
        docs = source_docs_dir() if update_docs else None
    except ConfigError as e:
        raise _exit(e) from None
    if name == "all":
        _reproduce_all(only, out, report if report is not None else out / "report", docs, jobs, as_json, chosen)
        return
    import time

    t0 = time.monotonic()
    try:
        with interruptible(name, lambda _e: _said(f"{name} stopped after {time.monotonic() - t0:.1f} s, unfinished; nothing written")):
            outcome = run_one(name, progress=lambda m: err_console.print(f"[dim]{m}[/]"), seeds=chosen)
    except ConfigError as e:
        raise _exit(e) from None
    except typer.Exit:  # an interrupt's exit (click's Exit is a RuntimeError too)
        raise
    except RuntimeError as e:  # a run that did not complete (a job failed or did not finish), a worker that died
        from .sweeps import WorkerDied

        _said(f"error: {name}: {e}")
        raise typer.Exit(EXIT_ERROR if isinstance(e, WorkerDied) else EXIT_INCOMPLETE) from None
    files = write_outcome(outcome, out)
    if docs is not None:
        write_docs(outcome, docs)
    if report is not None:
        from .reproduce.report import entry, write_report

        write_report([entry(outcome)], report, wall_s=outcome.seconds, jobs=1, command=f"inalab reproduce {name}"
                     + (f" --seeds {','.join(map(str, outcome.seeds))}" if chosen is not None else ""))
        outcome.files["report"] = report / "index.html"
    if as_json:
        d = outcome.to_dict()
        d.pop("writeup")
        print(json.dumps(d), flush=True)
        return
    out_console.print(f"[bold]{name}[/] ({outcome.paper} {outcome.figure}): {outcome.claim}", highlight=False)
    if outcome.seeds is not None:
        whose = "the default" if outcome.seeds_default else "--seeds"
        s_text = ", ".join(map(str, outcome.seeds))
        out_console.print(f"seed{'s' * (len(outcome.seeds) > 1)} {s_text} ({whose})"
                          + (f"; the table is their mean, each seed's rows are in {files['csv']}" if outcome.means is not None else ""),
                          highlight=False, soft_wrap=True)
    # A missing value prints as "-", never "nan"; number columns stay right-aligned.
    import pandas as pd

    shown = outcome.judged
    numeric = {str(c) for c in shown.columns
               if pd.api.types.is_numeric_dtype(shown[c]) and not pd.api.types.is_bool_dtype(shown[c])}
    for table in _wide_table(shown.astype(object).where(shown.notna(), "-"), out_console):
        for column in table.columns:
            if str(column.header) in numeric:
                column.justify = "right"
        out_console.print(table)
    out_console.print(f"tolerance: {outcome.tolerance}", highlight=False)
    if outcome.checks:
        out_console.print("checks: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in outcome.checks.items()), highlight=False)
    out_console.print(f"holds: {'yes' if outcome.holds else 'no'}")
    out_console.print(f"wall time: {outcome.seconds:.1f} s", highlight=False)
    _said("wrote " + ", ".join(str(f) for k, f in outcome.files.items() if k != "json") + f" and {files['json']}")


def _reproduce_all(only: Optional[str], out: Path, report_dir: Path, docs: Optional[Path], jobs: Optional[int],
                   as_json: bool, seeds: Optional[tuple] = None) -> None:
    """`inalab reproduce all`: every reproduction (or --only's) in parallel, one report; ``seeds``
    for each that takes seeds. Ctrl-C / SIGTERM: every reproduction's processes are killed, the
    finished ones are named, exit 130 / 143."""
    import os
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .reproduce import REPRODUCTIONS, takes_seeds
    from .reproduce.report import previous_seconds, run_many, write_report

    names = list(REPRODUCTIONS)
    if only is not None:
        names = [n.strip() for n in only.split(",") if n.strip()]
        bad = [n for n in names if n not in REPRODUCTIONS]
        if bad or not names:
            err_console.print(f"error: --only: {'unknown reproduction ' + repr(bad[0]) if bad else 'no names given'}; "
                              f"allowed values (comma-separated): {', '.join(REPRODUCTIONS)}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_CONFIG)
        names = list(dict.fromkeys(names))
    if seeds is not None:
        seedless = [n for n in names if not takes_seeds(REPRODUCTIONS[n])]
        if seedless:
            _said(f"--seeds: {', '.join(seedless)} take{'s' * (len(seedless) == 1)} no seed; run{'s' * (len(seedless) == 1)} without")
    jobs = jobs or os.cpu_count() or 1
    running: dict[str, str] = {}
    finished: list[dict] = []
    bar = None
    if not as_json:
        bar = Progress(TextColumn("[bold]reproduce all"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.description}"), console=err_console, transient=False)
        bar.start()
        task = bar.add_task("", total=len(names))

    def show() -> None:
        if bar is not None:
            text = "; ".join(f"{n}: {m}" if m else n for n, m in running.items())
            bar.update(task, description=text[:100])

    def on_progress(n: str, msg: str) -> None:
        running[n] = msg
        show()

    def word(e: dict) -> str:
        return "error: " + e["error"] if e["error"] else ("holds" if e["holds"] else "does not hold")

    def on_done(e: dict) -> None:
        finished.append(e)
        running.pop(e["name"], None)
        line = f"{e['name']}: {word(e)} ({e['seconds'] or 0:.0f} s)"
        (bar.console if bar is not None else err_console).print(line, markup=False, highlight=False, soft_wrap=True)
        if bar is not None:
            bar.advance(task)
        show()

    def stopped(_e) -> None:
        if bar is not None:
            bar.stop()
        done = {e2["name"] for e2 in finished}
        cut = [n for n in names if n not in done]
        _said(f"after {time.monotonic() - t0:.0f} s: "
              + (f"finished {len(finished)}: " + "; ".join(f"{e2['name']} ({word(e2)})" for e2 in finished)
                 + f" (their files are in {out})" if finished else "none had finished")
              + (f"; stopped unfinished: {', '.join(cut)}" if cut else "") + "; no report written")

    t0 = time.monotonic()
    try:
        with interruptible("reproduce all", stopped):
            entries = run_many(names, out, jobs=jobs, docs=docs, order_hint=previous_seconds(report_dir),
                               on_progress=on_progress, on_done=on_done, seeds=seeds)
    finally:
        if bar is not None:
            bar.stop()
    command = ("inalab reproduce all" + (f" --only {','.join(names)}" if only is not None else "") + f" --jobs {jobs}"
               + (f" --seeds {','.join(map(str, seeds))}" if seeds is not None else ""))
    rep = write_report(entries, report_dir, wall_s=time.monotonic() - t0, jobs=jobs, command=command)
    summary = {"report": str(report_dir / "index.html"), "json": str(report_dir / "report.json"), "out": str(out),
               **rep["summary"], "wall_s": rep["wall_s"],
               "holds": {e["name"]: e["holds"] for e in rep["reproductions"]},
               "seeds": {e["name"]: e.get("seeds") for e in rep["reproductions"]}}
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        table = Table("paper", "figure", "reproduction", "seeds", "holds", "wall s")
        for e in rep["reproductions"]:
            word = "[red]error[/]" if e["error"] else ("yes" if e["holds"] else "no")
            seeds_text = "-" if e.get("seeds") is None else ",".join(map(str, e["seeds"]))
            table.add_row(e["paper"], e["figure"], e["name"], seeds_text, word,
                          "-" if e["seconds"] is None else f"{e['seconds']:.{0 if e['seconds'] >= 10 else 1}f}")
        out_console.print(table)
        s = rep["summary"]
        out_console.print(f"{s['hold']} of {s['reproductions']} hold, {s['do_not_hold']} do not, {s['errors']} failed; "
                          f"{rep['wall_s']:.0f} s; wrote {summary['report']} and {summary['json']}", markup=False, highlight=False,
                          soft_wrap=True)
    if rep["summary"]["errors"]:
        raise typer.Exit(1)




# ---------------------------------------------------------------- the real data plane (docs/runtime.md)

StatsEvery = Annotated[float, typer.Option("--stats-every", help="Seconds between status lines (0: none).")]
ServeJsonOpt = Annotated[bool, typer.Option("--json", help=(
    'JSON lines on stdout instead of text: {"event": "ready", ...} once listening, {"event": "stats", ...} '
    'every --stats-every s and {"event": "stopped", ...} with the final counters, or {"event": "failed", "error": ...} '
    'if its data plane stopped (exit status 1) (and {"event": "standby"} / '
    '{"event": "command", ...} with --standby / --stdin-commands). Without it: status lines on stderr, the '
    'final counters as indented JSON on stdout.'))]


def _serve(kind: str, start, as_json: bool, every: float, commands: bool = False, standby: bool = False) -> None:
    """Runs a switch or PS until Ctrl-C / SIGTERM, printing a status line every `every` s.
    ``commands``: also read JSON lines from stdin (see `_stdin_commands`). ``standby``: start
    only when stdin says ``{"op": "start"}`` (a switch restarted at a given time: everything
    is imported and ready to go before)."""
    import signal
    import time

    if standby:
        import sys

        if as_json:
            print(json.dumps({"event": "standby", "kind": kind}), flush=True)
        for line in iter(sys.stdin.readline, ""):
            if line.strip() and json.loads(line).get("op") == "start":
                break
        else:
            return
    try:
        node = start()
    except (ValueError, RuntimeError, OSError) as e:
        # Unreachable peers (ConnectionError) are 1, what cannot run as given (an address in
        # use, a bad option) 2; each message names the address, the cause and the fix.
        raise _exit(e, EXIT_ERROR if isinstance(e, ConnectionError) else EXIT_CONFIG) from None

    def stop_on_sigterm(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    ready = {"event": "ready", "kind": kind, "udp": node.udp_addr, "control": node.control_addr}
    if as_json:
        print(json.dumps(ready), flush=True)
    err_console.print(f"{kind} ready: data plane udp {node.udp_addr}, control tcp {node.control_addr}", highlight=False)
    if commands:
        import threading

        threading.Thread(target=_stdin_commands, args=(node, as_json), name="inalab-stdin", daemon=True).start()
    try:
        next_line = time.monotonic() + every
        while True:
            # The data plane is checked every half second, status line or not: a switch whose
            # data plane stopped exits with the reason instead of living on serving nothing.
            time.sleep(min(0.5, every) if every > 0 else 0.5)
            node.health()
            if every > 0 and time.monotonic() >= next_line:
                next_line += every
                st = node.stats()
                if as_json:
                    print(json.dumps({"event": "stats", **st}), flush=True)
                else:
                    err_console.print(_status_line(kind, st), highlight=False, soft_wrap=True)
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:
        _say(e)
        if as_json:
            print(json.dumps({"event": "failed", "kind": kind, "error": str(e)}), flush=True)
        node.stop()
        raise typer.Exit(EXIT_ERROR) from None
    final = node.stats()
    node.stop()
    print(json.dumps({"event": "stopped", **final}) if as_json else json.dumps(final, indent=1), flush=True)


def _stdin_commands(node, as_json: bool) -> None:
    """Commands for a running switch, one JSON line each on stdin, from the process that
    started it (``inalab emulate`` models a link's carrier this way): ``{"op": "link", "peer":
    NODE, "up": false}`` reports the link to neighbour NODE down (true: up again); ``{"op":
    "release", "job": J}`` says job J ended (its state here is removed; the reply carries the
    ``aggregators_released`` it still held). Each is answered on stdout by ``{"event":
    "command", "ok": ..., ...}``."""
    import sys

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("op") == "link":
                node.set_link(int(cmd["peer"]), bool(cmd["up"]))
                reply = {"event": "command", "ok": True, **cmd}
            elif cmd.get("op") == "release":
                reply = {"event": "command", "ok": True, **cmd, "aggregators_released": node.release_job(int(cmd["job"]))}
            else:
                raise ValueError(f"op: {cmd.get('op')!r} is not \"link\" or \"release\"")
        except (ValueError, KeyError, TypeError) as e:
            reply = {"event": "command", "ok": False, "error": str(e), "line": line.strip()[:64]}
        if as_json:
            print(json.dumps(reply), flush=True)
        else:
            err_console.print(json.dumps(reply), highlight=False, markup=False)


def _status_line(kind: str, st: dict) -> str:
    if kind == "switch":
        # Every driver counter of a packet lost (docs/runtime.md, "What the switch drops"); the
        # programs' own discards (program_drops: duplicates, stale packets) are not losses either.
        drops = sum(st.get(k, 0) for k in ("malformed", "unknown_source", "spoofed", "unadmitted", "no_route", "dead_port",
                                           "link_down", "outside_job", "unsealed", "processing_drops", "injected_drops"))
        drops += sum(st.get("forged", {}).values())
        return (f"switch: jobs {st['jobs']} | packets in {st['received']} out {st['forwarded']} dropped {drops} | "
                f"aggregators in use {st['aggregators_in_use']}")
    return f"ps: jobs {list(st['jobs'])} | datagrams in {st['io']['datagrams_received']} out {st['io']['datagrams_sent']}"


@app.command()
def switch(
    program: Annotated[str, typer.Option(help="Switch programs: a scheme with one (switchml, atp, dsa, canary, static_tree, rina, grid), or several joined by commas.")] = "switchml",
    udp: Annotated[str, typer.Option(help="Data-plane UDP address (ip:port).")] = "127.0.0.1:9000",
    control: Annotated[str, typer.Option(help="Control-plane TCP address (ip:port).")] = "127.0.0.1:9100",
    node: Annotated[int, typer.Option(help="Node id, 1-65535, unique among the switches and PS.")] = 1,
    memory_bytes: Annotated[int, typer.Option(help="Aggregator memory, bytes.")] = 5_000_000,
    pool_slots: Annotated[int, typer.Option(help="Switch pool of a job that sets none (SwitchML slots per job).")] = 128,
    packet_values: Annotated[int, typer.Option(help="Values per datagram of a job that sets no ina.packet_bytes (SwitchML, ATP); "
                                               "0: the scheme's default, a Tofino's. At most what the interfaces' MTU carries (352 at 1500 B).")] = 2048,
    drop_probability: Annotated[float, typer.Option(help="Share of incoming packets dropped at random (0-1).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the random drops.")] = 1,
    upstream: Annotated[Optional[str], typer.Option(help="Control address of the next switch toward the PS (ATP chains).")] = None,
    timeout_us: Annotated[int, typer.Option(help="Loss-recovery timeout of a job that sets none, microseconds.")] = 20_000,
    link_rate: Annotated[Optional[int], typer.Option(help="Shape every port's egress to this rate, bits/s (default: not shaped).")] = None,
    link_delay_us: Annotated[float, typer.Option(help="With --link-rate: each port's link delay, microseconds.")] = 0.0,
    buffer_bytes: Annotated[int, typer.Option(help="With --link-rate: each port's queue, bytes (tail drop beyond).")] = 1 << 20,
    fabric: Annotated[Optional[Path], typer.Option(help="A static deployment's JSON (neighbours, routes, jobs), as inalab emulate writes it.")] = None,
    commands: Annotated[bool, typer.Option("--stdin-commands", help='Read commands from stdin, one JSON line each: {"op": "link", "peer": NODE, "up": false} reports the link to neighbour NODE down (true: up); {"op": "release", "job": J} says job J ended.')] = False,
    standby: Annotated[bool, typer.Option("--standby", help='Start only when stdin says {"op": "start"} (a switch restarted at a set time).')] = False,
    pcap: Annotated[Optional[Path], typer.Option("--pcap", help="Write every datagram received and sent to this pcapng file (wall-clock timestamps; docs/runtime.md, 'Packet captures').")] = None,
    threads: Annotated[int, typer.Option(help="Data-plane threads, each with its own socket and --memory-bytes of aggregator memory; "
                                         "a SwitchML or ATP job runs on all of them (by slot or fragment), any other job on one. "
                                         "0: a quarter of the cores, 1 to 8 (1 with --fabric, --pcap or --link-rate).")] = 0,
    every: StatsEvery = 5.0,
    as_json: ServeJsonOpt = False,
) -> None:
    """Run a software INA switch (the switch programs of ATP, SwitchML, ...) over UDP until interrupted.
    Every --stats-every s a status line on stderr: admitted jobs, packets in and out, drops, and the
    aggregators holding a partial sum at that moment (0 between jobs); on SIGTERM or Ctrl-C the final
    counters on stdout (docs/runtime.md)."""
    from .runtime import Switch

    f = _read_json(fabric, "--fabric")
    _serve("switch", lambda: Switch(program, udp, control, node, memory_bytes, pool_slots, drop_probability, seed,
                                    upstream, timeout_us, link_rate, link_delay_us, buffer_bytes, f, packet_values, pcap, threads), as_json, every,
                                    commands, standby)


def _read_json(path: Optional[Path], option: str) -> Optional[dict]:
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        err_console.print(f"error: {option}: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None


@app.command()
def ps(
    switch: Annotated[str, typer.Option("--switch", help="Control address of the ATP switch the PS attaches to.")] = "127.0.0.1:9100",
    udp: Annotated[str, typer.Option(help="Data-plane UDP address (ip:port).")] = "127.0.0.1:9200",
    control: Annotated[str, typer.Option(help="Control-plane TCP address (ip:port).")] = "127.0.0.1:9300",
    node: Annotated[int, typer.Option(help="Node id, 1-65535, unique among the switches and PS.")] = 2,
    link_rate: Annotated[Optional[int], typer.Option(help="Send no faster than this link rate, bits/s (default: unpaced).")] = None,
    fabric: Annotated[Optional[Path], typer.Option(help="A static deployment's JSON (gateway, jobs): attach to no switch.")] = None,
    every: StatsEvery = 5.0,
    as_json: ServeJsonOpt = False,
) -> None:
    """Run the parameter server of the jobs whose scheme has one (ATP's fallback aggregator) until interrupted."""
    from .runtime import ParameterServer

    f = _read_json(fabric, "--fabric")
    _serve("ps", lambda: ParameterServer(switch, udp, control, node, link_rate, f), as_json, every)


@app.command("worker-key")
def worker_key() -> None:
    """Print this deployment's worker key (64 hex digits): set it as INALAB_WORKER_KEY on a worker
    machine, which can then join jobs without the deployment secret (and cannot act as a switch or PS)."""
    from . import _core

    try:
        print(_core.worker_key())
    except ValueError as e:
        raise _exit(e)


@app.command()
def wireshark(
    path: Annotated[bool, typer.Option("--path", help="Print the dissector's path (the default).")] = False,
    install: Annotated[bool, typer.Option("--install", help="Copy the dissector into Wireshark's personal Lua plugin folder.")] = False,
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Plugin folder to install into.")] = None,
) -> None:
    """The Wireshark dissector of inalab's frames and control plane (a Lua plugin): print its path,
    or install it (default ~/.local/lib/wireshark/plugins/, Wireshark's personal Lua plugin folder;
    restart Wireshark or reload Lua plugins, Ctrl+Shift+L)."""
    import shutil

    lua = Path(__file__).resolve().parent / "wireshark" / "inalab.lua"
    if not install:
        print(lua)
        return
    target = directory if directory is not None else Path.home() / ".local" / "lib" / "wireshark" / "plugins"
    try:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lua, target / lua.name)
    except OSError as e:
        err_console.print(f"error: cannot install into {target}: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    print(target / lua.name)


@app.command("nccl-plugin")
def nccl_plugin(
    path: Annotated[bool, typer.Option("--path", help="Print the plugin's path (the default).")] = False,
) -> None:
    """The NCCL network plugin whose CollNet allreduce goes through an inalab switch: print its
    path. A GPU job uses it with NCCL_NET_PLUGIN=<that path> NCCL_COLLNET_ENABLE=1
    INALAB_SWITCH=<the switch's control address> (INALAB_SCHEME: switchml, atp or dsa)."""
    from . import nccl_plugin_path

    try:
        print(nccl_plugin_path())
    except FileNotFoundError as e:
        raise _exit(e, 1)


if __name__ == "__main__":
    app()
