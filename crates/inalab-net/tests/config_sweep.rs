//! Issue #36, "Done when": every registry parameter of every scheme the switch runs, at
//! hostile values (0, -1, 1, 2^31-1, 2^63, 2^64-1, 1e300, NaN, infinity, a 100 KB string and
//! the wrong JSON types), joined as a job against a live switch with a PS, while a second
//! tenant's SwitchML job runs allreduces whose sums are checked exact throughout. Each hostile
//! configuration is admitted (then it works or fails only its own job) or refused with a
//! message naming the field; the switch and the PS stay up and the honest job exact.
//!
//! Before the fix, `ina.pool_slots = 2147483647` (SwitchML) aborted the switch's process and
//! `ina.rto_ps >= 2^62` (Rina) panicked while holding the data-plane lock.

use inalab_net::client::{Client, ClientOptions};
use inalab_net::control::{self, AuthRole, Secret};
use inalab_net::ps::{PsHandle, PsOptions};
use inalab_net::switch::{SwitchHandle, SwitchOptions};
use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// The hostile values, as JSON text (NaN and infinity have no JSON form: a client that sends
/// them sends a malformed line).
fn hostile_values() -> Vec<(&'static str, String)> {
    vec![
        ("0", "0".into()),
        ("-1", "-1".into()),
        ("1", "1".into()),
        ("2^31-1", "2147483647".into()),
        ("2^63", "9223372036854775808".into()),
        ("2^64-1", "18446744073709551615".into()),
        ("1e300", "1e300".into()),
        ("NaN", "NaN".into()),
        ("inf", "Infinity".into()),
        ("huge string", format!("\"{}\"", "x".repeat(100_000))),
        ("null", "null".into()),
        ("list", "[1,2]".into()),
        ("object", "{\"a\":1}".into()),
        ("bool", "true".into()),
    ]
}

/// `{"scheme": NAME, <path>: <value>}` as JSON text, the value inserted verbatim.
fn config_text(scheme: &str, path: &str, value: &str) -> String {
    let keys: Vec<&str> = path.split('.').collect();
    let mut inner = format!("{{\"{}\":{value}}}", keys[keys.len() - 1]);
    for k in keys[..keys.len() - 1].iter().rev() {
        inner = format!("{{\"{k}\":{inner}}}");
    }
    // `inner` is an object; splice the scheme in front of its keys.
    format!("{{\"scheme\":\"{scheme}\",{}", &inner[1..])
}

