//! Lossless fabrics: PFC (hop-by-hop pause, 802.1Qbb-style, one traffic class) and credits.
//!
//! The model. A switch counts, per ingress port, the bytes that came in through that port and
//! are still at the switch (waiting in an egress queue or being sent). The packets a program
//! emits while handling one packet are charged to that packet's port once, at the largest one's
//! size, until the last of them has left, as a shared buffer stores a multicast once (charging
//! every copy in full made a static tree's root pause its children at every broadcast: a fifth
//! of one tree's goodput on the 64-host Canary case; ATP's copies to each worker are separate
//! packets to the program, the same stored packet to the switch). A packet a timer emits is
//! charged to none. Under PFC, when a port's count
//! exceeds `xoff` the switch sends PAUSE to the node at the other end of that port's link, and
//! RESUME once the count is back to `xon`.
//! A frame takes effect one link delay after it is sent (its own serialization and its wait
//! behind the packet on the reverse link are not modelled); a paused port finishes the packet
//! it is sending and starts no other. Host NICs obey pause; hosts never send it (they take
//! every packet at line rate). Nothing is dropped for lack of buffer.
//!
//! A paused port holds packets it has not started, so the closed-form queue of `network.rs`
//! does not apply: here each switch egress port has a real FIFO (the wires' pooled `Fifos`),
//! a packet starts when the port is free, not paused and the packet is ready, and a `TxDone`
//! event at the end of its serialization frees the port and takes its bytes off the ingress
//! count. Queue lengths that programs, ECN and adaptive routing read are the bytes waiting
//! plus the rest of the packet in service.
//!
//! Credits (`network.flow_control = "credit"`, what SST's merlin routers do). The same
//! per-ingress-port count, with no PAUSE: a port sends into a switch only against credits, the
//! bytes of that switch's buffer for its link. Sending a packet spends its size; the receiving
//! switch returns credits (one link delay later) as the bytes charged to that ingress port
//! leave it, and at once for what it takes in and sends nothing for (an aggregated packet, a
//! refused one). So a switch holds at most the buffer from each ingress port, whatever the
//! load: the bound is exact unless one packet makes a switch emit more bytes than it brought
//! (none of the INA programs does: a multicast is charged once), and after a failure, which
//! gives the link's sender its whole buffer back while the old charges drain. A port whose
//! head packet lacks credits waits (counted as a pause, its wait as paused time); a port that
//! has spent nothing may send a packet larger than the buffer, so nothing deadlocks. merlin
//! splits a switch's buffer into an input and an output buffer per port; here the output
//! queues are the egress FIFOs below, bounded by the ingress charges that feed them.
//! A host NIC waiting for credits holds the packet it took, as a NIC's transmit ring does.
//!
//! Failures. Packets waiting at a switch that fails, or at a port whose link fails, are lost and
//! counted as failure drops (drop-tail loses its queues there too). The pause a dead switch or
//! link leaves behind is cleared at once, since no RESUME would ever come, and frames still on
//! their way are made stale by bumping the pausing port's generation.

use super::Sim;
use crate::events::Ev;
use crate::failures::{Target, Why};
use crate::wires::Fifos;
use inalab_core::{NodeId, Packet, Time};

/// The ingress port of a packet a switch made itself (a timer's): charged to no port.
pub(super) const NO_INGRESS: u32 = u32::MAX;

/// What a queued packet's bytes are charged to.
#[derive(Debug, Clone, Copy, Default)]
enum Charge {
    /// A packet a timer made.
    #[default]
    None,
    /// Ingress port (global index).
    Port(u32),
    /// One copy of a multicast: index into `Pfc::shared`.
    Shared(u32),
}

/// The one charge of the packets a program made of one packet: released when the last has
/// left.
#[derive(Debug, Clone, Copy)]
struct SharedCharge {
    from: u32,
    size: u32,
    copies_left: u32,
}

/// Which lossless discipline (`FlowControl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Pause { xoff: u64, xon: u64 },
    Credit { buffer: u64 },
}

