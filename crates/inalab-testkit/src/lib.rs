//! The deterministic test fabric that every protocol crate's tests run on.
//!
//! A [`Fabric`] is a small network of hosts and switches that drives protocol state machines
//! exactly through the sans-IO contract of `inalab_core`, nothing more: host endpoints
//! ([`HostProtocol`]) get `submit`, `handle_packet` and `handle_timeout`, and the fabric
//! drains `poll_transmit`, `poll_timeout` and `poll_event`; switches run a [`SwitchProgram`]
//! (`on_packet`, `on_timer`) and the fabric carries out its [`SwitchAction`]s. Everything is
//! a function of the set-up, the requests and [`Fabric::seed`]: a test that passes once
//! passes every time.
//!
//! # Topology and numbering
//! - [`Fabric::star`]`(hosts, link)`: hosts `0..hosts` on one switch, node `hosts`; switch
//!   port `h` faces host `h`.
//! - [`Fabric::leaf_spine`]`(leaves, spines, hosts_per_leaf, link)`: hosts first (host `h`
//!   hangs off leaf `h / hosts_per_leaf`), then the leaves, then the spines. A leaf's ports
//!   `0..hosts_per_leaf` face its hosts in order, port `hosts_per_leaf + s` faces spine `s`;
//!   spine port `l` faces leaf `l`.
//!
//! Every switch runs [`L3Forward`] until [`Fabric::install`] gives it another program (for
//! example an `inalab_core::Programs`); [`Fabric::program`] and [`Fabric::program_mut`] get
//! it back by type. [`Fabric::add`] puts a host endpoint on the host its `endpoint()` names
//! (a host may have several, on different ports).
//! `SwitchAction::Route` takes the shortest path by node: a host's own switch delivers on
//! the host's port, a leaf sends traffic for another leaf to spine `pkt.flow % spines` (one
//! path per flow), a spine to the destination's leaf. A packet routed to anything but a host
//! is dropped as "no route".
//!
//! # Timing
//! All links have the same [`Link`]: a one-way `delay` and a `rate_bps` (integer
//! picoseconds, `inalab_core::Time`).
//! - A host has one NIC. While it is free the fabric polls the host's endpoints round robin
//!   for one packet; a packet of `size` bytes keeps the NIC busy for its serialization, and
//!   arrives at the far end `delay` after its last bit left.
//! - Switch egress ports are FIFO queues at the same rate, and switches are cut-through: on
//!   an idle port a packet leaves as its last bit arrives (a switch adds no delay), on a busy
//!   one it waits for the packets ahead. Unloaded, host to host across one switch takes one
//!   serialization plus `2 × delay`. `SwitchCtx::queue_bytes` reports that backlog.
//! - Hosts receive without queueing. A packet for the sender's own host (co-located
//!   endpoints) skips the NIC and the links and arrives at the same instant.
//! - [`Link::INSTANT`] (zero delay, infinitely fast) runs everything at one instant: time
//!   moves only when a timer fires.
//!
//! # Filters
//! Filters act on packets as they are put on a link, in the order they were added, on the
//! [`Links`] they watch: `FromHosts` sees each packet a host sends once, `ToHosts` each
//! packet a host receives once, `All` every link a packet crosses.
//! - [`Fabric::lose`]: the packets a [`Rule`] picks vanish (counted as dropped, "loss"; later
//!   filters do not see them);
//! - [`Fabric::mark`]: they arrive with `ecn` set;
//! - [`Fabric::reorder`]: they arrive a given time later, behind packets sent after them;
//! - [`Fabric::tap`]: a closure sees (and may edit) every packet, to count or assert.
//!
//! Filters see only packets put on links after they were added, and `submit` puts packets
//! on links at once: add filters before the requests they are meant for.
//!
//! A [`Rule`] picks packets with a probability ([`Rule::chance`], drawn from a stream
//! seeded by the fabric's seed and the filter's position), by index ([`Rule::nth`]) or by a
//! closure ([`Rule::when`]), optionally among the packets a predicate accepts
//! ([`Rule::only`]). Each `lose`/`mark`/`reorder`/`tap` returns a [`Filter`] whose
//! [`Fabric::hits`] says how many packets it acted on.
//!
//! # Running and results
//! [`Fabric::submit`] hands a request to an endpoint at the current time; [`Fabric::run`]
//! processes events until the fabric is quiet (no packet in flight, no timer armed; it
//! returns `true`) or the next event is after the time limit (`false`; calling `run` again
//! goes on from there). Events of each
//! endpoint are collected per (host, port): [`Fabric::events`], [`Fabric::timed_events`].
//! Protocol and program counters: [`Fabric::counter`], [`Fabric::total`],
//! [`Fabric::switch_counter`]. [`Fabric::stats`] counts packets and bytes sent by endpoints,
//! delivered to endpoints, dropped (by reason) and taken in and put out by switch programs;
//! [`Fabric::check_conservation`] checks that
//! `sent = delivered + dropped + consumed by programs + in flight`.
//!
//! # Example
//! ```ignore
//! use inalab_testkit::{Fabric, Link, Links, Rule};
//! let mut f = Fabric::star(2, Link { delay: US / 2, rate_bps: 100_000_000_000 });
//! let (a, b) = (f.add(Box::new(sender_on_host_0)), f.add(Box::new(receiver_on_host_1)));
//! f.seed(7);
//! let loss = f.lose(Links::FromHosts, Rule::chance(0.01).only(is_data));
//! f.submit(a, AppRequest::Send { id: 1, dst: b, bytes: 100_000 });
//! assert!(f.run(S), "went quiet");
//! assert!(matches!(f.events(b)[..], [HostEvent::Received { id: 1, .. }]));
//! assert!(f.hits(loss) > 0);
//! f.check_conservation().unwrap();
//! ```
//! Runnable examples: this crate's `tests/fabric.rs`, and the tests of `inalab-host` and
//! `inalab-switch`.

