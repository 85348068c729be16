//! Control lines as the switch and PS read them: bounded line reading, JSON, the
//! authentication handshake's fields, and a job description as an `admit` carries it, checked
//! and planned the way the switch and PS do. Nothing may panic.
#![no_main]
use inalab_net::control::{self, AuthRole, JobSpec, Secret, ServerAuth};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = std::io::Cursor::new(data);
    let mut auth = ServerAuth::new(Secret::from_bytes([1; 32]));
    for _ in 0..8 {
        let Ok(Some(msg)) = control::read_line(&mut r) else { break };
        let op = msg["op"].as_str().unwrap_or("");
        let _ = auth.handle(op, &msg);
        let _ = auth.require(op, &[AuthRole::Switch]);
        if let Ok(spec) = control::field::<JobSpec>(&msg, "spec") {
            let _ = spec.frame_mac();
            if spec.workers.len() <= 64 {
                let _ = spec.plan(Some(1), &|_| Some(0));
                let _ = spec.plan(None, &|_| None);
            }
        }
    }
});
