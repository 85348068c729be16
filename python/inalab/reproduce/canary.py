"""Canary's evaluation (De Sensi et al. §5.2, Figs. 7-11; `../shared/specs/canary.md` §3): the
1024-host two-level fat tree at 100 Gbps, an allreduce on a random share of the hosts while the
others congest the fabric, Canary against ring allreduce and in-network allreduce on 1 to 16
static trees, and two ablations the paper lacks."""
from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from . import markdown_table, register, simulate_all
from .dsa_policy_ablation import bar_plot

# Spec A5: 32K descriptors per switch, sized for the simulations' 1024-B blocks (1060 B each
# with the descriptor's fields), not the 5 MB default of the other schemes.
MEMORY = f"{32768 * 1060}B"
# Spec A17: the paper's SST network is probably lossless; inalab's is drop-tail. With the spec's
# 1 MiB buffers the line-rate background drops Canary's packets, every loss re-issues a block to
# all 511 other hosts, and the run collapses (measured: 4.2 M queue drops, 8.2 M Fail packets and
# no allreduce finished in 3 ms). Buffers of 64 MiB make the drop-tail fabric effectively lossless
# for these runs (the figures' `flow_control="drop_tail"`; their default is PFC, FLOW_CONTROL
# below); adaptive routing keeps its 512 KiB threshold as an absolute queue (1/128 of the
# buffer), the same as Canary's own default `ina.reroute_queue`.
BUFFER = "64MiB"
ADAPTIVE_THRESHOLD = 1 / 128
# The absolute queue adaptive routing leaves a port above (ADAPTIVE_THRESHOLD x BUFFER), kept
# when a scenario picks another buffer.
REROUTE_QUEUE = 512 << 10
# Spec A17's lossless option: `scenario(flow_control="pfc")` runs the fabric with per-port pause
# (`network.flow_control`), so queues stay short and congestion throttles the senders instead
# of building deep queues; the 64 MiB buffer then only scales the adaptive threshold.
FLOW_CONTROLS = ("drop_tail", "pfc", "credit")
# The reproductions' fabric (every figure's `flow_control`): lossless and short-queued, what the
# paper's SST network is (spec A17). On the 64 MiB drop-tail fabric queues grow to milliseconds
# under the line-rate background, a block's partial sums meet their switches far apart against a
# 1 us window, and congested Canary collapses (23.5 Gbps against 51-67 for static trees at 1024
# hosts, docs/canary.md); "drop_tail" keeps that fabric available.
FLOW_CONTROL = "pfc"
# Canary's reroute threshold (`ina.reroute_queue`) on the PFC fabric. PFC keeps every queue near
# its 64 KiB pause threshold, so the 512 KiB default (1/128 of the drop-tail buffer) almost never
# triggers; an adaptive router on a short-queued fabric leaves a port at about xoff. Chosen by
# measurement on the congested 1024-host Fig. 7a point (docs/reproductions/canary-congestion.md).
# Only Canary's program uses it: the network's adaptive routing (the background's) keeps
# REROUTE_QUEUE, so the static trees and the ring see the same fabric whatever Canary's setting.
PFC_REROUTE_QUEUE = "64KiB"
# The paper's SST network (§5.2, issue #40), every figure's default set-up ("sst"): one routing
# rule for every packet (background, static trees, ring and Canary's partial sums alike): merlin's
# fat tree sends a packet up the port its destination picks (the destination modulo the up
# ports) unless that port's output buffer is more than half full, then up the least queued
# (§5.2: "occupancy higher than 50% of its capacity"); credit-based lossless links with a
# per-port buffer of SST_BUFFER; a background in which each host sends to one random host and
# receives from another (a new derangement per 1 MiB message, §5.2); noise that delays the drawn
# packet alone (§5.2.5: "delays 10 % of the packets ... by 1 us"). "inalab" is the set-up the
# committed write-ups used before (PFC, flow-hash ECMP, Canary's own 64 KiB load balancer, the
# background's 512 KiB threshold, a fresh peer per message, NIC stalls), kept as a sensitivity row.
SETUPS = ("sst", "inalab")
SETUP = "sst"
# The per-port buffer: the paper gives none; SST ember's default router parameters
# (`defaultParams.py`: input_buf_size = output_buf_size = 14 KB). It is the credit buffer and
# the base of the 50 % reroute threshold (7 KB); 2 x 300 ns x 100 Gbps = 7.5 KB is the credit
# loop, so one flow keeps its line rate.
SST_BUFFER = "14KB"
SST_NETWORK = {"routing": "adaptive", "adaptive_threshold": 0.5, "default_port": "destination", "buffer": SST_BUFFER}
# Spec A20: the ring sends the INA schemes' 1081-B packets (1024 B of values + 57 B).
RING_TRANSPORT = {"mss": "1024B", "header": "57B"}


def scheme_job(scheme: str) -> dict:
    """A job's scheme fields from its label: "ring", "canary", or "N ST" (N static trees)."""
    if scheme == "ring":
        return {"scheme": "ring", "transport": dict(RING_TRANSPORT)}
    if scheme == "canary":
        return {"scheme": "canary", "ina": {}}
    if scheme.endswith(" ST"):
        return {"scheme": "static_tree", "ina": {"trees": int(scheme.split()[0])}}
    raise ValueError(f"unknown scheme label {scheme!r}")


# Spec A19: 300 ns per link in the paper's model (inalab's default is 1 us).
TOPOLOGY = {"kind": "canary_fat_tree", "link_delay": "300ns"}


def scenario(scheme: str, *, fraction: float = 0.5, congested: bool = True, size: str = "4MiB", tenants: int = 1,
             seed: int = 1, ina: dict | None = None, routing: str = "adaptive", topology: dict | None = None,
             flow_control: str = "drop_tail", buffer: str = BUFFER, pfc: dict | None = None, setup: str = "inalab") -> dict:
    """Canary §5.2: ``tenants`` allreduces of ``size`` on ``fraction`` of the hosts, chosen at
    random (seeded), split equally among the tenants; with ``congested`` the other hosts send
    1 MiB messages at line rate to random peers among themselves (spec A18). ``topology``: a
    leaf-spine table (default the paper's 1024-host fat tree; smaller ones for tests).
    ``flow_control``: "drop_tail" (deep ``buffer``s; this builder's default, the simulator's) or
    "pfc" (a lossless, short-queued fabric, spec A17; ``pfc`` may set ``pfc_xoff`` / ``pfc_xon``).
    The figures pass their own ``flow_control`` (FLOW_CONTROL, "pfc", by default) through
    ``_CanaryFigure.scenario``. ``setup = "sst"``: the paper's network instead (SST_NETWORK, a
    permutation background, Canary's partial sums routed by the network's rule, see SETUPS);
    ``flow_control`` still chooses the links' discipline ("credit" is SST's) and ``routing``
    "ecmp" still turns rerouting off, the rest of ``buffer``/``routing`` is the set-up's."""
    if setup not in SETUPS:
        raise ValueError(f"setup {setup!r}; allowed values: {', '.join(SETUPS)}")
    if flow_control not in FLOW_CONTROLS:
        raise ValueError(f"flow_control {flow_control!r}; allowed values: {', '.join(FLOW_CONTROLS)}")
    if pfc and flow_control != "pfc":
        raise ValueError('pfc thresholds apply only with flow_control="pfc"')
    if setup == "sst":
        return _sst(scenario(scheme, fraction=fraction, congested=congested, size=size, tenants=tenants, seed=seed, ina=ina,
                             routing=routing, topology=topology, flow_control=flow_control, buffer=buffer, pfc=pfc),
                    scheme, flow_control, routing)
    topology = topology or TOPOLOGY
    hosts = topology.get("leaves", 32) * topology.get("hosts_per_leaf", 32)
    order = list(range(hosts))
    random.Random(seed).shuffle(order)
    n = max(2 * tenants, round(fraction * hosts))
    per = n // tenants
    jobs = []
    for k in range(tenants):
        job = {"name": f"{scheme}-{k}", **scheme_job(scheme), "allreduce": size, "iterations": 1,
               "workers": [f"h{h}" for h in sorted(order[k * per:(k + 1) * per])]}
        job["ina"] = {**job.get("ina", {}), **(ina or {})} if "ina" in job else job.get("ina")
        jobs.append({k: v for k, v in job.items() if v is not None})
    s = {"name": f"canary-{scheme}-{fraction}-{congested}-{size}-{tenants}", "seed": seed, "stop": "1s",
         "topology": topology,
         "network": {"routing": routing, "aggregator_memory": MEMORY, "buffer": buffer,
                     **({"adaptive_threshold": _adaptive_threshold(buffer)} if routing == "adaptive" else {}),
                     **({"flow_control": "pfc", **(pfc or {})} if flow_control == "pfc" else {}),
                     **({"flow_control": "credit", "credit_buffer": SST_BUFFER} if flow_control == "credit" else {})},
         "jobs": jobs}
    rest = order[n:]
    if congested and len(rest) >= 2:
        s["background"] = {"hosts": [f"h{h}" for h in sorted(rest)], "load": 1.0, "message": "1MiB"}
    return s