/// PFC or credit state of every port (global port index), and the switch ports' queues.
pub(crate) struct Pfc {
    mode: Mode,
    /// Packets waiting at each switch egress port: (time it may start, charge, packet).
    queues: Fifos<Charge>,
    ports: Vec<PfcPort>,
    /// Multicasts with copies still at their switch; freed slots are reused.
    shared: Vec<SharedCharge>,
    /// The shared charge of the packets being queued (`pfc_share_open`).
    sharing: Option<u32>,
    free_shared: Vec<u32>,
    /// The node each port belongs to.
    node_of_port: Vec<NodeId>,
}

#[derive(Debug, Clone, Default)]
struct PfcPort {
    // ---- as an egress port
    /// A switch port serializing a packet (host NICs use `HostState::nic_busy`).
    busy: bool,
    /// A `PortReady` is queued for the head packet.
    ready_pending: bool,
    /// (size, charge) of the packet in service.
    serving: (u32, Charge),
    /// Paused by the node at the far end of the link.
    paused: bool,
    paused_since: Time,
    paused_ps: Time,
    /// Times it was paused.
    pauses: u64,
    // ---- as a switch's ingress port
    /// Bytes that came in through this port and are still at the switch.
    in_bytes: u64,
    max_in_bytes: u64,
    /// It has paused the far end (and not resumed it since).
    pausing: bool,
    pauses_sent: u64,
    /// Bumped when a failure clears this link's pause: frames sent before are stale.
    gen: u16,
    // ---- credits only
    /// As an egress port into a switch: bytes sent not yet credited back.
    spent: u64,
    /// As a switch's ingress port: bytes its sender paid for that have not been credited
    /// back (at least `in_bytes`, the rest returned as soon as it is not).
    paid: u64,
}

impl PfcPort {
    /// Credits: the head packet waits for credits from `now` (a pause, in the statistics).
    #[inline]
    fn stall(&mut self, now: Time) {
        if !self.paused {
            self.paused = true;
            self.paused_since = now;
            self.pauses += 1;
        }
    }

    /// Credits: a packet starts; a wait for credits ends.
    #[inline]
    fn unstall(&mut self, now: Time) {
        if self.paused {
            self.paused = false;
            self.paused_ps += now - self.paused_since;
        }
    }
}

/// One link direction's PFC figures, for the results.
pub(crate) struct LinkPfc {
    /// Times the sender was paused, and for how long in all (up to `now`).
    pub pauses: u64,
    pub paused_ps: Time,
    /// Most bytes from this link held at the receiving switch at once (0 at a host).
    pub max_ingress_bytes: u64,
    /// PAUSE frames the receiver sent over it.
    pub pauses_sent: u64,
}

impl Pfc {
    pub fn new(mode: Mode, node_of_port: Vec<NodeId>) -> Self {
        let n = node_of_port.len();
        Pfc { mode, queues: Fifos::new(n), ports: vec![PfcPort::default(); n], shared: vec![], sharing: None, free_shared: vec![], node_of_port }
    }

    /// Bytes waiting at port `pi`, not counting the packet in service.
    #[inline]
    pub fn waiting(&self, pi: usize) -> u64 {
        self.queues.bytes(pi)
    }

    /// Packets and bytes waiting in the switch queues.
    pub fn in_flight(&self) -> (u64, u64) {
        self.queues.in_flight()
    }

    #[inline]
    pub fn credit(&self) -> Option<u64> {
        match self.mode {
            Mode::Credit { buffer } => Some(buffer),
            Mode::Pause { .. } => None,
        }
    }

    /// Credits: whether egress port `pi` may start a packet of `size` bytes (a port into a
    /// host needs none: hosts take every packet at line rate).
    #[inline]
    fn may_send(&self, pi: usize, size: u32, into_host: bool) -> bool {
        match self.mode {
            Mode::Pause { .. } => true,
            Mode::Credit { buffer } => {
                let spent = self.ports[pi].spent;
                into_host || spent == 0 || spent + size as u64 <= buffer
            }
        }
    }
}

impl Sim {
    /// The far end of port `pi`'s link, as a global port index.
    #[inline]
    fn peer_port_index(&self, pi: usize) -> usize {
        let p = &self.queues.ports[pi];
        (self.queues.port_base[p.peer as usize] + p.peer_port as u32) as usize
    }

