//! `inalab._core`: the Rust simulator and UDP runtime behind the Python front. JSON crosses the boundary in
//! both directions so the Python side owns configs and DataFrames and the Rust side owns the
//! simulation; errors become `ValueError("field.path: message")`.

mod net;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Simulates a scenario spec (JSON, as `inalab.config` produces) and returns the result as
/// JSON. `progress(fraction, events, sim_time_s)` is called about every 0.1 s of wall time
/// (`inalab_sim::REPORT_EVERY_MS`) and once at the end. The GIL is released while simulating
/// and taken back at each report to run Python's signal handlers: Ctrl-C (or a handler that
/// raises, as `inalab simulate`'s for SIGTERM) or an exception of `progress` stops the run
/// there, and that exception is raised with the partial result's JSON as its `inalab_result`
/// attribute (the result's `outcome` says "interrupted").
#[pyfunction]
#[pyo3(signature = (spec_json, progress=None))]
fn simulate(py: Python<'_>, spec_json: &str, progress: Option<Py<PyAny>>) -> PyResult<String> {
    use std::ops::ControlFlow;
    let spec = inalab_sim::parse_spec(spec_json).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut sim = inalab_sim::Sim::new(&spec).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut stopped_by: Option<PyErr> = None;
    py.detach(|| {
        let mut report = |r: &inalab_sim::ProgressReport| {
            Python::attach(|py| {
                let outcome = py.check_signals().and_then(|()| match &progress {
                    Some(cb) => cb.call1(py, (r.fraction, r.events, r.sim_time_s)).map(drop),
                    None => Ok(()),
                });
                match outcome {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        stopped_by.get_or_insert(e);
                        ControlFlow::Break(())
                    }
                }
            })
        };
        sim.run(Some(&mut report));
    });
    let result = serde_json::to_string(&sim.finish()).map_err(|e| PyValueError::new_err(e.to_string()))?;
    match stopped_by {
        Some(e) => {
            // What was done before the stop goes with the exception, for the caller to report.
            e.value(py).setattr("inalab_result", result)?;
            Err(e)
        }
        None => Ok(result),
    }
}