def _sst(s: dict, scheme: str, flow_control: str, routing: str) -> dict:
    """Scenario ``s`` on the paper's network (SETUPS)."""
    net = s["network"]
    net.pop("adaptive_threshold", None)
    net.update(SST_NETWORK)
    if routing == "ecmp":
        net["routing"] = "ecmp"
        net.pop("adaptive_threshold")
    if flow_control == "pfc":
        # Half a per-port buffer taken as PFC's pause threshold (64 KiB): 32 KiB.
        net["buffer"] = net.get("pfc_xoff", "64KiB")
    if scheme == "canary":
        for j in s["jobs"]:
            j["ina"] = {"routing": "network", **j.get("ina", {})}
    if "background" in s:
        s["background"]["pattern"] = "permutation"
    return s


def _adaptive_threshold(buffer: str) -> float:
    """The fraction of ``buffer`` that is REROUTE_QUEUE (exactly ADAPTIVE_THRESHOLD for BUFFER)."""
    if buffer == BUFFER:
        return ADAPTIVE_THRESHOLD
    from ..units import SIZE

    return min(1.0, REROUTE_QUEUE / SIZE.parse(buffer))


def _sum(counters, name: str) -> int:
    return int(sum(c.get(name, 0) for c in counters))


def measure(r) -> list[dict]:
    """A run's row: the allreduces' goodput (mean over tenants, S x 8 / runtime, spec A22), the
    per-link utilization over the run (which ends with the last allreduce), and the counters
    that explain it."""
    util = r.links.utilization
    sw = list(r.switches["counters"])
    hosts = list(r.hosts["counters"])
    # skipna=False: a tenant that did not finish has no goodput or runtime, nor has the run.
    return [{"goodput_gbps": float(r.jobs.goodput_gbps.mean(skipna=False)), "min_goodput_gbps": float(r.jobs.goodput_gbps.min(skipna=False)),
             "runtime_us": float(r.jobs.jct_s.max(skipna=False) * 1e6), "finished": bool(r.jobs.finished.all()),
             "util_mean": float(util.mean()), "util_idle": float((util < 0.05).mean()), "util_above_80": float((util > 0.8).mean()),
             "util_p10": float(util.quantile(0.1)), "util_p50": float(util.quantile(0.5)), "util_p90": float(util.quantile(0.9)),
             "stragglers": _sum(sw, "stragglers"), "collisions": _sum(sw, "collisions"), "rerouted": _sum(sw, "rerouted"),
             "reissues": _sum(hosts, "reissues"), "rtx_requests": _sum(hosts, "rtx_requests") + _sum(hosts, "resends"),
             "drops_queue": int(r.switches.drops_queue.sum()), "descriptors_peak": int(r.switches.aggregators_peak.max()),
             # PFC only (0 under drop-tail): PAUSE frames the switches sent. The deepest switch queue either way.
             "pfc_pauses": _sum(sw, "pfc_pauses_sent"), "max_queue_bytes": int(r.switches.max_queue_bytes.max()),
             # Credits only (0 otherwise): times a port's next packet waited for credits.
             "credit_waits": int(r.links.pfc_pauses.sum()) if "pfc_pauses" in r.links and not _sum(sw, "pfc_pauses_sent") else 0}]


def run_grid(label: str, points: list[tuple[dict, dict]], progress) -> pd.DataFrame:
    """Every point as one parallel sweep; adds each point's goodput relative to Canary's at the
    same setting (``vs_canary``, above 1: Canary faster)."""
    return simulate_all(label, points, progress, measure)


def relative(df: pd.DataFrame, keys: list[str], col: str = "goodput_gbps") -> pd.Series:
    """Canary's ``col`` over each row's at the same ``keys`` (mean over seeds)."""
    canary = df[df.scheme == "canary"].groupby(keys)[col].mean()
    return pd.Series([canary.get(tuple(k) if len(keys) > 1 else k[0], float("nan")) / v
                      for k, v in zip(df[keys].itertuples(index=False), df[col])], index=df.index)


def _ring_congested(ring_congested: bool | None, flow_control: str) -> bool:
    """Whether the ring runs with congestion (None: on PFC only; `canary-congestion`'s default).
    On drop-tail the background's losses make a congested 512-host ring wait out a 1 ms timeout
    at each of its 1,022 steps (about 10 minutes of simulation for under 1 Gbps); on PFC nothing
    is lost and the congested 512-host point takes about 1.5 minutes (`canary-size`'s seven
    205-host points 4 minutes together). `canary-fraction` leaves it off by default (False):
    with 75-95 % of the hosts congesting, one ring point took 2.3-3.3 minutes on PFC."""
    return flow_control in ("pfc", "credit") if ring_congested is None else bool(ring_congested)


