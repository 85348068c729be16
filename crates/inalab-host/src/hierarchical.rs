//! Hierarchical (two-level) allreduce: reduce-scatter inside the rack, ring allreduce across
//! racks among the members with the same local rank on their shard, all-gather inside the
//! rack.

use crate::collective::{host_protocol_via_runner, Algorithm, Ctx, Request, Runner};
use crate::error::ensure;
use crate::ring::{check_chunk_size, check_ring_group, chunk_bounds, owned_chunk, PhaseKind, RingPhase};
use crate::transport::TransportConfig;
use crate::ConfigError;
use inalab_core::time::Time;
use inalab_core::Endpoint;

struct Hierarchical {
    /// This member's rack, in local-rank order.
    rack: Vec<Endpoint>,
    local_rank: usize,
    /// The members with this member's local rank, one per rack, in rack order.
    peers: Vec<Endpoint>,
    rack_index: usize,
    phases: Vec<RingPhase>,
}

impl Algorithm for Hierarchical {
    fn check(&self, bytes: u64) -> Result<(), String> {
        let l = self.rack.len();
        check_chunk_size(bytes, l)?;
        check_chunk_size(bytes / l as u64 + 4, self.peers.len())
    }

    fn start(&mut self, req: &Request) {
        let l = self.local_rank;
        let shard = owned_chunk(l, self.rack.len());
        let bounds = chunk_bounds(0, req.bytes, self.rack.len());
        let (a, b) = (bounds[shard], bounds[shard + 1]);
        let k = self.rack_index;
        self.phases = vec![
            RingPhase::new(PhaseKind::ReduceScatter, 0, &self.rack, l, 0, req.bytes),
            RingPhase::new(PhaseKind::ReduceScatter, 1, &self.peers, k, a, b),
            RingPhase::new(PhaseKind::AllGather, 2, &self.peers, k, a, b),
            RingPhase::new(PhaseKind::AllGather, 3, &self.rack, l, 0, req.bytes),
        ];
    }

    fn advance(&mut self, now: Time, ctx: &mut Ctx, req: &mut Request) -> bool {
        self.phases.iter_mut().all(|p| p.advance(now, ctx, req))
    }
}

/// Two-level allreduce over racks of equal size. Requests are served FIFO, one at a time;
/// every member must submit the same requests in the same order.
///
/// Restriction: all racks must have the same number of members, so that every local rank
/// has exactly one peer in every rack for the cross-rack ring.
pub struct HierarchicalAllreduce {
    runner: Runner<Hierarchical>,
}

impl HierarchicalAllreduce {
    /// `racks`: the members of each rack in local-rank order. `rank`: this member's position
    /// in the rack-major flattening of `racks` (rack `rank / L`, local rank `rank % L` with
    /// `L` members per rack). Errors on empty or unequal racks, a duplicate endpoint, a rank
    /// outside the group, more than 16384 members per rack or racks, or a bad `cfg`.
    pub fn new(racks: Vec<Vec<Endpoint>>, rank: usize, cfg: TransportConfig) -> Result<Self, ConfigError> {
        ensure!(!racks.is_empty() && !racks[0].is_empty(), "need at least one non-empty rack");
        let size = racks[0].len();
        ensure!(racks.iter().all(|r| r.len() == size), "all racks must have the same size ({size})");
        let all: Vec<Endpoint> = racks.iter().flatten().copied().collect();
        crate::collective::check_group(&all, rank)?;
        let (rack_index, local_rank) = (rank / size, rank % size);
        let rack = racks[rack_index].clone();
        let peers: Vec<Endpoint> = racks.iter().map(|r| r[local_rank]).collect();
        check_ring_group(&rack, local_rank)?;
        check_ring_group(&peers, rack_index)?;
        let algo = Hierarchical { rack, local_rank, peers, rack_index, phases: Vec::new() };
        Ok(HierarchicalAllreduce { runner: Runner::new(all[rank], cfg, algo)? })
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

host_protocol_via_runner!(HierarchicalAllreduce);