/// Builds and validates a topology spec (JSON) and returns the graph as JSON:
/// `{"hosts", "nodes": [{name, kind, tier, programmable, ports}], "links": [...]}`.
#[pyfunction]
fn build_topology(topology_json: &str) -> PyResult<String> {
    let spec: inalab_topo::TopologySpec =
        serde_json::from_str(topology_json).map_err(|e| PyValueError::new_err(format!("topology: {e}")))?;
    let topo = inalab_topo::build(&spec).map_err(|e| PyValueError::new_err(e.to_string()))?;
    serde_json::to_string(&topo).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The paths the simulator's ECMP gives a job's flows: `flows_json` is `[{"job": J, "src":
/// HOST, "src_server": bool, "dst": HOST, "dst_server": bool}]` (host names of the built
/// topology; a server's packets use the job's server port, a worker's its worker port, as in
/// the simulator); returns one list of node names per flow (`null` where there is no path).
/// `inalab emulate` installs these paths so that its flows cross the links they cross in the
/// simulator. `default_port`: the network's rule, "flow_hash" or "destination".
#[pyfunction]
#[pyo3(signature = (topology_json, flows_json, default_port = "flow_hash"))]
fn ecmp_paths(topology_json: &str, flows_json: &str, default_port: &str) -> PyResult<String> {
    #[derive(serde::Deserialize)]
    struct Flow {
        job: u32,
        src: String,
        src_server: bool,
        dst: String,
        dst_server: bool,
    }
    let spec: inalab_topo::TopologySpec =
        serde_json::from_str(topology_json).map_err(|e| PyValueError::new_err(format!("topology: {e}")))?;
    let topo = inalab_topo::build(&spec).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let flows: Vec<Flow> = serde_json::from_str(flows_json).map_err(|e| PyValueError::new_err(format!("flows: {e}")))?;
    let rule: inalab_topo::DefaultPort = serde_json::from_value(serde_json::Value::String(default_port.into()))
        .map_err(|_| PyValueError::new_err(format!("network.default_port: {default_port:?}; allowed values: \"flow_hash\", \"destination\"")))?;
    let routes = inalab_topo::Routes::compute(&topo);
    let port = |job: u32, server: bool| if server { inalab_sim::setup::server_port(job) } else { inalab_sim::setup::worker_port(job) };
    let mut out = vec![];
    for f in &flows {
        let (Some(src), Some(dst)) = (topo.find(&f.src), topo.find(&f.dst)) else {
            return Err(PyValueError::new_err(format!("flows: no host {:?} or {:?}", f.src, f.dst)));
        };
        let key = inalab_core::flow_key(src, port(f.job, f.src_server), dst, port(f.job, f.dst_server));
        let path = routes.ecmp_path(&topo, src, dst, key, rule);
        out.push(path.map(|p| p.into_iter().map(|n| topo.nodes[n as usize].name.clone()).collect::<Vec<_>>()));
    }
    serde_json::to_string(&out).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The scheme registry as JSON: `[{name, doc, servers, program, quantization, params: [{name,
/// default, unit, doc, range, allowed}]}]` (`range` as [`range_json`] gives it, `allowed` in
/// words), where `servers` is "none", "exactly_one" or "at_least_one",
/// `program` whether the scheme installs a switch program (so the UDP switch can run it) and
/// `quantization` `{"kind": "none" | "fixed_point" | "agreed_exponent", "scale"?}`.
#[pyfunction]
fn schemes() -> String {
    let list: Vec<serde_json::Value> = inalab_scheme::schemes()
        .iter()
        .map(|s| {
            let defaults = s.defaults();
            let params: Vec<serde_json::Value> = s
                .params()
                .iter()
                .map(|p| {
                    let default = defaults.pointer(&format!("/{}", p.name.replace('.', "/"))).cloned().expect("a documented parameter has a default");
                    serde_json::json!({"name": p.name, "default": default, "unit": p.unit, "doc": p.doc, "range": range_json(&p.range), "allowed": p.range.describe(p.unit)})
                })
                .collect();
            let servers = match s.servers() {
                inalab_scheme::Servers::None => "none",
                inalab_scheme::Servers::ExactlyOne => "exactly_one",
                inalab_scheme::Servers::AtLeastOne => "at_least_one",
            };
            let quantization = match s.quantization(&serde_json::json!({"scheme": s.name()})) {
                inalab_scheme::Quantization::None => serde_json::json!({"kind": "none"}),
                inalab_scheme::Quantization::FixedPoint { scale } => serde_json::json!({"kind": "fixed_point", "scale": scale}),
                inalab_scheme::Quantization::AgreedExponent => serde_json::json!({"kind": "agreed_exponent"}),
            };
            serde_json::json!({"name": s.name(), "doc": s.doc(), "servers": servers, "program": s.has_program(),
                               "quantization": quantization, "params": params})
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// A parameter's range as the registry's JSON gives it: `{"min", "max"}` for integers and
/// numbers, `{"choices": [...]}`, `{"bool": true}` or `{"list": true}`.
fn range_json(r: &inalab_scheme::Range) -> serde_json::Value {
    use inalab_scheme::Range;
    match *r {
        Range::Int { min, max } => serde_json::json!({"min": min, "max": max}),
        Range::Float { min, max } => serde_json::json!({"min": min, "max": max}),
        Range::Choice(names) => serde_json::json!({"choices": names}),
        Range::Bool => serde_json::json!({"bool": true}),
        Range::List => serde_json::json!({"list": true}),
    }
}

/// A job's scheme configuration (`{"scheme": NAME, ...}`, JSON) checked by its scheme and
/// with every default filled in; errors are `ValueError("field.path: message")`.
#[pyfunction]
fn normalize_config(config_json: &str) -> PyResult<String> {
    let config: serde_json::Value = serde_json::from_str(config_json).map_err(|e| PyValueError::new_err(format!("config: {e}")))?;
    let filled = inalab_scheme::scheme_of(&config).and_then(|s| s.normalize(&config));
    filled.map(|v| v.to_string()).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Largest absolute error of one summed value of a job with this scheme configuration (JSON),
/// `world` workers and inputs of magnitude at most `max_abs`:
/// `inalab_host::Quantization::error_bound` of the scheme's quantization.
#[pyfunction]
fn quantization_bound(config_json: &str, world: usize, max_abs: f64) -> PyResult<f64> {
    let config: serde_json::Value = serde_json::from_str(config_json).map_err(|e| PyValueError::new_err(format!("config: {e}")))?;
    let scheme = inalab_scheme::scheme_of(&config).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(scheme.quantization(&config).error_bound(world, max_abs))
}

/// The worker role key of this deployment's secret (hex): what a worker machine alone needs,
/// as `INALAB_WORKER_KEY`, to join jobs without holding the secret.
#[pyfunction]
fn worker_key() -> PyResult<String> {
    let secret = inalab_net::auth::Secret::load().map_err(PyValueError::new_err)?;
    Ok(inalab_net::auth::key_to_hex(&secret.role_key(inalab_net::auth::Role::Worker)))
}

/// Decodes one frame (the bytes of a datagram before its tag) with the runtime's own decoder,
/// as JSON: the envelope's fields, the header's kind and its `Debug` form, the values. For
/// checking what other tools (the Wireshark dissector) make of captured bytes.
#[pyfunction]
fn decode_frame(frame: &[u8]) -> PyResult<String> {
    use inalab_core::Payload;
    let p = inalab_core::frame::decode(frame).map_err(|e| PyValueError::new_err(format!("frame: {e}")))?;
    let values = match p.payload.as_deref() {
        None => serde_json::Value::Null,
        Some(Payload::I32(v)) => serde_json::json!(v),
        Some(Payload::F32(v)) => serde_json::json!(v),
    };
    Ok(serde_json::json!({
        "src": p.src, "dst": p.dst, "src_port": p.src_port, "dst_port": p.dst_port, "ecn": p.ecn,
        "kind": format!("{:?}", p.header.kind()), "job": p.header.job(), "header": format!("{:?}", p.header), "values": values,
    })
    .to_string())
}

/// The frame layout as the wire crate defines it, as JSON: the envelope's bytes, the runtime
/// trailer's sequence number and tag, and each header kind's tag, name and body length. What
/// the Wireshark dissector's tables are checked against (python/tests/test_wireshark.py).
#[pyfunction]
fn wire_layout() -> String {
    let kinds: Vec<serde_json::Value> =
        inalab_core::wire::HeaderKind::ALL.iter().map(|&k| serde_json::json!({"tag": k as u8, "name": format!("{k:?}"), "body_len": k.body_len()})).collect();
    serde_json::json!({
        "envelope_len": inalab_core::wire::frame::field::HEADER,
        "seq_len": inalab_net::auth::SEQ_BYTES,
        "tag_len": inalab_net::auth::TAG_BYTES,
        "kinds": kinds,
    })
    .to_string()
}

#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(build_topology, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(schemes, m)?)?;
    m.add_function(wrap_pyfunction!(normalize_config, m)?)?;
    m.add_function(wrap_pyfunction!(quantization_bound, m)?)?;
    m.add_function(wrap_pyfunction!(worker_key, m)?)?;
    m.add_function(wrap_pyfunction!(ecmp_paths, m)?)?;
    m.add_function(wrap_pyfunction!(decode_frame, m)?)?;
    m.add_function(wrap_pyfunction!(wire_layout, m)?)?;
    m.add_class::<net::Switch>()?;
    m.add_class::<net::ParameterServer>()?;
    m.add_class::<net::PyClient>()?;
    Ok(())
}