class _CanaryFigure:
    name = ""
    claim = ""
    simulates = "1024-host fat tree"
    # The scenario seed: which hosts run the allreduces (drawn in `scenario`) and, in the
    # simulations, the background's peers and the static trees' roots. (1,): the committed
    # write-ups'; each figure's `seeds` argument sets it.
    seeds: tuple = (1,)
    # `plot` gets every seed's rows (write_outcome): the lines are the mean over the seeds, a band
    # their range; the bar figures (Fig. 7, the ablations) average them and show the mean.
    plots_every_seed = True
    seed_use = ("the scenario `seed`: which hosts run the allreduces, the background's peers and the static trees' "
                "roots")
    flow_control: str = "credit"
    reroute_queue: str | None = None
    setup: str = SETUP

    def _fabric(self, flow_control: str | None, reroute_queue: str | None, setup: str = SETUP) -> None:
        """The figures' common constructor arguments. ``setup``: "sst" (SETUP, the paper's
        network) or "inalab" (the earlier write-ups'). ``flow_control``: "credit" (the "sst"
        default, SST's), "pfc" (the "inalab" default: lossless, short queues, spec A17) or
        "drop_tail" (64 MiB buffers). ``reroute_queue``: Canary's own ``ina.reroute_queue``
        ("inalab" only; "sst" routes Canary by the network's rule); None = the fabric's default
        (PFC_REROUTE_QUEUE on PFC, the scheme's 512 KiB on drop-tail)."""
        if setup not in SETUPS:
            raise ValueError(f"setup {setup!r}; allowed values: {', '.join(SETUPS)}")
        flow_control = flow_control or ("credit" if setup == "sst" else FLOW_CONTROL)
        if flow_control not in FLOW_CONTROLS:
            raise ValueError(f"flow_control {flow_control!r}; allowed values: {', '.join(FLOW_CONTROLS)}")
        if setup == "sst" and reroute_queue is not None:
            raise ValueError('reroute_queue applies only with setup="inalab" (on "sst" Canary follows the network\'s routing)')
        self.setup, self.flow_control = setup, flow_control
        self.reroute_queue = reroute_queue if reroute_queue is not None else (
            PFC_REROUTE_QUEUE if flow_control == "pfc" and setup == "inalab" else None)

    def scenario(self, scheme: str, *, ina: dict | None = None, **kw) -> dict:
        """:func:`scenario` on this figure's set-up and fabric; on "inalab" Canary gets its
        reroute threshold (an explicit ``ina.reroute_queue`` wins)."""
        if scheme == "canary" and self.reroute_queue is not None:
            ina = {"reroute_queue": self.reroute_queue, **(ina or {})}
        return scenario(scheme, ina=ina, flow_control=self.flow_control, setup=self.setup, **kw)

    def setup_table(self, *extra: tuple[str, str, str, str]) -> str:
        """The write-up's opening table: parameter | the paper's value and where | ours | why
        different; ``extra`` rows are the figure's own."""
        sst = self.setup == "sst"
        fc = {"credit": f"credits, {SST_BUFFER} per port (`network.flow_control = \"credit\"`)",
              "pfc": "PFC, pause at 64 KiB, resume at 32 KiB",
              "drop_tail": "drop-tail, 64 MiB buffers"}[self.flow_control]
        rows = [
            ("topology", "two-level fat tree, 32 leaves x (32 hosts + 32 up ports), 32 spines, 1024 hosts (§5.2)",
             "the same (`canary_fat_tree`)", ""),
            ("link rate", "100 Gbps, hosts and switches (§5.2)", "100 Gbps", ""),
            ("link delay", "not given for the simulations; \"per-hop latency of around 300 ns\" (§3.3)", "300 ns", "the paper's model value"),
            ("flow control", "not given; SST's merlin routers are credit-based", fc,
             "" if self.flow_control == "credit" else "a sensitivity row of issue #40 (the earlier write-ups' fabric)"),
            ("per-port buffer", "not given", SST_BUFFER if sst else ("64 KiB (PFC xoff)" if self.flow_control == "pfc" else "64 MiB"),
             "SST ember's default router buffer (`defaultParams.py`)" if sst else "the earlier write-ups' choice"),
            ("default up port", "\"selected depending on the packet destination\" (§5.2)",
             "destination modulo the up ports, every packet" if sst else "flow hash (ECMP); Canary's leaders by its own hash",
             "" if sst else "the earlier write-ups' set-up"),
            ("rerouting", "up port with the fewest queued bytes once the output buffer is over 50 % full (§5.2), every packet",
             f"the same: over half of {SST_BUFFER} (7 KB), every packet incl. Canary's partial sums (`ina.routing = \"network\"`)" if sst
             else f"background over 512 KiB; Canary's own load balancer over {self.reroute_queue or '512KiB'}",
             "" if sst else "the earlier write-ups' set-up (Canary's threshold tuned on Fig. 7a)"),
            ("background", "\"each host sends a message to a randomly selected host and receives a message from another\", peers change "
             "through the run (§5.2)", "a new derangement per 1 MiB message, line rate, open loop" if sst else
             "a fresh uniform peer per 1 MiB message, line rate", "message size not given (spec A18)"),
            ("descriptors", "not given", "32K of 1060 B per switch", "spec A5"),
            ("packet", "256 elements (1 KiB) per packet (§5.1)", "1024 B of values + 57 B header", "spec A20"),
            ("runs", "\"each test five times\", hosts and tree roots drawn anew (§5.2)",
             f"seeds {', '.join(map(str, self.seeds))}: hosts, background peers, tree roots",
             "" if len(self.seeds) >= 5 else "fewer runs than the paper: see Seeds"),
        ]
        rows += list(extra)
        lines = ["| parameter | paper (where) | ours | why different |", "| --- | --- | --- | --- |"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        return "**Set-up.**\n\n" + "\n".join(lines)

    def fabric_text(self) -> str:
        """The fabric, for the write-ups' Command paragraphs."""
        if self.setup == "sst":
            fc = {"credit": f"credit-based lossless links ({SST_BUFFER} per port)", "pfc": "PFC links (64 KiB xoff)",
                  "drop_tail": "64 MiB drop-tail buffers"}[self.flow_control]
            return (f"the paper's SST network (`setup = \"sst\"`): {fc}, every packet up the port its destination picks "
                    "and rerouted to the least queued up port above half a port's buffer, a permutation background")
        if self.flow_control == "pfc":
            rq = self.reroute_queue or "512KiB"
            return (f"lossless PFC fabric (`flow_control = \"pfc\"`, spec A17: per-ingress-port pause at 64 KiB, resume "
                    f"at 32 KiB, nothing dropped), Canary's load balancer leaving a port queued above "
                    f"`ina.reroute_queue` = {rq}, the network's adaptive routing (the background's) above 512 KiB")
        return ("64 MiB drop-tail buffers (`flow_control = \"drop_tail\"`; effectively lossless but deep-queued), "
                "adaptive routing and Canary's load balancer leaving a port queued above 512 KiB")

    # The columns naming a setup (besides the seed): each figure's, for `seed_range`.
    range_keys: tuple = ("scheme", "congested")
    range_metric = "goodput_gbps"

    def seed_range(self, rows: pd.DataFrame) -> str:
        """Each setup's ``range_metric`` over the seeds (min, mean, max), from every seed's rows."""
        keys = [k for k in self.range_keys if k in rows]
        t = rows.groupby(keys)[self.range_metric].agg(["min", "mean", "max"]).round(2).reset_index()
        return markdown_table(t)

    def _table(self, rows: pd.DataFrame, index: list[str], col: str = "goodput_gbps") -> pd.DataFrame:
        return rows.pivot_table(index=index, columns="scheme", values=col, aggfunc="mean").reset_index()

    def _all_runs(self, rows: pd.DataFrame, extra: list[str]) -> str:
        cols = [c for c in extra + ["scheme", "seed", "goodput_gbps", "runtime_us", "util_mean", "util_idle", "stragglers",
                                    "collisions", "rerouted", "reissues", "drops_queue", "descriptors_peak", "pfc_pauses",
                                    "credit_waits", "max_queue_bytes"] if c in rows]
        return markdown_table(rows[cols])


class CanaryCongestion(_CanaryFigure):
    """Fig. 7a/7b: 512 allreduce hosts, 512 congesting; Canary against 1..16 static trees."""

    name = "canary-congestion"
    figure = "Figs. 7a/7b"
    claim = ("Canary Fig. 7a/7b (§5.2.1): 4 MiB allreduce on 512 of 1024 hosts of a 100 Gbps fat tree, the other 512 "
             "congesting. Without congestion every in-network allreduce is comparable; with it Canary shows no "
             "degradation, is up to 2x one static tree and up to about 40 % above several; beyond 4 trees little "
             "changes. Average link utilization about 40.2 / 29.5 / 20.9 % (Canary / 4 trees / 1 tree).")

    def __init__(self, trees=(1, 2, 4, 8, 16), seeds=(1,), ring_congested=None, flow_control=None, reroute_queue=None, setup=SETUP):
        self.schemes = ["canary", "ring"] + [f"{n} ST" for n in trees]
        self.seeds = tuple(seeds)
        self._fabric(flow_control, reroute_queue, setup)
        self.ring_congested = _ring_congested(ring_congested, self.flow_control)

    def run(self, progress) -> pd.DataFrame:
        pts = [({"scheme": s, "congested": c, "seed": seed}, self.scenario(s, congested=c, seed=seed))
               for seed in self.seeds for c in (False, True) for s in self.schemes
               if not (s == "ring" and c and not self.ring_congested)]
        df = run_grid(self.name, pts, progress)
        df["vs_canary"] = relative(df, ["congested"])
        return df

    def _ratio(self, rows, scheme, congested=True):
        return float(rows[(rows.scheme == scheme) & (rows.congested == congested)].vs_canary.mean())

    def checks(self, rows: pd.DataFrame) -> dict:
        c = rows[rows.scheme == "canary"].groupby("congested").goodput_gbps.mean()
        util = rows[rows.congested].groupby("scheme").util_mean.mean()
        multi = [s for s in self.schemes if s.endswith(" ST") and s != "1 ST"]
        return {
            # Tolerances written here, two-sided (issue #40): "no degradation" = congested
            # Canary at 0.9-1.1x uncongested; "up to 2x one tree" = 1.5-3x; "up to 40 % above
            # several" = every multi-tree run at 0.6-1.0x Canary (the spec's "about 0.7");
            # utilization ranks Canary > 4 ST > 1 ST.
            "no_degradation": bool(0.9 * c[False] <= c[True] <= 1.1 * c[False]),
            "vs_one_tree": bool(1.5 <= self._ratio(rows, "1 ST") <= 3.0),
            "vs_multi_trees": bool(all(1.0 <= self._ratio(rows, s) <= 1 / 0.6 for s in multi)),
            "utilization_order": bool("4 ST" not in util or util["canary"] > util["4 ST"] > util.get("1 ST", 0)),
        }

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return ("no_degradation: congested Canary at 0.9-1.1x uncongested; vs_one_tree: Canary at 1.5-3x one static tree "
                "(paper up to 2x); vs_multi_trees: every several-tree run at 0.6-1.0x Canary (paper about 0.7); utilization_order: "
                "congested mean link utilization Canary > 4 trees > 1 tree")

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def explain(self, rows: pd.DataFrame) -> str:
        t = self._table(rows, ["congested"])
        u = self._table(rows, ["congested"], "util_mean")
        c = rows[rows.scheme == "canary"].groupby("congested").goodput_gbps.mean()
        st = {s: self._ratio(rows, s) for s in self.schemes if s != "canary"}
        st = {s: v for s, v in st.items() if v == v}  # the ring only when it ran congested
        checks = self.checks(rows)
        return f"""# {self.name} (Canary Fig. 7a/7b; simulation)

**Claim.** {self.claim}

{self.setup_table(("allreduce", "4 MiB on 512 hosts, the other 512 congesting (§5.2.1)", "the same", ""))}

**Command.** `inalab reproduce {self.name}`: {self.fabric_text()}; 512 allreduce hosts drawn at random
(seeds {", ".join(map(str, self.seeds))}), the other 512 sending 1 MiB messages at line rate among themselves
(spec A18). Ring with the same 1081-B packets (spec A20). Static trees: spec A21 (`scheme = "static_tree"`).

**Our result** (`holds` = {self.holds(rows)}; checks: {checks}):

Goodput (Gbps):

{markdown_table(t)}

Average link utilization over the run (all links, both directions):

{markdown_table(u)}

All runs:

{self._all_runs(rows, ["congested"])}

**Where and why they differ.** Canary keeps {c[True] / c[False]:.0%} of its uncongested goodput
under congestion. Canary over the others with congestion: {", ".join(f"{s} {v:.2f}x" for s, v in st.items())}.
{_congestion_notes(rows)} {_ring_note(self.ring_congested, self.flow_control)}
"""

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line, from the rows the write-up shows."""
        g = rows.groupby(["congested", "scheme"]).goodput_gbps.mean()
        trees = [s for s in self.schemes if s.endswith(" ST")]
        ring = f", ring {g[(True, 'ring')]:.1f}" if (True, "ring") in g else ""
        return (f"{self.fabric_text().split(':')[0]}: uncongested in-network {g[False].drop('ring', errors='ignore').min():.0f}-"
                f"{g[False].drop('ring', errors='ignore').max():.0f} Gbps; congested Canary {g[(True, 'canary')]:.1f} "
                f"({g[(True, 'canary')] / g[(False, 'canary')]:.0%} of uncongested), static trees "
                f"{min(g[(True, t)] for t in trees):.1f}-{max(g[(True, t)] for t in trees):.1f}{ring}: Canary "
                f"{self._ratio(rows, '1 ST'):.1f}x one tree, {self._ratio(rows, '4 ST'):.1f}x four (paper 2x, 1.4x)")

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        t = self._table(rows, ["congested"]).set_index("congested")[self.schemes]
        t.index = ["congested" if c else "no congestion" for c in t.index]
        t.columns.name = "scheme (ST: static trees)"
        return bar_plot(t, path, "allreduce goodput (Gbps)", "Canary Fig. 7a: goodput of a 4 MiB allreduce on 512 of "
                        "1024 hosts, Canary vs ring and 1-16 static trees, without and with congestion", (9, 4),
                        xlabel="the other 512 hosts: idle, or sending background traffic (congested)")


def _congestion_notes(rows: pd.DataFrame) -> str:
    """What the counters say about the congested Canary runs."""
    c = rows[(rows.scheme == "canary") & rows.congested]
    if not len(c):
        return ""
    r = c.iloc[0]
    return (f"In the congested Canary run the switches rerouted {int(r.rerouted):,} partial sums off their default "
            f"port, {int(r.stragglers):,} packets came after their window (stragglers), {int(r.collisions):,} collided, "
            f"hosts re-issued {int(r.reissues):,} blocks, and the queues dropped {int(r.drops_queue):,} packets "
            f"(background included); at most {int(r.descriptors_peak):,} descriptors were held at one switch"
            + (f"; the switches sent {int(r.pfc_pauses):,} PAUSE frames and the deepest switch queue held "
               f"{r.max_queue_bytes / 1e3:,.0f} KB." if "pfc_pauses" in r and r.pfc_pauses else
               f"; ports waited {int(r.credit_waits):,} times for credits and the deepest switch queue held "
               f"{r.max_queue_bytes / 1e3:,.0f} KB." if "credit_waits" in r and r.credit_waits else "."))


register(CanaryCongestion(seeds=(1, 2, 3, 4, 5)))


# Panel titles of the congested flag.
CONGESTED = {False: "no congestion", True: "congested (the other hosts send background traffic)"}


def _plot_lines(rows: pd.DataFrame, path: Path, x: str, y: str, title: str, panels: list[tuple[str, object]], logx=False,
                ylabel=None, xlabel=None, logbase=2, logy=False) -> Path:
    """One panel per (column, value) filter, a line per scheme (the mean over the seeds, shaded
    from their minimum to maximum where ``rows`` hold several): each scheme keeps its color and
    marker in every panel, and one legend beside the panels lists them all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plots import finish_figure, styles

    look = styles(sorted(rows["scheme"].unique(), key=str))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (col, val) in zip(axes[0], panels):
        sub = rows[rows[col] == val] if col else rows
        for scheme, g in sub.groupby("scheme"):
            by_x = g.groupby(x)[y]
            mean = by_x.mean()
            ax.plot(mean.index, mean.values, label=scheme, **look[scheme])
            if "seed" in g and g.seed.nunique() > 1:
                ax.fill_between(mean.index, by_x.min().values, by_x.max().values, color=look[scheme].get("color"), alpha=0.15, linewidth=0)
        if col == "congested":
            ax.set_title(CONGESTED[bool(val)], fontsize=9)
        elif col:
            ax.set_title(f"{col} = {val}", fontsize=9)
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(ylabel or y)
        if logx:
            ax.set_xscale("log", base=logbase)
        if logy:
            ax.set_yscale("log")
    return finish_figure(fig, path, title, legend="right", legend_title="scheme")


def _ring_note(ring_congested: bool, flow_control: str = FLOW_CONTROL) -> str:
    fabric = {"pfc": "the PFC fabric", "credit": "the credit fabric"}.get(flow_control, "the 64 MiB drop-tail buffers")
    return ("" if ring_congested else
            "Ring allreduce runs only without congestion by default: with the spec's 1 MiB drop-tail buffers one "
            "congested 512-host ring point lost tens of millions of packets, its 1,022 steps each waited out 1 ms "
            f"retransmission timeouts, and it took about 10 minutes of simulation for under 1 Gbps; on {fabric} "
            "it is not measured by default. `ring_congested=True` runs it.")


class CanaryFraction(_CanaryFigure):
    """Fig. 8: the allreduce on 5 to 75 % of the hosts, the rest congesting."""

    range_keys = ("scheme", "fraction", "congested")
    name = "canary-fraction"
    figure = "Fig. 8"
    claim = ("Canary Fig. 8 (§5.2.2): 4 MiB allreduce on 5 to 75 % of the 1024 hosts, the rest congesting: Canary "
             "is best at every point. At 5 % Canary loses about 20 % (against its uncongested run), one static "
             "tree about 66 %, four trees about 47 %; at large fractions Canary is about 2x one tree and +23 % "
             "over four.")

    def __init__(self, fractions=(0.05, 0.1, 0.25, 0.5, 0.75), seeds=(1,), ring_congested=False, flow_control=None, reroute_queue=None, setup=SETUP):
        self.fractions, self.seeds = list(fractions), tuple(seeds)
        self._fabric(flow_control, reroute_queue, setup)
        self.ring_congested = _ring_congested(ring_congested, self.flow_control)

    def run(self, progress) -> pd.DataFrame:
        pts = [({"scheme": s, "fraction": f, "congested": c, "seed": seed}, self.scenario(s, fraction=f, congested=c, seed=seed))
               for seed in self.seeds for f in self.fractions for c in (False, True)
               for s in ("canary", "1 ST", "4 ST", "ring") if not (s == "ring" and c and not self.ring_congested)]
        df = run_grid(self.name, pts, progress)
        df["vs_canary"] = relative(df, ["fraction", "congested"])
        base = df[~df.congested].groupby(["scheme", "fraction"]).goodput_gbps.mean()
        df["vs_uncongested"] = [g / base.get((s, f), float("nan")) for s, f, g in zip(df.scheme, df.fraction, df.goodput_gbps)]
        return df

    def checks(self, rows: pd.DataFrame) -> dict:
        cong = rows[rows.congested].groupby(["fraction", "scheme"]).goodput_gbps.mean().unstack()
        loss = 1 - rows[rows.congested].groupby(["fraction", "scheme"]).vs_uncongested.mean().unstack()
        lo, hi = min(self.fractions), max(self.fractions)
        # Tolerances: "best at every point" = Canary >= 0.95x each static tree and 4 ST >=
        # 0.95x 1 ST under congestion; at the smallest fraction Canary loses at most 30 % of its
        # uncongested goodput (paper 20 %) and less than either static tree.
        checks = {
            "canary_best": bool((cong["canary"] >= 0.95 * cong[["1 ST", "4 ST"]].max(axis=1)).all()),
            "four_over_one": bool((cong["4 ST"] >= 0.95 * cong["1 ST"]).all()),
            "canary_small_loss": bool(loss.loc[lo, "canary"] <= 0.3),
            "static_lose_more": bool(loss.loc[lo, "canary"] < min(loss.loc[lo, "1 ST"], loss.loc[lo, "4 ST"])),
        }
        if self.setup == "sst":
            # Issue #40: the paper's numbers as two-sided bands, the static trees' too. At the
            # smallest fraction the losses: Canary 10-30 % (paper 20 %), one tree 50-80 % (66 %),
            # four trees 30-65 % (47 %); at the largest, Canary 1.5-3x one tree (about 2x) and
            # 1.0-1.5x four (+23 %).
            ratio = cong.loc[hi, "canary"] / cong.loc[hi]
            checks.update({
                "canary_small_loss": bool(0.1 <= loss.loc[lo, "canary"] <= 0.3),
                "one_tree_loss": bool(0.5 <= loss.loc[lo, "1 ST"] <= 0.8),
                "four_trees_loss": bool(0.3 <= loss.loc[lo, "4 ST"] <= 0.65),
                "vs_one_tree_large": bool(1.5 <= ratio["1 ST"] <= 3.0),
                "vs_four_trees_large": bool(1.0 <= ratio["4 ST"] <= 1.5),
            })
        return checks

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        text = ("congested, at every fraction: canary_best: Canary >= 0.95x the better static tree; four_over_one: "
                "4 trees >= 0.95x 1 tree; at the smallest fraction: canary_small_loss: Canary loses at most 30 % "
                "of its uncongested goodput (paper 20 %); static_lose_more: and less than either static tree")
        if self.setup == "sst":
            text += ("; on the paper's network also two-sided: canary_small_loss 10-30 %, one_tree_loss 50-80 % (paper "
                     "66 %), four_trees_loss 30-65 % (47 %) at the smallest fraction; at the largest vs_one_tree_large "
                     "Canary 1.5-3x one tree (about 2x), vs_four_trees_large 1.0-1.5x four (+23 %)")
        return text

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def explain(self, rows: pd.DataFrame) -> str:
        t = self._table(rows, ["congested", "fraction"])
        loss = rows[rows.congested].pivot_table(index="fraction", columns="scheme", values="vs_uncongested").reset_index()
        return f"""# {self.name} (Canary Fig. 8; simulation)

**Claim.** {self.claim}

{self.setup_table(("allreduce", "4 MiB on 5-75 % of the hosts, the rest congesting (§5.2.2)", f"4 MiB on {self.fractions}", ""))}

**Command.** `inalab reproduce {self.name}`. Setup as `canary-congestion` (a {self.fabric_text()}); fractions {self.fractions} of the
hosts (spec A25), drawn at random (seed {", ".join(map(str, self.seeds))}), the rest congesting.

**Our result** (`holds` = {self.holds(rows)}; checks: {self.checks(rows)}):

Goodput (Gbps):

{markdown_table(t)}

Congested goodput over the same scheme's uncongested goodput:

{markdown_table(loss)}

All runs:

{self._all_runs(rows, ["fraction", "congested", "vs_uncongested"])}

**Where and why they differ.** {_ring_note(self.ring_congested, self.flow_control)}
{_congestion_notes(rows[rows.fraction == max(self.fractions)])}
"""

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line, from the rows the write-up shows."""
        cong = rows[rows.congested].groupby(["fraction", "scheme"]).goodput_gbps.mean().unstack()
        loss = 1 - rows[rows.congested].groupby(["fraction", "scheme"]).vs_uncongested.mean().unstack()
        lo = min(self.fractions)
        return (f"{self.fabric_text().split(':')[0]}: congested Canary {cong['canary'].min():.0f}-{cong['canary'].max():.0f} Gbps, "
                f"1 tree {cong['1 ST'].min():.1f}-{cong['1 ST'].max():.1f}, 4 trees {cong['4 ST'].min():.1f}-{cong['4 ST'].max():.1f}; "
                f"at {lo:.0%} of the hosts Canary loses {loss.loc[lo, 'canary']:.0%}, one tree {loss.loc[lo, '1 ST']:.0%}, "
                f"four {loss.loc[lo, '4 ST']:.0%} (paper 20 / 66 / 47 %)")

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        return _plot_lines(rows, path, "fraction", "goodput_gbps", "Canary Fig. 8: allreduce goodput against the share of "
                           "the 1024 hosts in the allreduce, Canary vs static trees and ring",
                           [("congested", False), ("congested", True)], ylabel="allreduce goodput (Gbps)",
                           xlabel="share of the hosts in the allreduce")


def _size_text(nbytes) -> str:
    """1024 -> "1 KiB", 4194304 -> "4 MiB"."""
    n = int(nbytes)
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"


class CanarySize(_CanaryFigure):
    """Fig. 9: runtime against the allreduce size on 20 % of the hosts."""

    range_keys = ("scheme", "size", "congested")
    range_metric = "runtime_us"
    name = "canary-size"
    figure = "Fig. 9"
    claim = ("Canary Fig. 9 (§5.2.3): on 20 % of the hosts (80 % congesting), Canary is slower than static trees "
             "for small allreduces (its timeout windows add latency) and faster for large ones; the ring's "
             "runtime is flat from 1 KiB to 256 KiB (latency-bound).")
    SIZES = ("1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB")

    def __init__(self, sizes=SIZES, seeds=(1,), ring_congested=None, flow_control=None, reroute_queue=None, setup=SETUP):
        self.sizes, self.seeds = list(sizes), tuple(seeds)
        self._fabric(flow_control, reroute_queue, setup)
        self.ring_congested = _ring_congested(ring_congested, self.flow_control)

    def run(self, progress) -> pd.DataFrame:
        from ..units import parse_size

        pts = [({"scheme": s, "size": size, "bytes": parse_size(size), "congested": c, "seed": seed},
                self.scenario(s, fraction=0.2, congested=c, size=size, seed=seed))
               for seed in self.seeds for size in self.sizes for c in (False, True)
               for s in ("canary", "4 ST", "ring") if not (s == "ring" and c and not self.ring_congested)]
        return run_grid(self.name, pts, progress)

    def checks(self, rows: pd.DataFrame) -> dict:
        rt = rows.groupby(["congested", "bytes", "scheme"]).runtime_us.mean().unstack()
        small, large = min(rows.bytes), max(rows.bytes)
        ring = rt.loc[False]["ring"].dropna()
        flat = ring[ring.index <= 256 * 1024]
        # Tolerances: a crossover (Canary slower than 4 ST at the smallest size without
        # congestion, faster at the largest with it); the ring's runtime within 2x from the
        # smallest size to 256 KiB.
        return {
            "canary_slower_small": bool(rt.loc[(False, small), "canary"] > rt.loc[(False, small), "4 ST"]),
            "canary_faster_large": bool(rt.loc[(True, large), "canary"] < rt.loc[(True, large), "4 ST"]),
            "ring_flat": bool(len(flat) < 2 or flat.max() <= 2 * flat.min()),
        }

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return ("canary_slower_small: uncongested, Canary slower than 4 static trees at the smallest size; canary_faster_large: "
                "congested, faster at the largest; ring_flat: the ring's uncongested runtime within 2x from the smallest "
                "size to 256 KiB")

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def explain(self, rows: pd.DataFrame) -> str:
        t = rows.pivot_table(index=["congested", "bytes"], columns="scheme", values="runtime_us").reset_index()
        return f"""# {self.name} (Canary Fig. 9; simulation)

**Claim.** {self.claim}

{self.setup_table(("allreduce", "1 KiB-4 MiB on 20 % of the hosts, 80 % congesting (§5.2.3)", f"{', '.join(self.sizes)} on 205 hosts", ""))}

**Command.** `inalab reproduce {self.name}`. Setup as `canary-congestion` (a {self.fabric_text()}), 20 % of the hosts (205),
sizes {", ".join(self.sizes)} (spec A26).

**Our result** (`holds` = {self.holds(rows)}; checks: {self.checks(rows)}):

Runtime (us):

{markdown_table(t)}

All runs:

{self._all_runs(rows, ["size", "congested"])}

**Where and why they differ.** A block's tree costs Canary one 1 us window per level (2 levels
here) besides the path; static trees wait only for their children. {_ring_note(self.ring_congested, self.flow_control)}
"""

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line, from the rows the write-up shows."""
        rt = rows.groupby(["congested", "bytes", "scheme"]).runtime_us.mean().unstack()
        small, large = min(rows.bytes), max(rows.bytes)
        c = rt.loc[True]
        faster = [b for b in c.index if c.loc[b, "canary"] < c.loc[b, "4 ST"]]
        cross = (f"faster than four trees from {_size_text(min(faster))}" if faster else "never faster than four trees")
        return (f"{self.fabric_text().split(':')[0]}: uncongested Canary {rt.loc[(False, small), 'canary'] - rt.loc[(False, small), '4 ST']:+.1f} us "
                f"against four trees at {_size_text(small)}, {rt.loc[(False, large), 'canary'] / rt.loc[(False, large), '4 ST']:.2f}x their runtime at "
                f"{_size_text(large)}; congested Canary {cross} ({c.loc[large, '4 ST'] / c.loc[large, 'canary']:.1f}x faster at {_size_text(large)})")

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        return _plot_lines(rows, path, "bytes", "runtime_us", "Canary Fig. 9: allreduce runtime against its size on 20 % "
                           "of the hosts, Canary vs static trees and ring", [("congested", False), ("congested", True)],
                           logx=True, logy=True, ylabel="allreduce runtime (us, log)", xlabel="allreduce size (bytes)")


