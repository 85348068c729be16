"""The scenario schema: every error names its field; shipped scenarios become valid SimSpecs.

These tests use the real ``inalab._core`` (built by ``make build``): a missing extension fails them.
"""
import json
import subprocess
import sys

import pytest

import inalab._core as core
import inalab
from inalab.config import ConfigError, load_scenario, markdown_reference, shipped_scenarios

from conftest import REPO


def error(data) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_scenario(data).to_spec()
    return e.value


def test_unknown_key_names_path_and_lists_allowed(star):
    star["jobs"][0]["transport"] = {"msss": "1436B"}
    e = error(star)
    assert e.field == "jobs[0].transport.msss"
    assert "mss, header, rto, init_window, increment" in e.message


def test_unknown_top_level_key(star):
    star["topolgy"] = {}
    assert error(star).field == "topolgy"


def test_unknown_key_for_this_topology_kind(star):
    star["topology"]["leaves"] = 2
    e = error(star)
    assert e.field == "topology.leaves" and "link_rate" in e.message


def test_wrong_unit_names_field_and_units(star):
    star["topology"]["link_delay"] = "1 furlong"
    e = error(star)
    assert e.field == "topology.link_delay" and "ps, ns, us" in e.message


def test_bare_number_rejected(star):
    star["network"] = {"buffer": 1048576}
    e = error(star)
    assert e.field == "network.buffer" and "needs a unit" in e.message


def test_unknown_topology_kind(star):
    star["topology"]["kind"] = "torus"
    e = error(star)
    assert e.field == "topology.kind" and "leaf_spine" in e.message


def test_more_hosts_than_ports_is_the_rust_message_on_the_users_field(star):
    star["topology"].update(hosts=80, switch_ports=64)
    e = error(star)
    assert e.field.startswith("topology.hosts"), e
    assert "64" in e.message


def test_impossible_dragonfly():
    e = error({"topology": {"kind": "dragonfly", "a": 2, "g": 9, "h": 1},
               "flows": [{"src": "h0", "dst": "h1", "size": "1KB"}]})
    assert e.field == "topology.g"


def test_job_on_missing_host(star):
    star["jobs"][0]["workers"] = ["h0", "h99"]
    e = error(star)
    assert e.field == "jobs[0].workers" and "h99" in e.message and "h0..h7" in e.message


def test_job_on_a_switch(star):
    star["jobs"][0]["workers"] = ["h0", "s0"]
    e = error(star)
    assert e.field == "jobs[0].workers" and "switch" in e.message


def test_overlapping_jobs_name_both(star):
    star["jobs"].append({"name": "b", "scheme": "ring", "allreduce": "1MiB", "workers": ["h3", "h4"]})
    e = error(star)
    assert e.field == "jobs[1].workers" and "'a'" in e.message and "jobs[0]" in e.message


def test_counts_take_free_hosts_and_ps_gets_the_next_one(star):
    star["jobs"].append({"name": "b", "scheme": "ps", "allreduce": "1MiB", "workers": 3})
    jobs = load_scenario(star).to_spec()["jobs"]
    assert jobs[0]["workers"] == ["h0", "h1", "h2", "h3"]
    assert jobs[1]["workers"] == ["h4", "h5", "h6"] and jobs[1]["servers"] == ["h7"]


def test_not_enough_free_hosts(star):
    star["jobs"].append({"name": "b", "scheme": "ring", "allreduce": "1MiB", "workers": 5})
    assert error(star).field == "jobs[1].workers"


def test_model_and_allreduce_are_exclusive(star):
    star["jobs"][0]["model"] = "vgg16"
    assert error(star).field == "jobs[0].model"


def test_unknown_model(star):
    del star["jobs"][0]["allreduce"]
    star["jobs"][0]["model"] = "vgg17"
    e = error(star)
    assert e.field == "jobs[0].model" and "vgg16" in e.message


def test_servers_only_for_ps(star):
    star["jobs"][0]["servers"] = ["h7"]
    assert error(star).field == "jobs[0].servers"


