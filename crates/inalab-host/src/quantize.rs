//! Quantization as a host-side layer: switches sum i32, applications hand in float32. The
//! [`Quantized`] wrapper sits between an application and an integer-summing INA protocol and
//! converts on the way in and out, so both drivers run the same round trips and the same
//! conversion errors: the simulator (which also carries i32 or no values at all) and the UDP
//! runtime's worker library.
//!
//! - [`Quantization::FixedPoint`] (ATP): one scale for every value. The protocol converts
//!   (ATP's worker, `AtpConfig::scale`), because its overflow fallback (§3.8) needs the
//!   original floats: this layer hands them over unchanged and rejects only NaN and
//!   infinities, which have no fixed-point form and no float sum. A protocol that sums i32
//!   and has no fallback (DSA, Canary, static trees, Rina, GRID) is wrapped by
//!   [`Quantized::converting`] instead: this layer converts (`round(v x scale)`), sends a
//!   value with no place inside the range as a rail (`inalab_core::rail`), and converts the
//!   sum back, failing the call on every worker where the sum is at a rail.
//! - [`Quantization::AgreedExponent`] (SwitchML, with the tensor as the block): per tensor the
//!   workers first agree on the largest binary exponent of its values, with one extra
//!   allreduce of a `world`-long i32 vector in which each worker writes `e + 129` in its own
//!   slot (the sum holds every worker's exponent, each takes the maximum), then send the values
//!   with [`quant::switchml_scale`]. The exponent round is made for every tensor, with or
//!   without values (metadata-mode simulations model its round trip too). Rounds run one at a
//!   time, in submission order, so every worker submits exponent and data requests to the
//!   protocol in the same order. The values then go to the protocol in pieces of
//!   [`PIECE_VALUES`], each converted only when the protocol has nothing left to send (its
//!   window is full or its data ran out), and each piece's sum is converted back as it arrives:
//!   the conversions overlap the network instead of forming two serial passes over the tensor,
//!   and touch a piece while it is in cache. The next tensor's exponent round starts once
//!   every piece of this one is submitted, so the order of requests stays the same on every
//!   worker.
//! - [`Quantization::None`]: values travel as they are.
//!
//! Values already given as i32 (the simulator's payload mode) are taken as quantized and pass
//! through; results then come back as i32.

use crate::quant::{all_finite, finite_block_exponent, from_fixed, from_fixed_into, switchml_scale, switchml_to_fixed, to_fixed_railed, ZERO_BLOCK_EXPONENT};
use inalab_core::rail::{first_rail, RAIL};
use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload, TensorAttrs, Time};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How a scheme's worker turns float32 tensors into what its packets carry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quantization {
    /// Values travel as they are (host-only collectives).
    None,
    /// Fixed point with one scale for every value (ATP).
    FixedPoint { scale: f64 },
    /// Fixed point with an exponent the workers agree on per tensor before sending (SwitchML).
    AgreedExponent,
}

impl Quantization {
    /// Largest absolute error of one summed value over `world` workers whose inputs are at
    /// most `max_abs` in magnitude (docs/runtime.md): fixed point `n / (2 scale)`, an agreed
    /// exponent `n^2 2^e / (2^31 - 1)` with `max_abs < 2^e`, none 0; each plus the float32
    /// rounding of the result, `n x eps x max_abs`. `inalab.runtime.quantization_bound` is
    /// this function.
    pub fn error_bound(&self, world: usize, max_abs: f64) -> f64 {
        let n = world as f64;
        let f32_rounding = f32::EPSILON as f64 * n * max_abs.max(1e-30);
        f32_rounding
            + match *self {
                Quantization::None => 0.0,
                Quantization::FixedPoint { scale } => n / (2.0 * scale),
                Quantization::AgreedExponent => {
                    // frexp's exponent, exactly (max_abs = m 2^e, 0.5 <= m < 1): from the
                    // bits of a normal f64 (every float32 magnitude is one).
                    let e = if max_abs > 0.0 { ((max_abs.to_bits() >> 52) & 0x7ff) as i32 - 1022 } else { -128 };
                    n * n * 2f64.powi(e) / (i32::MAX as f64)
                }
            }
    }
}

/// Offset of an exponent in the agreement vector, so that every exponent (-149..=128) is
/// positive (1..=278) and a zero slot (another worker's) loses the maximum.
const EXP_BIAS: i32 = 1 - ZERO_BLOCK_EXPONENT as i32;
/// What a worker writes in its slot when its tensor has a value with no fixed-point form (NaN,
/// infinity): every worker sees it in the sum and rejects the tensor, so all stay in step.
const REJECT_MARK: i32 = -1;

/// A tensor's length as a slot of a size vector: one more than the length (a 0 is a rank that
/// wrote nothing: one that left a scheme that sums on without it, as Rina does), exact below
/// `i32::MAX - 2` values (8 GiB of float32), never a rail.
fn length_slot(len: usize) -> i32 {
    len.min(i32::MAX as usize - 2) as i32 + 1
}

