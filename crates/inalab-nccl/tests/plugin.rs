//! The plugin's version-free functions, called as the shim calls them, in one process:
//! point-to-point messages over TCP, and CollNet heads summing through a real switch. The
//! tables themselves, read through NVIDIA's headers by a C program as NCCL reads them, are
//! tested in python/tests/test_nccl_plugin.py.

use inalab_net::switch::{SwitchHandle, SwitchOptions};
use nccl_net_inalab::coll::*;
use nccl_net_inalab::dtype::DType;
use nccl_net_inalab::p2p::*;
use nccl_net_inalab::{inalab_nccl_init, result, HANDLE_BYTES};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(30);

fn ok(code: c_int) {
    assert_eq!(code, result::SUCCESS);
}

/// Polls `test` until the request is done, at most [`BOUND`]; the size it reports.
fn wait(test: extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> c_int, req: *mut c_void) -> Result<c_int, c_int> {
    let t0 = Instant::now();
    let (mut done, mut size) = (0, -1);
    loop {
        let code = test(req, &mut done, &mut size);
        if code != result::SUCCESS {
            return Err(code);
        }
        if done == 1 {
            return Ok(size);
        }
        assert!(t0.elapsed() < BOUND, "a request not done in {BOUND:?}");
        std::thread::yield_now();
    }
}

#[test]
fn messages_cross_a_connection_in_order_whatever_their_size() {
    ok(inalab_nccl_init());
    let mut handle = [0u8; HANDLE_BYTES];
    let mut listen: *mut c_void = null_mut();
    ok(inalab_nccl_listen(handle.as_mut_ptr().cast(), &mut listen));
    let mut send: *mut c_void = null_mut();
    ok(inalab_nccl_connect(handle.as_ptr().cast(), &mut send));
    let mut recv: *mut c_void = null_mut();
    let t0 = Instant::now();
    while recv.is_null() {
        ok(inalab_nccl_accept(listen, &mut recv));
        assert!(t0.elapsed() < BOUND);
    }
    let sizes = [0usize, 1, 4095, 65_536, (1 << 20) + 3];
    let msgs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(k, n)| (0..*n).map(|i| (i * 31 + k) as u8).collect()).collect();
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|_| vec![0u8; 2 << 20]).collect();
    // Every send and receive posted before any completes: all in flight at once.
    let sends: Vec<_> = msgs
        .iter()
        .enumerate()
        .map(|(k, m)| {
            let mut r = null_mut();
            ok(inalab_nccl_isend(send, m.as_ptr().cast(), m.len(), k as c_int, &mut r));
            r
        })
        .collect();
    let recvs: Vec<_> = bufs
        .iter_mut()
        .map(|b| {
            let mut r = null_mut();
            ok(inalab_nccl_irecv(recv, b.as_mut_ptr().cast(), b.len(), &mut r));
            r
        })
        .collect();
    // One thread plays both ends, so it tests sends and receives in turn (a receive
    // progresses only when the sender's side is tested too, as in two NCCL proxies).
    let mut pending: Vec<(usize, *mut c_void)> = sends.into_iter().chain(recvs).enumerate().map(|(i, r)| (i % sizes.len(), r)).collect();
    let t0 = Instant::now();
    while !pending.is_empty() {
        pending.retain(|&(k, r)| {
            let (mut done, mut size) = (0, -1);
            ok(inalab_nccl_test(r, &mut done, &mut size));
            if done == 1 {
                assert_eq!(size, sizes[k] as c_int, "message {k}");
            }
            done == 0
        });
        assert!(t0.elapsed() < BOUND, "requests not done in {BOUND:?}");
    }
    for k in 0..sizes.len() {
        assert!(bufs[k][..sizes[k]] == msgs[k][..], "message {k} arrived changed");
    }
    // A message larger than the receive posted for it fails that receive, never overruns it.
    let big = vec![7u8; 100];
    let (mut s, mut r) = (null_mut(), null_mut());
    let mut small = [0u8; 10];
    ok(inalab_nccl_isend(send, big.as_ptr().cast(), big.len(), 0, &mut s));
    ok(inalab_nccl_irecv(recv, small.as_mut_ptr().cast(), small.len(), &mut r));
    assert!(wait(inalab_nccl_test, s).is_ok());
    assert_eq!(wait(inalab_nccl_test, r), Err(result::SYSTEM_ERROR));
    assert_eq!(small, [0u8; 10]);
    for c in [send, recv] {
        ok(inalab_nccl_close(c));
    }
    ok(inalab_nccl_close_listen(listen));
}

