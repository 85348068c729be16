//! Host noise for the schemes of Canary's evaluation (Fig. 11, spec A28): the same three
//! parameters and the same draws for Canary and the static trees it is compared with, so a
//! figure that varies noise varies it for both.

use crate::plan::{Param, Range};
use inalab_core::HostProtocol;
use inalab_host::{NoiseConfig, NoiseMode, Noisy};
use serde::{Deserialize, Serialize};

/// What a noise draw does (`ina.noise_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Stall,
    Packet,
}

pub const PARAMS: [Param; 3] = [
    Param { name: "ina.noise_prob", unit: "", doc: "Host noise (Canary Fig. 11): as each packet leaves, with this probability, the host is disturbed for ina.noise (see ina.noise_mode); drawn from a stream seeded by the job and rank, the same for canary and static_tree jobs.", range: Range::Float { min: 0.0, max: 1.0 } },
    Param { name: "ina.noise_ps", unit: "ps", doc: "How long a noise draw disturbs the host (Canary §5.2.5: 1 us).", range: Range::TIME_OR_ZERO },
    Param { name: "ina.noise_mode", unit: "", doc: "What a noise draw does: \"stall\" = the host's NIC sends nothing for ina.noise after the packet, so every later packet shifts too; \"packet\" = that packet alone waits ina.noise beside the NIC, which goes on with the packets behind it (the paper's \"delays 10 % of the packets by 1 us\").", range: Range::Choice(&["stall", "packet"]) },
];

/// `proto` with the noise of rank `rank` of job `job`, or `proto` itself without noise.
pub fn wrap(proto: Box<dyn HostProtocol>, prob: f64, delay_ps: u64, mode: Mode, job: u32, rank: usize) -> Box<dyn HostProtocol> {
    if prob <= 0.0 {
        return proto;
    }
    // Each host's own stream (the seeds Canary's host drew from when it stalled itself).
    let job_seed = inalab_core::splitmix64(job as u64 ^ 0xC0FF_EE00);
    let seed = inalab_core::splitmix64(job_seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mode = match mode {
        Mode::Stall => NoiseMode::Stall,
        Mode::Packet => NoiseMode::Packet,
    };
    Box::new(Noisy::new(proto, NoiseConfig { mode, prob, delay_ps, seed }))
}