    #[inline]
    fn pfc_mut(&mut self) -> &mut Pfc {
        self.queues.pfc.as_mut().expect("PFC mode")
    }

    /// `egress` under PFC: charges a packet that arrived through global port `from` (or
    /// `NO_INGRESS`) to that port and queues it at switch port `pi`.
    pub(super) fn pfc_egress(&mut self, pi: usize, pkt: Packet, ready: Time, from: u32) {
        if let Some(idx) = self.pfc_mut().sharing {
            let c = &mut self.pfc_mut().shared[idx as usize];
            c.copies_left += 1;
            let (from, grow) = (c.from, pkt.size.saturating_sub(c.size));
            if grow > 0 {
                c.size = pkt.size;
                self.pfc_charge(from, grow);
            }
            return self.pfc_enqueue(pi, pkt, ready, Charge::Shared(idx));
        }
        let charge = if from == NO_INGRESS { Charge::None } else { Charge::Port(from) };
        self.pfc_charge(from, pkt.size);
        self.pfc_enqueue(pi, pkt, ready, charge);
    }

    /// What `egress` queues until `pfc_share_close` (the packets a program made of the one it
    /// was handling) shares one charge to its ingress port: the largest packet's size, held
    /// until the last has left, as a switch stores a packet once however many copies it sends
    /// (a multicast, ATP's copies to each worker, a tree's replication). Nothing to do without
    /// PFC or credits, or for a timer's packets (charged to no port).
    pub(super) fn pfc_share_open(&mut self) {
        let from = self.queues.ingress;
        let Some(pfc) = self.queues.pfc.as_mut() else { return };
        if from == NO_INGRESS {
            return;
        }
        let one = SharedCharge { from, size: 0, copies_left: 0 };
        let idx = match pfc.free_shared.pop() {
            Some(i) => {
                pfc.shared[i as usize] = one;
                i
            }
            None => {
                pfc.shared.push(one);
                (pfc.shared.len() - 1) as u32
            }
        };
        pfc.sharing = Some(idx);
    }

    /// Ends `pfc_share_open`'s group; a group that queued nothing is freed (it charged nothing).
    /// Copies leave by events, never while the group is open, so its charge cannot be released
    /// before it is complete.
    pub(super) fn pfc_share_close(&mut self) {
        let Some(pfc) = self.queues.pfc.as_mut() else { return };
        if let Some(idx) = pfc.sharing.take() {
            if pfc.shared[idx as usize].copies_left == 0 {
                pfc.free_shared.push(idx);
            }
        }
    }

    /// Adds `size` bytes to ingress port `from`'s count; PAUSE above `xoff`.
    fn pfc_charge(&mut self, from: u32, size: u32) {
        if from == NO_INGRESS {
            return;
        }
        let pfc = self.pfc_mut();
        let mode = pfc.mode;
        let p = &mut pfc.ports[from as usize];
        p.in_bytes += size as u64;
        p.max_in_bytes = p.max_in_bytes.max(p.in_bytes);
        // Credits: no PAUSE (the sender never sends beyond them).
        let Mode::Pause { xoff, .. } = mode else { return };
        if p.in_bytes > xoff && !p.pausing {
            p.pausing = true;
            p.pauses_sent += 1;
            self.pfc_send(from as usize, true);
        }
    }

    /// Queues a packet at switch port `pi` (ECN and queue statistics on the real queue) and
    /// starts the port if it can.
    fn pfc_enqueue(&mut self, pi: usize, mut pkt: Packet, ready: Time, charge: Charge) {
        let (now, bin, ecn_threshold) = (self.now, self.state.bin, self.queues.ecn_threshold);
        let backlog = self.queues.ports[pi].backlog(now) + self.pfc_mut().waiting(pi);
        pkt.ecn |= self.queues.ports[pi].note_queued(now, backlog, ecn_threshold, bin);
        self.pfc_mut().queues.push(pi, ready, charge, pkt);
        self.pfc_start(pi);
    }

