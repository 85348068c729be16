//! What every collective built on the transport shares: message ids, the mailbox of
//! delivered messages, and the FIFO request runner behind `HostProtocol`.

use crate::transport::{Delivered, Transport, TransportConfig};
use crate::ConfigError;
use inalab_core::time::Time;
use inalab_core::{AppRequest, Endpoint, HostEvent, Packet, Payload};
use std::collections::{BTreeMap, VecDeque};

/// Bits of a message id below the request id: 4 bits of phase, 28 bits of index.
const INDEX_BITS: u32 = 28;
/// Exclusive bound of the index of `msg_id`.
pub(crate) const MAX_INDEX: u64 = 1 << INDEX_BITS;

/// Message id of a collective: bits 63..32 the request id (its low 32 bits, enough to tell
/// apart the few requests that overlap in time), 31..28 the phase, 27..0 an index within the
/// phase (ring: step and chunk; parameter server: partition).
pub(crate) fn msg_id(req: u64, phase: u8, index: u64) -> u64 {
    debug_assert!(phase < 16 && index < MAX_INDEX);
    (req << 32) | (phase as u64) << INDEX_BITS | index
}

/// The phase of a message id.
pub(crate) fn phase_of(id: u64) -> u8 {
    ((id >> INDEX_BITS) & 0xF) as u8
}

/// The same message id in another phase.
pub(crate) fn with_phase(id: u64, phase: u8) -> u64 {
    id & !(0xF << INDEX_BITS) | (phase as u64) << INDEX_BITS
}

/// A request being served: `data` starts as the local tensor and ends as the result.
pub(crate) struct Request {
    pub id: u64,
    pub bytes: u64,
    pub data: Option<Payload>,
}

/// The per-step cost of the Rina paper's dependency chain (§III-A, eq. (1)): before its part
/// of a reduce-scatter step a host waits `O + max(0, sigma Z)`, Z standard normal. With
/// `barrier` every member of an n-member step waits `O + max over n draws of max(0, sigma Z)`,
/// the step's slowest member as a global barrier per step (NCCL's, as the paper reads it)
/// makes everyone wait; the members draw from one seed, so they agree as long as they take
/// the same steps. Default: no cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCost {
    /// O, ps.
    pub overhead_ps: Time,
    /// sigma, ps.
    pub jitter_ps: Time,
    pub barrier: bool,
    /// Seeds the draws (the driver's run seed mixed with the job, and with the host unless
    /// `barrier`).
    pub seed: u64,
}

/// The draws of a [`StepCost`].
#[derive(Debug, Clone)]
pub(crate) struct StepClock {
    cost: StepCost,
    rng: u64,
}

impl StepClock {
    pub fn new(cost: StepCost) -> Self {
        StepClock { cost, rng: inalab_core::splitmix64(cost.seed) }
    }

    pub fn is_free(&self) -> bool {
        self.cost.overhead_ps == 0 && self.cost.jitter_ps == 0
    }

    /// The wait before this host's part of a step of `members` hosts.
    pub fn draw(&mut self, members: usize) -> Time {
        let (o, sigma) = (self.cost.overhead_ps, self.cost.jitter_ps);
        if sigma == 0 {
            return o;
        }
        let draws = if self.cost.barrier { members.max(1) } else { 1 };
        let worst = (0..draws).map(|_| self.normal()).fold(f64::MIN, f64::max);
        o + (sigma as f64 * worst).max(0.0) as Time
    }

