//! The handles NCCL's bootstrap carries between ranks (128 bytes, opaque to NCCL): a magic
//! naming the kind (`INAP` point-to-point, `INAC` CollNet), a random nonce (8 bytes) and a text
//! (a listener's address), NUL-terminated.

use crate::{result, HANDLE_BYTES};
use std::ffi::{c_int, c_void};

type Failure = (c_int, String);

pub(crate) fn nonce() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source");
    u64::from_le_bytes(b)
}

pub(crate) fn write(handle: *mut c_void, magic: &[u8; 4], nonce: u64, text: &str) -> Result<(), Failure> {
    if handle.is_null() {
        return Err((result::INVALID_ARGUMENT, "handle is a null pointer".into()));
    }
    let mut h = [0u8; HANDLE_BYTES];
    h[..4].copy_from_slice(magic);
    h[4..12].copy_from_slice(&nonce.to_le_bytes());
    let t = text.as_bytes();
    if t.len() >= HANDLE_BYTES - 12 {
        return Err((result::INTERNAL_ERROR, format!("{text} does not fit a handle")));
    }
    h[12..12 + t.len()].copy_from_slice(t);
    // SAFETY: NCCL gives NCCL_NET_HANDLE_MAXSIZE (128) writable bytes.
    unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), handle.cast::<u8>(), HANDLE_BYTES) };
    Ok(())
}

/// A handle's nonce and text, if it carries `magic`.
pub(crate) fn read(handle: *const c_void, magic: &[u8; 4]) -> Result<(u64, String), Failure> {
    if handle.is_null() {
        return Err((result::INVALID_ARGUMENT, "handle is a null pointer".into()));
    }
    // SAFETY: NCCL hands back the 128 bytes a `listen` filled.
    let h = unsafe { std::slice::from_raw_parts(handle.cast::<u8>(), HANDLE_BYTES) };
    if &h[..4] != magic {
        return Err((result::INVALID_ARGUMENT, "not a handle of this plugin".into()));
    }
    let nonce = u64::from_le_bytes(h[4..12].try_into().unwrap());
    let text = &h[12..];
    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
    let text = std::str::from_utf8(&text[..end]).map_err(|_| (result::INVALID_ARGUMENT, "a handle's address is not text".to_string()))?;
    Ok((nonce, text.to_string()))
}

