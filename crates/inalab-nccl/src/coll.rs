//! CollNet: every node's head rank is a worker of one inalab job, and each `iallreduce`
//! chunk one allreduce through the switch, with the job's scheme (the same worker library
//! and protocol code as `inalab.Client` and the simulator).
//!
//! * `listen` draws a nonce and puts it in the handle (never blocks).
//! * `connect` gets every head's handle (NCCL's bootstrap spread them): the job id is drawn
//!   from the first head's nonce (16 bits, as DSA's header carries it), the job's rendezvous
//!   secret made from all the nonces, so only this communicator's heads can take its ranks. It joins the job at `INALAB_SWITCH`
//!   with the scheme `INALAB_SCHEME` and waits until every head joined, at most
//!   `INALAB_NCCL_JOIN_TIMEOUT_S`; an error (no switch there, a refused job) makes NCCL go on
//!   without CollNet for the communicator.
//! * `iallreduce` converts the chunk to float32, hands it to the client and returns; the
//!   client runs requests in the order given, which NCCL keeps the same on every head, so the
//!   heads' n-th chunks are summed together. Many are in flight; the sum is written to the
//!   receive buffer, converted back, on the client's completion thread, and `test` reports it.

use crate::dtype::{DType, NCCL_SUM};
use crate::settings::{join_timeout, scheme_setting, switch_addr, SCHEMES};
use crate::{entry, free, handle, put, result};
use inalab_net::client::{Client, ClientOptions};
use serde_json::json;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

pub(crate) const MAGIC: &[u8; 4] = b"INAC";
pub struct Listen {
    nonce: u64,
}

pub struct Coll {
    client: Option<Client>,
}

/// A chunk in flight: what the completion thread says, and the bytes `test` reports.
pub struct Request {
    state: Arc<Mutex<Option<Result<(), String>>>>,
    bytes: usize,
}

/// The receive buffer, handed to the completion thread (NCCL keeps it until `test` says done).
struct RecvPtr(*mut u8);
// SAFETY: only the completion thread writes through it, once, before `test` can report done.
unsafe impl Send for RecvPtr {}

#[no_mangle]
pub extern "C" fn inalab_coll_listen(handle: *mut c_void, listen_comm: *mut *mut c_void) -> c_int {
    entry("CollNet listen", || {
        let nonce = handle::nonce();
        handle::write(handle, MAGIC, nonce, "")?;
        put(listen_comm, Box::into_raw(Box::new(Listen { nonce })).cast(), "listenComm")
    })
}

#[no_mangle]
pub extern "C" fn inalab_coll_connect(handles: *const *const c_void, nranks: c_int, rank: c_int, listen_comm: *mut c_void, coll_comm: *mut *mut c_void) -> c_int {
    entry("CollNet connect", || {
        if handles.is_null() || nranks < 1 || rank < 0 || rank >= nranks {
            return Err((result::INVALID_ARGUMENT, format!("rank {rank} of {nranks} heads, handles {handles:?}")));
        }
        // SAFETY: NCCL passes `nranks` handle pointers.
        let hs = unsafe { std::slice::from_raw_parts(handles, nranks as usize) };
        let nonces = hs.iter().map(|h| handle::read(*h, MAGIC).map(|(n, _)| n)).collect::<Result<Vec<u64>, _>>()?;
        if !listen_comm.is_null() && nonces[rank as usize] != unsafe { (*listen_comm.cast::<Listen>()).nonce } {
            return Err((result::INVALID_ARGUMENT, format!("handle {rank} is not this head's own")));
        }
        let scheme = scheme_setting();
        if !SCHEMES.contains(&scheme.as_str()) {
            return Err((result::INVALID_ARGUMENT, format!("INALAB_SCHEME={scheme:?}: one of {}", SCHEMES.join(", "))));
        }
        let opts = ClientOptions {
            switch: switch_addr().map_err(|e| (result::INVALID_ARGUMENT, e))?,
            job: job_id(nonces[0]).map_err(|e| (result::INVALID_ARGUMENT, e))?,
            rank: rank as usize,
            world: nranks as usize,
            config: json!({"scheme": scheme}),
            join_timeout: join_timeout().map_err(|e| (result::INVALID_ARGUMENT, e))?,
            secret: None,
            job_secret: Some(job_secret(&nonces)),
            link_rate_bps: None,
        };
        let (job, switch) = (opts.job, opts.switch);
        let client = Client::connect(opts).map_err(|e| (result::REMOTE_ERROR, format!("joining job {job} at the switch {switch}: {e}")))?;
        crate::log(crate::Level::Info, &format!("CollNet: head {rank} of {nranks} joined job {job} ({scheme}) at {switch}"));
        put(coll_comm, Box::into_raw(Box::new(Coll { client: Some(client) })).cast(), "collComm")
    })
}

