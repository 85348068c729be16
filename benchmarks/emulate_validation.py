"""Simulated against emulated JCT of the shipped emulation scenarios (docs/validation.md,
"Emulation"): each scenario at its own link rate and at 1 Gbps, simulated once (deterministic)
and emulated `--reps` times. Writes the rows as JSON and the figure drawn from them.

    .venv/bin/python benchmarks/emulate_validation.py --out out/emulate-validation   # needs root
    .venv/bin/python benchmarks/emulate_validation.py --scenarios emulate-canary-leafspine,emulate-canary-spine-failure \
        --rates 100Mbps --out out/emulate-canary

Canary rows also carry the hosts' re-issues and requests and the switches' stragglers, both
drivers'.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import inalab
from inalab.config import read_source, shipped_scenarios

SCENARIOS = ("emulate-switchml-star", "emulate-atp-star", "emulate-atp-leafspine", "emulate-ring-leafspine",
             "emulate-canary-leafspine", "emulate-canary-spine-failure")
RATES = ("100Mbps", "1Gbps")
TOLERANCE = 0.15  # the bar: emulated JCT within 15 % of simulated


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/emulate-validation"))
    p.add_argument("--reps", type=int, default=3, help="emulations per point (default 3)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: every shipped emulate-* scenario)")
    p.add_argument("--rates", default=",".join(RATES), help="link rates, comma-separated (default: %(default)s)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    scenarios, rates = a.scenarios.split(","), a.rates.split(",")
    for name in scenarios:
        for rate in rates:
            scenario = read_source(name, shipped_scenarios(), "scenario")
            topo = scenario["topology"]
            for key in ("link_rate", "host_rate", "fabric_rate"):
                if key in topo:
                    topo[key] = rate
            simulated = inalab.simulate(scenario)
            sim = simulated.jobs.iloc[0]
            for rep in range(a.reps):
                t = time.monotonic()
                # Other work on the machine slows the processes, not the simulator: recorded.
                load = os.getloadavg()[0]
                emu = inalab.emulate(scenario, progress=False)
                j = emu.jobs.iloc[0]
                row = {"scenario": name, "link_rate": rate, "rep": rep, "sim_jct_s": float(sim.jct_s),
                       "emu_jct_s": float(j.jct_s), "ratio": float(j.jct_s / sim.jct_s), "finished": bool(j.finished),
                       "payload_errors": int(j.payload_errors), "max_error": float(j.max_error), "error_bound": float(j.error_bound),
                       "wall_s": round(time.monotonic() - t, 1), "load_1min_before": round(load, 2)}
                if j.scheme == "canary":
                    row |= canary_counters(simulated, "sim_") | canary_counters(emu, "emu_")
                row["holds"] = row["finished"] and row["payload_errors"] == 0 and abs(row["ratio"] - 1) <= TOLERANCE
                rows.append(row)
                print(json.dumps(row), flush=True)
    (a.out / "rows.json").write_text(json.dumps(rows, indent=1))
    figure(rows, a.out / "sim_vs_emu.png", scenarios, rates)
    print(f"wrote {a.out / 'rows.json'} and {a.out / 'sim_vs_emu.png'}", file=sys.stderr)
    return 0


def canary_counters(result, prefix: str) -> dict:
    """Hosts' re-issues and requests, switches' stragglers (the emulator prefixes program
    counters with `program.`)."""
    hosts = result.raw["hosts"]
    out = {prefix + k: sum(h["counters"].get(k, 0) for h in hosts) for k in ("reissues", "rtx_requests", "resent_results", "fallback_blocks")}
    out[prefix + "stragglers"] = sum(s["counters"].get("stragglers", s["counters"].get("program.stragglers", 0)) for s in result.raw["switches"])
    return out


def figure(rows: list[dict], path: Path, scenarios=SCENARIOS, rates=RATES) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for i, ((name, rate), marker) in enumerate(zip([(s, r) for s in scenarios for r in rates], "osD^v<>pPX*h")):
        pts = [r for r in rows if r["scenario"] == name and r["link_rate"] == rate]
        # Hollow markers: runs of two scenarios with the same JCTs stay visible one over the other.
        ax.scatter([r["sim_jct_s"] for r in pts], [r["emu_jct_s"] for r in pts], marker=marker, facecolors="none",
                   edgecolors=f"C{i % 10}", zorder=3, label=f"{name.removeprefix('emulate-')} @ {rate}")
    lo = min(r["sim_jct_s"] for r in rows) * 0.5
    hi = max(max(r["sim_jct_s"], r["emu_jct_s"]) for r in rows) * 1.5
    xs = [lo, hi]
    ax.plot(xs, xs, "k-", lw=0.8, label="emulated = simulated")
    ax.fill_between(xs, [x * (1 - TOLERANCE) for x in xs], [x * (1 + TOLERANCE) for x in xs], color="0.85", label="±15 %")
    ax.set(xscale="log", yscale="log", xlabel="simulated JCT (s)", ylabel="emulated JCT (s)",
           title="inalab emulate vs simulate: each scenario's JCT, run for real against simulated")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # beside the data
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