/// Why a tensor is refused when the ranks' lengths differ (`lens`: the summed size vector, each
/// rank's [`length_slot`] in its own place), if they do. `mine`: this rank's length. A rank
/// that wrote nothing (left the job) disagrees with no one.
fn size_disagreement(rank: usize, mine: usize, lens: &[i32]) -> Option<String> {
    if lens.iter().all(|&l| l == 0 || l == length_slot(mine)) {
        return None;
    }
    let sizes: Vec<String> = lens
        .iter()
        .enumerate()
        .map(|(r, &l)| match l {
            _ if r == rank => format!("rank {r} {mine}"),
            0 => format!("rank {r} gone"),
            l => format!("rank {r} {}", l - 1),
        })
        .collect();
    Some(format!(
        "the ranks disagree on this tensor's size (values per rank: {}): every rank must allreduce the same sizes in the same order",
        sizes.join(", ")
    ))
}

/// Why this worker's value `x` at index `i` fails the call (named on its own worker).
fn non_finite(rank: usize, i: usize, x: f32) -> String {
    // Debug: 3e38 rather than 39 digits.
    format!("rank {rank}'s value {i} is {x:?}, which has no fixed-point form")
}

/// Largest magnitude a fixed-point value or sum may have at `scale` (`inalab_core::rail`).
fn fixed_range(scale: f64) -> f64 {
    (i32::MAX as f64 - 1.5) / scale
}

/// Why the value at `i` of this worker's tensor went out as a rail ([`to_fixed_railed`]).
fn out_of_range(rank: usize, i: usize, x: f32, scale: f64) -> String {
    if !x.is_finite() {
        return non_finite(rank, i, x);
    }
    format!("rank {rank}'s value {i} is {x:?}, beyond the fixed-point range +/-{:.6} at scale {scale} (this scheme has no overflow fallback)", fixed_range(scale))
}

/// Why a fixed-point sum with a rail at `i` is no result, on a worker whose own value there
/// was fine: the value or the sum another worker's input made of it.
fn railed_sum(i: usize, at: i32, scale: Option<f64>) -> String {
    let range = scale.map_or(String::new(), |s| format!(" (+/-{:.6} at scale {s})", fixed_range(s)));
    let sign = if at == RAIL { "+" } else { "-" };
    format!(
        "value {i} of the sum is out of the fixed-point range{range}: saturated at its {sign} end, because another rank's value there is NaN, infinite or out of range, or the sum left the range (this scheme has no overflow fallback)"
    )
}

/// Why a quantized sum is no result, if a value of `sum` (at `offset` in the tensor) is NaN or
/// infinite: checked in one vectorized pass, located only when there is one.
fn non_finite_sum(sum: &[f32], offset: usize) -> Option<String> {
    if all_finite(sum) {
        return None;
    }
    let i = sum.iter().position(|x| !x.is_finite()).expect("a non-finite value is there");
    Some(format!(
        "value {} of the sum is {}: another worker's value there has no fixed-point form (NaN or infinity), or the sum exceeds float32",
        offset + i,
        sum[i]
    ))
}

/// Values per piece of an agreed-exponent tensor (256 KiB as i32): a multiple of every
/// values-per-packet a SwitchML job uses by default (32, 64, 2,048), so pieces fill packets.
pub const PIECE_VALUES: usize = 65_536;

/// A float32 tensor sent in pieces at one scale, and its sum as it comes back.
struct Pieces {
    outer: u64,
    attrs: TensorAttrs,
    /// The tensor, then its sum: a piece's values are converted and submitted before its sum
    /// comes back into their place (no second tensor-sized buffer to allocate and zero).
    values: Vec<f32>,
    /// The world size and exponent the values are converted with.
    n: u32,
    e_max: i16,
    /// Values converted and submitted so far.
    sent: usize,
    /// Pieces submitted whose sum has not come back.
    open: usize,
    /// Why the sum is no result (a non-finite value in it), if it is not.
    broken: Option<String>,
}

impl Pieces {
    fn done_sending(&self) -> bool {
        self.sent == self.values.len()
    }
}

/// What an inner request is for.
enum Stage {
    /// The exponent agreement of outer request `outer`; its data waits here.
    Exponent { outer: u64, bytes: u64, data: Option<Payload>, attrs: TensorAttrs },
    /// Outer request `outer`'s values; `scale` converts the i32 sum back to f32 (`None`:
    /// hand the result back as it comes). `bad`: this worker's input had a value with no
    /// fixed-point form (why, naming it), sent anyway so the other workers are not left waiting.
    Data { outer: u64, scale: Option<f64>, bad: Option<String> },
    /// Values `[start, start + len)` of the tensor in `pieces` under outer request `outer`.
    Piece { outer: u64, start: usize },
    /// Any other request, passed through under an id of the wrapper's own.
    Pass { outer: u64 },
    /// Fixed point: the size round of outer request `outer` (`len` values here), a
    /// `world`-long vector in which each rank writes its tensor's length in its own slot,
    /// submitted with the data and resolved before the data's result is handed out.
    Sizes { outer: u64, len: usize },
}

