//! Writes the seed corpus (`cargo +nightly fuzz run seeds` is not a fuzz target: run it with
//! `cargo +nightly run --bin seeds` from fuzz/): valid frames of every header kind, the same
//! length-prefixed for `ingress`, and control lines (hello, auth, join, admit).
use inalab_core::wire::{AtpHeader, Header, SwitchMlHeader};
use inalab_core::{frame, Packet, Payload};

fn main() {
    let headers = [
        Header::Raw,
        Header::SwitchMl(SwitchMlHeader { job: 1, slot: 3, chunk: 7, wid: 1, ver: 1, flags: 0, exp: -3 }),
        Header::SwitchMl(SwitchMlHeader { job: 1, slot: 0, chunk: 0, wid: 0, ver: 0, flags: 2, exp: 0 }),
        Header::Atp(AtpHeader { job: 2, seq: 5, agg_index: 9, bitmap0: 1, bitmap1: 1, fan_in0: 3, fan_in1: 1, esi: 0, flags: 0 }),
        Header::Atp(AtpHeader { job: 2, seq: 6, agg_index: 9, bitmap0: 2, bitmap1: 1, fan_in0: 3, fan_in1: 1, esi: 1, flags: 4 }),
    ];
    let mut ingress = vec![];
    for (i, h) in headers.into_iter().enumerate() {
        let mut p = Packet::new(65537 + (i as u32 % 3), 1, 1, 1, 0, h);
        p.payload = Some(Box::new(if i % 2 == 0 { Payload::I32((0..32).collect()) } else { Payload::F32((0..62).map(|x| x as f32).collect()) }));
        let mut b = vec![];
        frame::encode(&p, &mut b);
        std::fs::write(format!("corpus/frame/seed{i}"), &b).unwrap();
        ingress.push(i as u8);
        ingress.extend_from_slice(&(b.len() as u16).to_le_bytes());
        ingress.extend_from_slice(&b);
    }
    std::fs::write("corpus/ingress/seed0", &ingress).unwrap();
    let spec = r#"{"job":3,"config":{"scheme":"switchml"},"workers":[{"node":65537,"udp":"127.0.0.1:5","rack":1}],"servers":[],"switches":[{"node":1,"memory_bytes":5000}],"key":"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"}"#;
    let lines = [
        r#"{"op":"hello"}"#.to_string(),
        r#"{"op":"auth","role":"switch","nonce":"00","proof":"ab"}"#.to_string(),
        r#"{"op":"join","job":1,"rank":0,"world":2,"config":{"scheme":"atp"},"udp":"127.0.0.1:9"}"#.to_string(),
        format!(r#"{{"op":"admit","spec":{spec}}}"#),
        r#"{"op":"release","job":3}"#.to_string(),
    ];
    std::fs::write("corpus/control_line/seed0", lines.join("\n") + "\n").unwrap();
}
