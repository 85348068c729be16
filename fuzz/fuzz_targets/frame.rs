//! The frame parser: any bytes decode or fail cleanly, and a decoded frame re-encodes to
//! bytes that decode to the same packet.
#![no_main]
use inalab_core::frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = frame::decode(data) {
        let mut again = vec![];
        frame::encode(&p, &mut again);
        let q = frame::decode(&again).expect("a re-encoded frame decodes");
        assert_eq!(format!("{:?}", p.header), format!("{:?}", q.header));
        assert_eq!(again.len(), frame::encoded_len(&p));
    }
    // And behind a tag check, as every receiver reads a datagram.
    let _ = inalab_net::auth::split(data);
});