/// A [`HostProtocol`] wrapper that quantizes. See the module docs.
pub struct Quantized {
    inner: Box<dyn HostProtocol>,
    q: Quantization,
    rank: usize,
    world: usize,
    /// AgreedExponent: requests waiting for their exponent round.
    waiting: VecDeque<(u64, u64, Option<Payload>, TensorAttrs)>,
    exponent_busy: bool,
    stages: BTreeMap<u64, Stage>,
    next_inner: u64,
    events: VecDeque<HostEvent>,
    /// FixedPoint: this layer converts floats (the protocol sums i32 only).
    converts: bool,
    /// AgreedExponent: tensors going out (or coming back) in pieces, by outer id.
    pieces: BTreeMap<u64, Pieces>,
    /// FixedPoint: outer requests whose size round is out, with their data's outcome when it
    /// came first (held until the sizes are known to agree).
    size_pending: BTreeMap<u64, Option<HostEvent>>,
    /// Outer requests already answered while one of their inner requests is still out: its
    /// outcome is dropped when it comes.
    answered: BTreeSet<u64>,
    /// Why every later call fails: the ranks disagreed on a tensor's size after its data went
    /// out, so their protocols are out of step.
    out_of_step: Option<String>,
}

impl Quantized {
    /// Wraps worker `rank` of `world` (the exponent vector has a slot per worker).
    pub fn new(inner: Box<dyn HostProtocol>, q: Quantization, rank: usize, world: usize) -> Self {
        Quantized {
            inner,
            q,
            rank,
            world,
            waiting: VecDeque::new(),
            exponent_busy: false,
            stages: BTreeMap::new(),
            next_inner: 0,
            events: VecDeque::new(),
            converts: false,
            pieces: BTreeMap::new(),
            size_pending: BTreeMap::new(),
            answered: BTreeSet::new(),
            out_of_step: None,
        }
    }

    /// Fixed point at `scale` for a protocol that carries only i32 and has no overflow
    /// fallback (DSA, Canary, static trees, Rina, GRID): float32 tensors are converted here
    /// (`round(v x scale)`) and the i32 sums back (`x / scale`); i32 tensors (the simulator's
    /// payload mode) pass through. A value with no place strictly inside the range (NaN, an
    /// infinity, `|v| >= (2^31 - 1.5) / scale`) is sent as a rail (`inalab_core::rail`) so
    /// that every worker's sum has the rail there, as has a sum that left the range (the
    /// switches and servers saturate stickily): every worker fails the call, the value's own
    /// naming its rank, index and value, the others the index. Never a wrapped sum.
    pub fn converting(inner: Box<dyn HostProtocol>, scale: f64, rank: usize, world: usize) -> Self {
        Quantized { converts: true, ..Quantized::new(inner, Quantization::FixedPoint { scale }, rank, world) }
    }

    fn submit_inner(&mut self, now: Time, bytes: u64, data: Option<Payload>, attrs: TensorAttrs, stage: Stage) {
        self.next_inner += 1;
        let id = self.next_inner;
        self.stages.insert(id, stage);
        self.inner.submit(now, AppRequest::Allreduce { id, bytes, data, attrs });
    }

    /// Rejections reach the application as events (the simulator fails the job, the client
    /// returns the error); no counter, so the protocol's counters stay the inner one's.
    fn reject(&mut self, id: u64, reason: String) {
        self.events.push_back(HostEvent::Rejected { id, reason });
    }

    /// Fixed point: the protocol converts floats itself (and falls back to them on overflow).
    /// A value with no fixed-point form (NaN, infinity) still goes out, through the fallback,
    /// so every worker's call ends: the non-finite sum fails the tensor on all of them.
    ///
    /// A float tensor's data goes with a size round (the size vector first): the ranks learn
    /// whether they agree on its length, and its result is handed out only once they do.
    fn send_fixed(&mut self, now: Time, id: u64, bytes: u64, data: Option<Payload>, attrs: TensorAttrs) {
        if let Some(reason) = &self.out_of_step {
            return self.reject(id, reason.clone());
        }
        if let (true, Quantization::FixedPoint { scale }) = (self.converts, self.q) {
            if !(scale.is_finite() && scale > 0.0) {
                return self.reject(id, format!("the fixed-point scale must be a positive number, got {scale}"));
            }
        }
        if let Some(Payload::F32(v)) = &data {
            // Pipelined with the data rather than before it: no extra round trip per tensor.
            // Only with float values (the runtime, the simulator's float payloads), so that
            // metadata and integer simulations send what they always did.
            let mut sizes = vec![0i32; self.world];
            sizes[self.rank] = length_slot(v.len());
            self.size_pending.insert(id, None);
            self.submit_inner(now, self.world as u64 * 4, Some(Payload::I32(sizes)), attrs, Stage::Sizes { outer: id, len: v.len() });
        }
        if let (true, Quantization::FixedPoint { scale }, Some(Payload::F32(v))) = (self.converts, self.q, &data) {
            return self.convert_fixed(now, id, bytes, v, scale, attrs);
        }
        let bad = match &data {
            Some(Payload::F32(v)) if !all_finite(v) => v.iter().position(|x| !x.is_finite()).map(|i| non_finite(self.rank, i, v[i])),
            _ => None,
        };
        self.submit_inner(now, bytes, data, attrs, Stage::Data { outer: id, scale: None, bad });
    }