class CanaryTenants(_CanaryFigure):
    """Fig. 10: K concurrent allreduces on an equal split of the hosts."""

    range_keys = ("scheme", "tenants")
    name = "canary-tenants"
    figure = "Fig. 10"
    claim = ("Canary Fig. 10a (§5.2.4): K concurrent 4 MiB allreduces on an equal split of the 1024 hosts, "
             "Canary's table split statically per tenant: Canary stays almost flat (32 jobs at about 80 Gbps "
             "each) while static in-network allreduce loses about 40 %.")

    def __init__(self, tenants=(1, 2, 4, 8, 16, 32), seeds=(1,), flow_control=None, reroute_queue=None, setup=SETUP):
        self.tenants, self.seeds = list(tenants), tuple(seeds)
        self._fabric(flow_control, reroute_queue, setup)

    def run(self, progress) -> pd.DataFrame:
        pts = [({"scheme": s, "tenants": k, "seed": seed},
                self.scenario(s, fraction=1.0, congested=False, tenants=k, seed=seed, ina={"table": "static"} if s == "canary" else None))
               for seed in self.seeds for k in self.tenants for s in ("canary", "1 ST", "4 ST", "ring")]
        df = run_grid(self.name, pts, progress)
        df["vs_canary"] = relative(df, ["tenants"])
        return df

    def checks(self, rows: pd.DataFrame) -> dict:
        g = rows.groupby(["tenants", "scheme"]).goodput_gbps.mean().unstack()
        lo, hi = min(self.tenants), max(self.tenants)
        # Tolerances: Canary at the most tenants keeps at least 80 % of its single-job goodput;
        # the better static tree loses at least 25 % (paper 40 %) and ends below Canary.
        static_keep = max(g.loc[hi, s] / g.loc[lo, s] for s in ("1 ST", "4 ST"))
        return {
            "canary_flat": bool(g.loc[hi, "canary"] >= 0.8 * g.loc[lo, "canary"]),
            "static_drops": bool(static_keep <= 0.75),
            "canary_best_at_most": bool(g.loc[hi, "canary"] >= g.loc[hi, ["1 ST", "4 ST"]].max()),
        }

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return ("canary_flat: Canary at the most tenants keeps >= 80 % of its single-job goodput; static_drops: the "
                "better static tree keeps <= 75 % (paper: loses 40 %); canary_best_at_most: Canary above both static "
                "trees at the most tenants")

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def explain(self, rows: pd.DataFrame) -> str:
        t = self._table(rows, ["tenants"])
        u = self._table(rows, ["tenants"], "util_mean")
        return f"""# {self.name} (Canary Fig. 10a/10b; simulation)

**Claim.** {self.claim}

{self.setup_table(("tenants", "K concurrent 4 MiB allreduces on an equal split of the hosts, no background (§5.2.4)", f"K in {self.tenants}; Canary's table split statically", ""))}

**Command.** `inalab reproduce {self.name}`. Setup as `canary-congestion` (a {self.fabric_text()}) without background: K in
{self.tenants} (spec A27) jobs of 1024 / K random hosts each, one 4 MiB allreduce each; Canary with
`ina.table = "static"` (an equal slice of every table per job); static trees split their slots
equally too.

**Our result** (`holds` = {self.holds(rows)}; checks: {self.checks(rows)}):

Mean goodput per job (Gbps):

{markdown_table(t)}

Average link utilization:

{markdown_table(u)}

All runs:

{self._all_runs(rows, ["tenants"])}

**Where and why they differ.** Goodput is the mean over the K jobs of S x 8 / runtime.
"""

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line, from the rows the write-up shows."""
        g = rows.groupby(["tenants", "scheme"]).goodput_gbps.mean().unstack()
        lo, hi = min(self.tenants), max(self.tenants)
        return (f"{self.fabric_text().split(':')[0]}: Canary {g.loc[lo, 'canary']:.0f} Gbps per job alone, {g.loc[hi, 'canary']:.0f} at "
                f"{hi} tenants (paper ~80); one tree {g.loc[lo, '1 ST']:.0f} -> {g.loc[hi, '1 ST']:.0f}, four {g.loc[lo, '4 ST']:.0f} -> "
                f"{g.loc[hi, '4 ST']:.0f}; ring {g.loc[lo, 'ring']:.0f} -> {g.loc[hi, 'ring']:.0f}")

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        return _plot_lines(rows, path, "tenants", "goodput_gbps", "Canary Fig. 10a: goodput of K concurrent 4 MiB "
                           "allreduces on an equal split of the hosts, Canary vs static trees and ring", [(None, None)],
                           logx=True, ylabel="goodput per job (Gbps)", xlabel="concurrent allreduces (tenants)")


class CanaryTimeout(_CanaryFigure):
    """Fig. 11: the aggregation window against host noise."""

    range_keys = ("scheme", "window", "noise", "congested")
    name = "canary-timeout"
    figure = "Fig. 11"
    claim = ("Canary Fig. 11 (§5.2.5): 4 MiB on 512 hosts, Canary with windows of 1 to 3 us against hosts whose NIC "
             "stalls 1 us before a packet with probability 0.01 to 10 %: at most about 30 % spread across windows, "
             "and under congestion Canary above four static trees for every setting.")

    def __init__(self, windows=("1us", "2us", "3us"), noise=(0.0001, 0.001, 0.01, 0.1), seeds=(1,), flow_control=None, reroute_queue=None, setup=SETUP):
        self.windows, self.noise, self.seeds = list(windows), list(noise), tuple(seeds)
        self._fabric(flow_control, reroute_queue, setup)

    def run(self, progress) -> pd.DataFrame:
        # "sst": the paper's noise, the drawn packet alone delayed (`ina.noise_mode = "packet"`),
        # and four static trees under every noise level too; "inalab": a NIC stall, trees noiseless.
        sst = self.setup == "sst"
        mode = {"noise_mode": "packet"} if sst else {}
        pts = [({"scheme": "canary", "window": w, "noise": p, "congested": c, "seed": seed},
                self.scenario("canary", congested=c, seed=seed, ina={"aggregation_timeout": w, "noise_prob": p, **mode}))
               for seed in self.seeds for c in (False, True) for w in self.windows for p in self.noise]
        pts += [({"scheme": "4 ST", "window": "-", "noise": p, "congested": c, "seed": seed},
                 self.scenario("4 ST", congested=c, seed=seed, ina={"noise_prob": p, **mode} if p else None))
                for seed in self.seeds for c in (False, True) for p in (self.noise if sst else [0.0])]
        return run_grid(self.name, pts, progress)

    def checks(self, rows: pd.DataFrame) -> dict:
        c = rows[rows.scheme == "canary"].groupby(["congested", "noise", "window"]).goodput_gbps.mean()
        spread = c.groupby(level=["congested", "noise"]).agg(lambda g: g.max() / g.min())
        st = rows[rows.scheme == "4 ST"].groupby(["congested", "noise"]).goodput_gbps.mean()
        # Tolerances: max/min across windows at most 1.3 for every noise level and congestion;
        # congested Canary above congested 4 ST at every setting (the trees at the same noise
        # level where they ran under noise, else noiseless).
        above = all(g > st.loc[True].get(p, st.loc[True].iloc[0]) for (p, _w), g in c.loc[True].items())
        return {"spread_within_30pct": bool((spread <= 1.3).all()), "above_four_trees_congested": bool(above)}

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return ("spread_within_30pct: Canary's goodput max / min across windows <= 1.3 at every noise level, with "
                "and without congestion; above_four_trees_congested: congested Canary above congested 4 static trees "
                "at every setting")

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def _noise_row(self) -> tuple:
        """The set-up table's noise row."""
        if self.setup == "sst":
            return ("noise", "before a packet, a host delays it 1 us with probability 0.01-10 % (§5.2.5)",
                    'the drawn packet alone (`ina.noise_mode = "packet"`), the static trees too', "")
        return ("noise", "before a packet, a host delays it 1 us with probability 0.01-10 % (§5.2.5)",
                "a 1 us NIC stall (every later packet shifts), trees without noise", "the earlier write-ups' reading")

    def explain(self, rows: pd.DataFrame) -> str:
        t = rows[rows.scheme == "canary"].pivot_table(index=["congested", "noise"], columns="window", values="goodput_gbps").reset_index()
        st = rows[rows.scheme == "4 ST"][["congested", "noise", "goodput_gbps"]]
        if self.setup == "sst":
            noise = ('a drawn packet waits `ina.noise` = 1 us, the packets behind it go on (`ina.noise_mode = "packet"`), '
                     "for Canary and the four static trees alike")
            why = ("A delayed packet reaches its switches 1 us late, after its block's window may have closed "
                   "(`stragglers`), and leaders receive more packets per block; a static tree's switch waits for it.")
        else:
            noise = "a host's NIC stalls `ina.noise` = 1 us before a packet with that probability"
            why = ("Noise stalls shift a host's later packets, so more of them miss their window (`stragglers`) and "
                   "leaders receive more packets per block.")
        return f"""# {self.name} (Canary Fig. 11; simulation)

**Claim.** {self.claim}

{self.setup_table(self._noise_row())}

**Command.** `inalab reproduce {self.name}`. Setup as `canary-congestion` (a {self.fabric_text()}); `ina.aggregation_timeout` in
{self.windows} and `ina.noise_prob` in {self.noise} ({noise}, spec A28).

**Our result** (`holds` = {self.holds(rows)}; checks: {self.checks(rows)}):

Canary's goodput (Gbps) by window:

{markdown_table(t)}

Four static trees{" (same noise)" if self.setup == "sst" else " (no noise)"}:

{markdown_table(st)}

All runs:

{self._all_runs(rows, ["window", "noise", "congested"])}

**Where and why they differ.** {why}
"""

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line, from the rows the write-up shows."""
        c = rows[rows.scheme == "canary"].groupby(["congested", "noise", "window"]).goodput_gbps.mean()
        spread = c.groupby(level=["congested", "noise"]).agg(lambda g: g.max() / g.min())
        st = rows[rows.scheme == "4 ST"].groupby("congested").goodput_gbps
        return (f"{self.fabric_text().split(':')[0]}: congested Canary {c.loc[True].min():.0f}-{c.loc[True].max():.0f} Gbps, "
                f"four trees {st.min()[True]:.1f}-{st.max()[True]:.1f}; uncongested Canary {c.loc[False].min():.0f}-"
                f"{c.loc[False].max():.0f}, trees {st.min()[False]:.0f}-{st.max()[False]:.0f}; spread across windows at most "
                f"{spread.max():.2f}x (paper <= 1.3x)")

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        c = rows[rows.scheme == "canary"].assign(scheme=lambda d: "canary, window " + d.window)
        return _plot_lines(c, path, "noise", "goodput_gbps", "Canary Fig. 11: Canary's goodput against host noise for "
                           "aggregation windows of 1 to 3 us (4 MiB on 512 hosts)", [("congested", False), ("congested", True)],
                           logx=True, logbase=10, ylabel="allreduce goodput (Gbps)",
                           xlabel="probability of a 1 us delay before a packet" if self.setup == "sst" else "probability of a 1 us NIC stall before a packet")


class CanaryAblations(_CanaryFigure):
    """Two ablations the paper lacks (spec §3.3): no rerouting (ECMP), and one leader."""

    range_keys = ("variant", "congested")
    name = "canary-ablations"
    figure = "ablations (spec §3.3, no figure)"
    claim = ("Ablations the Canary paper lacks (spec §3.3), on the Fig. 7 setup: Canary with ECMP (every switch "
             "sends a block on its leader's default port, never rerouting) separates the spreading of roots "
             "over spines by leader from adaptivity; Canary with a single leader shows what round-robin leaders buy.")

    # "one leader, 64 blocks": the single leader with a 64-block window (issue #40 item 5): what
    # one leader costs once its own link is not flooded with 4,096 blocks at a time.
    VARIANTS = {"canary": ({}, "adaptive"),
                "canary, ECMP": ({"reroute_queue": "1TiB"}, "ecmp"),
                "canary, one leader": ({"leaders": "single"}, "adaptive"),
                "canary, one leader, 64 blocks": ({"leaders": "single", "window_blocks": 64}, "adaptive")}

    def __init__(self, seeds=(1,), one_leader_congested=False, flow_control=None, reroute_queue=None, setup=SETUP):
        self.seeds, self.one_leader_congested = tuple(seeds), one_leader_congested
        self._fabric(flow_control, reroute_queue, setup)

    def run(self, progress) -> pd.DataFrame:
        pts = [({"scheme": "canary", "variant": v, "congested": c, "seed": seed},
                self.scenario("canary", congested=c, seed=seed, ina=ina, routing=routing))
               for seed in self.seeds for c in (False, True) for v, (ina, routing) in self.VARIANTS.items()
               # One leader under congestion: every block's partial sums queue behind the
               # background on one downlink; the run did not end in 25 minutes of simulation on
               # drop-tail, nor in 10 on PFC (uncongested it takes 479 ms simulated there).
               # `one_leader_congested=True` runs it.
               if not (c and v == "canary, one leader" and not self.one_leader_congested)]
        pts += [({"scheme": "4 ST", "variant": "4 ST", "congested": c, "seed": seed}, self.scenario("4 ST", congested=c, seed=seed))
                for seed in self.seeds for c in (False, True)]
        return run_grid(self.name, pts, progress)

    def checks(self, rows: pd.DataFrame) -> dict:
        g = rows.groupby(["congested", "variant"]).goodput_gbps.mean()
        # What an ablation should show: adaptivity matters under congestion (ECMP below
        # adaptive), and one leader is far slower (its link carries every block).
        return {"adaptivity_helps_congested": bool(g[(True, "canary, ECMP")] < g[(True, "canary")]),
                "one_leader_slower": bool(g[(False, "canary, one leader")] < 0.5 * g[(False, "canary")])}

    @property
    def tolerance(self) -> str:
        """What `holds` checks, with its thresholds (shown by the report and the JSON)."""
        return ("adaptivity_helps_congested: congested, Canary with ECMP below Canary with adaptive routing; one_leader_slower: "
                "uncongested, one leader < 0.5x Canary")

    def holds(self, rows: pd.DataFrame) -> bool:
        return all(self.checks(rows).values())

    def explain(self, rows: pd.DataFrame) -> str:
        t = rows.pivot_table(index="variant", columns="congested", values="goodput_gbps")
        t = t.rename(columns={False: "uncongested", True: "congested"}).reset_index()
        return f"""# {self.name} (ablations; simulation)

