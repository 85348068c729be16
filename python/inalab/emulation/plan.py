"""The static deployment of an emulation: node ids, data-plane addresses, each switch's ports and
routes, and each job's spec, all derived from the scenario's built topology (the simulator's
view), so that no process needs a rendezvous.

- Node ids: the simulator's (a node's index in the built topology: hosts first, then
  switches), so that everything a program or a protocol computes from node ids is the same in
  both drivers (Canary's up port toward a leader is picked by the leader's address, its
  descriptor hash is salted by the switch's id; flow hashes). A PS on node 0 cannot have that id
  (the runtime's are 1..65535): then switch ``k`` is ``k + 1`` and host ``i`` ``HOST_BASE + i``,
  and flows are still pinned (below).
- Routes: toward every host in use and every other switch, each switch's next hops are the
  neighbours on a shortest path (all of them: ECMP, one picked per flow by hash; programs that
  route by themselves, Canary's, read them as `SwitchCtx::next_hops`, and a Canary Restore is
  addressed to a switch). Each port carries its link's rate, from which the switch estimates
  the port's egress queue where `tc` shapes the link (`SwitchCtx::queue_bytes`). Besides, every flow between two hosts
  of a job is pinned to the path the simulator's ECMP gives it (``_core.ecmp_paths``: same
  hash, same ports), so that emulated and simulated flows cross the same links; the node ids
  differ between the two, so hashing alone would not.
- A job's spec names its workers (node, UDP address, ToR switch), servers, the programmable
  switches (with the scenario's aggregator memory), a fresh frame key, and the network (every
  switch's and used host's name and node id, the links between them): what a scheme whose
  configuration names nodes resolves (a routing policy's paths, which each switch then pins by
  source, destination and ingress port, taking precedence over the pinned ECMP flows) and what
  a multicast tree is laid over (the runtime's replication of packets to ``GROUP``).
"""
from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field

HOST_BASE = 100
SWITCH_PORT, WORKER_PORT, PS_PORT, PS_CONTROL = 9000, 9500, 9200, 9300


@dataclass
class Deployment:
    switches: list[str]
    node_id: dict[str, int]
    udp: dict[tuple[str, str], str]          # (node, peer) -> node's data-plane address as peer reaches it
                                              # (a worker's where a PS shares its host)
    tor: dict[str, str]                       # host -> its switch
    programmable: dict[str, bool]
    fabrics: dict[str, dict] = field(default_factory=dict)   # switch -> its SwitchFabric JSON
    ps_udp: dict[str, str] = field(default_factory=dict)      # PS host -> the PS's data-plane address
    specs: list[dict] = field(default_factory=list)           # job specs, in the scenario's order


def _neighbours(built: dict) -> dict[str, list[str]]:
    names = [n["name"] for n in built["nodes"]]
    adj: dict[str, list[str]] = {n: [] for n in names}
    for l in built["links"]:
        a, b = names[l["a"]], names[l["b"]]
        adj[a].append(b)
        adj[b].append(a)
    return adj


def _distances(adj: dict[str, list[str]], src: str, kind: dict[str, str]) -> dict[str, int]:
    """Hops from ``src`` to every node, paths through switches only (hosts do not forward)."""
    dist, todo = {src: 0}, deque([src])
    while todo:
        n = todo.popleft()
        if n != src and kind[n] == "host":
            continue
        for m in adj[n]:
            if m not in dist:
                dist[m] = dist[n] + 1
                todo.append(m)
    return dist


def _pinned(spec: dict) -> dict[str, list[dict]]:
    """Per switch, the pinned routes of every flow between two hosts of a job, as the
    simulator's ECMP routes it: ``{"src": host, "dst": host, "via": next node}`` by name."""
    from .. import _core

    flows = []
    for j in spec["jobs"]:
        members = [(h, False) for h in j["workers"]] + [(h, True) for h in j["servers"]]
        flows += [{"job": j["id"], "src": a, "src_server": sa, "dst": b, "dst_server": sb}
                  for a, sa in members for b, sb in members if a != b]
    rule = spec["network"].get("default_port", "flow_hash")
    paths = json.loads(_core.ecmp_paths(json.dumps(spec["topology"]), json.dumps(flows), rule))
    out: dict[str, list[dict]] = {}
    for f, path in zip(flows, paths):
        for here, nxt in zip((path or [])[1:-1], (path or [])[2:]):
            out.setdefault(here, []).append({"src": f["src"], "dst": f["dst"], "via": nxt})
    return out


