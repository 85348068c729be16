"""The ``inalab`` command: simulate scenarios, list the shipped ones, run the demo.

Human output goes to stdout as rich tables; progress bars and messages go to stderr, so that
with ``--json`` the last line of stdout is the summary object. A bad scenario prints one line
``error: <field>: <message>`` on stderr and exits with status 2.
"""
from __future__ import annotations

import json
import tomllib
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

EXIT_CONFIG = 2

JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the summary as one JSON line on stdout.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write result.json, summary.json and CSV tables here.")]


def _run(scenario: str, seed: Optional[int], as_json: bool, pcap=None) -> Result:
    try:
        return run_simulation(scenario, seed=seed, progress=not as_json, pcap=pcap)
    except ConfigError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except OSError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


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


def _report(result: Result, as_json: bool, out: Optional[Path]) -> None:
    if out is not None:
        for path in result.save(out):
            _said(f"wrote {path}")
    if as_json:
        print(json.dumps(result.summary()), flush=True)
        return
    s = result.summary()
    if "emulation" in result.raw:
        out_console.print(f"[bold]{s['scenario']}[/]: emulated {s['sim_time_s']:.6g} s ({s['stopped_by']}) "
                          f"in {s['wall_s']:.2f} s wall, seed {s['seed']}")
    else:
        out_console.print(
            f"[bold]{s['scenario']}[/]: simulated {s['sim_time_s']:.6g} s ({s['stopped_by']}) "
            f"in {s['wall_s']:.2f} s wall, {s['events']:,} events, seed {s['seed']}"
        )
    if s["jobs"]:
        table = _compact_table(["job", "scheme"], ["workers", "iters", "JCT\nms", "iter\nms", "Gbps", "comm", "done"])
        for j in s["jobs"]:
            share = j.get("comm_share")
            comm = "-" if share is None else f"{share:.0%}"
            table.add_row(j["name"], j["scheme"], str(j["workers"]), str(j["iterations"]), _short(j["jct_s"] * 1e3),
                          _short(j["mean_iteration_s"] * 1e3), f"{j['goodput_gbps']:.2f}",
                          f"[yellow]{comm}[/]" if j.get("compute_bound") else comm, "yes" if j["finished"] else "[red]no[/]")
        out_console.print(table)
        bound = [j["name"] for j in s["jobs"] if j.get("compute_bound")]
        if bound:
            out_console.print(
                f"[yellow]compute-bound[/] (comm, the share of the JCT with communication outstanding, below "
                f"{COMPUTE_BOUND_SHARE:.0%}: no network or INA scheme can save more than that share): "
                f"{', '.join(bound)}. A job's compute_scale < 1 models a faster GPU.", highlight=False)
    if s["flows"]:
        out_console.print(f"{s['flows']} flows; see --out for flows.csv")
    if s["conservation_holds"] is False:
        err_console.print("[red]warning:[/] packet conservation does not hold; see result.json")


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
    """Simulate SCENARIO and print its jobs' completion times."""
    capture = None
    if pcap is not None:
        from .capture import Capture

        try:
            capture = Capture.from_cli(pcap, pcap_at, pcap_job, pcap_window)
        except ConfigError as e:
            err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_CONFIG) from None
    elif any(v is not None for v in (pcap_at, pcap_job, pcap_window)):
        err_console.print("error: --pcap-at, --pcap-job and --pcap-window need --pcap DIR", highlight=False)
        raise typer.Exit(EXIT_CONFIG)
    result = _run(scenario, seed, as_json, capture)
    for c in result.raw.get("captures") or []:
        _said(f"wrote {c['path']} ({c['packets']:,} packets)")
    _report(result, as_json, out)


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
        result = run_emulation(scenario, seed=seed, progress=True, keep_logs=logs, shaper=shaper, pcap=pcap)
    except ConfigError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except EmulationError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    _report(result, as_json, out)
    if not as_json:
        em = result.raw["emulation"]
        err_console.print(f"links shaped by {em['shaping']}" + ("" if em["link_delay_emulated"] else " (link delay not emulated: no netem)"),
                          highlight=False)


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="A result directory or result.json (e.g. simulated).")],
    b: Annotated[Path, typer.Argument(help="Another one (e.g. emulated).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the tables as JSON on stdout.")] = False,
) -> None:
    """Put two results side by side, job by job and link by link, with the relative difference (B - A) / A."""
    from .comparison import compare as side_by_side

    try:
        tables = side_by_side(a, b)
    except (FileNotFoundError, json.JSONDecodeError, KeyError) as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None
    if as_json:
        print(json.dumps({k: json.loads(v.to_json(orient="records")) for k, v in tables.items()}))
        return
    jobs = tables["jobs"]
    table = Table("job", "JCT ms (A)", "JCT ms (B)", "B vs A")
    for _, r in jobs.iterrows():
        table.add_row(str(r["name"]), f"{r['jct_s_a'] * 1e3:.3f}", f"{r['jct_s_b'] * 1e3:.3f}", f"{r['jct_s_rel']:+.1%}")
    out_console.print(table)
    links = tables["links"]
    if not links.empty:
        lt = Table("link", "bytes (A)", "bytes (B)", "B vs A")
        for _, r in links.iterrows():
            lt.add_row(f"{r['src']}->{r['dst']}", f"{r['tx_bytes_a']:,.0f}", f"{r['tx_bytes_b']:,.0f}", f"{r['tx_bytes_rel']:+.1%}")
        out_console.print(lt)


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(help="A sweep file (TOML): base scenario, [vary] fields, seeds.")],
    out: Annotated[Path, typer.Option("--out", help="The Parquet dataset's directory (reruns skip the points done).")],
    workers: Annotated[Optional[int], typer.Option("--workers", help="Local processes (default: one per CPU).")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="Run on Ray instead: local (start one here), auto (the running cluster) or a cluster address.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a summary as one JSON line, no progress bar.")] = False,
) -> None:
    """Simulate every combination of a sweep file's varied fields and seeds, in parallel; one row per job per point."""
    from .sweeps import sweep as run_sweep

    if workers is not None and workers < 1:
        err_console.print(f"error: --workers: must be at least 1, got {workers}", highlight=False)
        raise typer.Exit(EXIT_CONFIG)
    try:
        df = run_sweep(file, out, workers=workers, ray=ray, progress=not as_json)
    except ConfigError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None
    points = df.drop_duplicates("point") if not df.empty else df
    summary = {"out": str(out), "points": len(points), "failed": int((points.status == "error").sum()) if len(points) else 0,
               "rows": len(df)}
    if as_json:
        print(json.dumps(summary), flush=True)
        return
    out_console.print(f"{summary['points']} points ({summary['failed']} failed), {summary['rows']} rows in {out}")
    for _, r in points[points.status == "error"].head(5).iterrows():
        err_console.print(f"  point {r['point']}: {r['error']}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def scenarios() -> None:
    """List the scenarios shipped with inalab (usable by name)."""
    table = Table("name", "description")
    for name, path in shipped_scenarios().items():
        with path.open("rb") as f:
            table.add_row(name, tomllib.load(f).get("description", ""))
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

    result = _run("demo", None, as_json)
    with shipped_scenarios()["demo"].open("rb") as f:
        description = tomllib.load(f).get("description")
    figure = demo_figure(result, out / "demo.png", title=f"demo: {description}" if description else None)
    _report(result, as_json, out)
    _said(f"wrote {figure}")


@app.command()
def version() -> None:
    """Print the versions of the package and of the simulator extension."""
    from . import _core

    print(f"inalab {__version__} (simulator {_core.version()})")


# ---------------------------------------------------------------- flow-level analysis (docs/analysis.md)


def _config_exit(e: ConfigError) -> typer.Exit:
    err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_CONFIG)