use inalab_core::time::{serialization, Time, S, US};
use inalab_core::{
    splitmix64, Addressed, AppRequest, Endpoint, HostEvent, HostProtocol, L3Forward, NodeId, Packet, PortId, SwitchAction,
    SwitchCtx, SwitchProgram, TimerToken,
};
use std::any::{type_name, Any};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// Events one instant may hold before the fabric calls it a livelock.
const LIVELOCK: u64 = 50_000_000;

/// The parameters every link of a fabric shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// One-way propagation delay.
    pub delay: Time,
    /// Line rate in bits per second of host NICs and switch egress ports; 0 = infinitely
    /// fast (packets take no time to serialize).
    pub rate_bps: u64,
}

impl Link {
    /// Zero delay and no serialization: a protocol's packets all arrive at once.
    pub const INSTANT: Link = Link { delay: 0, rate_bps: 0 };

    fn serialization(&self, bytes: u32) -> Time {
        match self.rate_bps {
            0 => 0,
            rate => serialization(bytes as u64, rate),
        }
    }
}

impl Default for Link {
    /// 100 Gb/s, 1 us.
    fn default() -> Self {
        Link { delay: US, rate_bps: 100_000_000_000 }
    }
}

/// The links a filter watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Every link in both directions: a packet crossing k links is seen k times.
    All,
    /// Host NICs: each packet a host sends to another host, once, as it leaves.
    FromHosts,
    /// Links into hosts: each packet a host receives, once, as it leaves the last switch.
    ToHosts,
}

impl Links {
    fn covers(self, hop: Hop, hosts: NodeId) -> bool {
        match self {
            Links::All => true,
            Links::FromHosts => hop.from < hosts,
            Links::ToHosts => hop.to < hosts,
        }
    }
}

/// One direction of a link: a packet going from node `from` to node `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hop {
    pub from: NodeId,
    pub to: NodeId,
}

type Predicate = Box<dyn Fn(&Packet) -> bool>;
type TapFn = Box<dyn FnMut(Hop, &mut Packet)>;

/// Which packets a filter acts on.
pub struct Rule {
    only: Option<Predicate>,
    pick: Pick,
}

enum Pick {
    Chance(f64),
    Nth { which: BTreeSet<u64>, seen: u64 },
    When(Box<dyn FnMut(&Packet) -> bool>),
}

impl Rule {
    /// Each packet with probability `p`, from the filter's seeded stream (see
    /// [`Fabric::seed`]); `p = 0` draws nothing.
    pub fn chance(p: f64) -> Rule {
        assert!((0.0..=1.0).contains(&p), "a probability, not {p}");
        Rule { only: None, pick: Pick::Chance(p) }
    }

