//! The control plane against careless or hostile peers (issue #12's findings 2, 3 and 5): a
//! client that never reads, a second PS, a dead PS, `release`, `admit` and `attach` without the
//! right credentials, a forged `admit` from a switch, an oversized line. Each must cost the attacker only its own connection, and every
//! honest call must end with its sum or a clear error, never hang.

use inalab_net::client::{Client, ClientOptions};
use inalab_net::control;
use inalab_net::ps::{PsHandle, PsOptions};
use inalab_net::switch::{SwitchHandle, SwitchOptions};
use inalab_net::NetError;
use serde_json::json;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn switch(program: &'static str) -> SwitchHandle {
    SwitchHandle::start(SwitchOptions { udp: any_port(), control: any_port(), ..SwitchOptions::new(&[program]) }).unwrap()
}

fn ps(sw: &SwitchHandle, node: u32) -> Result<PsHandle, NetError> {
    PsHandle::start(PsOptions { node, udp: any_port(), control: any_port(), switch: sw.control_addr, secret: None, ..PsOptions::default() })
}

fn client(sw: &SwitchHandle, scheme: &str, job: u32, rank: usize, world: usize) -> Client {
    let opts = ClientOptions { switch: sw.control_addr, job, rank, world, config: json!({"scheme": scheme}), join_timeout: Duration::from_secs(20), secret: None, job_secret: None, link_rate_bps: None };
    Client::connect(opts).unwrap()
}

/// Both clients of a 2-worker job, connected in parallel.
fn pair(sw: &SwitchHandle, scheme: &'static str, job: u32) -> (Client, Client) {
    let addr = sw.control_addr;
    let other = std::thread::spawn(move || {
        let opts = ClientOptions { switch: addr, job, rank: 1, world: 2, config: json!({"scheme": scheme}), join_timeout: Duration::from_secs(20), secret: None, job_secret: None, link_rate_bps: None };
        Client::connect(opts).unwrap()
    });
    let c0 = client(sw, scheme, job, 0, 2);
    (c0, other.join().unwrap())
}

fn stats_within(sw: &SwitchHandle, limit: Duration) -> serde_json::Value {
    let t = Instant::now();
    let v = control::request(sw.control_addr, None, &json!({"op": "stats"}), limit).expect("stats answered");
    assert!(t.elapsed() < limit, "stats took {:?}", t.elapsed());
    v
}

#[test]
fn a_client_that_never_reads_costs_only_its_own_connection() {
    let sw = switch("switchml");
    // The attacker joins job 50 as rank 0, then pipelines stats requests and reads nothing
    // back: its replies fill the socket buffers and writes to it block. Before the fix the
    // switch wrote the rendezvous reply to it under the control lock, freezing every request.
    let mut attacker = TcpStream::connect(sw.control_addr).unwrap();
    let mut attacker_replies = BufReader::new(attacker.try_clone().unwrap());
    control::authenticate(&mut attacker, &mut attacker_replies, &secret().credential(control::AuthRole::Worker)).unwrap();
    let join = json!({"op": "join", "job": 50, "rank": 0, "world": 2, "config": {"scheme": "switchml"}, "udp": "127.0.0.1:9"});
    control::send_line(&mut attacker, &join).unwrap();
    let line = b"{\"op\":\"stats\"}\n".repeat(2000);
    for _ in 0..20 {
        if attacker.write_all(&line).is_err() {
            break;
        }
    }
    // Once the attacker's buffers are full, an honest rank 1 completes job 50's rendezvous:
    // the switch now writes the join reply to the attacker.
    std::thread::sleep(Duration::from_millis(300));
    let addr = sw.control_addr;
    let honest = std::thread::spawn(move || {
        let opts = ClientOptions { switch: addr, job: 50, rank: 1, world: 2, config: json!({"scheme": "switchml"}), join_timeout: Duration::from_secs(20), secret: None, job_secret: None, link_rate_bps: None };
        Client::connect(opts).map(|c| c.node)
    });
    std::thread::sleep(Duration::from_millis(100));
    // Meanwhile everyone else is served at once, and a job runs.
    stats_within(&sw, Duration::from_secs(2));
    let (a, b) = pair(&sw, "switchml", 1);
    let t = std::thread::spawn(move || b.allreduce(vec![2.0; 1000]).unwrap());
    assert_eq!(a.allreduce(vec![1.0; 1000]).unwrap(), vec![3.0; 1000]);
    assert_eq!(t.join().unwrap(), vec![3.0; 1000]);
    stats_within(&sw, Duration::from_secs(2));
    let h = honest.join().unwrap();
    drop(attacker);
    assert!(h.is_ok(), "the honest rank got its reply: {:?}", h.err());
}

