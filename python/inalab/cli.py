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
from rich.console import Console
from rich.table import Table

from . import __version__, simulate as run_simulation
from .config import ConfigError, shipped_scenarios
from .results import Result

app = typer.Typer(
    name="inalab", help="Simulate in-network aggregation for distributed ML training.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
out_console = Console()
err_console = Console(stderr=True)

EXIT_CONFIG = 2

JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the summary as one JSON line on stdout.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write result.json, summary.json and CSV tables here.")]


def _run(scenario: str, seed: Optional[int], as_json: bool) -> Result:
    try:
        return run_simulation(scenario, seed=seed, progress=not as_json)
    except ConfigError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None


def _report(result: Result, as_json: bool, out: Optional[Path]) -> None:
    if out is not None:
        for path in result.save(out):
            err_console.print(f"wrote {path}", highlight=False)
    if as_json:
        print(json.dumps(result.summary()), flush=True)
        return
    s = result.summary()
    out_console.print(
        f"[bold]{s['scenario']}[/]: simulated {s['sim_time_s']:.6g} s ({s['stopped_by']}) "
        f"in {s['wall_s']:.2f} s wall, {s['events']:,} events, seed {s['seed']}"
    )
    if s["jobs"]:
        table = Table("job", "scheme", "workers", "iters", "JCT ms", "iter ms", "Gbps", "done")
        for j in s["jobs"]:
            table.add_row(j["name"], j["scheme"], str(j["workers"]), str(j["iterations"]), f"{j['jct_s'] * 1e3:.3f}",
                          f"{j['mean_iteration_s'] * 1e3:.3f}", f"{j['goodput_gbps']:.2f}",
                          "yes" if j["finished"] else "[red]no[/]")
        out_console.print(table)
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
) -> None:
    """Simulate SCENARIO and print its jobs' completion times."""
    _report(_run(scenario, seed, as_json), as_json, out)


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
    """Ring allreduce vs parameter server training VGG16 on one 16-host star; writes OUT/demo.png."""
    from .plots import demo_figure

    result = _run("demo", None, as_json)
    figure = demo_figure(result, out / "demo.png")
    _report(result, as_json, out)
    err_console.print(f"wrote {figure}", highlight=False)


@app.command()
def version() -> None:
    """Print the versions of the package and of the simulator extension."""
    from . import _core

    print(f"inalab {__version__} (simulator {_core.version()})")


if __name__ == "__main__":
    app()
