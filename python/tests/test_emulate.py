"""``inalab emulate`` end to end: a small SwitchML scenario runs for real in network namespaces
and its result matches the simulator's for the same file (bytes on every link, sums exact,
JCT within a loose bound: CI machines are shared); Ctrl-C / SIGTERM and crashed runs leave no
namespace behind; what cannot be emulated is refused naming the field.

The namespace tests need root and iproute2 and are skipped (saying why) without them; the
user-space shaper (everything on loopback, links shaped by the switch and paced hosts) runs
everywhere.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import inalab
from inalab.config import ConfigError
from inalab.emulation import fabric

SCENARIO = {
    "name": "emulate-test",
    "topology": {"kind": "star", "hosts": 3, "link_rate": "100Mbps", "link_delay": "1us"},
    "jobs": [{"name": "sml", "scheme": "switchml", "allreduce": "512KiB", "iterations": 3, "workers": 3,
              "ina": {"packet": "8295B", "header": "103B", "pool_slots": 16, "timeout": "20ms"}}],
}
# The same job for a minute (50 x 4 MiB at 100 Mbps): long enough to be interrupted.
LONG_TOML = """
[topology]
kind = "star"
hosts = 3
link_rate = "100Mbps"
[[jobs]]
scheme = "switchml"
allreduce = "4MiB"
iterations = 50
workers = 3
ina = { packet = "8295B", header = "103B", pool_slots = 16, timeout = "20ms" }
"""
BYTES_TOLERANCE = 0.02   # every link carries what the simulator charges it, to 2 %
# Emulated against simulated time is a sanity bound here, not a measurement (issue #41): an
# emulation runs in real time on the test machine's cores, and with other CPU-bound work beside
# the suite it runs slower by the share of the cores it loses (Rina, whose agents forward and
# ACK every packet, +155 % in one full run on 2 shared cores; the suite beside two CPU hogs is
# the check, `make test-busy`). The bound catches what no load explains: a run faster than its
# links allow (shaping not applied: under x0.5) or a storm of loss-recovery timeouts (x10 and
# more). The 15 % comparison is benchmarks/emulate_validation.py's, on an idle machine
# (docs/validation.md).
FASTER, SLOWER = 0.5, 5.0


def assert_sane_time(emulated_s: float, simulated_s: float) -> None:
    assert FASTER < emulated_s / simulated_s < SLOWER, (emulated_s, simulated_s)


def resent_bytes(emu) -> float:
    """What the hosts' resends put on the wire (SwitchML's `retransmissions`, ATP's `resends`)."""
    return sum((h["counters"].get("retransmissions", 0) + h["counters"].get("resends", 0)) * h["tx_bytes"] / max(h["tx_packets"], 1)
               for h in emu.raw["hosts"])


def assert_links_carry_the_simulated_bytes(links, emu) -> None:
    """Every link carries what the simulator charges it, to BYTES_TOLERANCE, plus what resends
    add. Nothing is lost in these runs, but on a busy machine a worker's retransmission timer
    can fire before a late answer arrives (CI: SwitchML's h2 resent 6 % of its packets, with the
    switch answering each), and each resend (or its answer) crosses a link at most once. On an
    idle machine there are none and the bound is the plain 2 %."""
    allowance = resent_bytes(emu)
    low = links.tx_bytes_b < links.tx_bytes_a * (1 - BYTES_TOLERANCE)
    high = links.tx_bytes_b > links.tx_bytes_a * (1 + BYTES_TOLERANCE) + allowance
    assert not (low | high).any(), (f"resent {allowance:.0f} B", links[low | high].to_string())