    /// Starts the head packet of switch port `pi` if the port is free, not paused and the
    /// packet is ready; it goes on the wire at once (its arrival is known).
    fn pfc_start(&mut self, pi: usize) {
        let now = self.now;
        let into_host = self.fabric.topo.is_host(self.queues.ports[pi].peer);
        let pfc = self.queues.pfc.as_mut().expect("PFC mode");
        let st = &pfc.ports[pi];
        if st.busy || (st.paused && pfc.credit().is_none()) {
            return;
        }
        let Some((ready, size)) = pfc.queues.peek(pi) else { return };
        if ready > now {
            if !st.ready_pending {
                pfc.ports[pi].ready_pending = true;
                self.q.push(ready, Ev::PortReady { port: pi as u32 });
            }
            return;
        }
        if !pfc.may_send(pi, size, into_host) {
            pfc.ports[pi].stall(now);
            return;
        }
        let (charge, pkt, _) = pfc.queues.pop(pi).expect("peeked");
        let spends = pfc.credit().is_some() && !into_host;
        let st = &mut pfc.ports[pi];
        st.unstall(now);
        if spends {
            st.spent += pkt.size as u64;
        }
        st.busy = true;
        st.serving = (pkt.size, charge);
        let node = pfc.node_of_port[pi];
        let end = self.queues.ports[pi].start_tx(now, pkt.size, self.state.bin);
        self.q.push(end, Ev::TxDone { port: pi as u32 });
        // As in drop-tail: a failed link still takes the packet's time, then loses it.
        let down = self.faults.live.link_is_down(self.queues.ports[pi].link);
        if down {
            self.failure_drop(node, Why::LinkFailed, &pkt);
        } else if self.draw(self.queues.ports[pi].loss) {
            self.queues.ports[pi].stats.drops_loss += 1;
            self.dropped(&pkt);
        } else {
            let arrival = end + self.queues.ports[pi].delay_ps;
            self.put_on_wire(pi, arrival, pkt);
        }
    }

    /// Switch port `pi` finished serializing: its packet leaves the switch.
    pub(super) fn pfc_tx_done(&mut self, pi: usize) {
        let st = &mut self.pfc_mut().ports[pi];
        st.busy = false;
        let (size, charge) = st.serving;
        self.pfc_left(charge, size);
        self.pfc_start(pi);
    }

    pub(super) fn pfc_port_ready(&mut self, pi: usize) {
        self.pfc_mut().ports[pi].ready_pending = false;
        self.pfc_start(pi);
    }

    /// A packet of `size` bytes left the switch (sent, or lost to a failure).
    fn pfc_left(&mut self, charge: Charge, size: u32) {
        match charge {
            Charge::None => {}
            Charge::Port(from) => self.pfc_release(from, size),
            Charge::Shared(i) => {
                let pfc = self.pfc_mut();
                let c = &mut pfc.shared[i as usize];
                c.copies_left -= 1;
                if c.copies_left == 0 {
                    let (from, size) = (c.from, c.size);
                    pfc.free_shared.push(i);
                    self.pfc_release(from, size);
                }
            }
        }
    }

    /// `size` bytes charged to ingress port `from` left the switch; RESUME at `xon`.
    fn pfc_release(&mut self, from: u32, size: u32) {
        if from == NO_INGRESS {
            return;
        }
        let pfc = self.pfc_mut();
        let Mode::Pause { xon, .. } = pfc.mode else {
            pfc.ports[from as usize].in_bytes -= size as u64;
            return self.credit_settle(from as usize);
        };
        let p = &mut pfc.ports[from as usize];
        p.in_bytes -= size as u64;
        if p.pausing && p.in_bytes <= xon {
            p.pausing = false;
            self.pfc_send(from as usize, false);
        }
    }

    /// Sends PAUSE (`on`) or RESUME from ingress port `from` to the sender at the far end of
    /// its link, where it takes effect one link delay later.
    fn pfc_send(&mut self, from: usize, on: bool) {
        if self.faults.live.link_is_down(self.queues.ports[from].link) {
            return; // lost with the link; its failure cleared the pause already
        }
        let up = self.peer_port_index(from);
        let gen = self.pfc_mut().ports[from].gen;
        let at = self.now + self.queues.ports[from].delay_ps;
        self.q.push(at, Ev::Pause { port: up as u32, gen, on });
    }

