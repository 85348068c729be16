"""ns-3 counterparts of inalab scenarios, for `tools/ns3/crosscheck.py` and
`benchmarks/sim_speed.py`. Needs the `ns3` pip package (ns-3.44 with cppyy bindings):

    .venv/bin/pip install ns3        # never in requirements.txt: not for CI

The scenario is built and run by a small C++ driver compiled at import time by cppyy (only
the glue is JIT-compiled; the simulator, models and event loop are ns-3's own compiled
libraries). Modelling, chosen to match inalab's queue model as closely as ns-3 allows:

* Every node is an ns-3 `Node` with the internet stack; a "switch" is an IPv4 router
  (forwarding in zero time, routes from `Ipv4GlobalRoutingHelper`, one /30 subnet per link).
* Every link is a `PointToPointChannel` (full duplex, rate and propagation delay as in
  inalab). The p2p device is store-and-forward: a packet is delivered to the peer
  `tx_time + delay` after its transmission starts, exactly like inalab's port.
* Time resolution is set to picoseconds (ns-3 defaults to ns, which would round the
  24.48 ns serialization time of a 306-byte packet at 100 Gbps to 24 ns).
* The traffic-control layer's root queue disc (pfifo_fast, 1000 packets, installed by
  `Ipv4AddressHelper::Assign`) is removed from every device with
  `TrafficControlHelper::Uninstall`, and device flow control is off
  (`PointToPointHelper::DisableFlowControl`), so the device's own `DropTailQueue<Packet>` is
  the only queue and it alone decides drops (with flow control on and no queue disc, ns-3
  instead stops the device queue as soon as it could not take one more MTU-sized packet and
  the traffic-control layer drops packets while it is stopped: a buffer 1 MTU smaller, and an
  extra wake-up event per dequeued packet). The DropTailQueue admits a packet iff
  `queued bytes + size <= MaxSize`; the packet being serialized is not in the queue. On switch devices its `MaxSize` is the inalab buffer in bytes ("<n>B"); on host
  devices it is 100000 packets (inalab host NICs never drop; the senders pace at line rate so
  host queues stay empty anyway).
* A flow is a `UdpClient` sending `n` packets of `payload` bytes every `interval` (the wire
  time of one packet, so the sender is exactly at line rate) to a `PacketSink` (a listening
  socket, so the sink sends no ICMP port-unreachable back). Wire size = payload + 8 (UDP)
  + 20 (IPv4) + 2 (PPP) bytes; callers pick the payload so the wire size equals inalab's
  `packet_bytes`.
* Received packets are counted on the sink hosts' devices (`MacRx`, at the end of
  reception, i.e. the same instant inalab delivers); drops are the switch device queues'
  `GetTotalDroppedPackets`; transmissions are counted with `PhyTxBegin` on every device.

CLI: `python tools/ns3/ns3_scenarios.py speed_a` prints one JSON line (used by the benchmark).
"""

from __future__ import annotations

import json
import sys