def deploy(spec: dict, built: dict, used: list[str], address) -> Deployment:
    """``address(node, peer, port)``: ``node``'s address as ``peer`` reaches it on their link
    (an IP of the link in namespaces, 127.0.0.1 with a port of its own on loopback)."""
    kind = {n["name"]: n["kind"] for n in built["nodes"]}
    programmable = {n["name"]: n["programmable"] for n in built["nodes"]}
    switches = [n["name"] for n in built["nodes"] if n["kind"] == "switch"]
    hosts = [n["name"] for n in built["nodes"] if n["kind"] == "host"]
    adj = _neighbours(built)
    servers = {h for j in spec["jobs"] for h in j["servers"]}
    node_id = {n["name"]: i for i, n in enumerate(built["nodes"])}
    if any(node_id[h] == 0 for h in servers) or max(node_id.values()) > 0xFFFF:
        node_id = {s: k + 1 for k, s in enumerate(switches)} | {h: HOST_BASE + i for i, h in enumerate(hosts)}
    tor = {h: adj[h][0] for h in used}
    dep = Deployment(switches=switches, node_id=node_id, udp={}, tor=tor, programmable={s: programmable[s] for s in switches})
    for s in switches:
        for peer in adj[s]:
            if kind[peer] == "switch" or peer in used:
                dep.udp[s, peer] = address(s, peer, SWITCH_PORT)
    # A co-located PS (on one of its job's worker hosts) shares the host's address and link with
    # the worker, on a port of its own.
    hosting = {h for j in spec["jobs"] for h in j["workers"]}
    for h in used:
        dep.udp[h, tor[h]] = address(h, tor[h], WORKER_PORT if h in hosting else PS_PORT)
        if h in servers:
            dep.ps_udp[h] = address(h, tor[h], PS_PORT)

    in_use = set(used) | set(switches)
    network = {"names": {n: node_id[n] for n in switches + used},
               "links": [[node_id[built["nodes"][l["a"]]["name"]], node_id[built["nodes"][l["b"]]["name"]]] for l in built["links"]
                         if {built["nodes"][l["a"]]["name"], built["nodes"][l["b"]]["name"]} <= in_use]}
    memory = {s: spec["network"]["aggregator_memory_bytes"] for s in switches}
    for m in spec["network"]["switch_memory"]:
        memory[m["switch"]] = m["value"]
    capacity = {c["switch"]: c["value"] for c in spec["network"]["switch_capacity"]}
    for j in spec["jobs"]:
        config = {k: v for k, v in j.items() if k in ("scheme", "ina", "transport", "partition_bytes", "policy")}
        dep.specs.append({
            "job": j["id"] + 1,
            "config": config,
            "workers": [{"node": node_id[h], "udp": dep.udp[h, tor[h]], "rack": node_id[tor[h]]} for h in j["workers"]],
            "servers": [{"node": node_id[h], "rack": node_id[tor[h]]} for h in j["servers"]],
            "switches": [{"node": node_id[s], "memory_bytes": memory[s]} for s in switches if programmable[s]],
            "key": os.urandom(32).hex(),
            "network": network,
        })

    dist = {n: _distances(adj, n, kind) for n in used + switches}
    rule = spec["network"].get("default_port", "flow_hash")
    pinned = _pinned(spec)
    rate = {}
    for l in built["links"]:
        a, b = built["nodes"][l["a"]]["name"], built["nodes"][l["b"]]["name"]
        rate[a, b] = rate[b, a] = l["rate_bps"]
    for s in switches:
        ports = []
        for peer in adj[s]:
            if kind[peer] == "switch":
                ports.append({"node": node_id[peer], "kind": "switch", "udp": dep.udp[peer, s], "rate_bps": rate[s, peer]})
            elif peer in used:
                ports.append({"node": node_id[peer], "kind": "worker" if peer in hosting else "ps", "udp": dep.udp[peer, s],
                              "rate_bps": rate[s, peer]})
                if peer in servers and peer in hosting:
                    ports[-1]["ps_udp"] = dep.ps_udp[peer]
        routes = []
        for n in used + [t for t in switches if t != s]:
            if n in adj[s] or s not in dist[n]:
                continue
            via = [p for p in adj[s] if kind[p] == "switch" and dist[n].get(p) == dist[n][s] - 1]
            routes.append({"dst": node_id[n], "via": [node_id[p] for p in via]})
        routes += [{"src": node_id[r["src"]], "dst": node_id[r["dst"]], "via": [node_id[r["via"]]]} for r in pinned.get(s, [])]
        dep.fabrics[s] = {"ports": ports, "routes": routes, "jobs": dep.specs, "default_port": rule}
        if s in capacity:
            # Charged by the switch to what it aggregates, with the network's queue limits.
            dep.fabrics[s]["processing"] = {"rate_bps": capacity[s], "buffer_bytes": spec["network"]["buffer_bytes"],
                                            "ecn_threshold_bytes": spec["network"]["ecn_threshold_bytes"]}
    return dep