#[test]
fn an_oversized_line_gets_a_short_error_and_the_connection_closes() {
    let sw = switch("switchml");
    let mut c = TcpStream::connect(sw.control_addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let big = vec![1u8; (control::MAX_LINE_BYTES + 1000) as usize];
    let _ = c.write_all(&big);
    let mut reply = vec![];
    let _ = c.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("at most") && reply.len() < 300, "{} bytes: {text}", reply.len());
    // A bad line of normal length is quoted in at most a short prefix.
    let bad = format!("{}\n", "\u{1}".repeat(10_000));
    let mut c = TcpStream::connect(sw.control_addr).unwrap();
    c.write_all(bad.as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    let v = control::read_line(&mut r).unwrap().unwrap();
    assert!(v["error"].as_str().unwrap().len() < 600, "{v}");
    stats_within(&sw, Duration::from_secs(2));
}

#[test]
fn a_second_ps_is_refused_while_the_first_lives_and_a_dead_ps_fails_its_jobs() {
    let sw = switch("atp");
    let first = ps(&sw, 2).unwrap();
    match ps(&sw, 3) {
        Err(e) => assert!(e.to_string().contains("second one is refused"), "{e}"),
        Ok(_) => panic!("a second PS attached"),
    }
    let (a, b) = pair(&sw, "atp", 1);
    let t = std::thread::spawn(move || (b.allreduce(vec![2.0; 10]), b));
    assert_eq!(a.allreduce(vec![1.0; 10]).unwrap(), vec![3.0; 10]);
    let (sum, b) = t.join().unwrap();
    assert_eq!(sum.unwrap(), vec![3.0; 10]);
    // The PS goes away while rank 0 waits on an allreduce (rank 1 has not started its part):
    // the job fails on every worker with the PS named, at once.
    let t = std::thread::spawn(move || a.allreduce(vec![1.0; 100]));
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    first.stop();
    let e = t.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("parameter server"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    std::thread::sleep(Duration::from_millis(100));
    let e = b.allreduce(vec![2.0; 100]).unwrap_err().to_string();
    assert!(e.contains("parameter server"), "{e}");
    // And another PS may take its place.
    let _second = ps(&sw, 3).unwrap();
}

/// This deployment's secret, as the switches of these tests load it.
fn secret() -> control::Secret {
    control::Secret::load().unwrap()
}

#[test]
fn admit_release_and_attach_need_the_right_role() {
    let sw = switch("switchml");
    let (a, b) = pair(&sw, "switchml", 8);
    let release = json!({"op": "release", "job": 8});
    let t = Duration::from_secs(5);
    // No credentials, a worker's, or another deployment's: refused, and the job goes on.
    let stranger = control::Secret::from_bytes([9; 32]);
    for auth in [None, Some(secret().credential(control::AuthRole::Worker)), Some(stranger.credential(control::AuthRole::Switch))] {
        let e = control::request(sw.control_addr, auth.as_ref(), &release, t).unwrap_err().to_string();
        assert!(e.contains("needs a connection authenticated as switch") || e.contains("not this deployment's secret"), "{e}");
    }
    let attach = json!({"op": "attach", "role": "ps", "node": 7, "udp": "127.0.0.1:9", "control": "127.0.0.1:9"});
    let e = control::request(sw.control_addr, Some(&secret().credential(control::AuthRole::Worker)), &attach, t).unwrap_err().to_string();
    assert!(e.contains("authenticated as ps"), "{e}");
    let tb = std::thread::spawn(move || b.allreduce(vec![2.0; 100]).unwrap());
    assert_eq!(a.allreduce(vec![1.0; 100]).unwrap(), vec![3.0; 100]);
    assert_eq!(tb.join().unwrap(), vec![3.0; 100]);
    // A worker of another deployment cannot join, and says why.
    let opts = ClientOptions { switch: sw.control_addr, job: 9, rank: 0, world: 1, config: json!({"scheme": "switchml"}), join_timeout: Duration::from_secs(5), secret: Some(stranger), job_secret: None, link_rate_bps: None };
    let e = Client::connect(opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("refused our credentials"), "{e}");
}

#[test]
fn a_switchs_release_fails_the_job_on_every_worker() {
    let sw = switch("switchml");
    let (a, b) = pair(&sw, "switchml", 7);
    control::request(sw.control_addr, Some(&secret().credential(control::AuthRole::Switch)), &json!({"op": "release", "job": 7}), Duration::from_secs(5)).unwrap();
    for c in [a, b] {
        let e = c.allreduce(vec![1.0; 10]).unwrap_err().to_string();
        assert!(e.contains("released"), "{e}");
    }
}

#[test]
fn a_forged_admit_changes_nothing() {
    let sw = switch("switchml");
    let (a, b) = pair(&sw, "switchml", 4);
    // The running job's id, with rank 1's address under another node id: refused, and rank 1
    // keeps its port (it was re-numbered before the fix, and its packets dropped as spoofed).
    let mut spec = b.spec.clone();
    spec.workers[1].node = 4242;
    let me = secret();
    let as_switch = Some(&me.credential(control::AuthRole::Switch));
    let e = control::request(sw.control_addr, as_switch, &json!({"op": "admit", "spec": spec}), Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("already admitted"), "{e}");
    // Another job id that claims rank 1's address: refused too.
    spec.job = 99;
    let e = control::request(sw.control_addr, as_switch, &json!({"op": "admit", "spec": spec}), Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("belongs to node"), "{e}");
    let t = std::thread::spawn(move || b.allreduce(vec![2.0; 500]).unwrap());
    assert_eq!(a.allreduce(vec![1.0; 500]).unwrap(), vec![3.0; 500]);
    assert_eq!(t.join().unwrap(), vec![3.0; 500]);
    assert_eq!(stats_within(&sw, Duration::from_secs(2))["jobs"], json!([4]));
}

mod parsers {
    //! The control-line parser on the stable toolchain (the fuzz targets in fuzz/ run the
    //! same code under libFuzzer): random bytes and random JSON never panic, a line never
    //! yields more than the cap, and `auth` without the secret never authenticates.
    use inalab_net::control::{self, AuthRole, JobSpec, Secret, ServerAuth};
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        #[test]
        fn random_bytes_never_panic_nor_authenticate(data in prop::collection::vec(any::<u8>(), 0..4096)) {
            let mut r = std::io::Cursor::new(data);
            let mut auth = ServerAuth::new(Secret::from_bytes([1; 32]));
            for _ in 0..16 {
                let Ok(Some(msg)) = control::read_line(&mut r) else { break };
                let op = msg["op"].as_str().unwrap_or("");
                let _ = auth.handle(op, &msg);
                if let Ok(spec) = control::field::<JobSpec>(&msg, "spec") {
                    let _ = spec.frame_mac();
                }
            }
            prop_assert!(auth.role().is_none());
        }

        #[test]
        fn forged_proofs_are_refused(role in prop::sample::select(vec!["worker", "ps", "switch", "admin"]),
                                     nonce in "[0-9a-f]{0,80}", proof in "[0-9a-f]{0,80}") {
            let mut auth = ServerAuth::new(Secret::from_bytes([1; 32]));
            let _ = auth.handle("hello", &json!({"op": "hello"})).unwrap();
            let r = auth.handle("auth", &json!({"op": "auth", "role": role, "nonce": nonce, "proof": proof})).unwrap();
            prop_assert!(r.is_err());
            prop_assert!(auth.require("admit", &[AuthRole::Switch]).is_err());
        }
    }
}

#[test]
fn a_rendezvous_secret_keeps_strangers_out_of_a_jobs_ranks() {
    // Issue #12, finding 3: anyone could take a missing rank of a job in its rendezvous (or
    // pre-claim rank 0). With a job secret, a joiner without it is refused and the honest
    // ranks complete the job.
    let sw = switch("switchml");
    let opts = |rank: usize, job_secret: Option<&str>| ClientOptions {
        switch: sw.control_addr, job: 12, rank, world: 2, config: json!({"scheme": "switchml"}),
        join_timeout: Duration::from_secs(10), secret: None, job_secret: job_secret.map(str::to_string), link_rate_bps: None,
    };
    let first = {
        let o = opts(0, Some("s3cret"));
        std::thread::spawn(move || Client::connect(o).unwrap())
    };
    std::thread::sleep(Duration::from_millis(200));
    for wrong in [None, Some("guess")] {
        let e = Client::connect(opts(1, wrong)).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("rendezvous secret differs"), "{e}");
    }
    let second = Client::connect(opts(1, Some("s3cret"))).unwrap();
    let first = first.join().unwrap();
    let t = std::thread::spawn(move || first.allreduce(vec![1.0; 10]).unwrap());
    assert_eq!(second.allreduce(vec![2.0; 10]).unwrap(), vec![3.0; 10]);
    assert_eq!(t.join().unwrap(), vec![3.0; 10]);
}

