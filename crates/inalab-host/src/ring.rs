//! Ring allreduce, and the ring phases (reduce-scatter, all-gather over a group on a byte
//! range of the tensor) that the hierarchical allreduce reuses.

use crate::collective::{check_group, host_protocol_via_runner, msg_id, Algorithm, Ctx, Request, Runner, MAX_INDEX};
use crate::error::ensure;
use crate::transport::TransportConfig;
use crate::ConfigError;
use inalab_core::time::Time;
use inalab_core::{Endpoint, Payload};

/// Bits of a ring message index holding the chunk (the step sits above them).
const CHUNK_BITS: u32 = 14;
/// Largest group a ring phase supports: steps and chunks each fit `CHUNK_BITS`.
pub(crate) const MAX_RING: usize = 1 << CHUNK_BITS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PhaseKind {
    /// After `n - 1` steps rank `r` holds the group's sum of chunk `(r + 1) % n`.
    ReduceScatter,
    /// Starting from rank `r` holding chunk `(r + 1) % n`, after `n - 1` steps every rank
    /// holds every chunk.
    AllGather,
}

/// Byte boundaries of `[start, end)` cut into `n` near-equal chunks whose inner boundaries
/// are 4-byte aligned relative to `start` (value boundaries in payload mode).
pub(crate) fn chunk_bounds(start: u64, end: u64, n: usize) -> Vec<u64> {
    let values = ((end - start) / Payload::VALUE_BYTES as u64) as u128;
    let mut b: Vec<u64> = (0..n).map(|i| start + 4 * (values * i as u128 / n as u128) as u64).collect();
    b.push(end);
    b
}

/// The chunk rank `rank` of `n` owns after a reduce-scatter.
pub(crate) fn owned_chunk(rank: usize, n: usize) -> usize {
    (rank + 1) % n
}

/// One ring pass over a group on a byte range of the tensor. A step's send starts only once
/// the chunk it forwards was received (no pipelining inside a step).
pub(crate) struct RingPhase {
    kind: PhaseKind,
    /// Phase number in message ids; distinct for every phase of one request.
    tag: u8,
    next: Endpoint,
    prev: Endpoint,
    n: usize,
    rank: usize,
    bounds: Vec<u64>,
    step: usize,
    sent: bool,
    /// Whether its steps pay the context's step cost (eq. (1) models reduce-scatter), and
    /// when the current step's wait ends.
    charged: bool,
    ready_at: Option<Time>,
}

impl RingPhase {
    pub fn new(kind: PhaseKind, tag: u8, members: &[Endpoint], rank: usize, start: u64, end: u64) -> Self {
        let n = members.len();
        RingPhase {
            kind,
            tag,
            next: members[(rank + 1) % n],
            prev: members[(rank + n - 1) % n],
            n,
            rank,
            bounds: chunk_bounds(start, end, n),
            step: 0,
            sent: false,
            charged: kind == PhaseKind::ReduceScatter,
            ready_at: None,
        }
    }

    fn send_chunk(&self) -> usize {
        let (r, n, s) = (self.rank, self.n, self.step);
        match self.kind {
            PhaseKind::ReduceScatter => (r + n - s) % n,
            PhaseKind::AllGather => (r + 1 + n - s) % n,
        }
    }

    fn recv_chunk(&self) -> usize {
        let (r, n, s) = (self.rank, self.n, self.step);
        match self.kind {
            PhaseKind::ReduceScatter => (r + 2 * n - s - 1) % n,
            PhaseKind::AllGather => (r + n - s) % n,
        }
    }

    fn id(&self, req: u64, chunk: usize) -> u64 {
        msg_id(req, self.tag, ((self.step as u64) << CHUNK_BITS) | chunk as u64)
    }

    /// Runs as many steps as the arrived messages allow; true once the phase is complete.
    /// A complete phase returns true without side effects.
    pub fn advance(&mut self, now: Time, ctx: &mut Ctx, req: &mut Request) -> bool {
        while self.step + 1 < self.n {
            if !self.sent && self.charged && !ctx.steps.is_free() {
                // This host's part of the step waits out its cost first (eq. (1)).
                let at = *self.ready_at.get_or_insert_with(|| now + ctx.steps.draw(self.n));
                if now < at {
                    ctx.wake_at(at);
                    return false;
                }
            }
            if !self.sent {
                let c = self.send_chunk();
                let (a, b) = (self.bounds[c], self.bounds[c + 1]);
                let payload = req.data.as_ref().map(|d| d.slice(a as usize / 4, b as usize / 4));
                ctx.tr.send_message(now, self.next, self.id(req.id, c), b - a, payload);
                self.sent = true;
            }
            let c = self.recv_chunk();
            let Some(m) = ctx.take(self.prev, self.id(req.id, c)) else { return false };
            let a = self.bounds[c] as usize / 4;
            if let (Some(d), Some(p)) = (req.data.as_mut(), m.payload.as_ref()) {
                match self.kind {
                    PhaseKind::ReduceScatter => d.add_at(a, p),
                    PhaseKind::AllGather => d.copy_at(a, p),
                }
            }
            self.step += 1;
            self.sent = false;
            self.ready_at = None;
        }
        true
    }
}