    /// The packets whose 0-based index among those the rule sees is in `which`.
    pub fn nth(which: impl IntoIterator<Item = u64>) -> Rule {
        Rule { only: None, pick: Pick::Nth { which: which.into_iter().collect(), seen: 0 } }
    }

    /// The packets `f` picks; `f` is called once for every packet the rule sees, in order.
    pub fn when(f: impl FnMut(&Packet) -> bool + 'static) -> Rule {
        Rule { only: None, pick: Pick::When(Box::new(f)) }
    }

    /// Only among the packets `pred` accepts: the others pass untouched, are not counted by
    /// [`Rule::nth`], draw no random number and are not shown to a [`Rule::when`] closure.
    pub fn only(self, pred: impl Fn(&Packet) -> bool + 'static) -> Rule {
        let only: Predicate = match self.only {
            None => Box::new(pred),
            Some(first) => Box::new(move |p| first(p) && pred(p)),
        };
        Rule { only: Some(only), pick: self.pick }
    }

    fn picks(&mut self, pkt: &Packet, draw: impl FnOnce() -> u64) -> bool {
        if self.only.as_ref().is_some_and(|only| !only(pkt)) {
            return false;
        }
        match &mut self.pick {
            // 53 random bits against p: p = 1 picks every packet.
            Pick::Chance(p) => *p > 0.0 && ((draw() >> 11) as f64) < *p * (1u64 << 53) as f64,
            Pick::Nth { which, seen } => {
                *seen += 1;
                which.contains(&(*seen - 1))
            }
            Pick::When(f) => f(pkt),
        }
    }
}

/// A filter added to a fabric, for [`Fabric::hits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter(usize);

enum Effect {
    Lose(Rule),
    Mark(Rule),
    Hold(Rule, Time),
    Tap(TapFn),
}

struct FilterState {
    on: Links,
    effect: Effect,
    hits: u64,
    draws: u64,
}

/// Packets and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub packets: u64,
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, pkt: &Packet) {
        self.packets += 1;
        self.bytes += pkt.size as u64;
    }
}

/// What the fabric moved (see [`Fabric::check_conservation`]).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Handed out by endpoints (`poll_transmit`), to other hosts or to their own.
    pub sent: Count,
    /// Handed to endpoints (`handle_packet`).
    pub delivered: Count,
    /// Lost by a filter, dropped by a program, or with no route or no endpoint.
    pub dropped: Count,
    /// `dropped` packets by reason: "loss", "no route", "no endpoint", or the reason a
    /// program's `SwitchAction::Drop` gave.
    pub drops: BTreeMap<&'static str, u64>,
    /// Taken in by switch programs (`on_packet`).
    pub into_programs: Count,
    /// Put out by switch programs: forwarded, routed, each multicast copy, and dropped.
    pub out_of_programs: Count,
}

impl Stats {
    /// Packets and bytes switch programs consumed: taken in and not put out (negative when
    /// they put out more, as multicast does).
    pub fn consumed(&self) -> (i64, i64) {
        let (i, o) = (self.into_programs, self.out_of_programs);
        (i.packets as i64 - o.packets as i64, i.bytes as i64 - o.bytes as i64)
    }

    fn drop(&mut self, pkt: &Packet, reason: &'static str) {
        self.dropped.add(pkt);
        *self.drops.entry(reason).or_default() += 1;
    }
}

/// A switch program the fabric can hand back by type.
trait Installed: SwitchProgram {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<P: SwitchProgram + 'static> Installed for P {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

enum Shape {
    Star,
    LeafSpine { spines: u32, per_leaf: u32 },
}

struct Port {
    peer: NodeId,
    peer_port: PortId,
    /// When the last packet queued on this port has left.
    busy_until: Time,
}

enum Kind {
    Host { eps: Vec<usize>, next: usize, nic_busy: bool },
    Switch(Box<dyn Installed>),
}

struct Node {
    ports: Vec<Port>,
    kind: Kind,
}

struct Ep {
    local: Endpoint,
    proto: Box<dyn HostProtocol>,
    /// The armed timer's deadline and its key in the queue.
    timer: Option<(Time, (Time, u64))>,
}

enum Ev {
    NicFree(NodeId),
    Arrive { node: NodeId, port: PortId, pkt: Packet },
    Loopback(Packet),
    HostTimer(usize),
    SwitchTimer { switch: NodeId, token: TimerToken },
}

struct Ctx<'a> {
    node: NodeId,
    now: Time,
    rate_bps: u64,
    ports: &'a [Port],
}