    /// A standard normal draw (Box-Muller).
    fn normal(&mut self) -> f64 {
        let mut uniform = || {
            self.rng = inalab_core::splitmix64(self.rng);
            ((self.rng >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos()
    }
}

/// The transport plus the messages it delivered that nobody has consumed yet. Messages of a
/// later request or step may arrive early (a faster peer moved on) and wait here.
pub(crate) struct Ctx {
    pub tr: Transport,
    mailbox: BTreeMap<(Endpoint, u64), Delivered>,
    /// Per-step costs of the algorithm's charged steps.
    pub steps: StepClock,
    /// When the algorithm wants to be advanced again (a step waiting out its cost).
    wake: Option<Time>,
}

impl Ctx {
    /// Moves delivered messages into the mailbox; returns how many.
    fn collect(&mut self) -> usize {
        let mut n = 0;
        while let Some(d) = self.tr.poll_delivered() {
            self.mailbox.insert((d.from, d.msg_id), d);
            n += 1;
        }
        n
    }

    pub fn take(&mut self, from: Endpoint, msg_id: u64) -> Option<Delivered> {
        self.mailbox.remove(&(from, msg_id))
    }

    /// Asks to be advanced again at `at`.
    pub fn wake_at(&mut self, at: Time) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }
}

/// One allreduce algorithm's progress on the running request.
pub(crate) trait Algorithm: Send {
    /// Why a request of `bytes` bytes cannot be served, if it cannot.
    fn check(&self, bytes: u64) -> Result<(), String>;
    /// Resets the state for a new request.
    fn start(&mut self, req: &Request);
    /// Sends what can be sent and consumes what arrived; true once `req.data` holds the
    /// result (or, in metadata mode, once the algorithm is complete).
    fn advance(&mut self, now: Time, ctx: &mut Ctx, req: &mut Request) -> bool;
}

/// Serves allreduce requests FIFO, one at a time, with an [`Algorithm`].
pub(crate) struct Runner<A> {
    ctx: Ctx,
    algo: A,
    queue: VecDeque<Request>,
    running: Option<Request>,
    events: VecDeque<HostEvent>,
}

impl<A: Algorithm> Runner<A> {
    pub fn new(local: Endpoint, cfg: TransportConfig, algo: A) -> Result<Self, ConfigError> {
        Ok(Runner {
            ctx: Ctx { tr: Transport::new(local, cfg)?, mailbox: BTreeMap::new(), steps: StepClock::new(StepCost::default()), wake: None },
            algo,
            queue: VecDeque::new(),
            running: None,
            events: VecDeque::new(),
        })
    }

    pub fn transport(&self) -> &Transport {
        &self.ctx.tr
    }

    /// Charges the algorithm's reduce-scatter steps with `cost` (before any request).
    pub fn set_step_cost(&mut self, cost: StepCost) {
        self.ctx.steps = StepClock::new(cost);
    }

    pub fn endpoint(&self) -> Endpoint {
        self.ctx.tr.local()
    }

    pub fn submit(&mut self, now: Time, req: AppRequest) {
        match req {
            AppRequest::Allreduce { id, bytes, data, .. } => {
                let checked = match &data {
                    Some(d) if d.len() as u64 * Payload::VALUE_BYTES as u64 != bytes => {
                        Err(format!("payload has {} values but bytes is {bytes}", d.len()))
                    }
                    _ => self.algo.check(bytes),
                };
                if let Err(reason) = checked {
                    self.events.push_back(HostEvent::Failed { id, reason });
                    return;
                }
                self.queue.push_back(Request { id, bytes, data });
                self.pump(now);
            }
            AppRequest::Send { id, .. } => self.events.push_back(HostEvent::Failed {
                id,
                reason: "an allreduce protocol serves only Allreduce requests".into(),
            }),
        }
    }

    pub fn handle_packet(&mut self, now: Time, pkt: Packet) {
        self.ctx.tr.handle_packet(now, pkt);
        if self.ctx.collect() > 0 {
            self.pump(now);
        }
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.ctx.tr.handle_timeout(now);
        if self.ctx.wake.is_some_and(|w| w <= now) {
            self.ctx.wake = None;
            self.pump(now);
        }
    }

    pub fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        self.ctx.tr.poll_transmit(now)
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        match (self.ctx.tr.poll_timeout(), self.ctx.wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    /// Advances the running request and starts queued ones as earlier ones complete.
    fn pump(&mut self, now: Time) {
        loop {
            if self.running.is_none() {
                let Some(req) = self.queue.pop_front() else { return };
                self.algo.start(&req);
                self.running = Some(req);
            }
            let req = self.running.as_mut().expect("set above");
            if !self.algo.advance(now, &mut self.ctx, req) {
                return;
            }
            let req = self.running.take().expect("set above");
            self.events.push_back(HostEvent::Done { id: req.id, data: req.data });
        }
    }
}

/// Implements `HostProtocol` for a struct whose `runner` field is a [`Runner`].
macro_rules! host_protocol_via_runner {
    ($ty:ty) => {
        impl inalab_core::HostProtocol for $ty {
            fn endpoint(&self) -> inalab_core::Endpoint {
                self.runner.endpoint()
            }
            fn submit(&mut self, now: inalab_core::Time, req: inalab_core::AppRequest) {
                self.runner.submit(now, req)
            }
            fn handle_packet(&mut self, now: inalab_core::Time, pkt: inalab_core::Packet) {
                self.runner.handle_packet(now, pkt)
            }
            fn handle_timeout(&mut self, now: inalab_core::Time) {
                self.runner.handle_timeout(now)
            }
            fn poll_transmit(&mut self, now: inalab_core::Time) -> Option<inalab_core::Packet> {
                self.runner.poll_transmit(now)
            }
            fn poll_timeout(&self) -> Option<inalab_core::Time> {
                self.runner.poll_timeout()
            }
            fn poll_event(&mut self) -> Option<inalab_core::HostEvent> {
                self.runner.poll_event()
            }
            fn counters(&self) -> Vec<(&'static str, u64)> {
                self.runner.transport().counters()
            }
        }
    };
}
pub(crate) use host_protocol_via_runner;

/// Checks a group: non-empty, no endpoint twice, `rank` inside it.
pub(crate) fn check_group(members: &[Endpoint], rank: usize) -> Result<(), ConfigError> {
    crate::error::ensure!(!members.is_empty(), "empty group");
    crate::error::ensure!(rank < members.len(), "rank {rank} outside a group of {}", members.len());
    let distinct: std::collections::BTreeSet<_> = members.iter().collect();
    crate::error::ensure!(distinct.len() == members.len(), "an endpoint appears twice in the group");
    Ok(())
}
