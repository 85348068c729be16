//! `libnccl-net-inalab`: an NCCL network plugin whose CollNet allreduce goes through an
//! inalab switch, so an unmodified PyTorch job on GPUs reaches in-network aggregation by
//! setting environment variables (`NCCL_NET_PLUGIN`, `NCCL_COLLNET_ENABLE=1`,
//! `INALAB_SWITCH`), as NVIDIA's SHARP does through its CollNet plugin.
//!
//! # Layout
//! NCCL dlopens the library and reads the tables `ncclNetPlugin_vN` (point-to-point, which
//! NCCL requires before it takes the CollNet of the same library) and `ncclCollNetPlugin_vN`,
//! N from 12 down to 8 (these cover NCCL 2.27 to 2.30, the NCCL of every current PyTorch
//! wheel). The tables are laid out by `shim.c`, compiled against NVIDIA's own headers
//! (vendored in `nccl/`): one wrapper per version and function, each adapting that version's
//! signature to the version-free functions below (`inalab_nccl_*` for point-to-point, [`p2p`];
//! `inalab_coll_*` for CollNet, [`coll`]). Rust exports the tables' storage (a cdylib exports
//! only Rust's symbols) and the shim's constructor fills it when the library is loaded.
//!
//! # Conduct
//! Every entry catches panics and returns `ncclInternalError`; nothing waits without a bound
//! (connecting a CollNet group waits at most `INALAB_NCCL_JOIN_TIMEOUT_S`, default 60 s); an
//! error in `connect` makes NCCL go on without CollNet; unsupported types and operations are
//! reported unsupported (`reduceSupport`), so NCCL runs them itself.

pub mod coll;
pub mod dtype;
mod handle;
pub mod p2p;
pub mod settings;

use std::ffi::{c_char, c_int, c_void, CString};

/// `ncclResult_t`'s values (nccl.h).
pub mod result {
    use std::ffi::c_int;
    pub const SUCCESS: c_int = 0;
    pub const SYSTEM_ERROR: c_int = 2;
    pub const INTERNAL_ERROR: c_int = 3;
    pub const INVALID_ARGUMENT: c_int = 4;
    pub const INVALID_USAGE: c_int = 5;
    pub const REMOTE_ERROR: c_int = 6;
}

/// `NCCL_NET_HANDLE_MAXSIZE`: the bytes of a handle NCCL's bootstrap carries between ranks.
pub const HANDLE_BYTES: usize = 128;
/// `NCCL_PTR_HOST`: the only memory the plugin reads and writes (NCCL stages GPU buffers
/// through pinned host memory for it).
pub const PTR_HOST: c_int = 1;

/// Storage of the tables NCCL reads (see the module docs): 32 pointers each, more than the
/// largest table (`ncclNet_v12_t`: a name and 22 functions; `shim.c` asserts it fits).
pub type Table = [usize; 32];

macro_rules! tables {
    ($($name:ident),*) => {$(
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static mut $name: Table = [0; 32];
    )*};
}
tables!(
    ncclNetPlugin_v8, ncclNetPlugin_v9, ncclNetPlugin_v10, ncclNetPlugin_v11, ncclNetPlugin_v12,
    ncclCollNetPlugin_v8, ncclCollNetPlugin_v9, ncclCollNetPlugin_v10, ncclCollNetPlugin_v11, ncclCollNetPlugin_v12
);

extern "C" {
    /// NCCL's logger, as `init` gave it (`shim.c`); a no-op before.
    fn inalab_nccl_log(level: c_int, msg: *const c_char);
    /// Whether the shim's constructor filled the tables (also what links the shim in).
    fn inalab_nccl_tables_filled() -> c_int;
}

/// NCCL's log levels (`ncclDebugLogLevel`).
#[derive(Clone, Copy)]
pub enum Level {
    Warn = 2,
    Info = 3,
}

/// Logs through NCCL's logger (`NCCL_DEBUG=INFO` shows INFO; WARN always).
pub fn log(level: Level, msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `shim.c` defines it; it takes a NUL-terminated string for the call's duration.
    unsafe { inalab_nccl_log(level as c_int, c.as_ptr()) }
}

/// Runs an entry point: a panic becomes `ncclInternalError` with its message logged, never
/// an unwind into NCCL (which is undefined behaviour across `extern "C"`).
pub(crate) fn entry(what: &str, f: impl FnOnce() -> Result<(), (c_int, String)>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => result::SUCCESS,
        Ok(Err((code, msg))) => {
            log(Level::Warn, &format!("{what}: {msg}"));
            code
        }
        Err(p) => {
            log(Level::Warn, &format!("{what} panicked: {}", inalab_net::panic_message(&*p)));
            result::INTERNAL_ERROR
        }
    }
}

/// Writes through an out-pointer NCCL gave, refusing a null one.
pub(crate) fn put<T>(out: *mut T, v: T, what: &str) -> Result<(), (c_int, String)> {
    if out.is_null() {
        return Err((result::INVALID_ARGUMENT, format!("{what} is a null pointer")));
    }
    // SAFETY: NCCL passes a valid, aligned out-pointer (checked not null above).
    unsafe { out.write(v) };
    Ok(())
}

/// Called by every version's `init`: checks the tables were filled and says what it reads.
#[no_mangle]
pub extern "C" fn inalab_nccl_init() -> c_int {
    entry("init", || {
        // SAFETY: a plain C function of the shim.
        if unsafe { inalab_nccl_tables_filled() } == 0 {
            return Err((result::INTERNAL_ERROR, "the plugin tables were not filled at load".into()));
        }
        log(Level::Info, &format!("inalab plugin: switch {}, scheme {}", settings::switch_setting(), settings::scheme_setting()));
        Ok(())
    })
}

/// `regMr` for both tables: host memory needs no registration, so the handle is a token
/// that only records the memory type; device memory is refused (the properties say host).
#[no_mangle]
pub extern "C" fn inalab_nccl_reg_mr(_comm: *mut c_void, _data: *mut c_void, _size: usize, kind: c_int, mhandle: *mut *mut c_void) -> c_int {
    entry("regMr", || {
        if kind != PTR_HOST {
            return Err((result::INTERNAL_ERROR, format!("memory type {kind} is not host memory (NCCL_PTR_HOST = 1): the plugin reads host buffers only")));
        }
        put(mhandle, Box::into_raw(Box::new(kind)).cast(), "mhandle")
    })
}

#[no_mangle]
pub extern "C" fn inalab_nccl_dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> c_int {
    free::<c_int>(mhandle, "deregMr")
}

/// Frees what an entry handed NCCL as a `Box<T>` (a comm, a listener, a memory handle), when
/// NCCL closes it: once, and a null pointer is nothing to free.
pub(crate) fn free<T>(ptr: *mut c_void, what: &str) -> c_int {
    entry(what, || {
        if !ptr.is_null() {
            // SAFETY: made by this crate as a `Box<T>` and closed once, as NCCL's API promises.
            drop(unsafe { Box::from_raw(ptr.cast::<T>()) });
        }
        Ok(())
    })
}