**Claim.** {self.claim}

{self.setup_table()}

**Command.** `inalab reproduce {self.name}`. Setup as `canary-congestion` (a {self.fabric_text()}). "ECMP": network routing
`ecmp` and `ina.reroute_queue` = 1 TiB (the program never leaves the leader's default port);
"one leader": `ina.leaders = "single"`, uncongested only{"" if self.one_leader_congested else
" (congested it did not end in 25 minutes of simulation on drop-tail, nor in 10 on PFC; `one_leader_congested=True` runs it)"};
"one leader, 64 blocks": the same with `ina.window_blocks = 64` (the default window is 4,096 blocks, 4 MiB), with and
without congestion.

**Our result** (`holds` = {self.holds(rows)}; checks: {self.checks(rows)}):

Goodput (Gbps), without and with congestion:

{markdown_table(t)}

All runs:

{self._all_runs(rows, ["variant", "congested"])}
"""

    def headline(self, rows: pd.DataFrame) -> str:
        """The index's one line, from the rows the write-up shows."""
        g = rows.groupby(["congested", "variant"]).goodput_gbps.mean()
        rt = rows.groupby(["congested", "variant"]).runtime_us.mean()
        one, small = "canary, one leader", "canary, one leader, 64 blocks"
        congested_one = f"{g[(True, one)]:.2f} congested" if (True, one) in g else "congested skipped"
        return (f"{self.fabric_text().split(':')[0]}, congested: Canary {g[(True, 'canary')]:.1f} Gbps with the network's "
                f"rerouting, {g[(True, 'canary, ECMP')]:.1f} without it (ECMP); one leader {g[(False, one)]:.2f} Gbps uncongested "
                f"({rt[(False, one)] / 1000:.0f} ms), {congested_one}; with a 64-block window {g[(False, small)]:.1f} "
                f"uncongested, {g[(True, small)]:.1f} congested")

    def plot(self, rows: pd.DataFrame, path: Path) -> Path:
        t = rows.pivot_table(index="variant", columns="congested", values="goodput_gbps", dropna=False)
        t = t.reindex(columns=[False, True]).rename(columns={False: "no congestion", True: "congested"})
        t.columns.name = "the other 512 hosts"
        return bar_plot(t, path, "allreduce goodput (Gbps)", "Canary ablations (no paper figure): 4 MiB allreduce on 512 "
                        "of 1024 hosts, Canary vs Canary with ECMP, with one leader, and 4 static trees", (8, 4),
                        xlabel="variant", values=True)


register(CanaryFraction(seeds=(1, 2, 3, 4, 5)))
register(CanarySize(seeds=(1, 2, 3, 4, 5)))
register(CanaryTenants(seeds=(1, 2, 3, 4, 5)))
register(CanaryTimeout(seeds=(1, 2, 3, 4, 5)))
register(CanaryAblations(seeds=(1, 2, 3, 4, 5)))
