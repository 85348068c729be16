//! One numeric contract for every scheme with a switch program, on loopback (#36 items 2, 3
//! and 7; docs/runtime.md, "Workers and quantization"): each of the numeric cases is
//! either the exact sum within the quantization bound on every rank, or an error on every
//! rank, the rank that had the value naming its rank, index and value; ranks that disagree on
//! a tensor's size or order all fail, naming the sizes. Never a silently wrong value.

use inalab_host::Quantization;
use inalab_net::client::{Client, ClientOptions};
use inalab_net::ps::{PsHandle, PsOptions};
use inalab_net::switch::{SwitchHandle, SwitchOptions};
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// What a case must give.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    /// The float sum within the scheme's bound, on every rank.
    Exact,
    /// An error on every rank; each rank (R, I) that had a bad value at index I names
    /// "rank R's value I is" it, the others say where the sum is no result.
    Error { culprits: &'static [(usize, usize)] },
}

/// The schemes that sum int32 at the switch without an overflow fallback.
const NO_FALLBACK: [&str; 5] = ["dsa", "canary", "static_tree", "rina", "grid"];

/// The cases at scale 1e8 (range +/-21.47), three ranks each: name, inputs, and what
/// ATP, SwitchML and the schemes without a fallback must give. Sums that leave the range do
/// so for any two of the three contributions, so they overflow at the switch whichever host
/// sums last (Canary's leader, a tree's root).
#[allow(clippy::type_complexity)]
fn cases() -> Vec<(&'static str, [Vec<f32>; 3], [Want; 3])> {
    use Want::*;
    let err = |c: &'static [(usize, usize)]| Error { culprits: c };
    let sum_err = Error { culprits: &[] };
    vec![
        ("in range", [vec![1.5, -2.25, 1e-3], vec![0.5, 0.25, -2e-3], vec![0.25, 1.0, 0.0]], [Exact, Exact, Exact]),
        ("[1, NaN] + [1, 2]", [vec![1.0, f32::NAN], vec![1.0, 2.0], vec![1.0, 2.0]], [err(&[(0, 1)]), err(&[(0, 1)]), err(&[(0, 1)])]),
        ("[15, -15] + [15, -15]", [vec![15.0, -15.0], vec![15.0, -15.0], vec![15.0, -15.0]], [Exact, Exact, sum_err]),
        ("[25, 1] + [1, 1]", [vec![25.0, 1.0], vec![1.0, 1.0], vec![1.0, 1.0]], [Exact, Exact, err(&[(0, 0)])]),
        ("inf", [vec![1.0, 1.0], vec![f32::INFINITY, 1.0], vec![1.0, 1.0]], [err(&[(1, 0)]), err(&[(1, 0)]), err(&[(1, 0)])]),
        ("-inf", [vec![1.0, f32::NEG_INFINITY], vec![1.0, 1.0], vec![1.0, 1.0]], [err(&[(0, 1)]), err(&[(0, 1)]), err(&[(0, 1)])]),
        ("at +-21.47", [vec![21.47, -21.47, 21.4748], vec![0.002, -0.002, -0.5], vec![0.002, -0.002, 0.0]], [Exact, Exact, Exact]),
        ("a value beyond +-21.47", [vec![1.0, 0.0], vec![2.0, -21.48], vec![0.0, 0.0]], [Exact, Exact, err(&[(1, 1)])]),
        ("a sum beyond +-21.47", [vec![10.74, -10.74], vec![10.74, -10.74], vec![10.74, -10.74]], [Exact, Exact, sum_err]),
        ("the top of float32", [vec![f32::MAX, 1.0], vec![0.0, 1.0], vec![0.0, 1.0]], [Exact, Exact, err(&[(0, 0)])]),
        ("a sum beyond float32", [vec![3e38, 1.0], vec![3e38, 1.0], vec![0.0, 1.0]], [sum_err, sum_err, err(&[(0, 0), (1, 0)])]),
    ]
}

fn want(scheme: &str, w: [Want; 3]) -> Want {
    match scheme {
        "atp" => w[0],
        "switchml" => w[1],
        _ => w[2],
    }
}

/// A switch running `scheme`'s program, and a PS where the scheme has one.
fn deployment(scheme: &'static str) -> (SwitchHandle, Option<PsHandle>) {
    let sw = SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&[scheme]) }).unwrap();
    let ps = matches!(scheme, "atp" | "dsa" | "grid").then(|| PsHandle::start(PsOptions { udp: any_port(), control: any_port(), switch: sw.control_addr, ..PsOptions::default() }).unwrap());
    (sw, ps)
}