/// Whether the chunks of a `bytes`-byte tensor over `n` members fit a message (32-bit
/// length). A group of one sends nothing.
pub(crate) fn check_chunk_size(bytes: u64, n: usize) -> Result<(), String> {
    match n == 1 || bytes / n as u64 + 4 <= u32::MAX as u64 {
        true => Ok(()),
        false => Err(format!("chunks of {bytes} B over {n} members exceed 4 GiB")),
    }
}

/// Checks a group for ring phases.
pub(crate) fn check_ring_group(members: &[Endpoint], rank: usize) -> Result<(), ConfigError> {
    check_group(members, rank)?;
    ensure!(members.len() <= MAX_RING, "a ring supports at most {MAX_RING} members");
    debug_assert!((MAX_RING as u64) << CHUNK_BITS <= MAX_INDEX);
    Ok(())
}

struct Ring {
    members: Vec<Endpoint>,
    rank: usize,
    phases: Vec<RingPhase>,
}

impl Algorithm for Ring {
    fn check(&self, bytes: u64) -> Result<(), String> {
        check_chunk_size(bytes, self.members.len())
    }

    fn start(&mut self, req: &Request) {
        self.phases = vec![
            RingPhase::new(PhaseKind::ReduceScatter, 0, &self.members, self.rank, 0, req.bytes),
            RingPhase::new(PhaseKind::AllGather, 1, &self.members, self.rank, 0, req.bytes),
        ];
    }

    fn advance(&mut self, now: Time, ctx: &mut Ctx, req: &mut Request) -> bool {
        self.phases.iter_mut().all(|p| p.advance(now, ctx, req))
    }
}

/// Ring allreduce: reduce-scatter then all-gather around the group, `2 (N - 1)` steps, the
/// tensor cut into `N` near-equal 4-byte-aligned chunks. Requests are served FIFO, one at a
/// time; every member must submit the same requests (ids, sizes, value types) in the same
/// order. `N = 1` completes at once.
pub struct RingAllreduce {
    runner: Runner<Ring>,
}

impl RingAllreduce {
    /// Member `rank` of `members` (ring order). Errors on an empty group, a duplicate
    /// endpoint, a rank outside the group, more than 16384 members, or a bad `cfg`.
    pub fn new(members: Vec<Endpoint>, rank: usize, cfg: TransportConfig) -> Result<Self, ConfigError> {
        check_ring_group(&members, rank)?;
        let local = members[rank];
        Ok(RingAllreduce { runner: Runner::new(local, cfg, Ring { members, rank, phases: Vec::new() })? })
    }

    /// Charges every reduce-scatter step with `cost` (the Rina paper's eq. (1)); default none.
    pub fn with_step_cost(mut self, cost: crate::StepCost) -> Self {
        self.runner.set_step_cost(cost);
        self
    }

    pub fn transport_stats(&self) -> crate::TransportStats {
        self.runner.transport().stats()
    }
}

host_protocol_via_runner!(RingAllreduce);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_and_align() {
        let b = chunk_bounds(0, 4 * 10 + 2, 3);
        assert_eq!(b, vec![0, 12, 24, 42]);
        let b = chunk_bounds(8, 8 + 4 * 2, 5);
        assert_eq!(b, vec![8, 8, 8, 12, 12, 16]);
    }

    #[test]
    fn reduce_scatter_and_all_gather_schedules_match() {
        // Whatever rank r receives at step s, its predecessor sends at step s; and the chunk
        // r sends at step s + 1 is the one it received at step s.
        for n in 2..7 {
            for kind in [PhaseKind::ReduceScatter, PhaseKind::AllGather] {
                let eps: Vec<Endpoint> = (0..n).map(|h| Endpoint { host: h as u32, port: 1 }).collect();
                for r in 0..n {
                    let mut me = RingPhase::new(kind, 0, &eps, r, 0, 64);
                    let mut prev = RingPhase::new(kind, 0, &eps, (r + n - 1) % n, 0, 64);
                    for s in 0..n - 1 {
                        me.step = s;
                        prev.step = s;
                        assert_eq!(me.recv_chunk(), prev.send_chunk());
                        if s + 2 < n {
                            let got = me.recv_chunk();
                            me.step = s + 1;
                            assert_eq!(me.send_chunk(), got);
                        }
                    }
                }
                if kind == PhaseKind::ReduceScatter {
                    // The last chunk received by r is the one it owns.
                    for r in 0..n {
                        let mut me = RingPhase::new(kind, 0, &eps, r, 0, 64);
                        me.step = n - 2;
                        assert_eq!(me.recv_chunk(), owned_chunk(r, n));
                    }
                }
            }
        }
    }
}
