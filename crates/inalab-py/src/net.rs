//! Bindings of the UDP runtime (`inalab-net`): the software switch, the PS and the worker
//! client. The Python wrappers in `inalab.runtime` validate options and convert arrays.

use inalab_net::client::{Client, ClientOptions};
use inalab_net::ps::{PsHandle, PsOptions};
use inalab_net::switch::{PortShaping, SwitchHandle, SwitchOptions};
use inalab_net::NetError;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use std::net::SocketAddr;
use std::time::Duration;

/// Where a tensor stands in its model's iteration, as Python gives it (checked there):
/// (layer 1-based, layers, comm/comp, seconds left in the iteration).
type Context = (u32, u32, f64, f64);

fn tensor_context((layer, layers, comm_over_comp, remaining_s): Context) -> inalab_scheme::TensorContext {
    let remaining_ps = (remaining_s.max(0.0) * inalab_core::time::S as f64).min(u64::MAX as f64) as u64;
    inalab_scheme::TensorContext { layer, layers, comm_over_comp, remaining_ps }
}

fn addr(field: &str, s: &str) -> PyResult<SocketAddr> {
    s.parse().map_err(|_| PyValueError::new_err(format!("{field}: {s:?} is not an ip:port address")))
}

/// A static fabric's JSON (`inalab emulate` writes it), checked.
fn fabric<T: serde::de::DeserializeOwned>(json: Option<&str>) -> PyResult<Option<T>> {
    json.map(|j| serde_json::from_str(j).map_err(|e| PyValueError::new_err(format!("fabric: {e}")))).transpose()
}

/// The longest timeout a call takes, seconds: a day. Longer (or not a positive number) is a
/// `ValueError` naming the argument, not a panic in `Duration`.
const MAX_TIMEOUT_S: f64 = 86_400.0;

/// `seconds` as a timeout, or a `ValueError` naming `arg` and the allowed range.
fn timeout(arg: &str, seconds: f64) -> PyResult<Duration> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TIMEOUT_S) {
        return Err(PyValueError::new_err(format!("{arg}: {seconds} is not a number of seconds in (0, {MAX_TIMEOUT_S}] (0 excluded, at most a day)")));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A closure for the runtime's blocking waits: Ctrl-C (any signal handler's exception) ends
/// them; the exception is kept in `signal` to be raised once the GIL is back.
fn signals(signal: &mut Option<PyErr>) -> impl FnMut() -> Result<(), NetError> + '_ {
    move || match Python::attach(|py| py.check_signals()) {
        Ok(()) => Ok(()),
        Err(e) => {
            *signal = Some(e);
            Err(NetError::JobFailed("interrupted by a signal".into()))
        }
    }
}

fn net_err(e: NetError) -> PyErr {
    match e {
        NetError::Config(m) => PyValueError::new_err(m),
        NetError::Unreachable(m) => PyConnectionError::new_err(m),
        e => PyRuntimeError::new_err(e.to_string()),
    }
}

fn bytes_of(py: Python<'_>, v: &[f32]) -> Py<PyByteArray> {
    // SAFETY: f32 has no padding; the slice's memory is valid for its byte length.
    let b = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
    PyByteArray::new(py, b).unbind()
}

fn values(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    let buf = PyBuffer::<f32>::get(data)?;
    buf.to_vec(py)
}

/// A running software switch (threads inside this process).
#[pyclass(module = "inalab._core")]
pub struct Switch(Option<SwitchHandle>);