/// The job id: `INALAB_JOB` if set, else drawn from the first head's nonce in 1..=65535 (16
/// bits: DSA's header carries the job in 16, the other schemes in 32; `inalab.torch` draws
/// the same way). Two jobs drawing the same id on one switch: the second is refused there (and
/// runs without CollNet), as is every communicator after the first when `INALAB_JOB` is set.
fn job_id(nonce: u64) -> Result<u32, String> {
    match std::env::var("INALAB_JOB") {
        Ok(s) => s.parse().map_err(|_| format!("INALAB_JOB={s:?}: a job id, an integer (default: drawn by the first head)")),
        Err(_) => Ok((nonce % 65_535) as u32 + 1),
    }
}

/// The job's rendezvous secret: the first head's nonce and a 64-bit FNV-1a mix of all of
/// them (a fixed length whatever the head count).
fn job_secret(nonces: &[u64]) -> String {
    let mix = nonces.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, n| (h ^ n).wrapping_mul(0x100_0000_01b3));
    format!("{:016x}{mix:016x}", nonces[0])
}

#[no_mangle]
pub extern "C" fn inalab_coll_reduce_support(dtype: c_int, op: c_int, supported: *mut c_int) -> c_int {
    entry("CollNet reduceSupport", || put(supported, (op == NCCL_SUM && DType::from_nccl(dtype).is_some()) as c_int, "supported"))
}

#[no_mangle]
pub extern "C" fn inalab_coll_iallreduce(
    coll_comm: *mut c_void,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    request: *mut *mut c_void,
) -> c_int {
    entry("CollNet iallreduce", || {
        let t = DType::from_nccl(dtype).filter(|_| op == NCCL_SUM).ok_or_else(|| {
            (result::INVALID_ARGUMENT, format!("type {dtype}, operation {op}: only a sum of float32, float16 or bfloat16 (reduceSupport says so)"))
        })?;
        if coll_comm.is_null() || (count > 0 && (send.is_null() || recv.is_null())) {
            return Err((result::INVALID_ARGUMENT, "a null communicator or buffer".into()));
        }
        // SAFETY: made by connect, alive until closeColl.
        let client = unsafe { &*coll_comm.cast::<Coll>() }.client.as_ref().expect("open until closeColl");
        // SAFETY: NCCL's send buffer holds `count` elements of the type.
        let values = unsafe { t.read(send.cast(), count) };
        let state = Arc::new(Mutex::new(None));
        let (s, out) = (state.clone(), RecvPtr(recv.cast()));
        client.allreduce_with(
            values,
            Box::new(move |r| {
                let out = out;
                let r = r.map(|sum| unsafe { t.write(&sum, out.0) }).map_err(|e| e.to_string());
                *inalab_net::lock(&s) = Some(r);
            }),
        );
        put(request, Box::into_raw(Box::new(Request { state, bytes: count * t.bytes() })).cast(), "request")
    })
}

#[no_mangle]
pub extern "C" fn inalab_coll_test(request: *mut c_void, done: *mut c_int, size: *mut c_int) -> c_int {
    entry("CollNet test", || {
        if request.is_null() {
            return Err((result::INVALID_ARGUMENT, "request is a null pointer".into()));
        }
        let r = request.cast::<Request>();
        // SAFETY: made by iallreduce, not yet reported done.
        let outcome = inalab_net::lock(&unsafe { &*r }.state).take();
        let Some(outcome) = outcome else { return put(done, 0, "done") };
        // SAFETY: reported once, then freed.
        let req = unsafe { Box::from_raw(r) };
        outcome.map_err(|e| (result::REMOTE_ERROR, format!("an allreduce of {} bytes failed: {e}", req.bytes)))?;
        if !size.is_null() {
            put(size, req.bytes.min(c_int::MAX as usize) as c_int, "size")?;
        }
        put(done, 1, "done")
    })
}

#[no_mangle]
pub extern "C" fn inalab_coll_close(coll_comm: *mut c_void) -> c_int {
    entry("CollNet closeColl", || {
        if !coll_comm.is_null() {
            // SAFETY: made by connect, closed once.
            let mut c = unsafe { Box::from_raw(coll_comm.cast::<Coll>()) };
            if let Some(client) = c.client.take() {
                client.close();
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn inalab_coll_close_listen(listen_comm: *mut c_void) -> c_int {
    free::<Listen>(listen_comm, "CollNet closeListen")
}