    /// Credits: a packet of `size` bytes came into a switch through global port `from`; its
    /// sender paid for it.
    #[inline]
    pub(super) fn credit_paid(&mut self, from: usize, size: u32) {
        self.pfc_mut().ports[from].paid += size as u64;
    }

    /// Credits: returns to the sender at the far end of ingress port `from` what it paid for
    /// beyond the bytes still charged to the port (they arrive one link delay later).
    pub(super) fn credit_settle(&mut self, from: usize) {
        let p = &mut self.pfc_mut().ports[from];
        let back = p.paid.saturating_sub(p.in_bytes);
        if back == 0 {
            return;
        }
        p.paid -= back;
        let gen = p.gen;
        if self.faults.live.link_is_down(self.queues.ports[from].link) {
            return; // lost with the link; its failure gave the sender its credits back
        }
        let up = self.peer_port_index(from);
        let at = self.now + self.queues.ports[from].delay_ps;
        // At most the buffer, which set-up keeps within u32.
        self.q.push(at, Ev::Credit { port: up as u32, gen, bytes: back as u32 });
    }

    /// Credits returned reach egress port `pi`: its waiting packet may start.
    pub(super) fn credit_back(&mut self, pi: usize, gen: u16, bytes: u32) {
        let from = self.peer_port_index(pi);
        let pfc = self.pfc_mut();
        if pfc.ports[from].gen != gen {
            return; // sent before a failure reset this link's credits
        }
        // Saturating: packets already on their way when a failure reset the link's credits
        // are credited again when they arrive (the bound may be passed by those, once).
        let st = &mut pfc.ports[pi];
        st.spent = st.spent.saturating_sub(bytes as u64);
        self.credit_resume(pi);
    }

    /// Credits: port `pi` may have credits for its waiting packet now (a host's NIC sends the
    /// packet it holds).
    fn credit_resume(&mut self, pi: usize) {
        let node = self.pfc_mut().node_of_port[pi];
        if !self.fabric.topo.is_host(node) {
            return self.pfc_start(pi);
        }
        let Some(size) = self.nodes.hosts[node as usize].credit_held.as_ref().map(|p| p.size) else { return };
        if self.faults.live.node_is_down(node) {
            // A failed host sends nothing again: what it held is lost with it.
            let pkt = self.nodes.hosts[node as usize].credit_held.take().expect("held");
            return self.failure_drop(node, Why::NodeFailed, &pkt);
        }
        let now = self.now;
        let pfc = self.pfc_mut();
        if !pfc.may_send(pi, size, false) {
            return;
        }
        let st = &mut pfc.ports[pi];
        st.unstall(now);
        st.spent += size as u64;
        let pkt = self.nodes.hosts[node as usize].credit_held.take().expect("held");
        self.nic_send(node, pkt);
    }

    /// Credits: whether host `host`'s NIC may send `pkt` now; if not it holds it (and takes
    /// no other) until credits come back. Spends the credits when it may.
    pub(super) fn credit_nic(&mut self, host: NodeId, pkt: Packet) -> Option<Packet> {
        let pi = self.queues.port_base[host as usize] as usize;
        let now = self.now;
        let pfc = self.pfc_mut();
        if pfc.may_send(pi, pkt.size, false) {
            pfc.ports[pi].spent += pkt.size as u64;
            return Some(pkt);
        }
        pfc.ports[pi].stall(now);
        self.nodes.hosts[host as usize].credit_held = Some(pkt);
        None
    }

    /// A PAUSE or RESUME frame reaches egress port `pi`.
    pub(super) fn pfc_frame(&mut self, pi: usize, gen: u16, on: bool) {
        let from = self.peer_port_index(pi);
        if self.pfc_mut().ports[from].gen != gen {
            return; // sent before a failure cleared this link's pause
        }
        self.pfc_set_paused(pi, on);
    }