#[pymethods]
impl Switch {
    #[new]
    #[pyo3(signature = (programs, udp, control, node, memory_bytes, pool_slots, drop_probability, seed, upstream, timeout_us, link_rate_bps=None, link_delay_us=0.0, buffer_bytes=1048576, fabric_json=None, packet_values=2048, pcap=None, threads=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        programs: Vec<String>,
        udp: &str,
        control: &str,
        node: u32,
        memory_bytes: u64,
        pool_slots: u32,
        drop_probability: f64,
        seed: u64,
        upstream: Option<&str>,
        timeout_us: u64,
        link_rate_bps: Option<u64>,
        link_delay_us: f64,
        buffer_bytes: u64,
        fabric_json: Option<&str>,
        packet_values: u32,
        pcap: Option<std::path::PathBuf>,
        threads: usize,
    ) -> PyResult<Switch> {
        let opts = SwitchOptions {
            programs,
            node,
            udp: addr("udp", udp)?,
            control: addr("control", control)?,
            memory_bytes,
            pool_slots,
            packet_values,
            drop_probability,
            seed,
            upstream: upstream.map(|u| addr("upstream", u)).transpose()?,
            timeout_us,
            // The deployment secret comes from INALAB_SECRET or the secret file.
            secret: None,
            shaping: link_rate_bps.map(|rate_bps| PortShaping { rate_bps, delay_us: link_delay_us, buffer_bytes }),
            fabric: fabric(fabric_json)?,
            pcap,
            threads,
        };
        SwitchHandle::start(opts).map(|h| Switch(Some(h))).map_err(net_err)
    }

    #[getter]
    fn udp_addr(&self) -> PyResult<String> {
        Ok(self.handle()?.udp_addr.to_string())
    }
    #[getter]
    fn control_addr(&self) -> PyResult<String> {
        Ok(self.handle()?.control_addr.to_string())
    }
    /// Counters as JSON; `RuntimeError` once the switch's data plane stopped (it then serves
    /// nothing: the message says why).
    fn stats(&self) -> PyResult<String> {
        let h = self.handle()?;
        h.health().map_err(net_err)?;
        Ok(h.stats().to_string())
    }
    /// `RuntimeError` once the switch's data plane stopped; nothing while it serves.
    fn health(&self) -> PyResult<()> {
        self.handle()?.health().map_err(net_err)
    }
    /// The link to neighbour `peer` is down (`up` false) or up again.
    fn set_link(&self, py: Python<'_>, peer: u32, up: bool) -> PyResult<()> {
        let h = self.handle()?;
        py.detach(|| h.set_link(peer, up)).map_err(net_err)
    }
    /// Job `job` ended: its state here is removed; returns the aggregators it still held.
    fn release_job(&self, py: Python<'_>, job: u32) -> PyResult<u32> {
        let h = self.handle()?;
        Ok(py.detach(|| h.release_job(job)))
    }
    fn stop(&mut self, py: Python<'_>) {
        if let Some(h) = self.0.take() {
            py.detach(|| h.stop());
        }
    }
}

impl Switch {
    fn handle(&self) -> PyResult<&SwitchHandle> {
        self.0.as_ref().ok_or_else(|| PyRuntimeError::new_err("the switch was stopped"))
    }
}

/// A running parameter server.
#[pyclass(module = "inalab._core")]
pub struct ParameterServer(Option<PsHandle>);

#[pymethods]
impl ParameterServer {
    #[new]
    #[pyo3(signature = (udp, control, switch, node, link_rate_bps=None, fabric_json=None))]
    fn new(udp: &str, control: &str, switch: &str, node: u32, link_rate_bps: Option<u64>, fabric_json: Option<&str>) -> PyResult<ParameterServer> {
        let opts = PsOptions {
            node,
            udp: addr("udp", udp)?,
            control: addr("control", control)?,
            switch: addr("switch", switch)?,
            secret: None,
            link_rate_bps,
            fabric: fabric(fabric_json)?,
        };
        PsHandle::start(opts).map(|h| ParameterServer(Some(h))).map_err(net_err)
    }
    #[getter]
    fn udp_addr(&self) -> PyResult<String> {
        Ok(self.handle()?.udp_addr.to_string())
    }
    #[getter]
    fn control_addr(&self) -> PyResult<String> {
        Ok(self.handle()?.control_addr.to_string())
    }
    /// Counters as JSON; `RuntimeError` once the PS's data plane stopped.
    fn stats(&self) -> PyResult<String> {
        let h = self.handle()?;
        h.health().map_err(net_err)?;
        Ok(h.stats().to_string())
    }
    /// `RuntimeError` once the PS's data plane stopped; nothing while it serves.
    fn health(&self) -> PyResult<()> {
        self.handle()?.health().map_err(net_err)
    }
    fn stop(&mut self, py: Python<'_>) {
        if let Some(h) = self.0.take() {
            py.detach(|| h.stop());
        }
    }
}

impl ParameterServer {
    fn handle(&self) -> PyResult<&PsHandle> {
        self.0.as_ref().ok_or_else(|| PyRuntimeError::new_err("the parameter server was stopped"))
    }
}

/// A worker's connection to its job.
#[pyclass(module = "inalab._core", name = "Client")]
pub struct PyClient(Option<Client>);