// ---------------------------------------------------------------- issue #36, items 5, 6 and 9

/// A TCP connection to `to` from the local address `src` (127.0.0.2 and up are loopback too):
/// an attacker on a host of its own.
fn connect_from(src: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    connect_with(src, to, None)
}

/// As [`connect_from`], with a receive buffer of `rcvbuf` bytes (a peer that reads nothing
/// then fills up after that many bytes, not the megabytes loopback's autotuning allows).
fn connect_with(src: &str, to: SocketAddr, rcvbuf: Option<usize>) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    if let Some(n) = rcvbuf {
        s.set_recv_buffer_size(n)?;
    }
    s.bind(&SocketAddr::new(src.parse().unwrap(), 0).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// An authenticated worker connection from `src`, or why not (closed at accept).
fn worker_from(src: &str, to: SocketAddr) -> Result<(TcpStream, BufReader<TcpStream>), NetError> {
    let mut c = connect_from(src, to)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(c.try_clone()?);
    control::authenticate(&mut c, &mut r, &secret().credential(control::AuthRole::Worker))?;
    Ok((c, r))
}

#[test]
fn joins_that_never_complete_hold_at_most_a_sources_share_and_only_until_their_deadline() {
    // Issue #36, item 6: a tenant filled the switch's 256 connections with joins of a job that
    // never completes, and held them with no traffic. Now one address holds at most 128, and a
    // join ends at its join timeout (here 2 s; at most 600 s).
    let sw = switch("switchml");
    let mut held = vec![];
    let mut refused = 0;
    for rank in 0..200 {
        match worker_from("127.0.0.2", sw.control_addr) {
            Ok((mut c, r)) => {
                let join = json!({"op": "join", "job": 77, "rank": rank, "world": 1000, "timeout_s": 2, "config": {"scheme": "switchml"}, "udp": format!("127.0.0.2:{}", 1000 + rank)});
                control::send_line(&mut c, &join).unwrap();
                held.push((c, r));
            }
            Err(_) => refused += 1,
        }
    }
    let joined_at = Instant::now();
    assert_eq!((held.len(), refused), (service_cap(), 200 - service_cap()), "one source holds at most its share");
    // Meanwhile another host's job joins and runs.
    let (a, b) = pair(&sw, "switchml", 78);
    let t = std::thread::spawn(move || b.allreduce(vec![2.0; 100]).unwrap());
    assert_eq!(a.allreduce(vec![1.0; 100]).unwrap(), vec![3.0; 100]);
    assert_eq!(t.join().unwrap(), vec![3.0; 100]);
    // Every held join is told and closed at its deadline.
    for (_, r) in held.iter_mut() {
        let v = control::read_line(r).expect("an answer, not a hang").expect("an answer");
        assert!(v["error"].as_str().unwrap().contains("joined in time"), "{v}");
        assert!(matches!(control::read_line(r), Ok(None) | Err(_)), "the connection is closed");
    }
    assert!(joined_at.elapsed() < Duration::from_secs(10), "released within the deadline (2 s) and margin: {:?}", joined_at.elapsed());
    let as_switch = secret().credential(control::AuthRole::Switch);
    let v = control::request(sw.control_addr, Some(&as_switch), &json!({"op": "stats"}), Duration::from_secs(5)).unwrap();
    assert!(!v["jobs"].as_array().unwrap().contains(&json!(77)), "{}", v["jobs"]);
}

fn service_cap() -> usize {
    // inalab_net's per-source cap (half the 256 connections).
    128
}

#[test]
fn stats_without_the_switch_role_shows_no_job_in_its_rendezvous() {
    // Issue #36, item 6: unauthenticated `stats` listed jobs still waiting for ranks, and a
    // tenant took a victim's free rank (its sum became 1001).
    let sw = switch("switchml");
    let (mut c, mut r) = worker_from("127.0.0.1", sw.control_addr).unwrap();
    control::send_line(&mut c, &json!({"op": "join", "job": 91, "rank": 0, "world": 2, "config": {"scheme": "switchml"}, "udp": "127.0.0.1:9"})).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for auth in [None, Some(secret().credential(control::AuthRole::Worker))] {
        let v = control::request(sw.control_addr, auth.as_ref(), &json!({"op": "stats"}), Duration::from_secs(5)).unwrap();
        assert_eq!(v["jobs"], json!([]), "a waiting job's id leaks: {}", v["jobs"]);
    }
    let v = control::request(sw.control_addr, Some(&secret().credential(control::AuthRole::Switch)), &json!({"op": "stats"}), Duration::from_secs(5)).unwrap();
    assert_eq!(v["jobs"], json!([91]), "the operator sees it");
    assert_eq!(sw.stats()["jobs"], json!([91]), "the operator sees it");
    // A joiner with another configuration learns nothing of the first joiner's.
    let (mut d, mut rd) = worker_from("127.0.0.1", sw.control_addr).unwrap();
    control::send_line(&mut d, &json!({"op": "join", "job": 91, "rank": 1, "world": 2, "config": {"scheme": "switchml", "ina": {"pool_slots": 9}}, "udp": "127.0.0.1:10"})).unwrap();
    let e = control::read_line(&mut rd).unwrap().unwrap();
    let e = e["error"].as_str().unwrap();
    assert!(e.contains("differ") && !e.contains("\"pool_slots\":128"), "{e}");
    drop((c, r.get_mut()));
}

#[test]
fn a_failed_auth_at_the_ps_closes_the_connection() {
    // Issue #36, item 6: runtime.md said so; the PS answered and kept the connection open.
    let sw = switch("atp");
    let ps = ps(&sw, 2).unwrap();
    let mut c = TcpStream::connect(ps.control_addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    control::send_line(&mut c, &json!({"op": "hello"})).unwrap();
    assert!(control::read_line(&mut r).unwrap().unwrap()["nonce"].is_string());
    control::send_line(&mut c, &json!({"op": "auth", "role": "switch", "nonce": "00", "proof": "00"})).unwrap();
    let v = control::read_line(&mut r).unwrap().unwrap();
    assert!(v["error"].as_str().unwrap().contains("failed"), "{v}");
    assert!(matches!(control::read_line(&mut r), Ok(None)), "the PS closed the connection");
}

#[test]
fn connections_that_never_read_cannot_hold_the_ps() {
    // Issue #36, item 6: the PS set no write timeout, so 256 connections pipelining `stats`
    // without reading held every one of its connections for ever (new jobs got "Connection
    // reset by peer"). Each write now gives up after 5 s and closes its connection.
    let sw = switch("atp");
    let ps = ps(&sw, 2).unwrap();
    let line = b"{\"op\":\"stats\"}\n".repeat(100);
    let mut held = vec![];
    for src in ["127.0.0.2", "127.0.0.3"] {
        for _ in 0..service_cap() {
            let Ok(c) = connect_with(src, ps.control_addr, Some(4096)) else { continue };
            c.set_nonblocking(true).unwrap();
            held.push(c);
        }
    }
    // Pipeline requests until the PS stops reading them (its writes to us are stuck).
    let began = Instant::now();
    for c in held.iter_mut() {
        for _ in 0..100 {
            if c.write(&line).is_err() {
                break;
            }
        }
    }
    let stuffed = Instant::now();
    eprintln!("stuffed in {:?}", began.elapsed());
    // The holds end within the write timeout plus a margin: the PS answers `stats` again.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        match control::request(ps.control_addr, None, &json!({"op": "stats"}), Duration::from_secs(2)) {
            Ok(v) => {
                assert_eq!(v["node"], 2);
                eprintln!("answered after {:?} ({} held)", stuffed.elapsed(), held.len());
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "the PS is still held after {:?}: {e}", stuffed.elapsed()),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // And jobs still find it.
    let (a, b) = pair(&sw, "atp", 3);
    let t = std::thread::spawn(move || b.allreduce(vec![2.0; 100]).unwrap());
    assert_eq!(a.allreduce(vec![1.0; 100]).unwrap(), vec![3.0; 100]);
    assert_eq!(t.join().unwrap(), vec![3.0; 100]);
}

/// A loopback control address no one listens on yet.
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn a_ps_attaches_again_to_a_restarted_switch_and_serves_later_jobs() {
    // Issue #36, item 5: after a switch restart every later ATP job failed with "no parameter
    // server" while the PS ran on. It now attaches again and names the jobs it still runs
    // (here none survives: the switch restarted).
    let control = free_addr();
    let start = || SwitchHandle::start(SwitchOptions { udp: any_port(), control, ..SwitchOptions::new(&["atp"]) }).unwrap();
    let first = start();
    let p = ps(&first, 2).unwrap();
    let (a, b) = pair(&first, "atp", 1);
    let t = std::thread::spawn(move || b.allreduce(vec![2.0; 100]).unwrap());
    assert_eq!(a.allreduce(vec![1.0; 100]).unwrap(), vec![3.0; 100]);
    t.join().unwrap();
    assert_eq!(p.stats()["jobs"].as_object().unwrap().len(), 1);
    first.stop();
    // The job failed with its switch; the PS frees it once the new switch says it serves none.
    assert!(a.allreduce(vec![1.0; 10]).is_err());
    let second = start();
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.stats()["attaches"] != 2 {
        assert!(Instant::now() < deadline, "the PS did not attach again: {}", p.stats());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(p.stats()["jobs"], json!({}), "the lost job's server is freed");
    let (c, d) = pair(&second, "atp", 2);
    let t = std::thread::spawn(move || d.allreduce(vec![2.0; 100]).unwrap());
    assert_eq!(c.allreduce(vec![1.0; 100]).unwrap(), vec![3.0; 100]);
    assert_eq!(t.join().unwrap(), vec![3.0; 100]);
}

#[test]
fn a_returning_ps_replaces_its_older_connection_and_keeps_its_jobs() {
    // A PS that lost its switch (either stalled past the liveness limit) comes back before
    // the switch noticed: the same node replaces its attachment (it was "a second one is
    // refused"), the end of its old connection then fails nothing, and another node is
    // still refused.
    let sw = switch("atp");
    let attach = |node: u32, udp: &str| {
        let mut c = TcpStream::connect(sw.control_addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        control::authenticate(&mut c, &mut r, &secret().credential(control::AuthRole::Ps)).unwrap();
        control::send_line(&mut c, &json!({"op": "attach", "role": "ps", "node": node, "udp": udp, "control": "127.0.0.1:9", "jobs": []})).unwrap();
        let v = control::read_line(&mut r).unwrap().unwrap();
        (c, v)
    };
    let (old, v) = attach(7, "127.0.0.1:7");
    assert_eq!(v["ok"], true, "{v}");
    let (_new, v) = attach(7, "127.0.0.1:7");
    assert_eq!((v["ok"].clone(), v["jobs"].clone()), (json!(true), json!([])), "{v}");
    let (_other, v) = attach(8, "127.0.0.1:8");
    assert!(v["error"].as_str().unwrap().contains("second one is refused"), "{v}");
    drop(old);
    std::thread::sleep(Duration::from_millis(300));
    let info = control::request(sw.control_addr, Some(&secret().credential(control::AuthRole::Switch)), &json!({"op": "ps_info"}), Duration::from_secs(5)).unwrap();
    assert_eq!(info["ps"], 7, "the returning PS is still attached: {info}");
}

#[test]
fn the_join_timeout_bounds_every_step_against_a_stalled_or_slow_switch() {
    // Issue #36, item 9: against a switch that accepts and never answers, `join_timeout` was
    // not honoured (10 s, then "os error 11"); against one that trickles its answer, no
    // bound at all.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow_addr = slow.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in slow.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                // One byte of a never-ending line every 100 ms.
                while c.write_all(b" ").is_ok() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    for addr in [stalled.local_addr().unwrap(), slow_addr] {
        let opts = ClientOptions { switch: addr, job: 1, rank: 0, world: 1, config: json!({"scheme": "switchml"}), join_timeout: Duration::from_millis(1500), secret: None, job_secret: None, link_rate_bps: None };
        let t = Instant::now();
        let e = Client::connect(opts).map(|_| ()).unwrap_err().to_string();
        assert!(t.elapsed() < Duration::from_secs(5), "{addr}: {:?}", t.elapsed());
        assert!(e.contains("join timeout") && !e.contains("os error"), "{e}");
    }
}

#[test]
fn a_wait_for_the_other_ranks_can_be_interrupted() {
    // Issue #36, item 9: Ctrl-C was ignored while `Client()` waited for the other ranks (60 s
    // by default). The wait asks its caller every 100 ms or so (Python: for signals).
    let sw = switch("switchml");
    let opts = ClientOptions { switch: sw.control_addr, job: 5, rank: 0, world: 2, config: json!({"scheme": "switchml"}), join_timeout: Duration::from_secs(60), secret: None, job_secret: None, link_rate_bps: None };
    let t = Instant::now();
    let e = Client::connect_with(opts, || if t.elapsed() > Duration::from_millis(300) { Err(NetError::JobFailed("interrupted".into())) } else { Ok(()) })
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("interrupted"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}
