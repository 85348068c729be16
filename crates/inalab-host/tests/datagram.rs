//! Raw datagram sender and sink.

mod common;

use common::*;
use inalab_core::time::{serialization, S, US};
use inalab_core::{AppRequest, Endpoint, HostEvent};
use inalab_host::{DatagramConfig, DatagramSender, DatagramSink};
use inalab_testkit::{Links, Rule};

#[test]
fn sends_at_line_rate_and_sink_counts() {
    let mut f = star(2);
    let tx = f.add(Box::new(DatagramSender::new(Endpoint { host: 0, port: 9 }, DatagramConfig::default()).unwrap()));
    let rx = f.add(Box::new(DatagramSink::new(Endpoint { host: 1, port: 9 })));
    f.submit(tx, AppRequest::Send { id: 1, dst: rx, bytes: 10_000 });
    f.submit(tx, AppRequest::Send { id: 2, dst: rx, bytes: 0 });
    f.submit(tx, AppRequest::Send { id: 3, dst: rx, bytes: 1500 });
    assert!(f.run(S));
    assert_eq!(f.counter(rx, "rx_packets"), 8);
    assert_eq!(f.counter(rx, "rx_bytes"), 11_500);
    assert_eq!(f.counter(tx, "tx_packets"), 8);
    // Back to back: the last byte arrives one serialization of everything plus the delay
    // after the start (the switch is cut-through).
    assert_eq!(f.now(), serialization(11_500, 100_000_000_000) + US);
    let ids: Vec<u64> = f
        .events(tx)
        .into_iter()
        .map(|e| match e {
            HostEvent::Done { id, data: None } => id,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    // The empty message is done at once, before the first one's last packet left.
    assert_eq!(ids, vec![2, 1, 3]);
    f.check_conservation().unwrap();
}

#[test]
fn datagrams_are_unreliable_and_reject_allreduce() {
    let mut f = star(2);
    let tx = f.add(Box::new(DatagramSender::new(Endpoint { host: 0, port: 9 }, DatagramConfig { packet_bytes: 1000 }).unwrap()));
    let rx = f.add(Box::new(DatagramSink::new(Endpoint { host: 1, port: 9 })));
    f.lose(Links::FromHosts, Rule::nth([1]));
    f.submit(tx, AppRequest::Send { id: 1, dst: rx, bytes: 3000 });
    f.submit(tx, AppRequest::allreduce(2, 4, None));
    assert!(f.run(S));
    assert_eq!((f.counter(rx, "rx_packets"), f.counter(rx, "rx_bytes")), (2, 2000));
    assert!(matches!(f.events(tx)[..], [HostEvent::Failed { id: 2, .. }, HostEvent::Done { id: 1, .. }]));
    assert!(DatagramSender::new(Endpoint { host: 0, port: 9 }, DatagramConfig { packet_bytes: 0 }).is_err());
}