/// The ranks of `job` on the switch at `sw`; rank r allreduces `inputs[r]` in turn. Each
/// call's outcome, per rank (errors as their messages). A call that hangs fails the test
/// after 20 s rather than the suite.
fn run(sw: SocketAddr, scheme: &'static str, job: u32, inputs: Vec<Vec<Vec<f32>>>) -> Vec<Vec<Result<Vec<f32>, String>>> {
    let world = inputs.len();
    let threads: Vec<_> = inputs
        .into_iter()
        .enumerate()
        .map(|(rank, calls)| {
            std::thread::spawn(move || {
                let opts = ClientOptions { switch: sw, job, rank, world, config: json!({"scheme": scheme}), join_timeout: Duration::from_secs(30), secret: None, job_secret: None, link_rate_bps: None };
                let c = Client::connect(opts).unwrap();
                let out = calls.into_iter().map(|v| c.allreduce_within(v, None, Duration::from_secs(20), || Ok(())).map_err(|e| e.to_string())).collect();
                c.close();
                out
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn quantization(scheme: &str) -> Quantization {
    if scheme == "switchml" {
        Quantization::AgreedExponent
    } else {
        Quantization::FixedPoint { scale: 1e8 }
    }
}

fn the_numeric_cases(scheme: &'static str, job: u32) {
    let (sw, _ps) = deployment(scheme);
    let cases = cases();
    let inputs: Vec<Vec<Vec<f32>>> = (0..3).map(|r| cases.iter().map(|c| c.1[r].clone()).collect()).collect();
    let got = run(sw.control_addr, scheme, job, inputs);
    for (k, (what, x, w)) in cases.iter().enumerate() {
        match want(scheme, *w) {
            Want::Exact => {
                let exact: Vec<f64> = (0..x[0].len()).map(|i| x.iter().map(|v| v[i] as f64).sum()).collect();
                let max_abs = x.iter().flatten().fold(0f64, |m, v| m.max(v.abs() as f64));
                // ATP's fallback sums floats: float32 rounding of the sum at most.
                let bound = quantization(scheme).error_bound(3, max_abs).max(f32::EPSILON as f64 * exact.iter().fold(0f64, |m, s| m.max(s.abs())));
                for (rank, r) in got.iter().enumerate() {
                    let sum = r[k].as_ref().unwrap_or_else(|e| panic!("{scheme}, {what}, rank {rank}: an error where the sum is exact: {e}"));
                    assert_eq!(sum.len(), exact.len(), "{scheme}, {what}");
                    for (g, e) in sum.iter().zip(&exact) {
                        assert!((*g as f64 - e).abs() <= bound, "{scheme}, {what}, rank {rank}: {g} against {e} (bound {bound:e})");
                    }
                }
            }
            Want::Error { culprits } => {
                for (rank, r) in got.iter().enumerate() {
                    let e = match &r[k] {
                        Err(e) => e,
                        Ok(v) => panic!("{scheme}, {what}, rank {rank}: a result where every rank must fail: {v:?}"),
                    };
                    match culprits.iter().find(|c| c.0 == rank) {
                        Some(&(c, i)) => {
                            let named = format!("rank {c}'s value {i} is {:?}", x[c][i]);
                            assert!(e.contains(&named), "{scheme}, {what}, rank {rank}: {e:?} does not name {named:?}");
                        }
                        // Another rank's value, or the sum: the message says where (SwitchML's
                        // exponent round drops the whole tensor and names the rank).
                        _ => assert!(
                            e.contains("of the sum is") || e.contains("'s tensor has a value with no fixed-point form"),
                            "{scheme}, {what}, rank {rank}: {e:?}"
                        ),
                    }
                }
            }
        }
    }
    // Every case ran to an outcome on both ranks: the job stayed in step throughout.
    assert!(got.iter().all(|r| r.len() == cases.len()));
}

/// Ranks that disagree on a tensor's size (5 values against 6), and on the order of two
/// tensors (124 then 62 values against 62 then 124, which pairs fragments of different
/// tensors), all fail naming the sizes; where the data already went out (every scheme but
/// SwitchML), later calls fail saying the ranks are out of step.
fn mismatched_sizes(scheme: &'static str, job: u32) {
    let (sw, _ps) = deployment(scheme);
    for (what, inputs, sizes) in [
        ("sizes", vec![vec![vec![1.0; 5], vec![2.0; 3]], vec![vec![1.0; 6], vec![2.0; 3]]], "rank 0 5, rank 1 6"),
        ("order", vec![vec![vec![1.0; 124], vec![2.0; 62]], vec![vec![2.0; 62], vec![1.0; 124]]], "rank 0 124, rank 1 62"),
    ] {
        let job = job + (what == "order") as u32;
        let got = run(sw.control_addr, scheme, job, inputs);
        for (rank, r) in got.iter().enumerate() {
            let e = r[0].as_ref().expect_err(&format!("{scheme}, {what}, rank {rank}: a result for mismatched tensors"));
            assert!(e.contains(&format!("the ranks disagree on this tensor's size (values per rank: {sizes})")), "{scheme}, {what}, rank {rank}: {e}");
            match (&r[1], scheme, what) {
                // SwitchML found out before any data was sent: the next tensor pairs up.
                (Ok(v), "switchml", "sizes") => assert_eq!(v, &vec![4.0; 3], "{scheme}, {what}"),
                (Err(e), "switchml", "order") => assert!(e.contains("disagree on this tensor's size"), "{scheme}, {what}: {e}"),
                (Err(e), s, _) if s != "switchml" => assert!(e.contains("out of step"), "{scheme}, {what}, rank {rank}: {e}"),
                (other, _, _) => panic!("{scheme}, {what}, rank {rank}: second call {other:?}"),
            }
        }
    }
}

#[test]
fn switchml_numeric_cases() {
    the_numeric_cases("switchml", 1);
    mismatched_sizes("switchml", 10);
}

#[test]
fn atp_numeric_cases() {
    the_numeric_cases("atp", 1);
    mismatched_sizes("atp", 10);
}

#[test]
fn no_fallback_schemes_numeric_cases() {
    for (k, scheme) in NO_FALLBACK.into_iter().enumerate() {
        the_numeric_cases(scheme, 1 + 100 * k as u32);
        mismatched_sizes(scheme, 50 + 100 * k as u32);
    }
}