#[test]
fn a_connection_without_the_listener_s_nonce_is_refused() {
    let mut handle = [0u8; HANDLE_BYTES];
    let mut listen: *mut c_void = null_mut();
    ok(inalab_nccl_listen(handle.as_mut_ptr().cast(), &mut listen));
    let mut forged = handle;
    forged[4] ^= 1;
    let mut send: *mut c_void = null_mut();
    ok(inalab_nccl_connect(forged.as_ptr().cast(), &mut send));
    let mut recv: *mut c_void = null_mut();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        ok(inalab_nccl_accept(listen, &mut recv));
        assert!(recv.is_null(), "a connection with a forged nonce was accepted");
    }
    let mut not_ours = [0u8; HANDLE_BYTES];
    not_ours[..4].copy_from_slice(b"XXXX");
    assert_eq!(inalab_nccl_connect(not_ours.as_ptr().cast(), &mut send), result::INVALID_ARGUMENT);
    ok(inalab_nccl_close_listen(listen));
}

/// `n` CollNet heads in threads, as NCCL's proxies on `n` nodes: each listens, gets every
/// handle and connects; once every head is through `connect`, `between` runs, then each head
/// that joined runs `then(rank, its communicator)` and closes it. Per head, what `then`
/// returned, or the code `connect` failed with.
fn run_heads<R: Send + 'static>(n: usize, between: impl FnOnce(), then: impl Fn(usize, *mut c_void) -> R + Send + Sync + 'static) -> Vec<Result<R, c_int>> {
    let handles: Vec<([u8; HANDLE_BYTES], usize)> = (0..n)
        .map(|_| {
            let mut h = [0u8; HANDLE_BYTES];
            let mut l = null_mut();
            ok(inalab_coll_listen(h.as_mut_ptr().cast(), &mut l));
            (h, l as usize)
        })
        .collect();
    let all: Vec<[u8; HANDLE_BYTES]> = handles.iter().map(|(h, _)| *h).collect();
    let (joined_tx, joined_rx) = std::sync::mpsc::channel();
    let go = Arc::new(Barrier::new(n + 1));
    let then = Arc::new(then);
    let threads: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(rank, (_, l))| {
            let (all, joined, go, then) = (all.clone(), joined_tx.clone(), go.clone(), then.clone());
            std::thread::spawn(move || {
                let ptrs: Vec<*const c_void> = all.iter().map(|h| h.as_ptr().cast()).collect();
                let mut coll = null_mut();
                let code = inalab_coll_connect(ptrs.as_ptr(), n as c_int, rank as c_int, l as *mut c_void, &mut coll);
                ok(inalab_coll_close_listen(l as *mut c_void));
                joined.send(()).unwrap();
                go.wait();
                if code != result::SUCCESS {
                    return Err(code);
                }
                let r = then(rank, coll);
                ok(inalab_coll_close(coll));
                Ok(r)
            })
        })
        .collect();
    for _ in 0..n {
        joined_rx.recv_timeout(BOUND).expect("every head is through connect");
    }
    between();
    go.wait();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// `n` heads allreduce `chunks` (element counts) of type `dtype`, all in flight at once; each