    fn pfc_set_paused(&mut self, pi: usize, on: bool) {
        let now = self.now;
        let pfc = self.pfc_mut();
        let st = &mut pfc.ports[pi];
        if st.paused == on {
            return;
        }
        st.paused = on;
        if on {
            st.paused_since = now;
            st.pauses += 1;
            let node = pfc.node_of_port[pi];
            if self.fabric.topo.is_host(node) {
                self.nodes.hosts[node as usize].nic_paused = true;
            }
            return;
        }
        st.paused_ps += now - st.paused_since;
        let node = pfc.node_of_port[pi];
        if self.fabric.topo.is_host(node) {
            self.nodes.hosts[node as usize].nic_paused = false;
            self.try_transmit(node);
        } else {
            self.pfc_start(pi);
        }
    }

    /// After failure `target` started (liveness already updated): loses what waits where it
    /// failed and clears the pause its link(s) can no longer lift. Under credits also when it
    /// ends: what the link's sender spent into the dead end never comes back.
    pub(super) fn pfc_failed(&mut self, target: Target) {
        // (node, its port) pairs whose queue is lost, and whose link's pause is cleared.
        let ends: Vec<(NodeId, usize, Why)> = match target {
            Target::Node(n) => {
                let base = self.queues.port_base[n as usize] as usize;
                (base..base + self.fabric.topo.nodes[n as usize].ports.len()).map(|pi| (n, pi, Why::NodeFailed)).collect()
            }
            Target::Link(l) => {
                let link = &self.fabric.topo.links[l as usize];
                [(link.a, link.b), (link.b, link.a)]
                    .into_iter()
                    .map(|(a, b)| (a, (self.queues.port_base[a as usize] + self.fabric.topo.port_to(a, b).expect("a link's ends are adjacent") as u32) as usize, Why::LinkFailed))
                    .collect()
            }
        };
        for &(node, pi, why) in &ends {
            while let Some((charge, pkt, _)) = self.pfc_mut().queues.pop(pi) {
                self.pfc_left(charge, pkt.size);
                self.failure_drop(node, why, &pkt);
            }
        }
        for &(_, pi, _) in &ends {
            // `pi` as an ingress port: whatever it paused at the far end is lifted now.
            let st = &mut self.pfc_mut().ports[pi];
            st.gen = st.gen.wrapping_add(1);
            st.pausing = false;
            st.paid = 0;
            let up = self.peer_port_index(pi);
            if self.pfc_mut().credit().is_some() {
                // Both directions start afresh: each sender gets its whole buffer back (what it
                // spent is lost or drains uncredited), credits on their way are stale.
                let pfc = self.pfc_mut();
                pfc.ports[pi].spent = 0;
                let far = &mut pfc.ports[up];
                far.spent = 0;
                far.paid = 0;
                far.gen = far.gen.wrapping_add(1);
                self.credit_resume(up);
                self.credit_resume(pi);
            } else {
                self.pfc_set_paused(up, false);
            }
        }
    }

    /// PFC figures of link direction `pi` (sender's port), `None` without PFC.
    pub(crate) fn pfc_link(&self, pi: usize) -> Option<LinkPfc> {
        let pfc = self.queues.pfc.as_ref()?;
        let st = &pfc.ports[pi];
        let rx = &pfc.ports[self.peer_port_index(pi)];
        let ongoing = if st.paused { self.now - st.paused_since } else { 0 };
        Some(LinkPfc { pauses: st.pauses, paused_ps: st.paused_ps + ongoing, max_ingress_bytes: rx.max_in_bytes, pauses_sent: rx.pauses_sent })
    }

    /// PFC figures of a switch from its ports `range`: PAUSE frames it sent (as ingress ports),
    /// pauses and paused time of its egress ports, its largest ingress count.
    pub(crate) fn pfc_totals(&self, range: std::ops::Range<usize>) -> Option<LinkPfc> {
        let pfc = self.queues.pfc.as_ref()?;
        let mut t = LinkPfc { pauses: 0, paused_ps: 0, max_ingress_bytes: 0, pauses_sent: 0 };
        for st in &pfc.ports[range] {
            t.pauses += st.pauses;
            t.paused_ps += st.paused_ps + if st.paused { self.now - st.paused_since } else { 0 };
            t.pauses_sent += st.pauses_sent;
            t.max_ingress_bytes = t.max_ingress_bytes.max(st.max_in_bytes);
        }
        Some(t)
    }
}