def test_switch_names_checked(star):
    star["network"] = {"switch_memory": {"s9": "1MB"}}
    assert error(star).field == "network.switch_memory.s9"


def test_strings_are_not_coerced_to_numbers(star):
    star["topology"]["hosts"] = "8"
    assert error(star).field == "topology.hosts"


def test_toml_syntax_error_is_a_config_error(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("name = \n")
    assert error(str(p)).field == "scenario"


def test_spec_units_and_defaults(star):
    spec = load_scenario(star).to_spec()
    shape = spec["topology"]["shape"]
    assert shape == {"kind": "star", "hosts": 8, "switch_ports": 64, "link_rate_bps": 100 * 10**9,
                     "link_delay_ps": 10**6}
    assert spec["jobs"][0]["workload"] == {"kind": "allreduce", "bytes": 65536, "iterations": 1}
    assert spec["jobs"][0]["transport"]["rto_ps"] == 10**9
    assert spec["network"]["routing"] == {"kind": "ecmp"}


def test_canary_preset_is_overridable():
    s = load_scenario({"topology": {"kind": "canary_fat_tree", "leaves": 4, "hosts_per_leaf": 2},
                       "flows": [{"src": "h0", "dst": "h7", "size": "1KB"}]})
    shape = s.to_spec()["topology"]["shape"]
    assert shape["kind"] == "leaf_spine" and shape["leaves"] == 4 and shape["spines"] == 32
    assert shape["fabric_rate_bps"] == shape["host_rate_bps"] == 100 * 10**9


@pytest.mark.parametrize("name", sorted(shipped_scenarios()))
def test_shipped_scenarios_become_valid_specs(name):
    scenario = load_scenario(name)
    spec = scenario.to_spec()
    assert spec["name"] == name
    # The spec is JSON the simulator accepts: the same dict back from a JSON round trip, and a
    # topology the simulator builds.
    assert json.loads(json.dumps(spec)) == spec
    built = json.loads(core.build_topology(json.dumps(spec["topology"])))
    hosts = {n["name"] for n in built["nodes"] if n["kind"] == "host"}
    for job in spec["jobs"]:
        assert set(job["workers"] + job["servers"]) <= hosts
    assert scenario.description, "shipped scenarios need a description for `inalab scenarios`"


def test_canary_scenario_places_ring_and_background_apart():
    spec = load_scenario("canary-congestion").to_spec()
    assert len(spec["jobs"][0]["workers"]) == 512 and len(spec["background"]["hosts"]) == 512
    assert not set(spec["jobs"][0]["workers"]) & set(spec["background"]["hosts"])
    assert spec["network"]["routing"]["kind"] == "adaptive"


def test_simulator_accepts_spec_and_result_is_consistent():
    r = core.simulate(json.dumps(load_scenario("ring-star-allreduce").to_spec()), None)
    result = json.loads(r)
    assert result["jobs"][0]["finished"] and result["conservation"]["holds"]


def test_docs_config_md_is_generated_from_schema():
    committed = (REPO / "docs" / "config.md").read_text()
    assert committed == markdown_reference(), "run `make docs` to regenerate docs/config.md"


def test_markdown_cli_entry_point():
    out = subprocess.run([sys.executable, "-m", "inalab.config", "--markdown"], capture_output=True, text=True,
                         check=True).stdout
    assert out == markdown_reference()


def test_ina_schemes_run_from_toml_with_their_packet_defaults():
    import inalab

    scenario = {
        "name": "ina",
        "payload": True,
        "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 5, "programmable": "tor"},
        "jobs": [
            {"name": "sml", "scheme": "switchml", "allreduce": "40KiB", "iterations": 2, "workers": "h0..h3"},
            {"name": "atp", "scheme": "atp", "allreduce": "40KiB", "iterations": 2, "workers": "h5..h8", "servers": ["h9"]},
        ],
    }
    spec = inalab.load_scenario(scenario).to_spec()
    ina = {j["scheme"]: j["ina"] for j in spec["jobs"]}
    assert (ina["switchml"]["packet_bytes"], ina["switchml"]["header_bytes"]) == (180, 52)
    assert (ina["atp"]["packet_bytes"], ina["atp"]["header_bytes"]) == (306, 58)
    jobs = inalab.simulate(scenario).jobs.set_index("name")
    assert jobs["finished"].all()
    assert (jobs["payload_errors"] == 0).all() and (jobs["payload_checked"] == 4 * 2).all()


def test_switchml_across_racks_names_the_field():
    import inalab

    scenario = {
        "topology": {"kind": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 2},
        "jobs": [{"scheme": "switchml", "allreduce": "4KiB", "workers": "h0..h3"}],
    }
    with pytest.raises(ConfigError) as e:
        inalab.simulate(scenario)
    assert e.value.field.startswith("jobs[0].workers")


def test_the_scheme_list_and_defaults_come_from_the_registry():
    from inalab import schemes
    from inalab.config import Job

    reg = json.loads(core.schemes())
    assert [s["name"] for s in reg] == list(schemes.names())
    assert set(Job.model_fields["scheme"].annotation.__args__) == set(schemes.names())
    # Every parameter default is a JSON value with a unit string; the INA schemes have programs.
    assert {n for n, s in schemes.registry().items() if s["program"]} >= {"atp", "switchml"}
    assert schemes.default("atp", "ina.packet_bytes") == 306
    assert schemes.registry()["atp"]["quantization"] == {"kind": "fixed_point", "scale": 1e8}


@pytest.mark.parametrize("scheme, key, value, field", [
    ("switchml", "ina", {"hashing": "linear"}, "jobs[0].ina.hashing"),
    ("switchml", "ina", {"congestion_control": False}, "jobs[0].ina.congestion_control"),
    ("atp", "ina", {"pool_slots": 4}, "jobs[0].ina.pool_slots"),
    ("ring", "ina", {"timeout": "1ms"}, "jobs[0].ina.timeout"),  # a ring takes only the step costs
    ("switchml", "transport", {"mss": "1000B"}, "jobs[0].transport"),
    ("ring", "partition", "1MiB", "jobs[0].partition"),
])
def test_a_setting_the_scheme_does_not_take_is_an_error_not_ignored(star, scheme, key, value, field):
    star["jobs"][0] = {"scheme": scheme, "allreduce": "4KiB", "workers": "h0..h2", key: value}
    e = error(star)
    assert e.field == field and "applies only to" in e.message, (e.field, e.message)


def test_a_job_sends_only_the_keys_its_scheme_takes(star):
    star["jobs"] = [{"scheme": "switchml", "allreduce": "4KiB", "workers": "h0..h2"},
                    {"scheme": "ring", "allreduce": "4KiB", "workers": "h3..h4"}]
    sml, ring = load_scenario(star).to_spec()["jobs"]
    assert set(sml) - {"id", "name", "workers", "servers", "workload", "start_ps", "jitter_ps"} == {"scheme", "ina"}
    assert set(sml["ina"]) == {"packet_bytes", "header_bytes", "timeout_ps", "pool_slots"}
    assert "partition_bytes" not in ring and "transport" in ring
    # A ring's only ina keys are eq. (1)'s step costs, none by default.
    assert ring["ina"] == {"step_overhead_ps": 0, "step_jitter_ps": 0, "step_barrier": False}


@pytest.mark.parametrize("scheme", ["ring", "hierarchical", "ps", "ps_sharded", "atp", "switchml"])
def test_python_defaults_are_the_registrys(star, scheme):
    """A job that sets nothing sends exactly the registry's defaults for every parameter its
    scheme takes (Python's transport and partition defaults cannot drift from the registry's)."""
    from inalab import schemes

    star["jobs"] = [{"scheme": scheme, "allreduce": "4KiB", "workers": "h0..h2"}]
    job = load_scenario(star).to_spec()["jobs"][0]
    for p in schemes.registry()[scheme]["params"]:
        value = job
        for key in p["name"].split("."):
            value = value.get(key) if isinstance(value, dict) else None
        assert value == p["default"], (p["name"], value, p["default"])


def test_ina_fields_come_from_the_registry_and_the_registry_checks_them(star):
    from inalab.config import INA_FIELDS

    assert INA_FIELDS["timeout"] == "timeout_ps" and INA_FIELDS["scale"] == "scale"
    star["jobs"] = [{"scheme": "atp", "allreduce": "4KiB", "workers": "h0..h2", "ina": {"hashing": "round_robin"}}]
    e = error(star)
    assert e.field == "jobs[0].ina.hashing" and "linear" in e.message, (e.field, e.message)
    star["jobs"][0]["ina"] = {"timeout": "2ms", "scale": 1e6}
    ina = load_scenario(star).to_spec()["jobs"][0]["ina"]
    assert (ina["timeout_ps"], ina["scale"], ina["packet_bytes"]) == (2_000_000_000, 1e6, 306)


def test_static_tree_takes_trees_and_the_registry_checks_them(star):
    """The static-tree baselines' parameters come from the registry like every scheme's; a
    parameter two schemes share but mean differently shows each meaning."""
    from inalab.config import Ina

    star["topology"] = {"kind": "leaf_spine", "leaves": 2, "spines": 4, "hosts_per_leaf": 2}
    star["jobs"] = [{"scheme": "static_tree", "allreduce": "4KiB", "workers": "h0..h3",
                     "ina": {"trees": 4, "rtx_timeout": "20us"}}]
    ina = load_scenario(star).to_spec()["jobs"][0]["ina"]
    assert (ina["trees"], ina["rtx_timeout_ps"], ina["window_blocks"]) == (4, 20_000_000, 4096)
    star["jobs"][0]["ina"] = {"trees": 0}
    e = error(star)
    assert e.field == "jobs[0].ina.trees", (e.field, e.message)
    star["jobs"][0]["ina"] = {"table": "static"}
    e = error(star)
    assert e.field == "jobs[0].ina.table" and "applies only to" in e.message, (e.field, e.message)
    doc = Ina.model_fields["rtx_timeout"].description
    assert "canary: " in doc and "static_tree: " in doc, doc


@pytest.mark.parametrize("where, value, field, words", [
    ("iterations", 1_000_000_000_000, "jobs[0].iterations", "4294967295"),
    ("allreduce", "100003B", "jobs[0].allreduce", "multiple of 4"),
    ("link_rate", "1e30Gbps", "topology.link_rate", "too large"),
    ("stop", "1e30s", "stop", "too large"),
    ("link_rate", "-5Gbps", "topology.link_rate", "never negative"),
    ("link_rate", "nanGbps", "topology.link_rate", "finite number"),
])
def test_out_of_range_values_name_the_users_field(star, where, value, field, words):
    """#11: these named an internal field (spec, workload.layers[0].bytes) or none at all."""
    if where in ("iterations", "allreduce"):
        star["jobs"][0][where] = value
    elif where == "link_rate":
        star["topology"]["link_rate"] = value
    else:
        star[where] = value
    e = error(star)
    assert e.field == field and words in e.message, (e.field, e.message)


@pytest.mark.parametrize("slots", [0, (1 << 20) + 1, 4_000_000_000])
def test_atp_slots_out_of_range_name_the_field_and_range(star, slots):
    # A table of 4e9 slots would allocate 16 GB before anything runs.
    star["jobs"][0] = {"scheme": "atp", "allreduce": "4KiB", "workers": "h0..h1", "servers": ["h2"], "ina": {"slots": slots}}
    e = error(star)
    assert e.field == "jobs[0].ina.slots", (e.field, e.message)
    assert "1..=1048576" in e.message or "u32" in e.message, e.message


def test_rina_takes_its_parameters_from_the_registry(star):
    star["topology"] = {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 4}
    star["jobs"] = [{"scheme": "rina", "allreduce": "64KiB", "workers": "h0..h7",
                     "ina": {"rto": "50us", "window": "30000B", "min_rack": 3}}]
    ina = load_scenario(star).to_spec()["jobs"][0]["ina"]
    assert (ina["rto_ps"], ina["window_bytes"], ina["min_rack"], ina["slots"]) == (50_000_000, 30_000, 3, 1024)
    star["jobs"][0]["ina"] = {"min_rack": 1}
    e = error(star)
    assert e.field == "jobs[0].ina.min_rack" and "2..=32" in e.message, (e.field, e.message)


def test_a_host_failure_is_survived_by_rina_and_named_by_other_schemes(star):
    # Rina rebuilds its ring over the 7 survivors (spec §1.8); a ring job cannot go on and
    # fails naming the worker. Payload mode checks every result against the sums.
    star["topology"] = {"kind": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 4}
    star["payload"] = True
    star["failures"] = [{"node": "h0", "at": "10us", "detect": "20us"}]
    star["jobs"] = [{"scheme": "rina", "allreduce": "80KB", "iterations": 4, "workers": "h0..h7"}]
    assert load_scenario(star).to_spec()["failures"] == [{"node": "h0", "at_ps": 10_000_000, "detect_ps": 20_000_000}]
    r = inalab.simulate(star)
    job = r.jobs.iloc[0]
    assert job.finished and job.payload_errors == 0, job
    hosts = r.hosts.set_index("name")
    assert hosts.loc["h0", "counters"]["failed_at_ns"] == 10_000
    assert sum(c.get("failures", 0) for c in hosts.counters) == 7
    star["jobs"] = [{"scheme": "ring", "allreduce": "80KB", "iterations": 4, "workers": "h0..h7"}]
    r = inalab.simulate(star)
    assert not r.jobs.finished[0] and "worker 0 on h0 failed at 10000 ns" in str(r.jobs.failures[0]), r.jobs.failures[0]
    star["failures"] = [{"node": "h0", "at": "10us", "until": "20us"}]
    with pytest.raises(ConfigError) as e:
        inalab.simulate(star)
    assert e.value.field == "failures[0].until" and "does not come back" in e.value.message, e.value


def test_flow_control_defaults_to_drop_tail_and_pfc_has_thresholds(star):
    assert "flow_control" not in load_scenario(star).to_spec()["network"], "drop-tail specs are unchanged"
    star["network"] = {"flow_control": "pfc"}
    assert load_scenario(star).to_spec()["network"]["flow_control"] == {"kind": "pfc", "xoff_bytes": 65536, "xon_bytes": 32768}
    star["network"] = {"flow_control": "pfc", "pfc_xoff": "100KB", "pfc_xon": "40KB"}
    assert load_scenario(star).to_spec()["network"]["flow_control"] == {"kind": "pfc", "xoff_bytes": 100_000, "xon_bytes": 40_000}
    star["network"] = {"flow_control": "credit"}
    assert load_scenario(star).to_spec()["network"]["flow_control"] == {"kind": "credit", "buffer_bytes": 14_000}
    star["network"] = {"flow_control": "credit", "credit_buffer": "32KiB"}
    assert load_scenario(star).to_spec()["network"]["flow_control"] == {"kind": "credit", "buffer_bytes": 32768}


@pytest.mark.parametrize("network, field, words", [
    ({"flow_control": "credits"}, "network.flow_control", ["'drop_tail'", "'pfc'", "'credit'"]),
    ({"credit_buffer": "10KB"}, "network.credit_buffer", ['flow_control = "credit"']),
    ({"flow_control": "pfc", "credit_buffer": "10KB"}, "network.credit_buffer", ['flow_control = "credit"']),
    ({"flow_control": "credit", "credit_buffer": "0B"}, "network.credit_buffer", ["1 B to 4 GiB"]),
    ({"flow_control": "credit", "credit_buffer": "5GiB"}, "network.credit_buffer", ["1 B to 4 GiB"]),
    ({"pfc_xoff": "10KB"}, "network.pfc_xoff", ['flow_control = "pfc"']),
    ({"flow_control": "drop_tail", "pfc_xon": "10KB"}, "network.pfc_xon", ['flow_control = "pfc"']),
    ({"flow_control": "pfc", "pfc_xon": "100KiB"}, "network.pfc_xon", ["at most pfc_xoff (65536 B)"]),
    ({"flow_control": "pfc", "pfc_xoff": "0B", "pfc_xon": "0B"}, "network.pfc_xoff", ["positive"]),
    ({"flow_control": "pfc", "pfc_xoff": 65536}, "network.pfc_xoff", ["needs a unit"]),
])
def test_bad_flow_control_names_the_field_and_allowed_values(star, network, field, words):
    star["network"] = network
    e = error(star)
    assert e.field == field and all(w in e.message for w in words), (e.field, e.message)


def test_a_lossless_incast_loses_nothing_and_reports_pauses():
    import inalab

    flows = [{"src": f"h{i}", "dst": "h0", "size": "300KB"} for i in range(1, 9)]
    s = {"topology": {"kind": "star", "hosts": 9}, "flows": flows, "network": {"buffer": "64KiB"}}
    dt = inalab.simulate(s)
    assert dt.links.drops_queue.sum() > 0 and "pfc_pauses" not in dt.links
    s["network"] = {"flow_control": "pfc"}
    r = inalab.simulate(s)
    links = r.links
    assert links.drops_queue.sum() == 0 and (r.flows.bytes_received == 300_000).all()
    senders = links[(links.dst == "s0") & (links.src != "h0")]
    assert (senders.pfc_pauses > 0).all() and (senders.pfc_paused_s > 0).all()
    assert senders.pfc_max_ingress_bytes.max() <= 65536 + 2 * 12_500 + 3 * 1500
    assert r.switches.counters[0]["pfc_pauses_sent"] == senders.pfc_pauses.sum()
    # Credits: the same incast, nothing dropped, no switch holding more than its buffer per link.
    s["network"] = {"flow_control": "credit", "credit_buffer": "14KB"}
    r = inalab.simulate(s)
    senders = r.links[(r.links.dst == "s0") & (r.links.src != "h0")]
    assert r.links.drops_queue.sum() == 0 and (r.flows.bytes_received == 300_000).all()
    assert (senders.pfc_pauses > 0).all() and senders.pfc_max_ingress_bytes.max() <= 14_000
    assert (senders.pfc_pauses_sent == 0).all(), "credits send no PAUSE"


def test_host_costs_reach_the_simulator_and_slow_a_cpu_bound_job(star):
    # #37 item 1: hosts cost nothing by default; a worker CPU of 1 us per packet makes a ring
    # job host-bound, and the host's time on packets is its cpu_busy_ns counter.
    free = inalab.simulate(star)
    star["network"] = {"host_costs": [{"hosts": "workers", "per_packet": "1us", "copy_rate": "100Gbps"}]}
    spec = load_scenario(star).to_spec()
    assert spec["network"]["host_costs"] == [{"hosts": "workers", "per_packet_ps": 10**6, "copy_bps": 1e11}]
    slow = inalab.simulate(star)
    assert slow.jobs.jct_s[0] > 2 * free.jobs.jct_s[0]
    hosts = slow.hosts.set_index("name")
    assert hosts.loc["h0", "counters"]["cpu_busy_ns"] > 0 and "cpu_busy_ns" not in hosts.loc["h5", "counters"]
    star["network"] = {"host_costs": [{"hosts": "h42"}]}
    e = error(star)
    assert e.field == "network.host_costs[0].hosts" and "h0..h7" in e.message


def _two_jobs(servers0, servers1, workers1=("h3", "h4", "h5"), scheme="atp"):
    def job(name, workers, servers):
        return {"name": name, "scheme": scheme, "allreduce": "64KiB", "iterations": 2, "workers": list(workers),
                "servers": list(servers)}
    return {"payload": True, "stop": "1s", "topology": {"kind": "star", "hosts": 8},
            "jobs": [job("a", ("h0", "h1", "h2"), servers0), job("b", workers1, servers1)]}


def test_jobs_may_share_a_server_host_one_ps_serving_them():
    # Issue #37 (ATP Fig. 13's "identical placement"): two jobs that name the same server host
    # share one PS and its link; both sum exactly.
    r = inalab.simulate(_two_jobs(["h7"], ["h7"]))
    assert r.jobs.finished.all() and r.jobs.payload_checked.all() and (r.jobs.payload_errors == 0).all()
    alone = inalab.simulate(_two_jobs(["h6"], ["h7"]))
    rx = lambda res, h: int(res.hosts.set_index("name").loc[h, "rx_bytes"])  # noqa: E731
    assert rx(r, "h7") == rx(alone, "h6") + rx(alone, "h7") > 0  # one NIC carries both jobs' PS traffic


@pytest.mark.parametrize("servers0, servers1, workers1, field", [
    (["h7"], ["h7"], ("h3", "h4", "h7"), "jobs[1].workers"),   # the shared PS host as another job's worker
    (["h7"], ["h2"], ("h3", "h4", "h5"), "jobs[1].servers"),   # another job's worker host as a server
    (["h7", "h7"], ["h6"], ("h3", "h4", "h5"), "jobs[0].servers"),  # one job naming a server twice
    (["h6"], ["h7"], ("h2", "h4", "h5"), "jobs[1].workers"),   # a worker host reused
])
def test_any_other_reuse_of_a_host_is_refused(servers0, servers1, workers1, field):
    with pytest.raises(inalab.ConfigError) as e:
        inalab.simulate(_two_jobs(servers0, servers1, workers1))
    assert e.value.field == field and ("already used by" in str(e.value) or "listed twice" in str(e.value))


def test_a_permutation_background_loads_every_receiver_alike():
    """`background.pattern = "permutation"` (issue #40, Canary §5.2): every host's r-th
    message follows one derangement per round, so over a run each receiver's downlink carries
    exactly what each sender sends; "uniform" (a fresh peer per message) loads them unevenly."""
    hosts = [f"h{i}" for i in range(2, 10)]
    base = {"name": "bg", "topology": {"kind": "star", "hosts": 10, "link_rate": "10Gbps"},
            "flows": [{"src": "h0", "dst": "h1", "size": "4MiB"}],
            "background": {"hosts": hosts, "load": 1.0, "message": "64KiB"}}

    def downlinks(pattern):
        r = inalab.simulate({**base, "background": {**base["background"], "pattern": pattern}})
        l = r.links
        return l[(l.src == "s0") & l.dst.isin(hosts)].tx_bytes.tolist()

    perm, uniform = downlinks("permutation"), downlinks("uniform")
    assert len(set(perm)) == 1 and perm[0] > 1_000_000, perm
    assert max(uniform) > 1.2 * min(uniform), uniform
    assert sum(uniform) == pytest.approx(sum(perm), rel=0.05), "the same offered load either way"
    with pytest.raises(ConfigError, match="background.pattern.*'uniform' or 'permutation'"):
        inalab.simulate({**base, "background": {**base["background"], "pattern": "perm"}})


def test_a_closed_loop_background_never_has_more_than_one_message_outstanding():
    """`background.closed_loop` (issue #40 item 3): on a lossless fabric a sender whose receiver
    is shared is slowed; open loop it keeps starting messages on its clock and builds a
    backlog, closed loop it starts the next only when the last has left its NIC."""
    hosts = [f"h{i}" for i in range(2, 10)]
    base = {"name": "bg", "topology": {"kind": "star", "hosts": 10, "link_rate": "10Gbps"},
            "network": {"flow_control": "credit"},
            "flows": [{"src": "h0", "dst": "h1", "size": "4MiB"}],
            "background": {"hosts": hosts, "load": 1.0, "message": "64KiB"}}

    def backlog(closed):
        r = inalab.simulate({**base, "background": {**base["background"], "closed_loop": closed}})
        h = r.hosts[r.hosts.name.isin(hosts)]
        return [c["max_backlog_bytes"] for c in h.counters], int(h.rx_bytes.sum())

    (open_, open_rx), (closed, closed_rx) = backlog(False), backlog(True)
    assert max(open_) > 3 * 65536, open_
    assert closed == [65536] * len(hosts), closed
    assert 0.5 * open_rx < closed_rx <= open_rx * 1.01, "the same links, no more delivered"