/// head's sums per chunk, or the first error.
fn heads(n: usize, chunks: &[usize], dtype: c_int) -> Vec<Result<Vec<Vec<f32>>, c_int>> {
    let t = DType::from_nccl(dtype).unwrap();
    let chunks = chunks.to_vec();
    let sums = run_heads(n, || {}, move |rank, coll| -> Result<Vec<Vec<f32>>, c_int> {
        let encoded: Vec<Vec<u8>> = chunks
            .iter()
            .enumerate()
            .map(|(c, len)| {
                let v: Vec<f32> = (0..*len).map(|i| value(rank, c, i)).collect();
                let mut b = vec![0u8; v.len() * t.bytes()];
                unsafe { t.write(&v, b.as_mut_ptr()) };
                b
            })
            .collect();
        let mut out: Vec<Vec<u8>> = encoded.iter().map(|b| vec![0u8; b.len()]).collect();
        let reqs: Vec<_> = encoded
            .iter()
            .zip(out.iter_mut())
            .zip(&chunks)
            .map(|((s, o), len)| {
                let mut r = null_mut();
                ok(inalab_coll_iallreduce(coll, s.as_ptr().cast(), o.as_mut_ptr().cast(), *len, dtype, 0, &mut r));
                r
            })
            .collect();
        for (r, len) in reqs.into_iter().zip(&chunks) {
            assert_eq!(wait(inalab_coll_test, r)?, (len * t.bytes()) as c_int);
        }
        Ok(out.iter().map(|b| unsafe { t.read(b.as_ptr(), b.len() / t.bytes()) }).collect())
    });
    sums.into_iter().map(|r| r.and_then(|x| x)).collect()
}

/// Head `rank`'s element `i` of chunk `c`: multiples of 1/4, exact in every type summed.
fn value(rank: usize, c: usize, i: usize) -> f32 {
    ((i * 7 + c * 3) % 19) as f32 * 0.25 - 2.25 + rank as f32
}

#[test]
fn collnet_heads_sum_through_a_switch_and_fall_back_without_one() {
    let sw = SwitchHandle::start(SwitchOptions {
        udp: "127.0.0.1:0".parse().unwrap(),
        control: "127.0.0.1:0".parse().unwrap(),
        ..SwitchOptions::new(&["switchml"])
    })
    .unwrap();
    // The only test of this binary that reads the environment.
    std::env::set_var("INALAB_SWITCH", sw.control_addr.to_string());
    std::env::set_var("INALAB_SCHEME", "switchml");
    let chunks = [131_072, 1001, 1, 0, 131_072, 77];
    for dtype in [7, 6, 9] {
        let n = 4;
        for (rank, sums) in heads(n, &chunks, dtype).into_iter().enumerate() {
            let sums = sums.unwrap_or_else(|e| panic!("head {rank}: error {e}"));
            for (c, (got, len)) in sums.iter().zip(chunks).enumerate() {
                assert_eq!(got.len(), len);
                for (i, g) in got.iter().enumerate() {
                    let want: f32 = (0..n).map(|r| value(r, c, i)).sum();
                    assert!((g - want).abs() <= 1e-3 * want.abs().max(1.0), "type {dtype} head {rank} chunk {c} [{i}]: {g} vs {want}");
                }
            }
        }
    }
    let st = sw.stats();
    assert_eq!(st["aggregators_in_use"], 0, "{st}");
    // Only sums of the float types are offered; NCCL runs everything else itself.
    for (t, op, want) in [(7, 0, 1), (6, 0, 1), (9, 0, 1), (7, 1, 0), (7, 2, 0), (2, 0, 0), (8, 0, 0), (4, 0, 0)] {
        let mut s = -1;
        ok(inalab_coll_reduce_support(t, op, &mut s));
        assert_eq!(s, want, "type {t} op {op}");
    }
    // The switch gone mid-job: a chunk in flight fails with an error, it does not hang.
    let lost = run_heads(2, || drop(sw), |_, coll| {
        let send = [1.0f32; 4096];
        let mut out = [0.0f32; 4096];
        let mut r = null_mut();
        ok(inalab_coll_iallreduce(coll, send.as_ptr().cast(), out.as_mut_ptr().cast(), send.len(), 7, 0, &mut r));
        wait(inalab_coll_test, r)
    });
    assert!(lost.iter().all(|r| *r == Ok(Err(result::REMOTE_ERROR))), "{lost:?}");
    // No switch at the address: connect fails at once (NCCL goes on without CollNet).
    let t0 = Instant::now();
    let codes: Vec<_> = heads(2, &[8], 7).into_iter().map(|r| r.err()).collect();
    assert_eq!(codes, [Some(result::REMOTE_ERROR); 2]);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // A scheme no worker library runs: refused naming the variable.
    std::env::set_var("INALAB_SCHEME", "ring");
    assert_eq!(heads(1, &[8], 7)[0], Err(result::INVALID_ARGUMENT));
}