#[pymethods]
impl PyClient {
    /// A worker of a static deployment: rank `rank` of the job `spec_json` describes, sending
    /// to its switch at `gateway` (no rendezvous).
    #[staticmethod]
    #[pyo3(signature = (spec_json, rank, gateway, link_rate_bps=None))]
    fn from_spec(py: Python<'_>, spec_json: &str, rank: usize, gateway: &str, link_rate_bps: Option<u64>) -> PyResult<PyClient> {
        let spec = serde_json::from_str(spec_json).map_err(|e| PyValueError::new_err(format!("spec: {e}")))?;
        let gateway = addr("gateway", gateway)?;
        let c = py.detach(|| Client::from_spec(spec, rank, gateway, link_rate_bps)).map_err(net_err)?;
        Ok(PyClient(Some(c)))
    }

    /// Joins the job; blocks (without the GIL) until every rank joined, at most
    /// `join_timeout_s` from the first connect on; Ctrl-C ends the wait.
    #[new]
    /// `config_json`: the job's scheme configuration, `{"scheme": NAME, ...}`.
    #[pyo3(signature = (switch, job, rank, world, config_json, join_timeout_s, job_secret=None, link_rate_bps=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        switch: &str,
        job: u32,
        rank: usize,
        world: usize,
        config_json: &str,
        join_timeout_s: f64,
        job_secret: Option<String>,
        link_rate_bps: Option<u64>,
    ) -> PyResult<PyClient> {
        let config = serde_json::from_str(config_json).map_err(|e| PyValueError::new_err(format!("config: {e}")))?;
        let join_timeout = timeout("join_timeout_s", join_timeout_s)?;
        let opts = ClientOptions { switch: addr("switch", switch)?, job, rank, world, config, join_timeout, secret: None, job_secret, link_rate_bps };
        let mut signal: Option<PyErr> = None;
        let c = py.detach(|| Client::connect_with(opts, signals(&mut signal)));
        if let Some(e) = signal {
            return Err(e);
        }
        Ok(PyClient(Some(c.map_err(net_err)?)))
    }

    /// Sums a float32 buffer over the job's workers; returns the sum as a bytearray of
    /// float32. The GIL is released while waiting, at most `timeout_s` seconds; Ctrl-C (any
    /// signal handler's exception) ends the wait.
    #[pyo3(signature = (data, timeout_s=30.0, context=None))]
    fn allreduce(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout_s: f64, context: Option<Context>) -> PyResult<Py<PyByteArray>> {
        let timeout = timeout("timeout_s", timeout_s)?;
        let v = values(py, data)?;
        let c = self.client()?;
        let mut signal: Option<PyErr> = None;
        let out = py.detach(|| c.allreduce_within(v, context.map(tensor_context), timeout, signals(&mut signal)));
        if let Some(e) = signal {
            return Err(e);
        }
        Ok(bytes_of(py, &out.map_err(net_err)?))
    }

    /// Starts an allreduce; `callback(result: bytearray | None, error: str | None)` runs on
    /// the client's completion thread (it takes the GIL only to call back).
    #[pyo3(signature = (data, callback, context=None))]
    fn allreduce_async(&self, py: Python<'_>, data: &Bound<'_, PyAny>, callback: Py<PyAny>, context: Option<Context>) -> PyResult<()> {
        let v = values(py, data)?;
        let c = self.client()?;
        c.allreduce_about(
            v,
            context.map(tensor_context),
            Box::new(move |r| {
                Python::attach(|py| {
                    let res = match r {
                        Ok(out) => callback.call1(py, (bytes_of(py, &out), py.None())),
                        Err(e) => callback.call1(py, (py.None(), e.to_string())),
                    };
                    if let Err(e) = res {
                        e.print(py);
                    }
                })
            }),
        );
        Ok(())
    }

    #[getter]
    fn node(&self) -> PyResult<u32> {
        Ok(self.client()?.node)
    }

    fn stats(&self) -> PyResult<String> {
        Ok(self.client()?.stats().to_string())
    }

    /// Worker `rank` of the job died: whether the job's protocol goes on without it.
    fn peer_failed(&self, rank: u32) -> PyResult<bool> {
        Ok(self.client()?.peer_failed(rank))
    }

    /// Leaves the job (it is released at the switch when every worker left); Ctrl-C ends a
    /// linger for the peers (the close then completes, and the interrupt is raised).
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let mut signal: Option<PyErr> = None;
        if let Some(c) = self.0.take() {
            py.detach(|| c.close_with(signals(&mut signal)));
        }
        signal.map_or(Ok(()), Err)
    }
}

impl PyClient {
    fn client(&self) -> PyResult<&Client> {
        self.0.as_ref().ok_or_else(|| PyRuntimeError::new_err("the client was closed"))
    }
}