    /// [`Quantized::converting`]: the floats as i32 at `scale`, the sum back as floats.
    fn convert_fixed(&mut self, now: Time, id: u64, bytes: u64, v: &[f32], scale: f64, attrs: TensorAttrs) {
        let (fixed, first) = to_fixed_railed(v, scale).expect("send_fixed checked the scale");
        // Sent with the rail in its place: every worker's sum has it and fails there.
        let bad = first.map(|i| out_of_range(self.rank, i, v[i], scale));
        self.submit_inner(now, bytes, Some(Payload::I32(fixed)), attrs, Stage::Data { outer: id, scale: Some(scale), bad });
    }

    /// Converts and submits the next piece of the oldest tensor with values left to send;
    /// whether there was one. The last piece of a tensor lets the next exponent round start.
    fn send_piece(&mut self, now: Time) -> bool {
        let Some(p) = self.pieces.values_mut().find(|p| !p.done_sending()) else { return false };
        let (outer, start) = (p.outer, p.sent);
        let end = (start + PIECE_VALUES).min(p.values.len());
        let fixed = switchml_to_fixed(&p.values[start..end], p.n, p.e_max).expect("checked finite by the exponent round, n > 0");
        p.sent = end;
        p.open += 1;
        let (attrs, last) = (p.attrs, p.done_sending());
        self.submit_inner(now, (end - start) as u64 * 4, Some(Payload::I32(fixed.values)), attrs, Stage::Piece { outer, start });
        if last {
            self.start_exponent_round(now);
        }
        true
    }

    /// A piece's sum came back: converted into the tensor's sum; the last one finishes it.
    fn piece_done(&mut self, outer: u64, start: usize, data: Option<Payload>) {
        let Some(p) = self.pieces.get_mut(&outer) else { return };
        p.open -= 1;
        match data {
            // Only into a piece already sent (its values are no longer needed), and whole.
            Some(Payload::I32(sum)) if start + sum.len() <= p.sent && sum.len() == PIECE_VALUES.min(p.values.len().saturating_sub(start)) => {
                let out = &mut p.values[start..start + sum.len()];
                from_fixed_into(&sum, switchml_scale(p.n, p.e_max), out);
                if p.broken.is_none() {
                    p.broken = non_finite_sum(out, start);
                }
            }
            _ => p.broken = Some(format!("the sum of the piece at value {start} came back without its int32 values, or short of them")),
        }
        if p.open == 0 && p.done_sending() {
            let p = self.pieces.remove(&outer).expect("present");
            match p.broken {
                Some(reason) => self.reject(outer, reason),
                None => self.events.push_back(HostEvent::Done { id: outer, data: Some(Payload::F32(p.values)) }),
            }
        }
    }

    /// Agreed exponent: starts the next waiting request's exponent round, if none runs and
    /// every piece of the tensors before it went out.
    fn start_exponent_round(&mut self, now: Time) {
        while !self.exponent_busy && self.pieces.values().all(Pieces::done_sending) {
            let Some((id, bytes, data, attrs)) = self.waiting.pop_front() else { return };
            let mine = match &data {
                Some(Payload::F32(v)) => finite_block_exponent(v).map_or(REJECT_MARK, |e| e as i32 + EXP_BIAS),
                _ => EXP_BIAS,
            };
            // A float tensor's vector has a second half, each rank's tensor length in its own
            // slot: ranks that disagree on a tensor's size (or order) all find out here,
            // before any data is sent, and stay in step. Integer and metadata rounds (the
            // simulator's) keep their size.
            let len = match &data {
                Some(Payload::F32(_)) => 2 * self.world,
                _ => self.world,
            };
            let exps = data.as_ref().map(|d| {
                let mut e = vec![0i32; len];
                e[self.rank] = mine;
                if len > self.world {
                    e[self.world + self.rank] = length_slot(d.len());
                }
                Payload::I32(e)
            });
            self.exponent_busy = true;
            self.submit_inner(now, len as u64 * 4, exps, attrs, Stage::Exponent { outer: id, bytes, data, attrs });
        }
    }

    /// What a data round's sum (`data`) makes of outer request `outer`.
    fn data_outcome(&self, outer: u64, scale: Option<f64>, bad: Option<String>, data: Option<Payload>) -> HostEvent {
        // A rail in a fixed-point sum: a worker's value had no place in the range, or the sum
        // left it. Every worker sees it; the value's own names it.
        if let (true, Some(Payload::I32(sum))) = (self.converts, &data) {
            if let Some(i) = first_rail(sum) {
                return HostEvent::Rejected { id: outer, reason: bad.unwrap_or_else(|| railed_sum(i, sum[i], scale)) };
            }
        }
        let data = match (scale, data) {
            (Some(s), Some(Payload::I32(sum))) => Some(Payload::F32(from_fixed(&sum, s))),
            (_, d) => d,
        };
        // A quantized tensor's non-finite sum is no result: the value's own worker says which
        // input was at fault, the others where the sum broke. (Without quantization NaN
        // propagates, as in gloo and NCCL.)
        if let (Some(Payload::F32(v)), false) = (&data, self.q == Quantization::None) {
            if let Some(broken) = non_finite_sum(v, 0) {
                return HostEvent::Rejected { id: outer, reason: bad.unwrap_or(broken) };
            }
        }
        HostEvent::Done { id: outer, data }
    }