@app.command()
def analyze(
    scenario: Annotated[str, typer.Argument(help="An analysis scenario TOML file, or a shipped one's name (grid-fig1).")],
    as_json: JsonOpt = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Override the scenario's seed.")] = None,
) -> None:
    """Flow-level model of SCENARIO: common sending rate and aggregation rates of every scheme."""
    from .analysis import analyze as run_analysis

    try:
        a = run_analysis(scenario, seed=seed)
    except ConfigError as e:
        raise _config_exit(e) from None
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
        if feasible < lam * (1 - 1e-9):
            how = (f"at that rate the rounded plan loads processing {v['processing']:.3g}x (Theorem 5 bound "
                   f"{b['processing']:.3g}), the PS ingress {v['bandwidth']:.3g}x (Theorem 6 bound {b['bandwidth']:.3g}) "
                   f"and links {v['link']:.3g}x its capacity, so it runs at {feasible:.5g} Gbps, the rate above")
        else:
            how = "the rounded plan fits every capacity at that rate"
        out_console.print(f"GRID's LP bound: {lam:.5g} Gbps, the relaxation's lambda (R-GRIA's rounded lambda equals it, "
                          f"Theorem 7; LP solved in {a.plan.lp.seconds:.3f} s); {how}.", highlight=False)
    if a.bom is not None:
        out_console.print(f"BOM (Rina): {a.bom['throughput_gbps']:.6g} Gbps per worker ({a.bom['bottleneck']})")


