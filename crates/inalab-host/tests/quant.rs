//! Fixed-point conversion: SwitchML's no-overflow guarantee (property test) and the
//! precision of both schemes on gradient-like distributions. Run with `--nocapture` to see
//! the precision table.

use inalab_core::splitmix64;
use inalab_host::quant::{block_exponent, from_fixed, switchml_scale, switchml_to_fixed, to_fixed, ATP_SCALE};
use proptest::prelude::*;

const VALUES: usize = 32;

/// Deterministic uniform draws in (0, 1).
struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 += 1;
        ((splitmix64(self.0) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self, std: f64) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        std * (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    fn laplace(&mut self, b: f64) -> f64 {
        let u = self.uniform() - 0.5;
        -b * u.signum() * (1.0 - 2.0 * u.abs()).ln()
    }
}

/// One block per worker, values `sign * m * 2^e` with `e` uniform in `[lo, hi)`, a tenth of
/// them zero; or, with `worst`, every value the largest f32 below `2^hi`.
fn blocks(seed: u64, n: usize, lo: i32, hi: i32, worst: bool) -> Vec<Vec<f32>> {
    let mut r = Rng(seed);
    (0..n)
        .map(|_| {
            (0..VALUES)
                .map(|_| {
                    if worst {
                        return f32::from_bits((2f64.powi(hi) as f32).to_bits() - 1);
                        // hi >= -140: exact
                    }
                    if r.uniform() < 0.1 {
                        return 0.0;
                    }
                    let e = lo as f64 + r.uniform() * (hi - lo) as f64;
                    let sign = if r.uniform() < 0.5 { -1.0 } else { 1.0 };
                    (sign * 2f64.powf(e)) as f32
                })
                .collect()
        })
        .collect()
}

/// SwitchML over one block: the workers' converted values summed in i64, with the
/// agreed exponent.
fn switchml_sum(blocks: &[Vec<f32>]) -> (Vec<i64>, i16, usize) {
    let n = blocks.len() as u32;
    let e_max = blocks.iter().map(|b| block_exponent(b)).max().unwrap();
    let mut sum = vec![0i64; blocks[0].len()];
    let mut saturated = 0;
    for b in blocks {
        let f = switchml_to_fixed(b, n, e_max).unwrap();
        saturated += f.saturated;
        sum.iter_mut().zip(&f.values).for_each(|(s, &x)| *s += x as i64);
    }
    (sum, e_max, saturated)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The sum of n converted values never leaves i32; each converted value is within
    /// 1 / scale = n 2^e_max / i32::MAX of its input, so the sum is within n / scale (plus
    /// the f32 rounding of the result) of the exact sum.
    #[test]
    fn switchml_sums_never_overflow(seed in any::<u64>(), n in 1usize..=1024, lo in -140i32..20, span in 0i32..40, worst in any::<bool>()) {
        let hi = (lo + span).min(127);
        let b = blocks(seed, n, lo, hi, worst);
        let (sum, e_max, saturated) = switchml_sum(&b);
        prop_assert_eq!(saturated, 0, "every value is below 2^e_max");
        let scale = switchml_scale(n as u32, e_max);
        for w in &b {
            let f = switchml_to_fixed(w, n as u32, e_max).unwrap();
            for (&v, &x) in w.iter().zip(&f.values) {
                prop_assert!((x as f64 / scale - v as f64).abs() <= 1.0 / scale, "{} -> {} at scale {}", v, x, scale);
            }
        }
        for (i, &s) in sum.iter().enumerate() {
            prop_assert!(s.abs() <= i32::MAX as i64, "value {} sums to {} with n {} e_max {}", i, s, n, e_max);
            let exact: f64 = b.iter().map(|w| w[i] as f64).sum();
            let got = from_fixed(&[s as i32], scale)[0] as f64;
            let bound = n as f64 / scale + exact.abs() * 2f64.powi(-23);
            prop_assert!((got - exact).abs() <= bound, "value {}: {} vs {} (bound {})", i, got, exact, bound);
        }
    }
}

#[test]
fn atp_fixed_scale_overflows_on_large_sums() {
    // Three workers with 10.0 each: 3e9 > i32::MAX, while SwitchML's scale fits.
    let f = to_fixed(&[10.0], ATP_SCALE).unwrap();
    assert_eq!((f.values[0], f.saturated), (1_000_000_000, 0));
    assert!(3 * f.values[0] as i64 > i32::MAX as i64);
    let (sum, e_max, _) = switchml_sum(&[vec![10.0], vec![10.0], vec![10.0]]);
    let got = from_fixed(&[sum[0] as i32], switchml_scale(3, e_max))[0];
    assert!((got - 30.0).abs() < 1e-6, "{got}");
}

#[test]
fn switchml_clamps_values_above_the_agreed_exponent() {
    // A worker lies about its exponent: its values are clamped, the sum still fits.
    let n = 1000u32;
    let big = vec![1e9f32; VALUES];
    let f = switchml_to_fixed(&big, n, 0).unwrap();
    assert_eq!(f.saturated, VALUES);
    assert!(f.values.iter().all(|&x| x as i64 * n as i64 <= i32::MAX as i64));
}

struct Dist {
    name: &'static str,
    draw: fn(&mut Rng) -> f64,
}

const DISTS: [Dist; 4] = [
    Dist { name: "normal(1e-3)", draw: |r| r.normal(1e-3) },
    Dist { name: "normal(1e-6)", draw: |r| r.normal(1e-6) },
    Dist { name: "laplace(1e-3)", draw: |r| r.laplace(1e-3) },
    // Normal(1e-3) with one value in 2000 of magnitude ~10.
    Dist {
        name: "heavy mix",
        draw: |r| {
            if r.uniform() < 5e-4 {
                10.0 * (0.5 + r.uniform()) * if r.uniform() < 0.5 { -1.0 } else { 1.0 }
            } else {
                r.normal(1e-3)
            }
        },
    },
];

#[derive(Default)]
struct Stats {
    max_abs: f64,
    err_l1: f64,
    exact_l1: f64,
    overflowed: usize,
    saturated: usize,
}

impl Stats {
    fn add(&mut self, got: f64, exact: f64) {
        self.max_abs = self.max_abs.max((got - exact).abs());
        self.err_l1 += (got - exact).abs();
        self.exact_l1 += exact.abs();
    }
    fn row(&self, scheme: &str, dist: &str, n: usize) -> String {
        format!(
            "{scheme:<9} {dist:<14} {n:>3} {:>12.3e} {:>12.3e} {:>10} {:>10}",
            self.max_abs,
            self.err_l1 / self.exact_l1,
            self.overflowed,
            self.saturated
        )
    }
}

/// Precision of both schemes on gradient-like data; asserts the documented bounds on the
/// sums: ATP within n / (2 scale), SwitchML within n / scale = n^2 2^e_max / i32::MAX, both
/// plus the f32 rounding of the result, and SwitchML never overflows.
///
/// "max abs err" is over values whose sum did not overflow; "rel err" is the L1-normalized
/// error `sum |err| / sum |exact|` (a per-value relative error is meaningless for sums near
/// zero); "overflowed" counts sums outside i32 (ATP's switch would saturate them);
/// "saturated" counts input values that did not fit their scale.
#[test]
fn precision_table() {
    let len = VALUES * 256;
    let mut rows = vec![format!(
        "{:<9} {:<14} {:>3} {:>12} {:>12} {:>10} {:>10}",
        "scheme", "distribution", "n", "max abs err", "rel err", "overflowed", "saturated"
    )];
    for dist in &DISTS {
        for n in [8usize, 64] {
            let mut r = Rng(n as u64 * 7919 + dist.name.len() as u64);
            let tensors: Vec<Vec<f32>> =
                (0..n).map(|_| (0..len).map(|_| (dist.draw)(&mut r) as f32).collect()).collect();
            let exact: Vec<f64> = (0..len).map(|i| tensors.iter().map(|t| t[i] as f64).sum()).collect();
            let f32_round = |x: f64| x.abs() * 2f64.powi(-23);

            // ATP: one scale, i32 sums saturating at the switch.
            let mut atp = Stats::default();
            let mut sum = vec![0i64; len];
            for t in &tensors {
                let f = to_fixed(t, ATP_SCALE).unwrap();
                atp.saturated += f.saturated;
                sum.iter_mut().zip(&f.values).for_each(|(s, &x)| *s += x as i64);
            }
            for (i, &s) in sum.iter().enumerate() {
                if s.abs() > i32::MAX as i64 {
                    atp.overflowed += 1;
                    continue;
                }
                let got = from_fixed(&[s as i32], ATP_SCALE)[0] as f64;
                let bound = n as f64 / (2.0 * ATP_SCALE) + f32_round(exact[i]);
                assert!((got - exact[i]).abs() <= bound, "ATP {} n {n} value {i}: {got} vs {}", dist.name, exact[i]);
                atp.add(got, exact[i]);
            }
            rows.push(atp.row("ATP 1e8", dist.name, n));

            // SwitchML: per-block exponent agreed over the workers.
            let mut sml = Stats::default();
            for blk in 0..len / VALUES {
                let range = blk * VALUES..(blk + 1) * VALUES;
                let b: Vec<Vec<f32>> = tensors.iter().map(|t| t[range.clone()].to_vec()).collect();
                let (sum, e_max, saturated) = switchml_sum(&b);
                sml.saturated += saturated;
                let scale = switchml_scale(n as u32, e_max);
                for (k, &s) in sum.iter().enumerate() {
                    assert!(s.abs() <= i32::MAX as i64, "SwitchML overflowed");
                    let i = blk * VALUES + k;
                    let got = from_fixed(&[s as i32], scale)[0] as f64;
                    let bound = n as f64 / scale + f32_round(exact[i]);
                    assert!(
                        (got - exact[i]).abs() <= bound,
                        "SwitchML {} n {n} value {i}: {got} vs {}",
                        dist.name,
                        exact[i]
                    );
                    sml.add(got, exact[i]);
                }
            }
            assert_eq!(sml.saturated, 0);
            rows.push(sml.row("SwitchML", dist.name, n));

            // Only the heavy-tailed mix may leave ATP's range (|sum| > 21.47 at scale 1e8).
            if dist.name != "heavy mix" {
                assert_eq!(atp.overflowed + atp.saturated, 0, "{}", dist.name);
            }
        }
    }
    println!("\nFixed-point precision ({len} values per worker)\n{}", rows.join("\n"));
}