_CPP = r"""
#include "ns3/core-module.h"
#include "ns3/network-module.h"
#include "ns3/internet-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/applications-module.h"
#include "ns3/traffic-control-module.h"
#include <chrono>
#include <vector>
#include <string>
#include <sstream>

namespace inalab_ns3 {
using namespace ns3;

struct LinkDef { int a; int b; uint64_t rate; uint64_t delayPs; };
struct FlowDef { int src; int dst; uint32_t npkts; uint32_t payload; uint64_t intervalPs; uint64_t startPs; };

static std::vector<bool> g_isSwitch;
static std::vector<LinkDef> g_links;
static std::vector<FlowDef> g_flows;
static uint64_t g_rxPackets = 0, g_rxBytes = 0, g_txPackets = 0;
static int64_t g_firstRx = -1, g_lastRx = -1;
static std::vector<uint64_t> g_rxBySink;

void Reset() { g_isSwitch.clear(); g_links.clear(); g_flows.clear(); }
int AddNode(bool isSwitch) { g_isSwitch.push_back(isSwitch); return (int)g_isSwitch.size() - 1; }
void AddLink(int a, int b, uint64_t rate, uint64_t delayPs) { g_links.push_back({a, b, rate, delayPs}); }
void AddFlow(int src, int dst, uint32_t npkts, uint32_t payload, uint64_t intervalPs, uint64_t startPs) {
  g_flows.push_back({src, dst, npkts, payload, intervalPs, startPs});
}

static void OnRx(Ptr<const Packet> p) {
  int64_t now = Simulator::Now().GetPicoSeconds();
  if (g_firstRx < 0) g_firstRx = now;
  g_lastRx = now;
  g_rxPackets++;
  g_rxBytes += p->GetSize();
}
static void OnTx(Ptr<const Packet>) { g_txPackets++; }
static std::vector<uint64_t> g_rxByFlow;
static void OnSinkRx(size_t flow, Ptr<const Packet>, const Address &) { g_rxByFlow[flow]++; }
static uint64_t g_tcDrops = 0, g_uninstalled = 0;
static void OnTcDrop(Ptr<const Packet>) { g_tcDrops++; }

static bool g_resSet = false;
void UsePicoseconds() {
  if (!g_resSet) { Time::SetResolution(Time::PS); g_resSet = true; }
}

// Returns a JSON object as a string.
std::string Run(uint64_t bufferBytes, uint64_t stopPs) {
  g_rxPackets = g_rxBytes = g_txPackets = g_tcDrops = g_uninstalled = 0; g_firstRx = g_lastRx = -1;
  int n = (int)g_isSwitch.size();
  NodeContainer nodes; nodes.Create(n);
  InternetStackHelper stack; stack.Install(nodes);
  for (int i = 0; i < n; i++)
    nodes.Get(i)->GetObject<TrafficControlLayer>()->TraceConnectWithoutContext("Drop", MakeCallback(&OnTcDrop));
  Ipv4AddressHelper addr; addr.SetBase("10.0.0.0", "255.255.255.252");
  std::vector<Ptr<PointToPointNetDevice>> switchDevs;
  std::vector<std::vector<Ptr<NetDevice>>> devOf(n);
  std::vector<Ipv4Address> hostAddr(n);
  NetDeviceContainer all;
  TrafficControlHelper tch;
  for (auto &l : g_links) {
    PointToPointHelper p2p;
    p2p.SetDeviceAttribute("DataRate", DataRateValue(DataRate(l.rate)));
    p2p.SetChannelAttribute("Delay", TimeValue(PicoSeconds(l.delayPs)));
    p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", QueueSizeValue(QueueSize("100000p")));
    p2p.DisableFlowControl();
    NetDeviceContainer d = p2p.Install(nodes.Get(l.a), nodes.Get(l.b));
    Ipv4InterfaceContainer ifs = addr.Assign(d);
    addr.NewNetwork();
    for (int k = 0; k < 2; k++) {
      Ptr<TrafficControlLayer> tc = d.Get(k)->GetNode()->GetObject<TrafficControlLayer>();
      if (tc->GetRootQueueDiscOnDevice(d.Get(k))) { tch.Uninstall(d.Get(k)); g_uninstalled++; }
    }
    int ends[2] = {l.a, l.b};
    for (int k = 0; k < 2; k++) {
      Ptr<PointToPointNetDevice> dev = DynamicCast<PointToPointNetDevice>(d.Get(k));
      devOf[ends[k]].push_back(dev);
      if (!g_isSwitch[ends[k]]) hostAddr[ends[k]] = ifs.GetAddress(k);
      if (g_isSwitch[ends[k]]) {
        dev->GetQueue()->SetMaxSize(QueueSize(std::to_string(bufferBytes) + "B"));
        switchDevs.push_back(dev);
      }
      dev->TraceConnectWithoutContext("PhyTxBegin", MakeCallback(&OnTx));
      all.Add(dev);
    }
  }
  Ipv4GlobalRoutingHelper::PopulateRoutingTables();
  std::vector<bool> isSink(n, false);
  g_rxByFlow.assign(g_flows.size(), 0);
  for (size_t i = 0; i < g_flows.size(); i++) {
    auto &f = g_flows[i];
    uint16_t port = 9000 + (uint16_t)i;
    PacketSinkHelper sink("ns3::UdpSocketFactory", InetSocketAddress(Ipv4Address::GetAny(), port));
    ApplicationContainer sa = sink.Install(nodes.Get(f.dst));
    sa.Start(Seconds(0));
    sa.Get(0)->TraceConnectWithoutContext("Rx", MakeBoundCallback(&OnSinkRx, i));
    UdpClientHelper client(hostAddr[f.dst], port);
    client.SetAttribute("MaxPackets", UintegerValue(f.npkts));
    client.SetAttribute("Interval", TimeValue(PicoSeconds(f.intervalPs)));
    client.SetAttribute("PacketSize", UintegerValue(f.payload));
    ApplicationContainer ca = client.Install(nodes.Get(f.src));
    ca.Start(PicoSeconds(f.startPs));
    isSink[f.dst] = true;
  }
  for (int i = 0; i < n; i++)
    if (isSink[i])
      for (auto &d : devOf[i]) d->TraceConnectWithoutContext("MacRx", MakeCallback(&OnRx));
  Simulator::Stop(PicoSeconds(stopPs));
  uint64_t ev0 = Simulator::GetEventCount();
  auto t0 = std::chrono::steady_clock::now();
  Simulator::Run();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t events = Simulator::GetEventCount() - ev0;
  int64_t simNow = Simulator::Now().GetPicoSeconds();
  uint64_t swDrops = 0, swDropBytes = 0, swMaxBytes = 0;
  for (auto &d : switchDevs) {
    swDrops += d->GetQueue()->GetTotalDroppedPackets();
    swDropBytes += d->GetQueue()->GetTotalDroppedBytes();
  }
  uint64_t hostDrops = 0;
  for (int i = 0; i < n; i++)
    if (!g_isSwitch[i])
      for (auto &d : devOf[i]) hostDrops += DynamicCast<PointToPointNetDevice>(d)->GetQueue()->GetTotalDroppedPackets();
  std::ostringstream o;
  o << "{\"events\":" << events << ",\"wall_s\":" << wall << ",\"sim_end_ps\":" << simNow
    << ",\"rx_packets\":" << g_rxPackets << ",\"rx_bytes\":" << g_rxBytes
    << ",\"first_rx_ps\":" << g_firstRx << ",\"last_rx_ps\":" << g_lastRx
    << ",\"tx_packets\":" << g_txPackets << ",\"switch_drops\":" << swDrops
    << ",\"switch_drop_bytes\":" << swDropBytes << ",\"host_queue_drops\":" << hostDrops << ",\"tc_drops\":" << g_tcDrops << ",\"qdiscs_removed\":" << g_uninstalled << ",\"per_flow_rx\":[";
  for (size_t i = 0; i < g_rxByFlow.size(); i++) o << (i ? "," : "") << g_rxByFlow[i];
  o << "]}";
  Simulator::Destroy();
  return o.str();
}
}  // namespace inalab_ns3
"""