@app.command()
def plan(
    scheme: Annotated[str, typer.Argument(help="The planner; only grid.")],
    scenario: Annotated[str, typer.Argument(help="An analysis scenario TOML file, or a shipped one's name.")],
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the routing policy JSON here.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Override the scenario's seed.")] = None,
    trials: Annotated[Optional[int], typer.Option("--trials", help="R-GRIA roundings to try (best kept).")] = None,
) -> None:
    """Compute a GRID routing policy (aggregation node, path and rate per worker) as JSON. Rates
    (rate_gbps) are those at which the rounded plan fits every capacity; lp_rate_gbps is the LP bound."""
    from .analysis import load_analysis
    from .analysis.grid import plan_grid_best

    if scheme != "grid":
        err_console.print(f"error: scheme: unknown planner {scheme!r}; allowed values: grid", markup=False)
        raise typer.Exit(EXIT_CONFIG)
    try:
        sc = load_analysis(scenario)
        if seed is not None:
            sc = sc.model_copy(update={"seed": seed})
        policy = plan_grid_best(sc.problem(), sc.seed, trials or sc.rounding_trials)
    except ConfigError as e:
        raise _config_exit(e) from None
    text = policy.to_json()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        p = policy.policy()
        _said(f"wrote {out}: rate {p['rate_gbps']:.5g} Gbps per worker (LP bound {p['lp_rate_gbps']:.5g})")
    else:
        print(text, flush=True)


@app.command()
def reproduce(
    name: Annotated[str, typer.Argument(help="Reproduction name, or all (every one, in parallel, into one report); an unknown one lists them.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result (with all: the report's summary) as one JSON line last on stdout.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Where to write NAME.md (the write-up), NAME.png, NAME.csv (the rows) and NAME.json.")] = Path("out"),
    update_docs: Annotated[bool, typer.Option("--update-docs", help="Also refresh the committed write-up docs/reproductions/NAME.md of the source checkout "
                                              "(the whole file, except what follows its hand-written marker line: review with git diff). Refused when inalab "
                                              "does not run from a source checkout. Default: docs are never written.")] = False,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write one self-contained HTML page, DIR/index.html, and DIR/report.json of the "
                                                    "reproductions run (default with all: OUT/report; with a NAME: none).")] = None,
    only: Annotated[Optional[str], typer.Option("--only", help="With all: only these reproductions, comma-separated (e.g. a quick report).")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", help="With all: reproductions run at once, each in its own process (default: one per CPU).")] = None,
) -> None:
    """Run a paper reproduction: its table, claim, tolerance and whether it holds; writes OUT/NAME.md,
    .png, .csv and .json (never the docs, unless --update-docs). NAME all runs every one into a report."""
    from .reproduce import REPRODUCTIONS, run_one, source_docs_dir, update_docs as write_docs, write_outcome

    def usage(option: str, message: str) -> typer.Exit:
        err_console.print(f"error: {option}: {message}", markup=False, highlight=False, soft_wrap=True)
        return typer.Exit(EXIT_CONFIG)

    if name != "all" and name not in REPRODUCTIONS:
        raise usage("name", f"unknown reproduction {name!r}; allowed values: all, {', '.join(REPRODUCTIONS)}")
    if name != "all" and only is not None:
        raise usage("--only", "only with NAME all")
    if jobs is not None and (name != "all" or jobs < 1):
        raise usage("--jobs", "only with NAME all" if name != "all" else f"must be at least 1, got {jobs}")
    try:
        docs = source_docs_dir() if update_docs else None
    except ConfigError as e:
        raise _config_exit(e) from None
    if name == "all":
        _reproduce_all(only, out, report if report is not None else out / "report", docs, jobs, as_json)
        return
    try:
        outcome = run_one(name, progress=lambda m: err_console.print(f"[dim]{m}[/]"))
    except ConfigError as e:
        raise _config_exit(e) from None
    files = write_outcome(outcome, out)
    if docs is not None:
        write_docs(outcome, docs)
    if report is not None:
        from .reproduce.report import entry, write_report

        write_report([entry(outcome)], report, wall_s=outcome.seconds, jobs=1, command=f"inalab reproduce {name}")
        outcome.files["report"] = report / "index.html"
    if as_json:
        d = outcome.to_dict()
        d.pop("writeup")
        print(json.dumps(d), flush=True)
        return
    out_console.print(f"[bold]{name}[/] ({outcome.paper} {outcome.figure}): {outcome.claim}", highlight=False)
    for table in _wide_table(outcome.rows, out_console):
        out_console.print(table)
    out_console.print(f"tolerance: {outcome.tolerance}", highlight=False)
    if outcome.checks:
        out_console.print("checks: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in outcome.checks.items()), highlight=False)
    out_console.print(f"holds: {'yes' if outcome.holds else 'no'}")
    _said("wrote " + ", ".join(str(f) for k, f in outcome.files.items() if k != "json") + f" and {files['json']}")


def _reproduce_all(only: Optional[str], out: Path, report_dir: Path, docs: Optional[Path], jobs: Optional[int],
                   as_json: bool) -> None:
    """`inalab reproduce all`: every reproduction (or --only's) in parallel, one report."""
    import os
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .reproduce import REPRODUCTIONS
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
    jobs = jobs or os.cpu_count() or 1
    running: dict[str, str] = {}
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

    def on_done(e: dict) -> None:
        running.pop(e["name"], None)
        word = "error: " + e["error"] if e["error"] else ("holds" if e["holds"] else "does not hold")
        line = f"{e['name']}: {word} ({e['seconds'] or 0:.0f} s)"
        (bar.console if bar is not None else err_console).print(line, markup=False, highlight=False, soft_wrap=True)
        if bar is not None:
            bar.advance(task)
        show()

    t0 = time.monotonic()
    try:
        entries = run_many(names, out, jobs=jobs, docs=docs, order_hint=previous_seconds(report_dir),
                           on_progress=on_progress, on_done=on_done)
    finally:
        if bar is not None:
            bar.stop()
    command = "inalab reproduce all" + (f" --only {','.join(names)}" if only is not None else "") + f" --jobs {jobs}"
    rep = write_report(entries, report_dir, wall_s=time.monotonic() - t0, jobs=jobs, command=command)
    summary = {"report": str(report_dir / "index.html"), "json": str(report_dir / "report.json"), "out": str(out),
               **rep["summary"], "wall_s": rep["wall_s"],
               "holds": {e["name"]: e["holds"] for e in rep["reproductions"]}}
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        table = Table("paper", "figure", "reproduction", "holds", "wall s")
        for e in rep["reproductions"]:
            word = "[red]error[/]" if e["error"] else ("yes" if e["holds"] else "no")
            table.add_row(e["paper"], e["figure"], e["name"], word, "" if e["seconds"] is None else f"{e['seconds']:.{0 if e['seconds'] >= 10 else 1}f}")
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
    'every --stats-every s and {"event": "stopped", ...} with the final counters (and {"event": "standby"} / '
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
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG)
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
        while True:
            time.sleep(every if every > 0 else 3600)
            if every > 0:
                st = node.stats()
                if as_json:
                    print(json.dumps({"event": "stats", **st}), flush=True)
                else:
                    err_console.print(_status_line(kind, st), highlight=False, soft_wrap=True)
    except KeyboardInterrupt:
        pass
    final = node.stats()
    node.stop()
    print(json.dumps({"event": "stopped", **final}) if as_json else json.dumps(final, indent=1), flush=True)