/// A worker's authenticated control connection.
fn worker_conn(switch: SocketAddr) -> Result<(TcpStream, BufReader<TcpStream>), String> {
    let mut c = TcpStream::connect(switch).map_err(|e| format!("connect: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    control::authenticate(&mut c, &mut r, &Secret::load().unwrap().credential(AuthRole::Worker)).map_err(|e| format!("auth: {e}"))?;
    Ok((c, r))
}

/// Joins both ranks of a 2-worker job `job` with the configuration `config` (JSON text), then
/// leaves: `Ok` if it was admitted, else the switch's refusal (of rank 0; neither is admitted).
fn join_pair(switch: SocketAddr, job: u32, config: &str) -> Result<(), String> {
    let mut conns = [worker_conn(switch)?, worker_conn(switch)?];
    for (rank, (c, _)) in conns.iter_mut().enumerate() {
        let line = format!("{{\"op\":\"join\",\"job\":{job},\"rank\":{rank},\"world\":2,\"timeout_s\":10,\"udp\":\"127.0.0.1:{}\",\"config\":{config}}}\n", 9 + rank);
        c.write_all(line.as_bytes()).map_err(|e| format!("write: {e}"))?;
    }
    let mut replies = vec![];
    for (_, r) in conns.iter_mut() {
        let reply = control::read_line(r).map_err(|e| format!("the switch's reply: {e}"))?.ok_or("the switch closed the connection")?;
        replies.push(reply);
    }
    let oks = replies.iter().filter(|r| r["ok"] == true).count();
    if oks == 0 {
        return Err(replies[0]["error"].as_str().unwrap_or("").to_string());
    }
    assert_eq!(oks, 2, "{replies:?}");
    for (c, r) in conns.iter_mut() {
        control::send_line(c, &json!({"op": "leave"})).unwrap();
        while let Ok(Some(v)) = control::read_line(r) {
            if v.get("ok").is_some() {
                break;
            }
        }
    }
    Ok(())
}

/// Runs one allreduce of a 2-worker job with `config` (admitted above):
/// the sum, or why the job failed (then only it did).
fn run_job(switch: SocketAddr, job: u32, config: Value) -> Result<(), String> {
    let opts = |rank| ClientOptions {
        switch,
        job,
        rank,
        world: 2,
        config: config.clone(),
        join_timeout: Duration::from_secs(20),
        secret: None,
        job_secret: None,
        link_rate_bps: None,
    };
    let o1 = opts(1);
    let other = std::thread::spawn(move || -> Result<(), String> {
        let c = Client::connect(o1).map_err(|e| e.to_string())?;
        let r = c.allreduce_within(vec![2.0; 300], None, Duration::from_secs(20), || Ok(())).map_err(|e| e.to_string());
        drop(c);
        r.map(|v| assert!(v.iter().all(|&x| (x - 3.0).abs() < 1e-3), "a wrong sum: {:?}", &v[..3]))
    });
    let c = Client::connect(opts(0)).map_err(|e| e.to_string())?;
    let mine = c.allreduce_within(vec![1.0; 300], None, Duration::from_secs(20), || Ok(())).map_err(|e| e.to_string());
    drop(c);
    let theirs = other.join().unwrap();
    let v = mine?;
    assert!(v.iter().all(|&x| (x - 3.0).abs() < 1e-3), "a wrong sum: {:?}", &v[..3]);
    theirs
}

#[test]
fn every_parameter_at_hostile_values_against_a_live_switch_with_an_honest_tenant() {
    let started = Instant::now();
    let programs: Vec<&'static str> = inalab_scheme::schemes().iter().filter(|s| s.has_program()).map(|s| s.name()).collect();
    let sw = SwitchHandle::start(SwitchOptions {
        udp: any_port(),
        control: any_port(),
        memory_bytes: 40_000_000,
        ..SwitchOptions::new(&programs)
    })
    .unwrap();
    let ps = PsHandle::start(PsOptions { udp: any_port(), control: any_port(), switch: sw.control_addr, ..PsOptions::default() }).unwrap();

    // The honest tenant: a 2-worker SwitchML job summing integers (exact) all along.
    let honest = |rank| ClientOptions {
        switch: sw.control_addr,
        job: 1,
        rank,
        world: 2,
        config: json!({"scheme": "switchml", "ina": {"pool_slots": 8}}),
        join_timeout: Duration::from_secs(20),
        secret: None,
        job_secret: None,
        link_rate_bps: None,
    };
    let o1 = honest(1);
    let peer = std::thread::spawn(move || Client::connect(o1).unwrap());
    let (a, b) = (Client::connect(honest(0)).unwrap(), peer.join().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let sums = Arc::new(AtomicU64::new(0));
    let tenant = {
        let (stop, sums) = (stop.clone(), sums.clone());
        std::thread::spawn(move || {
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let mine: Vec<f32> = (0..2000).map(|i| ((i + k as usize) % 97) as f32).collect();
                let theirs: Vec<f32> = (0..2000).map(|i| ((i * 3 + k as usize) % 89) as f32).collect();
                let want: Vec<f32> = mine.iter().zip(&theirs).map(|(x, y)| x + y).collect();
                let t = {
                    let b = &b;
                    std::thread::scope(|sc| {
                        let h = sc.spawn(move || b.allreduce(theirs));
                        let got = a.allreduce(mine);
                        (got, h.join().unwrap())
                    })
                };
                assert_eq!(t.0.expect("the honest job's allreduce"), want, "allreduce {k}: rank 0's sum");
                assert_eq!(t.1.expect("the honest job's allreduce"), want, "allreduce {k}: rank 1's sum");
                sums.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    // Job ids stay below 256 (Canary's tenant prefix): each sweep job is gone before the next.
    let mut job = 10;
    let (mut admitted, mut refused) = (0, 0);
    // One admitted configuration per scheme that runs traffic below.
    let mut to_run: Vec<(String, Value)> = vec![];
    for scheme in inalab_scheme::schemes().iter().filter(|s| s.has_program()) {
        for p in scheme.params() {
            for (what, text) in hostile_values() {
                job = if job >= 249 { 10 } else { job + 1 };
                let config = config_text(scheme.name(), p.name, &text);
                let value: Option<Value> = serde_json::from_str(&text).ok();
                match join_pair(sw.control_addr, job, &config) {
                    Ok(()) => {
                        admitted += 1;
                        let v = value.expect("only JSON values are admitted");
                        assert!(p.range.allows(&v), "{}: {} = {what} admitted outside its range", scheme.name(), p.name);
                        if !to_run.iter().any(|(s, _)| s == scheme.name()) {
                            to_run.push((scheme.name().to_string(), serde_json::from_str(&config).unwrap()));
                        }
                    }
                    Err(e) => {
                        refused += 1;
                        assert!(!e.is_empty() && e.len() < 1200, "{}: {} = {what}: a {}-byte refusal", scheme.name(), p.name, e.len());
                        match value {
                            // NaN and infinity are not JSON: the line is refused as malformed.
                            None => assert!(e.contains("bad control line"), "{}: {} = {what}: {e}", scheme.name(), p.name),
                            // A value outside the parameter's range is refused naming it.
                            Some(v) if !p.range.allows(&v) => {
                                assert!(e.contains(&format!("config.{}", p.name)) && e.contains("allowed"), "{}: {} = {what}: {e}", scheme.name(), p.name)
                            }
                            // One inside it may still not make a job (a packet too small for its
                            // header, a scheme this deployment cannot lay out): said clearly.
                            Some(_) => {
                                if std::env::var("SWEEP_VERBOSE").is_ok() {
                                    eprintln!("{}: {} = {what}: {e}", scheme.name(), p.name);
                                }
                            }
                        }
                    }
                }
            }
            // The switch and the PS answer throughout.
            assert!(sw.health().is_ok() && ps.health().is_ok());
        }
    }
    // Every parameter of every scheme met every hostile value: none skipped by an early exit.
    let params: usize = inalab_scheme::schemes().iter().filter(|s| s.has_program()).map(|s| s.params().len()).sum();
    assert!(params >= 70, "the schemes lost parameters: {params}");
    assert_eq!(admitted + refused, params * hostile_values().len(), "{params} parameters x {} values", hostile_values().len());
    // The two configurations of the issue: refused, naming the field and its range.
    let e = join_pair(sw.control_addr, 3, r#"{"scheme":"switchml","ina":{"pool_slots":2147483647}}"#).unwrap_err();
    assert!(e.contains("config.ina.pool_slots") && e.contains("0..=16777216"), "{e}");
    let e = join_pair(sw.control_addr, 4, r#"{"scheme":"rina","ina":{"rto_ps":4611686018427387904}}"#).unwrap_err();
    assert!(e.contains("config.ina.rto_ps") && e.contains("1 us to 60 s"), "{e}");

    // An admitted hostile configuration of each scheme runs a 2-worker job: it works, or fails
    // alone.
    for (i, (scheme, config)) in to_run.iter().enumerate() {
        let r = run_job(sw.control_addr, 250 + i as u32, config.clone());
        eprintln!("{scheme}: {config}: {r:?}");
    }
    assert!(to_run.len() >= 5, "admitted configurations ran for {to_run:?}");

    stop.store(true, Ordering::Relaxed);
    tenant.join().expect("the honest job stayed exact");
    let st = sw.stats();
    assert!(sums.load(Ordering::Relaxed) >= 5, "the honest job ran {} allreduces", sums.load(Ordering::Relaxed));
    assert!(sw.health().is_ok() && ps.health().is_ok(), "{st}");
    assert_eq!(st["program_panics"], 0, "{st}");
    eprintln!("{admitted} admitted, {refused} refused, {} honest allreduces, {:?}", sums.load(Ordering::Relaxed), started.elapsed());
}