    /// Hands outer request `outer`'s outcome out, or holds it while its size round is out; drops
    /// it when the size round already answered the request.
    fn answer(&mut self, outer: u64, mut ev: HostEvent) {
        if self.answered.remove(&outer) {
            return;
        }
        // A call made before the ranks were found out of step, whose data met other ranks'
        // data of other calls: no result.
        if let Some(reason) = &self.out_of_step {
            ev = HostEvent::Rejected { id: outer, reason: reason.clone() };
        }
        match self.size_pending.get_mut(&outer) {
            Some(held) => *held = Some(ev),
            None => self.events.push_back(ev),
        }
    }

    /// Turns the inner protocol's events into the application's, starting data rounds.
    fn pump(&mut self, now: Time) {
        while let Some(ev) = self.inner.poll_event() {
            let (id, data) = match ev {
                HostEvent::Done { id, data } => (id, data),
                HostEvent::Failed { id, reason } | HostEvent::Rejected { id, reason } => {
                    let Some(stage) = self.stages.remove(&id) else { continue };
                    let outer = match stage {
                        Stage::Exponent { outer, .. } => {
                            // The next tensor's round must not wait for this one forever.
                            self.exponent_busy = false;
                            self.start_exponent_round(now);
                            outer
                        }
                        Stage::Piece { outer, .. } => {
                            // The tensor fails once; its other pieces' sums are ignored and
                            // the next tensor's round may start.
                            if self.pieces.remove(&outer).is_none() {
                                continue;
                            }
                            self.start_exponent_round(now);
                            outer
                        }
                        Stage::Pass { outer } => outer,
                        Stage::Data { outer, .. } => {
                            self.answer(outer, HostEvent::Failed { id: outer, reason });
                            continue;
                        }
                        Stage::Sizes { outer, .. } => {
                            // Sizes that cannot be checked: the call fails, once.
                            if self.answered.remove(&outer) {
                                continue;
                            }
                            if self.size_pending.remove(&outer).is_some_and(|held| held.is_none()) {
                                self.answered.insert(outer);
                            }
                            outer
                        }
                    };
                    self.events.push_back(HostEvent::Failed { id: outer, reason });
                    continue;
                }
                received @ HostEvent::Received { .. } => {
                    self.events.push_back(received);
                    continue;
                }
            };
            match self.stages.remove(&id) {
                Some(Stage::Exponent { outer, bytes, data: values, attrs }) => {
                    self.exponent_busy = false;
                    // Exponents first, then (float tensors) each rank's length.
                    let (exps, lens) = match (&data, &values) {
                        (Some(Payload::I32(sum)), Some(Payload::F32(_))) if sum.len() == 2 * self.world => (&sum[..self.world], Some(&sum[self.world..])),
                        (Some(Payload::I32(sum)), Some(Payload::F32(_))) => {
                            self.reject(outer, format!("the exponent round came back with {} values instead of {}", sum.len(), 2 * self.world));
                            self.start_exponent_round(now);
                            continue;
                        }
                        (Some(Payload::I32(sum)), _) => (&sum[..], None),
                        _ => (&[][..], None),
                    };
                    // Ranks that disagree on the tensor's size all drop it (no data round).
                    if let (Some(lens), Some(v)) = (lens, &values) {
                        if let Some(reason) = size_disagreement(self.rank, v.len(), lens) {
                            self.reject(outer, reason);
                            self.start_exponent_round(now);
                            continue;
                        }
                    }
                    // A worker that cannot carry its tensor marked its slot: every worker drops
                    // the tensor (no data round), naming who and, on that worker, the value.
                    let marked = exps.iter().position(|&x| x == REJECT_MARK);
                    if let Some(r) = marked {
                        let reason = match &values {
                            Some(Payload::F32(v)) if r == self.rank => {
                                let i = v.iter().position(|x| !x.is_finite()).expect("marked for a non-finite value");
                                non_finite(self.rank, i, v[i])
                            }
                            _ => format!("rank {r}'s tensor has a value with no fixed-point form (NaN or infinity)"),
                        };
                        self.reject(outer, reason);
                        self.start_exponent_round(now);
                        continue;
                    }
                    match values {
                        Some(Payload::F32(v)) if v.is_empty() => {
                            self.events.push_back(HostEvent::Done { id: outer, data: Some(Payload::F32(v)) });
                            self.start_exponent_round(now);
                        }
                        Some(Payload::F32(v)) => {
                            let e_max = match exps {
                                [] => ZERO_BLOCK_EXPONENT,
                                e => (e.iter().copied().max().unwrap_or(EXP_BIAS) - EXP_BIAS).clamp(ZERO_BLOCK_EXPONENT as i32, 128) as i16,
                            };
                            let p = Pieces { outer, attrs, values: v, n: self.world as u32, e_max, sent: 0, open: 0, broken: None };
                            self.pieces.insert(outer, p);
                            // The first piece now; the others when the protocol asks for more.
                            self.send_piece(now);
                        }
                        other => {
                            self.submit_inner(now, bytes, other, attrs, Stage::Data { outer, scale: None, bad: None });
                            self.start_exponent_round(now);
                        }
                    }
                }
                Some(Stage::Data { outer, scale, bad }) => {
                    let ev = self.data_outcome(outer, scale, bad, data);
                    self.answer(outer, ev);
                }
                Some(Stage::Sizes { outer, len }) => {
                    if self.answered.remove(&outer) {
                        continue;
                    }
                    let held = self.size_pending.remove(&outer).flatten();
                    let disagreement = match &data {
                        _ if self.out_of_step.is_some() => self.out_of_step.clone(),
                        Some(Payload::I32(lens)) if lens.len() == self.world => size_disagreement(self.rank, len, lens).map(|reason| {
                            // The data went out with the sizes: the ranks' protocols are out of
                            // step from here on, so this call's successors fail too.
                            let reason = format!("{reason}; the ranks' protocols are out of step from this call on, so every later call fails too");
                            self.out_of_step = Some(reason.clone());
                            reason
                        }),
                        _ => Some(format!("the size round came back without its {} values", self.world)),
                    };
                    match disagreement {
                        Some(reason) => {
                            if held.is_none() {
                                self.answered.insert(outer);
                            }
                            self.reject(outer, reason);
                        }
                        None => self.events.extend(held),
                    }
                }
                Some(Stage::Piece { outer, start }) => self.piece_done(outer, start, data),
                Some(Stage::Pass { outer }) => self.events.push_back(HostEvent::Done { id: outer, data }),
                None => {}
            }
        }
    }
}