impl SwitchCtx for Ctx<'_> {
    fn node(&self) -> NodeId {
        self.node
    }
    fn num_ports(&self) -> usize {
        self.ports.len()
    }
    fn queue_bytes(&self, port: PortId) -> u64 {
        let ahead = self.ports[port as usize].busy_until.saturating_sub(self.now);
        (ahead as u128 * self.rate_bps as u128).div_ceil(8 * S as u128) as u64
    }
    fn peer(&self, port: PortId) -> NodeId {
        self.ports[port as usize].peer
    }
}

/// A switch context for calling one program directly in a unit test: switch `node` with
/// `ports` idle ports, port p facing node p.
#[derive(Debug, Clone, Copy)]
pub struct IdleCtx {
    pub node: NodeId,
    pub ports: usize,
}

impl SwitchCtx for IdleCtx {
    fn node(&self) -> NodeId {
        self.node
    }
    fn num_ports(&self) -> usize {
        self.ports
    }
    fn queue_bytes(&self, _port: PortId) -> u64 {
        0
    }
    fn peer(&self, port: PortId) -> NodeId {
        port as NodeId
    }
}

/// Hosts and switches on a star or a leaf-spine; see the crate documentation.
pub struct Fabric {
    link: Link,
    shape: Shape,
    hosts: NodeId,
    nodes: Vec<Node>,
    eps: Vec<Ep>,
    by_ep: BTreeMap<Endpoint, usize>,
    queue: BTreeMap<(Time, u64), Ev>,
    seq: u64,
    now: Time,
    seed: u64,
    filters: Vec<FilterState>,
    events: BTreeMap<Endpoint, Vec<(Time, HostEvent)>>,
    stats: Stats,
    actions: Vec<SwitchAction>,
}

impl Fabric {
    /// Hosts `0..hosts` on one switch (node `hosts`, port `h` facing host `h`).
    pub fn star(hosts: usize, link: Link) -> Fabric {
        let mut f = Fabric::empty(hosts, 1, Shape::Star, link);
        for h in 0..f.hosts {
            f.connect(h, f.hosts);
        }
        f
    }

    /// `leaves` leaves of `hosts_per_leaf` hosts each, every leaf linked to every one of
    /// `spines` spines. Hosts are numbered first, then leaves, then spines.
    pub fn leaf_spine(leaves: usize, spines: usize, hosts_per_leaf: usize, link: Link) -> Fabric {
        assert!(leaves > 0 && spines > 0 && hosts_per_leaf > 0, "a leaf-spine needs leaves, spines and hosts");
        let shape = Shape::LeafSpine { spines: spines as u32, per_leaf: hosts_per_leaf as u32 };
        let mut f = Fabric::empty(leaves * hosts_per_leaf, leaves + spines, shape, link);
        for h in 0..f.hosts {
            f.connect(h, f.tor(h));
        }
        let first_spine = f.hosts + leaves as NodeId;
        for leaf in f.hosts..first_spine {
            for spine in first_spine..first_spine + spines as NodeId {
                f.connect(leaf, spine);
            }
        }
        f
    }

    fn empty(hosts: usize, switches: usize, shape: Shape, link: Link) -> Fabric {
        let host = || Node { ports: Vec::new(), kind: Kind::Host { eps: Vec::new(), next: 0, nic_busy: false } };
        let switch = || Node { ports: Vec::new(), kind: Kind::Switch(Box::new(L3Forward)) };
        Fabric {
            link,
            shape,
            hosts: hosts as NodeId,
            nodes: (0..hosts).map(|_| host()).chain((0..switches).map(|_| switch())).collect(),
            eps: Vec::new(),
            by_ep: BTreeMap::new(),
            queue: BTreeMap::new(),
            seq: 0,
            now: 0,
            seed: 0,
            filters: Vec::new(),
            events: BTreeMap::new(),
            stats: Stats::default(),
            actions: Vec::new(),
        }
    }

    fn connect(&mut self, a: NodeId, b: NodeId) {
        let (pa, pb) = (self.nodes[a as usize].ports.len() as PortId, self.nodes[b as usize].ports.len() as PortId);
        self.nodes[a as usize].ports.push(Port { peer: b, peer_port: pb, busy_until: 0 });
        self.nodes[b as usize].ports.push(Port { peer: a, peer_port: pa, busy_until: 0 });
    }