# Bytes ns-3 adds to a UDP payload on a point-to-point wire: UDP 8 + IPv4 20 + PPP 2.
NS3_OVERHEAD = 8 + 20 + 2

_lib = None


def lib():
    """Loads ns-3 and compiles the driver once per process."""
    global _lib
    if _lib is None:
        from ns import ns  # noqa: F401  (loads the ns-3 libraries and headers)
        import cppyy

        cppyy.cppdef(_CPP)
        _lib = cppyy.gbl.inalab_ns3
        _lib.UsePicoseconds()
    return _lib


def version():
    try:
        from importlib.metadata import version as v

        return "ns-3 " + v("ns3")
    except Exception:
        return "ns-3"


def run(nodes, links, flows, buffer_bytes, stop_ps):
    """Runs one scenario; each process can run several (Simulator::Destroy between runs).

    nodes: list of "host"/"switch"; links: (a, b, rate_bps, delay_ps) with node indices;
    flows: (src, dst, packets, wire_bytes, start_ps) -- sent at the src link's line rate.
    """
    L = lib()
    L.Reset()
    for k in nodes:
        L.AddNode(k == "switch")
    rate_of = {}
    for a, b, rate, delay in links:
        L.AddLink(a, b, rate, delay)
        rate_of.setdefault(a, rate)
        rate_of.setdefault(b, rate)
    for src, dst, npkts, wire, start in flows:
        payload = wire - NS3_OVERHEAD
        interval_ps = wire * 8 * 10**12 // rate_of[src]
        assert wire * 8 * 10**12 % rate_of[src] == 0, "line-rate interval must be a whole number of ps"
        L.AddFlow(src, dst, npkts, payload, interval_ps, start)
    out = json.loads(str(L.Run(buffer_bytes, stop_ps)))
    out["version"] = version()
    return out


def speed_a():
    """Benchmark scenario (a): 64 senders -> h0 through one switch, 306 B at 100 Gbps, 1 ms."""
    G, US = 100_000_000_000, 1_000_000
    n = 64
    nodes = ["host"] * (n + 1) + ["switch"]
    sw = n + 1
    links = [(h, sw, G, US) for h in range(n + 1)]
    pkts = -(-(G // 1000 // 8) // 306)  # 12.5 MB / 306 B, rounded up: 40850
    flows = [(h, 0, pkts, 306, 0) for h in range(1, n + 1)]
    r = run(nodes, links, flows, buffer_bytes=1 << 20, stop_ps=1000 * US)
    return {
        "events": r["events"],
        "tx": r["tx_packets"],
        "sim_s": r["sim_end_ps"] / 1e12,
        "wall_s": r["wall_s"],
        "version": r["version"],
        "note": f"delivered {r['rx_packets']:,} pkts, switch drops {r['switch_drops']:,}, host-queue drops {r['host_queue_drops']:,}, tc drops {r['tc_drops']}",
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["speed_a"]:
        print(json.dumps(speed_a()))
    else:
        sys.exit("usage: ns3_scenarios.py speed_a")