impl HostProtocol for Quantized {
    fn endpoint(&self) -> Endpoint {
        self.inner.endpoint()
    }

    fn submit(&mut self, now: Time, req: AppRequest) {
        match (req, self.q) {
            (AppRequest::Allreduce { id, bytes, data, attrs }, Quantization::FixedPoint { .. }) => self.send_fixed(now, id, bytes, data, attrs),
            (AppRequest::Allreduce { id, bytes, data, attrs }, Quantization::AgreedExponent) => {
                self.waiting.push_back((id, bytes, data, attrs));
                self.start_exponent_round(now);
            }
            (AppRequest::Allreduce { id, bytes, data, attrs }, Quantization::None) => self.submit_inner(now, bytes, data, attrs, Stage::Data { outer: id, scale: None, bad: None }),
            (AppRequest::Send { id, dst, bytes }, _) => {
                self.next_inner += 1;
                let inner = self.next_inner;
                self.stages.insert(inner, Stage::Pass { outer: id });
                self.inner.submit(now, AppRequest::Send { id: inner, dst, bytes });
            }
        }
        self.pump(now);
    }

    fn handle_packet(&mut self, now: Time, pkt: Packet) {
        self.inner.handle_packet(now, pkt);
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Time) {
        self.inner.handle_timeout(now);
        self.pump(now);
    }

    /// The protocol's next packet; when it has none, the next piece of a tensor is converted
    /// and handed to it first.
    fn poll_transmit(&mut self, now: Time) -> Option<Packet> {
        loop {
            if let Some(p) = self.inner.poll_transmit(now) {
                return Some(p);
            }
            if !self.send_piece(now) {
                return None;
            }
            // The new piece may finish an exponent round's wait; its events come out here.
            self.pump(now);
        }
    }

    /// None once the ranks are out of step: every call has failed, nothing the protocol would
    /// resend can become a result, so it stops resending (a worker closes at once instead of
    /// lingering on retransmissions no peer will ever answer).
    fn poll_timeout(&self) -> Option<Time> {
        match self.out_of_step {
            Some(_) => None,
            None => self.inner.poll_timeout(),
        }
    }

    fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn peer_failed(&mut self, now: Time, rank: u32) -> bool {
        self.inner.peer_failed(now, rank)
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::{Quantization, Quantized};
    use inalab_core::{AppRequest, Endpoint, HostEvent, HostProtocol, Packet, Payload, TensorAttrs, Time};
    use std::collections::VecDeque;

    /// An i32-only protocol whose "network" doubles each value (two workers with equal data).
    struct Doubler {
        /// What it was asked to sum, in submission order (shared with the test).
        seen: std::sync::Arc<std::sync::Mutex<Vec<Option<Payload>>>>,
        events: VecDeque<HostEvent>,
        /// What the network multiplies by: 2 by default; 1 is a one-worker job.
        times: i32,
        /// The job's workers: a request of `world` or `2 world` values is an agreement vector
        /// (exponents, sizes), answered as if every worker wrote what this one did in its own
        /// slot; only other requests are data (the tests give them other lengths).
        world: usize,
        /// Return data sums one value short (a garbled result).
        short: bool,
        /// Values per request, in submission order (shared with the test).
        sizes: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl Default for Doubler {
        fn default() -> Self {
            Doubler { seen: Default::default(), events: VecDeque::new(), times: 2, world: 2, short: false, sizes: Default::default() }
        }
    }

    impl HostProtocol for Doubler {
        fn endpoint(&self) -> Endpoint {
            Endpoint { host: 1, port: 1 }
        }
        fn submit(&mut self, _now: Time, req: AppRequest) {
            let AppRequest::Allreduce { id, data, .. } = req else { return };
            let sum = match &data {
                Some(Payload::I32(v)) if v.len() == self.world || v.len() == 2 * self.world => {
                    Some(Payload::I32(v.chunks(self.world).flat_map(|half| vec![half.iter().copied().find(|&x| x != 0).unwrap_or(0); half.len()]).collect()))
                }
                // A switch's sticky saturation (inalab_core::rail): a rail stays, a product
                // beyond the range becomes one.
                Some(Payload::I32(v)) => Some(Payload::I32(
                    v.iter()
                        .map(|&x| if inalab_core::rail::is_rail(x) { x } else { (x as i64 * self.times as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32 })
                        .take(v.len() - self.short as usize)
                        .collect(),
                )),
                Some(_) => return self.events.push_back(HostEvent::Rejected { id, reason: "i32 only".into() }),
                None => None,
            };
            self.sizes.lock().unwrap().push(data.as_ref().map_or(0, Payload::len));
            self.seen.lock().unwrap().push(data);
            self.events.push_back(HostEvent::Done { id, data: sum });
        }
        fn handle_packet(&mut self, _now: Time, _pkt: Packet) {}
        fn handle_timeout(&mut self, _now: Time) {}
        fn poll_transmit(&mut self, _now: Time) -> Option<Packet> {
            None
        }
        fn poll_timeout(&self) -> Option<Time> {
            None
        }
        fn poll_event(&mut self) -> Option<HostEvent> {
            self.events.pop_front()
        }
        fn counters(&self) -> Vec<(&'static str, u64)> {
            vec![]
        }
    }

    fn allreduce(q: &mut Quantized, id: u64, data: Payload) -> HostEvent {
        q.submit(0, AppRequest::Allreduce { id, bytes: 0, data: Some(data), attrs: TensorAttrs::default() });
        q.poll_event().expect("an event")
    }

    #[test]
    fn a_converting_layer_sends_fixed_point_and_returns_floats() {
        let mut q = Quantized::converting(Box::new(Doubler::default()), 1e8, 0, 2);
        match allreduce(&mut q, 7, Payload::F32(vec![0.25, -1.5, 3e-8])) {
            HostEvent::Done { id: 7, data: Some(Payload::F32(v)) } => assert_eq!(v, vec![0.5, -3.0, 6e-8]),
            e => panic!("{e:?}"),
        }
        // i32 (the simulator's payload mode) passes through both ways.
        match allreduce(&mut q, 8, Payload::I32(vec![5, -6, 7])) {
            HostEvent::Done { id: 8, data: Some(Payload::I32(v)) } => assert_eq!(v, vec![10, -12, 14]),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_value_without_a_fixed_point_form_fails_its_own_call_but_is_sent_as_a_rail() {
        let inner = Box::new(Doubler::default());
        let (sizes, seen) = (inner.sizes.clone(), inner.seen.clone());
        let mut q = Quantized::converting(inner, 1e8, 0, 2);
        for (id, bad, says) in [(1, f32::NAN, "NaN, which has no fixed-point form"), (2, 30.0, "30.0, beyond the fixed-point range +/-21.474836"), (3, -f32::INFINITY, "-inf")] {
            match allreduce(&mut q, id, Payload::F32(vec![1.0, bad, 0.5])) {
                HostEvent::Rejected { id: got, reason } => assert!(got == id && reason.contains("rank 0's value 1 is") && reason.contains(says), "{reason}"),
                e => panic!("{e:?}"),
            }
        }
        assert_eq!(*sizes.lock().unwrap(), vec![2, 3, 2, 3, 2, 3], "each tensor is still sent, after its size round");
        // The rails went out where the bad values were.
        let rails: Vec<Option<i32>> = seen.lock().unwrap().iter().skip(1).step_by(2).map(|d| match d {
            Some(Payload::I32(v)) => Some(v[1]),
            _ => None,
        }).collect();
        assert_eq!(rails, [Some(i32::MAX), Some(i32::MAX), Some(i32::MIN)]);
    }

    #[test]
    fn a_sum_at_a_rail_fails_the_call_of_a_worker_whose_values_were_fine() {
        // 15 + 15 at scale 1e8 leaves the range: the switch saturates (here: doubles to the
        // rail), and the call fails where it wrapped to -12.95 before.
        let mut q = Quantized::converting(Box::new(Doubler::default()), 1e8, 1, 2);
        match allreduce(&mut q, 4, Payload::F32(vec![15.0, -15.0, 1.0])) {
            HostEvent::Rejected { id: 4, reason } => assert!(reason.starts_with("value 0 of the sum is out of the fixed-point range (+/-21.474836 at scale 100000000): saturated at its + end"), "{reason}"),
            e => panic!("{e:?}"),
        }
        // The simulator's i32 payloads too: a sum at a rail is no result.
        match allreduce(&mut q, 5, Payload::I32(vec![1, i32::MIN / 2 - 1, 0])) {
            HostEvent::Rejected { id: 5, reason } => assert!(reason.starts_with("value 1 of the sum is out of the fixed-point range: saturated at its - end"), "{reason}"),
            e => panic!("{e:?}"),
        }
    }

    /// An agreed-exponent tensor goes to the protocol in pieces, the later ones only when the
    /// protocol asks for packets; the next tensor's exponent round follows the last piece, and
    /// the sums come back whole, within the bound. The "network" negates the data, so a
    /// piece whose sum never came back into the tensor's buffer would show.
    #[test]
    fn an_agreed_exponent_tensor_goes_out_in_pieces_and_comes_back_whole() {
        let inner = Doubler { times: -1, world: 1, ..Doubler::default() };
        let sizes = inner.sizes.clone();
        let mut q = Quantized::new(Box::new(inner), Quantization::AgreedExponent, 0, 1);
        let n = 2 * super::PIECE_VALUES + 3;
        let a: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let b = vec![0.5f32; 10];
        for (id, v) in [(1, &a), (2, &b)] {
            q.submit(0, AppRequest::Allreduce { id, bytes: 4 * v.len() as u64, data: Some(Payload::F32(v.clone())), attrs: TensorAttrs::default() });
        }
        // The exponent round and the first piece only: no result yet, tensor 2 not started.
        assert_eq!(*sizes.lock().unwrap(), vec![2, super::PIECE_VALUES]);
        assert!(q.poll_event().is_none());
        // The protocol has nothing to send: the other pieces go, then tensor 2.
        assert!(q.poll_transmit(0).is_none(), "the fake protocol sends nothing");
        assert_eq!(*sizes.lock().unwrap(), vec![2, super::PIECE_VALUES, super::PIECE_VALUES, 3, 2, 10]);
        let mut done = vec![];
        while let Some(e) = q.poll_event() {
            done.push(e);
        }
        let bound = Quantization::AgreedExponent.error_bound(1, 1.0);
        match &done[..] {
            [HostEvent::Done { id: 1, data: Some(Payload::F32(sa)) }, HostEvent::Done { id: 2, data: Some(Payload::F32(sb)) }] => {
                assert_eq!((sa.len(), sb.len()), (n, 10));
                let err = a.iter().zip(sa).map(|(x, y)| (x + y).abs() as f64).fold(0.0, f64::max);
                assert!(err <= bound && err > 0.0, "error {err} against bound {bound}");
                assert_eq!(sb, &b.iter().map(|x| -x).collect::<Vec<_>>());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_piece_whose_sum_comes_back_short_fails_the_tensor() {
        let inner = Doubler { times: -1, world: 1, short: true, ..Doubler::default() };
        let mut q = Quantized::new(Box::new(inner), Quantization::AgreedExponent, 0, 1);
        match allreduce(&mut q, 3, Payload::F32(vec![0.5; 10])) {
            HostEvent::Rejected { id: 3, reason } => assert!(reason.contains("piece at value 0"), "{reason}"),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_rank_that_left_disagrees_on_no_size() {
        // Found in the emulated Rina jobs that lose a worker (#36): the dead rank's slot of the
        // size vector stayed 0, read as a 0-value tensor, and every survivor failed the call.
        let (one, other) = (super::length_slot(262_144), super::length_slot(4));
        assert_eq!(super::size_disagreement(1, 262_144, &[0, one, one]), None);
        assert_eq!(super::size_disagreement(0, 0, &[super::length_slot(0), super::length_slot(0)]), None);
        let e = super::size_disagreement(1, 262_144, &[0, one, other]).expect("4 values against 262,144");
        assert!(e.contains("rank 0 gone, rank 1 262144, rank 2 4"), "{e}");
    }

    #[test]
    fn error_bounds_match_the_documented_formulas() {
        let eps = f32::EPSILON as f64;
        // ATP: 4 / 2e8 plus 4 eps x 10.
        assert_eq!(Quantization::FixedPoint { scale: 1e8 }.error_bound(4, 10.0), 4.0 / 2e8 + 4.0 * eps * 10.0);
        // SwitchML: frexp(1.0) = 0.5 x 2^1, frexp(0.75) = 0.75 x 2^0.
        let q = Quantization::AgreedExponent;
        assert_eq!(q.error_bound(2, 1.0), 4.0 * 2.0 / i32::MAX as f64 + 2.0 * eps);
        assert_eq!(q.error_bound(2, 0.75), 4.0 / i32::MAX as f64 + 2.0 * eps * 0.75);
        assert_eq!(Quantization::None.error_bound(3, 2.0), 3.0 * eps * 2.0);
    }
}