def _stdin_commands(node, as_json: bool) -> None:
    """Commands for a running switch, one JSON line each on stdin, from the process that
    started it (``inalab emulate`` models a link's carrier this way): ``{"op": "link", "peer":
    NODE, "up": false}`` reports the link to neighbour NODE down (true: up again). Each is
    answered on stdout by ``{"event": "command", "ok": ..., ...}``."""
    import sys

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("op") != "link":
                raise ValueError(f"op: {cmd.get('op')!r} is not \"link\"")
            node.set_link(int(cmd["peer"]), bool(cmd["up"]))
            reply = {"event": "command", "ok": True, **cmd}
        except (ValueError, KeyError, TypeError) as e:
            reply = {"event": "command", "ok": False, "error": str(e), "line": line.strip()[:64]}
        if as_json:
            print(json.dumps(reply), flush=True)
        else:
            err_console.print(json.dumps(reply), highlight=False, markup=False)


def _status_line(kind: str, st: dict) -> str:
    if kind == "switch":
        # Every driver counter of a packet lost (docs/runtime.md, "What the switch drops"); the
        # programs' own drops (program_drops) are mostly packets consumed by aggregation.
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
    commands: Annotated[bool, typer.Option("--stdin-commands", help='Read commands from stdin, one JSON line each: {"op": "link", "peer": NODE, "up": false} reports the link to neighbour NODE down (true: up).')] = False,
    standby: Annotated[bool, typer.Option("--standby", help='Start only when stdin says {"op": "start"} (a switch restarted at a set time).')] = False,
    pcap: Annotated[Optional[Path], typer.Option("--pcap", help="Write every datagram received and sent to this pcapng file (wall-clock timestamps; docs/runtime.md, 'Packet captures').")] = None,
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
                                    upstream, timeout_us, link_rate, link_delay_us, buffer_bytes, f, packet_values, pcap), as_json, every,
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
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG)


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


if __name__ == "__main__":
    app()