    /// Seeds the random filters: filter `k` draws from a stream keyed by (`seed`, `k`).
    /// The default seed is 0.
    pub fn seed(&mut self, seed: u64) -> &mut Self {
        self.seed = seed;
        self
    }

    /// The host nodes.
    pub fn hosts(&self) -> Range<NodeId> {
        0..self.hosts
    }

    /// The switch nodes (star: one; leaf-spine: the leaves, then the spines).
    pub fn switches(&self) -> Range<NodeId> {
        self.hosts..self.nodes.len() as NodeId
    }

    /// The switch a host hangs off.
    pub fn tor(&self, host: NodeId) -> NodeId {
        assert!(host < self.hosts, "node {host} is not a host");
        match self.shape {
            Shape::Star => self.hosts,
            Shape::LeafSpine { per_leaf, .. } => self.hosts + host / per_leaf,
        }
    }

    /// Installs `program` on `switch`, replacing what ran there (at first [`L3Forward`]).
    pub fn install<P: SwitchProgram + 'static>(&mut self, switch: NodeId, program: P) {
        self.assert_switch(switch);
        self.nodes[switch as usize].kind = Kind::Switch(Box::new(program));
    }

    /// The program on `switch`, which must be a `P`.
    pub fn program<P: SwitchProgram + 'static>(&self, switch: NodeId) -> &P {
        self.switch_program(switch).as_any().downcast_ref().unwrap_or_else(|| panic!("switch {switch} does not run a {}", type_name::<P>()))
    }

    /// The program on `switch`, which must be a `P`, to change (admit a job, ...).
    pub fn program_mut<P: SwitchProgram + 'static>(&mut self, switch: NodeId) -> &mut P {
        self.assert_switch(switch);
        let Kind::Switch(p) = &mut self.nodes[switch as usize].kind else { unreachable!() };
        p.as_any_mut().downcast_mut().unwrap_or_else(|| panic!("switch {switch} does not run a {}", type_name::<P>()))
    }

    fn assert_switch(&self, switch: NodeId) {
        assert!(self.switches().contains(&switch), "node {switch} is not a switch");
    }

    fn switch_program(&self, switch: NodeId) -> &dyn Installed {
        self.assert_switch(switch);
        let Kind::Switch(p) = &self.nodes[switch as usize].kind else { unreachable!() };
        p.as_ref()
    }

    /// Adds an endpoint on the host its `endpoint()` names, and returns that endpoint.
    pub fn add(&mut self, endpoint: Box<dyn HostProtocol>) -> Endpoint {
        let local = endpoint.endpoint();
        assert!(local.host < self.hosts, "{local:?}: the fabric has hosts 0..{}", self.hosts);
        let i = self.eps.len();
        assert!(self.by_ep.insert(local, i).is_none(), "endpoint {local:?} added twice");
        let Kind::Host { eps, .. } = &mut self.nodes[local.host as usize].kind else { unreachable!() };
        eps.push(i);
        self.eps.push(Ep { local, proto: endpoint, timer: None });
        self.after_input(i);
        local
    }

    /// The protocol bound to `ep`.
    pub fn endpoint(&self, ep: Endpoint) -> &dyn HostProtocol {
        self.eps[self.index(ep)].proto.as_ref()
    }

    fn index(&self, ep: Endpoint) -> usize {
        *self.by_ep.get(&ep).unwrap_or_else(|| panic!("no endpoint {ep:?}"))
    }

    /// Hands `req` to the endpoint `ep` now, and carries out what follows.
    pub fn submit(&mut self, ep: Endpoint, req: AppRequest) {
        let i = self.index(ep);
        self.eps[i].proto.submit(self.now, req);
        self.after_input(i);
    }

    /// Runs until quiet (returns `true`) or until the next event is after `until`
    /// (`false`). [`Fabric::now`] is then the time of the last event processed.
    pub fn run(&mut self, until: Time) -> bool {
        let mut same_instant = 0;
        while let Some(next) = self.queue.first_entry() {
            let at = next.key().0;
            if at > until {
                return false;
            }
            let ev = next.remove();
            same_instant = if at == self.now { same_instant + 1 } else { 0 };
            assert!(same_instant < LIVELOCK, "livelock: {LIVELOCK} events at {at} ps");
            self.now = at;
            self.handle(ev);
        }
        debug_assert_eq!(self.check_conservation(), Ok(()));
        true
    }

    /// The time of the last event processed (or of the set-up: 0).
    pub fn now(&self) -> Time {
        self.now
    }

    /// The events endpoint `ep` reported, in order (none for an endpoint that reported none).
    pub fn events(&self, ep: Endpoint) -> Vec<HostEvent> {
        self.timed_events(ep).iter().map(|(_, e)| e.clone()).collect()
    }

    /// The events endpoint `ep` reported, with the time of each.
    pub fn timed_events(&self, ep: Endpoint) -> &[(Time, HostEvent)] {
        self.events.get(&ep).map_or(&[], Vec::as_slice)
    }

    /// Counter `name` of endpoint `ep`'s protocol; panics if it has no such counter.
    pub fn counter(&self, ep: Endpoint, name: &str) -> u64 {
        let counters = self.endpoint(ep).counters();
        find(&counters, name).unwrap_or_else(|| panic!("{ep:?} has no counter {name:?}: {counters:?}"))
    }

    /// Counter `name` summed over the endpoints that have it; panics if none has.
    pub fn total(&self, name: &str) -> u64 {
        let found: Vec<u64> = self.eps.iter().filter_map(|e| find(&e.proto.counters(), name)).collect();
        assert!(!found.is_empty(), "no endpoint has a counter {name:?}");
        found.iter().sum()
    }

    /// Counter `name` of the program on `switch`; panics if it has no such counter.
    pub fn switch_counter(&self, switch: NodeId, name: &str) -> u64 {
        let counters = self.switch_program(switch).counters();
        find(&counters, name).unwrap_or_else(|| panic!("switch {switch} has no counter {name:?}: {counters:?}"))
    }

    /// Packets lost by filter `lose`, marked by `mark`, held back by `reorder`, or seen by
    /// `tap`.
    pub fn hits(&self, filter: Filter) -> u64 {
        self.filters[filter.0].hits
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Packets on links (serializing, propagating or held back) or between co-located
    /// endpoints, counted from the event queue.
    pub fn in_flight(&self) -> Count {
        let mut c = Count::default();
        for ev in self.queue.values() {
            if let Ev::Arrive { pkt, .. } | Ev::Loopback(pkt) = ev {
                c.add(pkt);
            }
        }
        c
    }

    /// Checks `sent = delivered + dropped + consumed by programs + in flight`, in packets
    /// and in bytes (consumed = taken in by programs − put out by them).
    pub fn check_conservation(&self) -> Result<(), String> {
        let s = &self.stats;
        let flight = self.in_flight();
        let side = |f: fn(&Count) -> u64| {
            let lhs = f(&s.sent) + f(&s.out_of_programs);
            let rhs = f(&s.delivered) + f(&s.dropped) + f(&s.into_programs) + f(&flight);
            (lhs, rhs)
        };
        for (what, (lhs, rhs)) in [("packets", side(|c| c.packets)), ("bytes", side(|c| c.bytes))] {
            if lhs != rhs {
                return Err(format!(
                    "{what} not conserved: sent + put out by programs = {lhs}, delivered + dropped + taken in by programs + in flight = {rhs} ({s:?}, in flight {flight:?})"
                ));
            }
        }
        Ok(())
    }

    /// Loses the packets `rule` picks on `on`.
    pub fn lose(&mut self, on: Links, rule: Rule) -> Filter {
        self.filter(on, Effect::Lose(rule))
    }

    /// Sets the ECN mark of the packets `rule` picks on `on`.
    pub fn mark(&mut self, on: Links, rule: Rule) -> Filter {
        self.filter(on, Effect::Mark(rule))
    }

    /// Holds the packets `rule` picks on `on` back by `hold`: they arrive that much later,
    /// after packets sent behind them.
    pub fn reorder(&mut self, on: Links, rule: Rule, hold: Time) -> Filter {
        self.filter(on, Effect::Hold(rule, hold))
    }

    /// Shows every packet put on a link of `on` to `f`, which may change it.
    pub fn tap(&mut self, on: Links, f: impl FnMut(Hop, &mut Packet) + 'static) -> Filter {
        self.filter(on, Effect::Tap(Box::new(f)))
    }

    fn filter(&mut self, on: Links, effect: Effect) -> Filter {
        self.filters.push(FilterState { on, effect, hits: 0, draws: 0 });
        Filter(self.filters.len() - 1)
    }

    // ---- the event loop ------------------------------------------------------------------

    fn schedule(&mut self, at: Time, ev: Ev) -> (Time, u64) {
        self.seq += 1;
        let key = (at.max(self.now), self.seq);
        self.queue.insert(key, ev);
        key
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::NicFree(host) => {
                let Kind::Host { nic_busy, .. } = &mut self.nodes[host as usize].kind else { unreachable!() };
                *nic_busy = false;
                self.kick(host);
            }
            Ev::Arrive { node, pkt, .. } if node < self.hosts => self.deliver(node, pkt),
            Ev::Arrive { node, port, pkt } => {
                self.stats.into_programs.add(&pkt);
                self.on_switch(node, |p, now, ctx, out| p.on_packet(now, ctx, port, pkt, out));
            }
            Ev::Loopback(pkt) => self.deliver(pkt.dst, pkt),
            Ev::HostTimer(i) => {
                self.eps[i].timer = None;
                self.eps[i].proto.handle_timeout(self.now);
                self.after_input(i);
            }
            Ev::SwitchTimer { switch, token } => self.on_switch(switch, |p, now, ctx, out| p.on_timer(now, ctx, token, out)),
        }
    }

    fn deliver(&mut self, host: NodeId, pkt: Packet) {
        let Some(&i) = self.by_ep.get(&Endpoint { host, port: pkt.dst_port }) else {
            return self.stats.drop(&pkt, "no endpoint");
        };
        self.stats.delivered.add(&pkt);
        self.eps[i].proto.handle_packet(self.now, pkt);
        self.after_input(i);
    }

    /// After any input to endpoint `i`: feed its NIC, re-arm its timer, collect its events.
    fn after_input(&mut self, i: usize) {
        self.kick(self.eps[i].local.host);
        self.settle(i);
    }

    /// Re-arms endpoint `i`'s timer (dropping a stale one from the queue) and collects its
    /// events. Needed after every call into the protocol, `poll_transmit` included.
    fn settle(&mut self, i: usize) {
        let want = self.eps[i].proto.poll_timeout();
        if want != self.eps[i].timer.map(|(t, _)| t) {
            if let Some((_, key)) = self.eps[i].timer.take() {
                self.queue.remove(&key);
            }
            if let Some(t) = want {
                let key = self.schedule(t, Ev::HostTimer(i));
                self.eps[i].timer = Some((t, key));
            }
        }
        let ep = &mut self.eps[i];
        while let Some(e) = ep.proto.poll_event() {
            self.events.entry(ep.local).or_default().push((self.now, e));
        }
    }

    /// While the host's NIC is free, asks its endpoints round robin for a packet.
    fn kick(&mut self, host: NodeId) {
        loop {
            let Kind::Host { eps, next, nic_busy } = &mut self.nodes[host as usize].kind else { unreachable!() };
            if *nic_busy || eps.is_empty() {
                return;
            }
            let m = eps.len();
            let mut got = None;
            for k in 0..m {
                let i = eps[(*next + k) % m];
                if let Some(pkt) = self.eps[i].proto.poll_transmit(self.now) {
                    *next = (*next + k + 1) % m;
                    got = Some((i, pkt));
                    break;
                }
            }
            let Some((i, pkt)) = got else { return };
            self.stats.sent.add(&pkt);
            if pkt.dst == host {
                self.schedule(self.now, Ev::Loopback(pkt));
                self.settle(i);
                continue;
            }
            *nic_busy = true;
            let end = self.now + self.link.serialization(pkt.size);
            self.nodes[host as usize].ports[0].busy_until = end;
            self.schedule(end, Ev::NicFree(host));
            self.put_on_link(host, 0, pkt, end);
            self.settle(i);
            return;
        }
    }

    /// Calls the program on `switch` and carries out its actions.
    fn on_switch(&mut self, switch: NodeId, call: impl FnOnce(&mut dyn Installed, Time, &Ctx, &mut Vec<SwitchAction>)) {
        let mut out = std::mem::take(&mut self.actions);
        let Node { ports, kind } = &mut self.nodes[switch as usize];
        let Kind::Switch(program) = kind else { unreachable!() };
        let ctx = Ctx { node: switch, now: self.now, rate_bps: self.link.rate_bps, ports: ports.as_slice() };
        call(program.as_mut(), self.now, &ctx, &mut out);
        for action in out.drain(..) {
            match action {
                SwitchAction::Forward { port, pkt } => {
                    self.stats.out_of_programs.add(&pkt);
                    self.egress(switch, port, pkt);
                }
                SwitchAction::ForwardEach { pkt, to } => {
                    for (port, pkt) in Addressed::copies(pkt, to) {
                        self.stats.out_of_programs.add(&pkt);
                        self.egress(switch, port, pkt);
                    }
                }
                SwitchAction::Route { pkt } => {
                    self.stats.out_of_programs.add(&pkt);
                    match self.route(switch, &pkt) {
                        Some(port) => self.egress(switch, port, pkt),
                        None => self.stats.drop(&pkt, "no route"),
                    }
                }
                SwitchAction::Multicast { ports, pkt } => {
                    for port in ports {
                        self.stats.out_of_programs.add(&pkt);
                        self.egress(switch, port, pkt.clone());
                    }
                }
                SwitchAction::Drop { pkt, reason } => {
                    self.stats.out_of_programs.add(&pkt);
                    self.stats.drop(&pkt, reason);
                }
                SwitchAction::SetTimer { at, token } => {
                    self.schedule(at, Ev::SwitchTimer { switch, token });
                }
            }
        }
        self.actions = out;
    }

    /// The port of `switch` on the shortest path to `pkt.dst` (see the crate docs).
    fn route(&self, switch: NodeId, pkt: &Packet) -> Option<PortId> {
        if pkt.dst >= self.hosts {
            return None;
        }
        let tor = self.tor(pkt.dst);
        match self.shape {
            Shape::Star => Some(pkt.dst as PortId),
            Shape::LeafSpine { per_leaf, .. } if switch == tor => Some((pkt.dst % per_leaf) as PortId),
            Shape::LeafSpine { spines, per_leaf } => {
                let leaves = self.hosts / per_leaf;
                if switch < self.hosts + leaves {
                    Some((per_leaf as u64 + pkt.flow % spines as u64) as PortId)
                } else {
                    Some((tor - self.hosts) as PortId)
                }
            }
        }
    }

    /// Queues `pkt` on a switch's egress port (cut-through, FIFO at the link rate).
    fn egress(&mut self, switch: NodeId, port: PortId, pkt: Packet) {
        let n = self.nodes[switch as usize].ports.len();
        assert!((port as usize) < n, "switch {switch} has ports 0..{n}, not {port}");
        let p = &mut self.nodes[switch as usize].ports[port as usize];
        let end = self.now.max(p.busy_until + self.link.serialization(pkt.size));
        p.busy_until = end;
        self.put_on_link(switch, port, pkt, end);
    }

    /// Runs the filters on a packet whose last bit leaves `node` on `port` at `end`, and
    /// schedules its arrival at the far end.
    fn put_on_link(&mut self, node: NodeId, port: PortId, mut pkt: Packet, end: Time) {
        let p = &self.nodes[node as usize].ports[port as usize];
        let (hop, peer_port) = (Hop { from: node, to: p.peer }, p.peer_port);
        let mut hold = 0;
        for (k, f) in self.filters.iter_mut().enumerate() {
            if !f.on.covers(hop, self.hosts) {
                continue;
            }
            let seed = self.seed;
            let draws = &mut f.draws;
            let draw = || {
                *draws += 1;
                splitmix64(splitmix64(seed ^ (k as u64) << 48) ^ *draws)
            };
            let hit = match &mut f.effect {
                Effect::Lose(rule) => rule.picks(&pkt, draw),
                Effect::Mark(rule) => {
                    let hit = rule.picks(&pkt, draw);
                    pkt.ecn |= hit;
                    hit
                }
                Effect::Hold(rule, by) => {
                    let hit = rule.picks(&pkt, draw);
                    hold += if hit { *by } else { 0 };
                    hit
                }
                Effect::Tap(tap) => {
                    tap(hop, &mut pkt);
                    true
                }
            };
            if hit {
                f.hits += 1;
                if let Effect::Lose(_) = f.effect {
                    return self.stats.drop(&pkt, "loss");
                }
            }
        }
        self.schedule(end + self.link.delay + hold, Ev::Arrive { node: hop.to, port: peer_port, pkt });
    }
}

fn find(counters: &[(&'static str, u64)], name: &str) -> Option<u64> {
    counters.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}
