//! Which MAC tags frames fastest on this machine (issue #41, "authentication at memory speed"):
//! RustCrypto's and BLAKE3's candidates side by side in one run, per frame size.
//!
//!     cargo run --release -p inalab-net --example mac_speed
//!
//! Candidates, each producing a 16-byte tag over the whole frame under a 256-bit key:
//! - `inalab` — what frames carry today ([`FrameMac`]): HMAC-SHA256 below 4 KiB, above it keyed
//!   BLAKE3 over the head and the plain BLAKE3 hash of the 1 KiB-aligned tail;
//! - `hmac-sha256` — RustCrypto `hmac` + `sha2` (SHA-NI where the CPU has it);
//! - `blake3-keyed` — `blake3::keyed_hash` of the whole frame;
//! - `gmac` — AES-256-GCM with the frame as associated data and no plaintext (RustCrypto
//!   `aes-gcm`: AES-NI and carry-less multiply where the CPU has them). Needs a nonce unique per
//!   frame and key: a per-sender counter would have to travel in each frame;
//! - `poly1305` — ChaCha20-Poly1305 likewise (RustCrypto `chacha20poly1305`; the one-time
//!   Poly1305 key comes from ChaCha20 under the nonce), the same nonce requirement.
//!
//! Every candidate tags the same frames in interleaved rounds; printed per size: the median of
//! 7 rounds in ns per frame, GB/s, and the ratio to `inalab`'s (below 1: faster). A memcpy of
//! the frame is the memory-speed yardstick. The numbers are this machine's; run it where the
//! switch runs.

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use chacha20poly1305::ChaCha20Poly1305;
use hmac::{Hmac, Mac};
use inalab_net::auth::{random_key, FrameMac, Link, ANY, SEQ_BYTES};
use sha2::Sha256;
use std::hint::black_box;
use std::time::Instant;

const SIZES: [usize; 5] = [306, 1_024, 4_096, 8_229, 16_421];
const ROUNDS: usize = 7;
const BYTES_PER_ROUND: usize = 64 << 20;

type Tagger<'a> = Box<dyn Fn(&[u8], u64) -> [u8; 16] + 'a>;

fn main() {
    let key = random_key();
    let inalab = FrameMac::new(&key);
    let hmac = <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("any key length");
    let gcm = Aes256Gcm::new_from_slice(&key).expect("a 32-byte key");
    let chacha = ChaCha20Poly1305::new_from_slice(&key).expect("a 32-byte key");
    let nonce = |n: u64| {
        let mut b = [0u8; 12];
        b[4..].copy_from_slice(&n.to_le_bytes());
        b
    };
    let candidates: Vec<(&str, Tagger)> = vec![
        ("inalab", Box::new(|f: &[u8], _| {
            let mut buf = f.to_vec();
            inalab.seal(&mut buf, 0, Link { from: 1, to: ANY }, 1);
            buf[f.len() + SEQ_BYTES..].try_into().expect("16 bytes")
        })),
        ("hmac-sha256", Box::new(|f: &[u8], _| {
            let mut m = hmac.clone();
            m.update(f);
            m.finalize().into_bytes()[..16].try_into().expect("16 bytes")
        })),
        ("blake3-keyed", Box::new(|f: &[u8], _| blake3::keyed_hash(&key, f).as_bytes()[..16].try_into().expect("16 bytes"))),
        ("gmac", Box::new(|f: &[u8], n| {
            let tag = gcm.encrypt_in_place_detached(Nonce::from_slice(&nonce(n)), f, &mut []).expect("in bounds");
            tag.into()
        })),
        ("poly1305", Box::new(|f: &[u8], n| {
            let tag = chacha
                .encrypt_in_place_detached(chacha20poly1305::Nonce::from_slice(&nonce(n)), f, &mut [])
                .expect("in bounds");
            tag.into()
        })),
    ];
    println!("{:>8} {:>14} {:>10} {:>8} {:>9}", "frame B", "MAC", "ns/frame", "GB/s", "vs inalab");
    for size in SIZES {
        let frame: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8).collect();
        let frames = (BYTES_PER_ROUND / size).max(1000);
        let mut copy = vec![0u8; size];
        let mut times = vec![Vec::new(); candidates.len() + 1];
        for _ in 0..ROUNDS {
            for (i, (_, tag)) in candidates.iter().enumerate() {
                let t = Instant::now();
                for n in 0..frames as u64 {
                    black_box(tag(black_box(&frame), n));
                }
                times[i].push(t.elapsed().as_nanos() as f64 / frames as f64);
            }
            let t = Instant::now();
            for _ in 0..frames {
                copy.copy_from_slice(black_box(&frame));
                black_box(&copy);
            }
            times[candidates.len()].push(t.elapsed().as_nanos() as f64 / frames as f64);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let medians: Vec<f64> = times.iter_mut().map(median).collect();
        let names = candidates.iter().map(|(n, _)| *n).chain(["memcpy"]);
        for (name, ns) in names.zip(&medians) {
            println!("{size:>8} {name:>14} {ns:>10.0} {:>8.2} {:>9.2}", size as f64 / ns, ns / medians[0]);
        }
    }
}