def ours() -> list[str]:
    """This test process's namespaces (`inaem<pid>-<node>`): another emulation running on the
    machine at the same time (another checkout's tests) has its own."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [n for n in out if n.startswith(f"{fabric.PREFIX}{os.getpid()}-")]


@pytest.fixture
def namespaces():
    why = fabric.unavailable()
    if why:
        print(f"\nskipping the emulation test: {why}")
        pytest.skip(why)
    before = set(ours())
    yield
    left = set(ours()) - before
    assert not left, f"namespaces left behind: {left}"


@pytest.fixture(params=["tc", "user"])
def shaper(request):
    if request.param == "tc":
        request.getfixturevalue("namespaces")
    return request.param


def test_a_star_scenario_runs_for_real_and_matches_the_simulator(shaper):
    sim = inalab.simulate(SCENARIO)
    emu = inalab.emulate(SCENARIO, progress=False, shaper=shaper)
    s, e = sim.jobs.iloc[0], emu.jobs.iloc[0]
    print(f"\nsimulated JCT {s.jct_s * 1e3:.1f} ms, emulated {e.jct_s * 1e3:.1f} ms ({e.jct_s / s.jct_s - 1:+.1%}); "
          f"max error {e.max_error:.3g} (bound {e.error_bound:.3g}); shaping {emu.raw['emulation']['shaping']}")
    assert e.finished and e.iterations == 3, e.failures
    assert e.payload_checked == 3 * 3 and e.payload_errors == 0 and e.max_error <= e.error_bound
    assert_sane_time(e.jct_s, s.jct_s)
    both = inalab.compare(sim, emu)["links"]
    assert len(both) == 6
    assert_links_carry_the_simulated_bytes(both, emu)
    sw = emu.raw["emulation"]["switches"]["s0"]
    # Every aggregator is free once the job ended, and the job's end released it at the switch
    # (a static fabric's jobs stay admitted until the emulator says they ended), with nothing
    # still held to free.
    assert sw["aggregators_in_use"] == 0 and sw["jobs"] == [], sw
    assert emu.switches.set_index("name").loc["s0", "aggregators_released"] == 0
    assert sum(sw["forged"].values()) == 0 and sw["malformed"] == 0
    assert emu.switches.drops_socket.sum() == 0 and emu.hosts.drops_loss.sum() == 0
    assert sum(p["queue_drops"] for p in sw["ports"]) == 0
    assert emu.raw["emulation"]["shaping"].startswith("tc" if shaper == "tc" else "user space")
    from inalab.columns import undocumented

    assert undocumented(emu.raw) == [], "every emulated column is defined in docs/results.md"
    assert emu.ok and emu.summary()["outcome"] == "completed"


LEAF_SPINE = {
    "name": "emulate-test-leafspine",
    "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 3, "host_rate": "100Mbps",
                 "fabric_rate": "100Mbps", "link_delay": "1us", "programmable": "tor"},
    "jobs": [{"name": "atp", "scheme": "atp", "allreduce": "512KiB", "iterations": 2, "workers": ["h0", "h1", "h3", "h4"],
              "servers": ["h5"], "ina": {"packet": "8302B", "header": "110B", "timeout": "100ms"}}],
}


@pytest.mark.parametrize("scheme", ["atp", "ring"])
def test_a_leaf_spine_runs_with_every_flow_on_its_simulated_path(shaper, scheme):
    scenario = LEAF_SPINE
    if scheme == "ring":
        scenario = {**LEAF_SPINE, "jobs": [{"name": "ring", "scheme": "ring", "allreduce": "512KiB", "iterations": 2,
                                            "workers": ["h0", "h1", "h3", "h4"], "transport": {"rto": "20ms"}}]}
    sim = inalab.simulate(scenario)
    emu = inalab.emulate(scenario, progress=False, shaper=shaper)
    e = emu.jobs.iloc[0]
    assert e.finished and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    links = inalab.compare(sim, emu)["links"]
    print(f"\n{scheme} on a leaf-spine ({shaper}): JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated")
    # The same links carry the traffic (ECMP paths pinned to the simulator's), in like amounts:
    # ATP exactly; the ring up to its retransmissions.
    busy_sim = set(links[links.tx_bytes_a > 10_000].apply(lambda r: (r.src, r.dst), axis=1))
    busy_emu = set(links[links.tx_bytes_b > 10_000].apply(lambda r: (r.src, r.dst), axis=1))
    assert busy_sim == busy_emu and any("spine" in s for s, _ in busy_sim), (busy_sim ^ busy_emu)
    both = links[links.tx_bytes_a > 10_000]
    if scheme == "atp":
        assert_links_carry_the_simulated_bytes(both, emu)
    else:
        assert both.tx_bytes_rel.abs().max() < 0.15, both
    for name, st in emu.raw["emulation"]["switches"].items():
        assert st["aggregators_in_use"] == 0 and sum(st["forged"].values()) == 0 and st["no_route"] == 0, (name, st)


# Canary on every switch of a 2-leaf, 2-spine leaf-spine, set for 100 Mbps links as the shipped
# emulate-canary-* scenarios are (their comments say why): 1 MiB x 2 with 4 workers.
CANARY = {
    "name": "emulate-test-canary",
    "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 2, "host_rate": "100Mbps",
                 "fabric_rate": "100Mbps", "link_delay": "1us", "programmable": "all"},
    "jobs": [{"name": "canary", "scheme": "canary", "allreduce": "1MiB", "iterations": 2, "workers": 4,
              "ina": {"aggregation_timeout": "5ms", "rtx_timeout": "200ms", "window_blocks": 128, "header": "105B"}}],
}


def canary_totals(result, key: str) -> int:
    return sum(h["counters"].get(key, 0) for h in result.raw["hosts"])


def test_canary_sums_exactly_on_a_leaf_spine_with_its_program_on_every_switch(shaper):
    sim = inalab.simulate(CANARY)
    emu = inalab.emulate(CANARY, progress=False, shaper=shaper)
    e = emu.jobs.iloc[0]
    print(f"\ncanary ({shaper}): JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated")
    assert e.finished and e.iterations == 2 and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    assert e.payload_checked == 4 * 2
    sw = emu.raw["emulation"]["switches"]
    # The leaves sum their hosts' packets; partial sums cross the spines toward the leaders.
    assert all(sw[leaf]["program"]["aggregated"] > 0 for leaf in ("leaf0", "leaf1")), sw
    assert sum(sw[s]["program"]["reduces"] for s in ("spine0", "spine1")) > 0
    for name, st in sw.items():
        assert st["aggregators_in_use"] == 0 and sum(st["forged"].values()) == 0, (name, st)
        assert st["no_route"] == 0 and st["program_drops"].get("canary_no_route_to_switch", 0) == 0, (name, st)
    # Hosts send the simulator's bytes (the real frame's overhead is the scenario's header).
    # Downlinks and spine links carry more where a leaf's two hosts drifted apart beyond the
    # window (stragglers go on unsummed, up to the leader), so there only which spine is the
    # busier is compared: the leaders' addresses pick the same one in both drivers (the
    # simulator's node ids).
    links = inalab.compare(sim, emu)["links"]
    up, down = links[links.src.str.startswith("h")], links[links.dst.str.startswith("h")]
    assert up.tx_bytes_rel.abs().max() < 0.02 and down.tx_bytes_rel.abs().max() < 0.15, links
    for side in ("a", "b"):
        per_spine = {sp: links[(links.src == sp) | (links.dst == sp)][f"tx_bytes_{side}"].sum() for sp in ("spine0", "spine1")}
        assert per_spine["spine1"] > per_spine["spine0"], (side, per_spine)
    assert_sane_time(e.jct_s, sim.jobs.jct_s[0])


def test_canary_on_the_papers_routing_rule_sums_exactly_for_real():
    """Issue #40: the Canary figures route partial sums by the network's rule (`ina.routing =
    "network"`, destination-modulo default ports). The runtime switch runs that too: exact sums,
    the leaves aggregate, nothing held at the end (the emulation does not reroute adaptively)."""
    job = {**CANARY["jobs"][0], "ina": {**CANARY["jobs"][0]["ina"], "routing": "network"}}
    scenario = {**CANARY, "jobs": [job], "network": {"default_port": "destination"}}
    sim = inalab.simulate(scenario)
    emu = inalab.emulate(scenario, progress=False)
    e = emu.jobs.iloc[0]
    assert e.finished and e.iterations == 2 and e.payload_checked == 4 * 2, e.failures
    assert e.payload_errors == 0 and e.max_error <= e.error_bound
    sw = emu.raw["emulation"]["switches"]
    assert all(sw[leaf]["program"]["aggregated"] > 0 for leaf in ("leaf0", "leaf1")), sw
    for name, st in sw.items():
        assert st["aggregators_in_use"] == 0 and sum(st["forged"].values()) == 0 and st["no_route"] == 0, (name, st)
    assert_sane_time(e.jct_s, sim.jobs.jct_s[0])


def test_a_spine_killed_mid_allreduce_is_routed_around_and_the_sums_stay_exact(shaper):
    """The scenario's [[failures]]: spine1 (which carries three leaders' trees) dies 60 ms in;
    its process is killed, its neighbours told, and Canary re-issues the blocks it held."""
    scenario = {**CANARY, "failures": [{"node": "spine1", "at": "60ms"}]}
    sim = inalab.simulate(scenario)
    assert sim.jobs.finished[0] and canary_totals(sim, "reissues") > 0
    emu = inalab.emulate(scenario, progress=False, shaper=shaper)
    e = emu.jobs.iloc[0]
    print(f"\nspine failure ({shaper}): JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated; "
          f"re-issues {canary_totals(sim, 'reissues')} / {canary_totals(emu, 'reissues')}; {emu.raw['emulation']['failures']}")
    assert e.finished and e.iterations == 2 and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    assert canary_totals(emu, "reissues") > 0 and canary_totals(emu, "rtx_requests") > 0
    assert canary_totals(emu, "fallback_blocks") == 0
    (f,) = emu.raw["emulation"]["failures"]
    assert f["node"] == "spine1" and 0.06 <= f["down_s"] <= f["told_down_s"] < 0.06 + 0.2, f
    sw = emu.raw["emulation"]["switches"]
    assert sw["spine1"] is None, "a killed switch leaves no final counters"
    for leaf in ("leaf0", "leaf1"):
        port = next(p for p in sw[leaf]["ports"] if p["node"] == 7)  # spine1: the simulator's node id
        assert port["link_up"] is False, sw[leaf]
        assert sw[leaf]["no_route"] == 0
    assert sw["spine0"]["program"]["reduces"] > 0


def test_a_failed_spine_comes_back_with_a_fresh_program(namespaces):
    scenario = {**CANARY, "jobs": [{**CANARY["jobs"][0], "allreduce": "4MiB", "iterations": 6}],
                "failures": [{"node": "spine1", "at": "100ms", "until": "300ms"}]}
    assert inalab.simulate(scenario).jobs.finished[0]
    emu = inalab.emulate(scenario, progress=False)
    e = emu.jobs.iloc[0]
    (f,) = emu.raw["emulation"]["failures"]
    print(f"\nspine down and up: {f}")
    assert e.finished and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    assert f["up_s"] >= 0.3 and f["ready_s"] > f["up_s"], f
    sw = emu.raw["emulation"]["switches"]
    # The new process (its counters are its own) carried partial sums again once its
    # neighbours were told; their ports to it are up.
    assert sw["spine1"]["program"]["reduces"] > 0 and sw["spine1"]["aggregators_in_use"] == 0, sw["spine1"]
    for leaf in ("leaf0", "leaf1"):
        assert next(p for p in sw[leaf]["ports"] if p["node"] == 7)["link_up"] is True


def test_failures_emulate_cannot_carry_out_are_refused_naming_the_field():
    for failure, field in (({"link": ["h0", "leaf0"], "at": "1ms"}, "failures[0].link"),
                           ({"node": "h0", "at": "1ms", "until": "2ms"}, "failures[0].until"),
                           ({"node": "nowhere", "at": "1ms"}, "failures[0].node")):
        with pytest.raises(ConfigError) as e:
            inalab.emulate({**CANARY, "failures": [failure]}, progress=False)
        assert e.value.field == field, str(e.value)
    twice = [{"node": "spine0", "at": "1ms", "until": "5ms"}, {"node": "spine0", "at": "3ms"}]
    with pytest.raises(ConfigError) as e:
        inalab.emulate({**CANARY, "failures": twice}, progress=False)
    assert e.value.field == "failures[1]", str(e.value)


def test_sigterm_stops_every_process_and_removes_the_namespaces(namespaces, tmp_path):
    path = tmp_path / "long.toml"
    path.write_text(LONG_TOML)
    p = subprocess.Popen([sys.executable, "-m", "inalab", "emulate", str(path)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    seen = ""
    while "running" not in seen:
        line = p.stderr.readline()
        assert line and time.monotonic() < deadline, f"the emulation did not start: {seen}"
        seen += line
    p.send_signal(signal.SIGTERM)
    rc = p.wait(30)
    rest = p.stderr.read()
    assert rc != 0 and "interrupted" in rest, rest
    procs = subprocess.run(["pgrep", "-f", "inalab.emulation.worker"], capture_output=True, text=True).stdout.split()
    assert not procs, f"workers left running: {procs}"


def test_namespaces_of_a_crashed_run_are_removed_with_a_message(namespaces):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"{fabric.PREFIX}{dead.pid}-h0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    said = []
    gone = fabric.remove_stale(said.append)
    assert name in gone and name not in ours()
    assert said and "crashed" in said[0]


@pytest.mark.parametrize("change, field", [
    ({"topology": {"kind": "fat_tree", "k": 4}}, "topology"),
    ({"jobs": [{**SCENARIO["jobs"][0], "workers": 9}], "topology": {"kind": "star", "hosts": 9}}, "jobs.workers"),
    ({"jobs": [{**SCENARIO["jobs"][0], "ina": {"packet": "180B", "header": "52B"}}],
      "topology": {"kind": "star", "hosts": 3, "link_rate": "1Gbps"}}, "jobs[0].ina.packet_bytes"),
    ({"network": {"flow_control": "pfc"}}, "network.flow_control"),
])
def test_what_cannot_be_emulated_is_refused_naming_the_field(change, field, monkeypatch):
    monkeypatch.setenv("INALAB_EMULATE_CORES", "2")  # the limits below are a 2-core machine's
    with pytest.raises(ConfigError) as e:
        inalab.emulate({**SCENARIO, **change}, progress=False)
    assert e.value.field == field, str(e.value)


@pytest.mark.parametrize("rule", ["flow_hash", "destination"])
def test_pinned_paths_follow_the_networks_default_port_rule(rule):
    """The emulated switches pin each flow of a job to the simulator's path, so they must
    take it by the same rule: with network.default_port = "destination" every flow toward hX
    crosses spine X mod 4 (the spines' order on each leaf), whatever its source; each switch's
    fabric carries the rule for the flows it does not pin (and Canary's leaders)."""
    from inalab.emulation.plan import _pinned

    scenario = {"name": "rule", "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 4, "hosts_per_leaf": 4},
                "network": {"default_port": rule},
                "jobs": [{"name": "ring", "scheme": "ring", "allreduce": "1MiB", "workers": 8}]}
    spec = inalab.config.load_scenario(scenario).to_spec()
    assert spec["network"]["default_port"] == rule
    via = {(r["src"], r["dst"]): r["via"] for leaf in ("leaf0", "leaf1") for r in _pinned(spec).get(leaf, [])
           if r["via"].startswith("spine")}
    assert len(via) == 2 * 4 * 4, "every flow between the leaves goes up once"
    matches = [v == f"spine{int(dst[1:]) % 4}" for (_, dst), v in via.items()]
    assert all(matches) if rule == "destination" else not all(matches)
    with pytest.raises(ValueError, match="network.default_port"):
        inalab._core.ecmp_paths('{"shape": {"kind": "star", "hosts": 2, "switch_ports": 4, "link_rate_bps": 1, "link_delay_ps": 0}}', "[]", "random")


def test_the_limits_scale_with_the_cores_this_process_may_use(monkeypatch):
    from inalab.emulation.run import limits

    two, sixteen = limits(2), limits(16)
    assert (two.hosts, two.hosts_low_rate, two.switches, two.aggregate_gbps) == (8, 10, 6, 5.0)
    assert (sixteen.hosts, sixteen.switches, sixteen.aggregate_gbps) == (64, 48, 40.0)
    assert limits(1) == limits(2).__class__(1, 8, 10, 6, 5.0), "never below the measured 2-core limits"
    # 12 hosts: refused on 2 cores (the message says how many), within the limit on 4.
    twelve = {**SCENARIO, "topology": {**SCENARIO["topology"], "hosts": 12, "link_rate": "1Gbps"},
              "jobs": [{**SCENARIO["jobs"][0], "workers": 12}]}
    monkeypatch.setenv("INALAB_EMULATE_CORES", "2")
    with pytest.raises(ConfigError, match=r"12 hosts in use; emulate runs at most 8 on this machine \(2 cores\)") as e:
        inalab.emulate(twelve, progress=False)
    assert e.value.field == "jobs.workers"
    assert limits().hosts == 8
    monkeypatch.setenv("INALAB_EMULATE_CORES", "4")
    assert limits().hosts == 16
    monkeypatch.setenv("INALAB_EMULATE_CORES", "many")
    with pytest.raises(ConfigError, match="INALAB_EMULATE_CORES.*1 or more"):
        limits()


def test_a_training_job_sleeps_its_compute_and_overlaps_its_layers():
    """A model profile's job (dnn_b: 4 layers, 8 MB of gradients; compute scaled to ~130 ms per
    iteration) runs layer by layer as the simulator's does: every layer's sum exact, the
    iteration time within the loose bound of the simulated one."""
    scenario = {**SCENARIO, "topology": {**SCENARIO["topology"], "hosts": 3},
                "jobs": [{"name": "dnn", "scheme": "switchml", "model": "dnn_b", "compute_scale": 100, "iterations": 2,
                          "workers": 3, "ina": SCENARIO["jobs"][0]["ina"]}]}
    sim = inalab.simulate(scenario)
    emu = inalab.emulate(scenario, progress=False, shaper="user")
    e = emu.jobs.iloc[0]
    assert e.finished and e.payload_errors == 0 and e.payload_checked == 3 * 4 * 2, e.failures
    print(f"\ntraining: iteration {sim.jobs.mean_iteration_s[0] * 1e3:.0f} ms simulated, {e.mean_iteration_s * 1e3:.0f} ms emulated")
    assert_sane_time(e.mean_iteration_s, sim.jobs.mean_iteration_s[0])


# Rina on two racks of 2 workers (the shipped emulate-rina-* scenarios' settings): one INA ToR
# (a ring of rack 0 and two autonomous workers) and both (a ring of 2 racks), 1 MiB x 2.
def rina(programmable) -> dict:
    return {"name": "emulate-test-rina",
            "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 2, "host_rate": "100Mbps",
                         "fabric_rate": "100Mbps", "link_delay": "1us", "programmable": programmable},
            "jobs": [{"name": "rina", "scheme": "rina", "allreduce": "1MiB", "iterations": 2, "workers": 4,
                      "ina": {"rto": "20ms", "repair": "40ms", "window": "64000B", "header": "114B"}}]}


@pytest.mark.parametrize("programmable, groups", [(["leaf0"], 3), ("tor", 2)])
def test_rina_sums_exactly_over_ina_and_plain_racks(shaper, programmable, groups):
    scenario = rina(programmable)
    sim = inalab.simulate(scenario)
    emu = inalab.emulate(scenario, progress=False, shaper=shaper)
    e = emu.jobs.iloc[0]
    print(f"\nrina {programmable} ({shaper}): JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated")
    assert e.finished and e.iterations == 2 and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    assert e.payload_checked == 4 * 2
    # Each of the G chunks makes G ScatterReduce hops and G - 1 AllGather hops, per ring
    # allreduce. The emulation's workers allreduce float tensors, so each of their 2 iterations
    # is two: the data, and the ranks' tensor sizes (a world-long vector, so that ranks that
    # disagree on a size fail naming it); the simulator's integer payloads have no size round.
    for result, tensors in ((sim, 1), (emu, 2)):
        hops = sum(h["counters"].get("sr_hops", 0) + h["counters"].get("ag_hops", 0) for h in result.raw["hosts"])
        assert hops == 2 * tensors * groups * (2 * groups - 1), hops
    sw = emu.raw["emulation"]["switches"]
    assert sw["leaf0"]["program"]["aggregated"] > 0 and sw["leaf0"]["aggregators_in_use"] == 0, sw["leaf0"]
    assert_sane_time(e.jct_s, sim.jobs.jct_s[0])


def test_rina_survives_an_agent_killed_mid_allreduce(shaper):
    # emulate-rina-agent-failure at 1 MiB x 3: rack 0's agent (h0) is killed in the middle of
    # the second allreduce; h1 goes on as an autonomous worker (a ring of h1 and rack 1), and
    # the job finishes over the 3 survivors with the same sums, emulated as simulated.
    scenario = rina("tor")
    scenario["jobs"][0]["iterations"] = 3
    clean = inalab.simulate(scenario)
    at = 1.5 * clean.jobs.jct_s[0] / 3
    scenario["failures"] = [{"node": "h0", "at": f"{at:.4f}s", "detect": "50ms"}]
    sim = inalab.simulate(scenario)
    emu = inalab.emulate(scenario, progress=False, shaper=shaper)
    e = emu.jobs.iloc[0]
    print(f"\nrina agent killed ({shaper}): JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated")
    assert sim.jobs.finished[0] and sim.jobs.payload_errors[0] == 0
    assert e.finished and e.iterations == 3 and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    assert e.payload_checked == 3 * 3, "the three survivors' results"
    for result in (sim, emu):
        told = {h["name"]: h["counters"].get("failures", 0) for h in result.raw["hosts"] if h["name"] != "h0"}
        assert told == {"h1": 1, "h2": 1, "h3": 1}, told
    report = emu.raw["emulation"]["failures"][0]
    assert report["node"] == "h0" and report["told_down_s"] > report["down_s"], report
    assert_sane_time(e.jct_s, sim.jobs.jct_s[0])


def grid_fig1(shaper: str) -> dict:
    """The shipped emulate-grid-fig1 (Fig. 1 at 30 Mbps, R-GRIA seed 12's policy) with a small
    allreduce; for the user-space shaper, which gives every port one rate, the PS's link at
    30 Mbps too (it then carries the three switches' aggregates at its full rate)."""
    import tomllib

    from inalab.config import shipped_scenarios

    path = shipped_scenarios()["emulate-grid-fig1"]
    sc = tomllib.loads(path.read_text())
    sc["jobs"][0].update(allreduce="256KiB", iterations=2, policy=str(path.parent / sc["jobs"][0]["policy"]))
    if shaper == "user":
        sc["topology"]["links"] = [{**l, "rate": "30Mbps"} for l in sc["topology"]["links"]]
    return sc


def test_grid_runs_its_policy_paths_with_results_multicast_once(shaper):
    """GRID on Fig. 1's three switches and nine hosts: W2's gradients go to S2 over S1 (its
    policy path, pinned at each switch), S1, S2 and S3 aggregate their groups, the PS sends one
    result per fragment and the switches copy it down the PS's shortest-path tree; sums exact."""
    scenario = grid_fig1(shaper)
    sim = inalab.simulate(scenario)
    emu = inalab.emulate(scenario, progress=False, shaper=shaper)
    e = emu.jobs.iloc[0]
    print(f"\ngrid fig. 1 ({shaper}): JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated")
    assert e.finished and e.iterations == 2 and e.payload_checked == 8 * 2, e.failures
    assert e.payload_errors == 0 and e.max_error <= e.error_bound
    assert_sane_time(e.jct_s, sim.jobs.jct_s[0])
    if shaper == "tc":
        # Nothing is lost (no link is oversubscribed; the user-space shaper's 30 Mbps PS link
        # is, and drops), so a resend is a timeout that fired while a process was descheduled.
        # The scenario's 50 ms RTO outlasts most such stalls: 0-0.8 % of the packets beside a
        # busy core, against 8-20 % (and JCT up to 2x, in CI) with the 20 ms it had; 17.6 % in a
        # suite run beside two CPU hogs (`make test-busy`). So the bound is a sanity one: a storm
        # of timeouts (a window resent per RTO) would be several times the packets sent.
        sent, resent = (sum(h["counters"].get(k, 0) for h in emu.raw["hosts"]) for k in ("sent", "resent"))
        assert resent < 0.5 * sent, f"{resent} spurious resends of {sent} packets"
    sw = emu.raw["emulation"]["switches"]
    for name, st in sw.items():
        assert st["program"]["agg_packets"] > 0, (name, st["program"])
        assert st["no_route"] == 0 and st["unadmitted"] == 0 and sum(st["forged"].values()) == 0, (name, st)
        # Nothing held at the end: what a fragment left at a switch is freed by its result.
        assert st["aggregators_in_use"] == 0, (name, st)
    ps = emu.raw["emulation"]["ps"]["PS"]
    grid = ps["jobs"]["1"]
    # Multicast: one datagram per result out of the PS (unicast would be 8); S3 copies each to
    # W7, W8, S1 and S2 (answers to a late packet go to its sender alone).
    assert ps["io"]["datagrams_sent"] == grid["fragments_completed"] + grid["answered_again"], ps
    assert sw["S3"]["multicast_copies"] == 4 * grid["fragments_completed"], sw["S3"]
    assert sw["S1"]["multicast_copies"] == 4 * grid["fragments_completed"], sw["S1"]
    # The policy's paths: S1-S2 carries W2's gradients (as much as W2's own link), S2-S1 only
    # control packets; the same links busy as in the simulation, in like amounts.
    links = inalab.compare(sim, emu)["links"]
    by = links.set_index(["src", "dst"])
    assert abs(by.tx_bytes_b[("S1", "S2")] / by.tx_bytes_b[("W2", "S1")] - 1) < 0.02, by.loc[[("S1", "S2"), ("W2", "S1")]]
    assert by.tx_bytes_b[("S2", "S1")] < 20_000
    busy_sim = set(links[links.tx_bytes_a > 20_000].apply(lambda r: (r.src, r.dst), axis=1))
    busy_emu = set(links[links.tx_bytes_b > 20_000].apply(lambda r: (r.src, r.dst), axis=1))
    assert busy_sim == busy_emu, busy_sim ^ busy_emu
    if shaper == "tc":
        # Nothing is lost, so the emulated links carry what the simulated ones do, plus what
        # the spurious resends above add: each may be forwarded, and the PS answers each one
        # for a fragment it completed with the result again (`answered_again`), one more
        # result on its link. On an idle machine none; beside two CPU hogs 17 % more on the
        # PS's link, and 37 % in a CI run beside a two-process benchmark (7.6 % of the packets
        # resent, all workers resending the fragments a descheduled PS held). With the
        # user-space shaper's one rate the PS's link is the bottleneck, and the simulator
        # resends 10-40 % more there than the emulation (AIMD against a drop-tail queue).
        again = grid["answered_again"] / max(1, grid["fragments_completed"])
        rel = links[links.tx_bytes_a > 20_000].tx_bytes_rel
        assert rel.min() > -0.10 and rel.max() < 0.10 + max(3 * resent / sent, again), (resent, sent, again, links)
    # Control packets from a switch reach their senders (those not answered meanwhile count).
    sent = sum(st["program"]["control_sent"] for st in sw.values())
    acted = sum(h["counters"].get("controls", 0) for h in emu.raw["hosts"])
    assert acted <= sent and (sent == 0 or acted > 0), (sent, acted)


def test_atp_on_fig1_is_paced_by_s1s_processing_capacity(namespaces):
    """The shipped emulate-grid-fig1-atp (small allreduce): S1 aggregates four workers through
    its 90 Mbps of processing (the scenario's `switch_capacity`, charged by the software switch
    to what it aggregates), so the job cannot end before S1 has served every aggregated packet
    back to back, where the links alone would let it end sooner; sums exact, nothing held."""
    import tomllib

    from inalab.config import shipped_scenarios

    sc = tomllib.loads(shipped_scenarios()["emulate-grid-fig1-atp"].read_text())
    sc["jobs"][0].update(allreduce="256KiB", iterations=2)
    sim = inalab.simulate(sc)
    emu = inalab.emulate(sc, progress=False)
    e = emu.jobs.iloc[0]
    print(f"\natp fig. 1: JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated")
    assert e.finished and e.payload_errors == 0 and e.max_error <= e.error_bound, e.failures
    sw = emu.raw["emulation"]["switches"]
    s1 = sw["S1"]
    # S1's datagrams are all one size (a worker's packet and its result alike).
    worker_port = next(p for p in s1["ports"] if p["kind"] == "worker")
    wire = worker_port["sent_bytes"] / worker_port["sent"]
    floor = s1["program"]["aggregated"] * wire * 8 / 90e6
    link_only = 2 * 256 * 1024 * wire / 256 * 8 / 30e6  # a worker's own link, were S1 unlimited
    assert floor > 1.2 * link_only and e.jct_s >= floor, (e.jct_s, floor, link_only)
    # The FIFO queued, and marked if it held more than its threshold (whether it did depends
    # on how bursty the workers' processes were: one CI run saw no mark; marking itself is
    # checked in crates/inalab-net/tests/fabric.rs).
    fifo = s1["processing"]
    assert fifo["rate_bps"] == 90e6 and fifo["peak_bytes"] > 0, fifo
    assert s1["ecn_marked"] > 0 or fifo["peak_bytes"] <= fifo["ecn_threshold_bytes"], (s1["ecn_marked"], fifo)
    for name, st in sw.items():
        assert st["aggregators_in_use"] == 0 and st["processing_drops"] == 0 and st["no_route"] == 0, (name, st)
    assert_sane_time(e.jct_s, sim.jobs.jct_s[0])


def test_nine_hosts_run_only_where_the_links_are_slow():
    """Fig. 1 at its own 3 Gbps is refused (9 hosts need the links in use to sum to at most
    1 Gbps on 2 cores), naming the field; at 30 Mbps it passes the checks (run above)."""
    from inalab.emulation import run

    sc = grid_fig1("tc")
    sc["topology"]["links"] = [{**l, "rate": "3Gbps"} for l in sc["topology"]["links"]]
    with pytest.raises(ConfigError) as e:
        inalab.emulate(sc, progress=False)
    assert e.value.field == "jobs.workers" and "9 hosts" in str(e.value) and "1 Gbps" in str(e.value), str(e.value)
    spec = inalab.config.load_scenario(grid_fig1("tc")).to_spec()
    run._check(spec, inalab.config.build_topology(spec["topology"]))


COLOCATED = {"payload": True, "stop": "20s", "topology": {"kind": "star", "hosts": 5, "link_rate": "100Mbps", "link_delay": "1us"}}


@pytest.mark.parametrize("scheme, ina", [("atp", {"packet": "8302B", "header": "110B", "timeout": "100ms"}), ("grid", {})])
def test_a_colocated_ps_shares_its_workers_link_for_real(namespaces, scheme, ina):
    """#38 item 2 in the emulator: the PS on worker h3's host, a process of its own on that
    namespace's address, sharing its veth (the switch sends what is addressed to the server's
    endpoint port to the PS, the rest to the worker). Sums exact, and h3's link carries the
    worker's and the PS's bytes as the simulator charges them: its share of the hosts' bytes,
    since absolute bytes differ by design (the emulator's frames carry Ethernet, IP and UDP
    headers the simulator's packet sizes leave out, 13 % on GRID's 322 B packets) and by timing
    (resends: a CI run beside other work saw h3's bytes 15.6 % over the simulator's)."""
    sc = {**COLOCATED, "jobs": [{"scheme": scheme, "allreduce": "512KiB", "iterations": 2, "workers": ["h0", "h1", "h2", "h3"],
                                 "servers": ["h3"], "ina": ina}]}
    sim = inalab.simulate(sc)
    emu = inalab.emulate(sc, progress=False, shaper="tc")
    e = emu.jobs.iloc[0]
    assert e.finished and e.payload_checked == 4 * 2 and e.payload_errors == 0, e.failures
    both = emu.hosts.merge(sim.hosts, on="name", suffixes=("_emu", "_sim")).set_index("name")
    for c in ("rx_bytes", "tx_bytes"):
        share = {k: both.loc["h3", f"{c}_{k}"] / both[f"{c}_{k}"].sum() for k in ("emu", "sim")}
        assert abs(share["emu"] / share["sim"] - 1) < 0.1, (c, share, both)
        for h in ("h0", "h3"):  # a sanity bound only: framing and resends move the bytes themselves
            assert 0.5 < both.loc[h, f"{c}_emu"] / both.loc[h, f"{c}_sim"] < 2, (h, c, both)
    # One link carries the PS's traffic beside its worker's.
    assert both.loc["h3", "rx_bytes_emu"] > 1.5 * both.loc["h0", "rx_bytes_emu"], both
    print(f"\n{scheme} co-located: JCT {sim.jobs.jct_s[0] * 1e3:.1f} ms simulated, {e.jct_s * 1e3:.1f} ms emulated")
    assert_sane_time(e.jct_s, sim.jobs.jct_s[0])


def test_a_colocated_ps_is_refused_where_each_process_paces_its_own_link():
    sc = {**COLOCATED, "jobs": [{"scheme": "atp", "allreduce": "64KiB", "workers": ["h0", "h1", "h2"], "servers": ["h2"]}]}
    with pytest.raises(ConfigError) as e:
        inalab.emulate(sc, progress=False, shaper="user")
    assert e.value.field == "jobs[0].servers" and "tc shaper" in str(e.value), str(e.value)


def test_a_run_started_with_sigint_ignored_still_stops_its_switches_and_reads_their_counters():
    # A script's `nohup inalab emulate ... &` starts it with SIGINT ignored, which its child
    # processes inherited: the switches never stopped on the SIGINT that ends them, and their
    # final counters came back as None (found by a CI run launched that way).
    code = ("import json, inalab, sys; sys.path.insert(0, 'python/tests'); from test_emulate import SCENARIO; "
            "e = inalab.emulate(SCENARIO, progress=False, shaper='user'); "
            "print(json.dumps({'finished': bool(e.jobs.finished.all()), 'switches': e.raw['emulation']['switches']}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert p.returncode == 0, p.stderr[-2000:]
    out = __import__("json").loads(p.stdout.strip().splitlines()[-1])
    assert out["finished"]
    assert out["switches"] and all(st is not None and st["aggregators_in_use"] == 0 for st in out["switches"].values()), out
