//! What a scheme is given (a job and a read-only view of the network) and what it returns (a
//! plan that speaks of nodes and roles only, never of a driver's types).

use inalab_core::{Admission, HostProtocol, NodeId, PortId, SwitchProgram, Time};
pub use inalab_host::Quantization;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::fmt;

/// What a scheme may ask of the network, read-only. The simulator answers from its topology,
/// the UDP runtime from what its control plane learned.
pub trait NetView {
    /// The switch a host is attached to (its top-of-rack switch).
    fn tor(&self, host: NodeId) -> NodeId;
    /// The switch's port facing an attached host, if the driver knows it here.
    fn port_toward(&self, switch: NodeId, host: NodeId) -> Option<PortId>;
    /// Whether the switch can run INA programs.
    fn programmable(&self, switch: NodeId) -> bool;
    /// Aggregator memory of a programmable switch, bytes (0 for others).
    fn memory_bytes(&self, switch: NodeId) -> u64;
    /// A node's name, for error messages.
    fn name(&self, node: NodeId) -> String;
    /// Among the jobs that asked for a share named `key` ([`Scheme::shares`]), this job's
    /// index and their count: how an equal split of a resource is computed. Drivers that set
    /// jobs up one at a time answer (0, 1).
    fn share(&self, job: u32, key: &str) -> (u32, u32);
    /// Every switch of the network (what a scheme with a program on every switch admits its
    /// jobs on); empty when the driver cannot list them.
    fn switches(&self) -> Vec<NodeId> {
        vec![]
    }
    /// A switch's ports with the node each leads to (hosts and switches): what a scheme that
    /// lays out fixed trees walks; empty when the driver does not know the links.
    fn links(&self, _switch: NodeId) -> Vec<(PortId, NodeId)> {
        vec![]
    }
    /// A switch's tier: 1 for the switches hosts attach to, upward from there (2 for the
    /// spines of a leaf-spine); 1 when the driver does not know.
    fn tier(&self, _switch: NodeId) -> u8 {
        1
    }
    /// Paths a job's packets take that may overtake each other, a packet's path being its
    /// scheme's steering key modulo this ([`Scheme::steering`]: a sharded runtime switch's
    /// threads); a protocol that infers loss from order compares packets of one path only.
    /// Default 1 (every driver but the sharded switch).
    fn lanes(&self) -> u32 {
        1
    }
    /// The run's seed, for the random choices a set-up makes (a static tree's root); 0 when
    /// the driver has none.
    fn seed(&self) -> u64 {
        0
    }
    /// The nodes a packet with ECMP key `flow` visits from `from` (a host or a switch) to the
    /// host `dst`, `from` and `dst` included, as the driver routes it; empty when the driver
    /// does not know its routes. What a scheme that pins a job's packets to one key (so that
    /// their paths form a tree) lays its tree out by.
    fn route_path(&self, _from: NodeId, _dst: NodeId, _flow: u64) -> Vec<NodeId> {
        vec![]
    }
    /// The node called `name`, for a configuration that names nodes (a routing policy);
    /// `None` when there is none or the driver does not know names.
    fn node_named(&self, _name: &str) -> Option<NodeId> {
        None
    }
}

/// A job as every driver describes it: who takes part and the scheme's own configuration,
/// `{"scheme": NAME, ...the scheme's parameters}` (see [`Scheme::params`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub id: u32,
    /// Worker hosts, by rank.
    pub workers: Vec<NodeId>,
    /// Server hosts (for schemes that use them).
    pub servers: Vec<NodeId>,
    pub config: Value,
    /// Protocol ports (like UDP ports) of the job's workers and servers, chosen by the driver.
    pub worker_port: u16,
    pub server_port: u16,
}

/// A host's part in a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Worker { rank: u32 },
    Server { index: u32 },
}

/// One host protocol endpoint a job runs.
pub struct PlannedEndpoint {
    pub host: NodeId,
    pub role: Role,
    pub proto: Box<dyn HostProtocol>,
    /// The configuration the protocol was built with, for people and for comparing plans.
    pub config: String,
}

/// What a job needs from the network: its host endpoints and what each switch admits (the
/// program it is for is installed by the driver through [`Scheme::program`] first).
#[derive(Default)]
pub struct Plan {
    pub endpoints: Vec<PlannedEndpoint>,
    pub admissions: Vec<SwitchAdmission>,
    /// Fixed paths (nodes from the endpoint's host to its peer's) for the packets an endpoint
    /// sends, where the driver can pin them (the simulator); others route as usual.
    pub paths: Vec<(Role, Vec<NodeId>)>,
    /// Multicast trees (edges parent -> child, from the endpoint's host down to receiving
    /// hosts) along which the driver replicates what an endpoint sends to [`inalab_core::GROUP`].
    pub trees: Vec<(Role, Vec<(NodeId, NodeId)>)>,
}

/// The shortest-path tree from `root` (a host) to `leaves` (hosts) over the network's links
/// (GRID's result tree, spec §1.6), pruned to the nodes on the way to a leaf; edges parent ->
/// child. Empty when the driver does not know its links. A node with several parents at the
/// same distance takes the one whose link to it carries the fewest of `load`'s streams (edges
/// `from -> to`), then the first found (BFS from the root, neighbours by node id). GRID's
/// results share the links down to a switch that aggregates other racks' workers with those
/// workers' gradients, which the plan's LP does not count: on a link the plan fills exactly,
/// the result stream took a fifth of the rate (#38).
pub fn shortest_path_tree(net: &dyn NetView, root: NodeId, leaves: &[NodeId], load: &std::collections::BTreeMap<(NodeId, NodeId), u64>) -> Vec<(NodeId, NodeId)> {
    use std::collections::{BTreeMap, BTreeSet, VecDeque};
    let first = net.tor(root);
    let mut dist: BTreeMap<NodeId, usize> = BTreeMap::from([(first, 0)]);
    // Every node one hop nearer the root that reaches it, in the order found.
    let mut parents: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::from([(first, vec![root])]);
    let mut queue = VecDeque::from([first]);
    while let Some(n) = queue.pop_front() {
        let d = dist[&n] + 1;
        let mut next: Vec<NodeId> = net.links(n).into_iter().map(|(_, m)| m).collect();
        next.sort_unstable();
        for m in next {
            if m == root {
                continue;
            }
            if !dist.contains_key(&m) {
                dist.insert(m, d);
                // Receivers do not forward (other hosts lead back only to their own switch).
                if !leaves.contains(&m) {
                    queue.push_back(m);
                }
            }
            if dist[&m] == d {
                parents.entry(m).or_default().push(n);
            }
        }
    }
    let parent = |m: NodeId| parents.get(&m).and_then(|ps| ps.iter().copied().min_by_key(|&p| load.get(&(p, m)).copied().unwrap_or(0)));
    let mut edges = BTreeSet::new();
    for &leaf in leaves {
        if !parents.contains_key(&leaf) {
            return vec![]; // the links do not reach it
        }
        let mut n = leaf;
        while let Some(p) = parent(n) {
            if !edges.insert((p, n)) {
                break;
            }
            n = p;
        }
    }
    edges.into_iter().collect()
}

/// A job's state at one switch, for the scheme's program there.
#[derive(Debug)]
pub struct SwitchAdmission {
    pub switch: NodeId,
    /// The program (named as the scheme) that admits it.
    pub program: &'static str,
    pub state: Admission,
    /// The job's field a refusal is about (for example `"ina.pool_slots"`).
    pub field: &'static str,
}

/// A job that cannot be set up: `field` is relative to the job (`"ina.pool_slots"`,
/// `"servers"`); drivers prefix it with where the job came from (`jobs[0].`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError {
    pub field: String,
    pub message: String,
}

impl PlanError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        PlanError { field: field.into(), message: message.into() }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for PlanError {}

/// A documented parameter of a scheme's configuration (Python builds its schema and docs from
/// these). Its default is not written here: it is the configuration struct's `Default`
/// ([`Scheme::defaults`]), the one place each default is written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Param {
    /// Dotted path in the configuration, e.g. `"ina.timeout_ps"`.
    pub name: &'static str,
    /// Unit of the value ("ps", "bytes", "slots", "" for plain values).
    pub unit: &'static str,
    pub doc: &'static str,
    /// The values it may take: checked for every scheme before a configuration is parsed
    /// ([`parse_config`]), so that no scheme sizes or times anything by a value outside it.
    pub range: Range,
}

/// The values a parameter may take. A job's configuration comes from whoever joins a job (a
/// tenant of a shared switch), so every size and time is bounded: generous for any real use,
/// small enough that nothing built from it overflows or allocates beyond what the switch's
/// memory check refuses first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    /// An integer from `min` to `max`, both included, in the parameter's unit.
    Int { min: u64, max: u64 },
    /// A finite number from `min` to `max`, both included.
    Float { min: f64, max: f64 },
    /// `true` or `false`.
    Bool,
    /// One of these strings.
    Choice(&'static [&'static str]),
    /// A list, whose items the scheme checks.
    List,
}

/// The largest packet a scheme may be configured with, bytes: a 64 KiB datagram.
pub const MAX_PACKET_BYTES: u64 = 64 << 10;
/// The longest time a scheme may be configured with: 60 s (loss-recovery timeouts are
/// milliseconds; a minute is far beyond any round trip).
pub const MAX_TIME_PS: u64 = 60 * inalab_core::time::S;
/// The largest window a scheme may be configured with: 1 GiB, 20 times the bandwidth-delay
/// product of a 400 Gbps link over a 1 ms round trip.
pub const MAX_WINDOW_BYTES: u64 = 1 << 30;
/// The most slots, blocks or packets a job may keep per switch or in flight: 2^24, e.g. 16 M
/// SwitchML slots of 280 B are 4.7 GB, beyond any switch's aggregator memory.
pub const MAX_SLOTS: u64 = 1 << 24;

impl Range {
    /// A loss-recovery or similar timeout: 1 us to 60 s.
    pub const TIME: Range = Range::Int { min: inalab_core::time::US, max: MAX_TIME_PS };
    /// A time where 0 means none (or the documented default): 0 to 60 s.
    pub const TIME_OR_ZERO: Range = Range::Int { min: 0, max: MAX_TIME_PS };
    /// Bytes of a packet: 1 B to a 64 KiB datagram.
    pub const PACKET: Range = Range::Int { min: 1, max: MAX_PACKET_BYTES };
    /// Header bytes of a packet: 0 to a 64 KiB datagram (a scheme checks its own header fits).
    pub const HEADER: Range = Range::Int { min: 0, max: MAX_PACKET_BYTES };
    /// A window or a window's step, bytes: 1 B to 1 GiB.
    pub const WINDOW: Range = Range::Int { min: 1, max: MAX_WINDOW_BYTES };
    /// A count of slots, blocks or packets a job keeps: 1 to 2^24.
    pub const SLOTS: Range = Range::Int { min: 1, max: MAX_SLOTS };
    /// A fixed-point scale: 1e-6 to 1e12 (values times it are summed as 32-bit integers).
    pub const SCALE: Range = Range::Float { min: 1e-6, max: 1e12 };

    /// The allowed values in words, for errors and docs (`unit`: the parameter's).
    pub fn describe(&self, unit: &str) -> String {
        match *self {
            Range::Int { min, max } if unit == "ps" => format!("integers {min}..={max} ps ({} to {})", show_ps(min), show_ps(max)),
            Range::Int { min, max } if unit.is_empty() => format!("integers {min}..={max}"),
            Range::Int { min, max } => format!("integers {min}..={max} ({unit})"),
            Range::Float { min, max } => format!("finite numbers {min:e}..={max:e}"),
            Range::Bool => "true or false".into(),
            Range::Choice(names) => names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", "),
            Range::List => "a list".into(),
        }
    }

    /// Whether `v` is allowed.
    pub fn allows(&self, v: &Value) -> bool {
        match *self {
            Range::Int { min, max } => v.as_u64().is_some_and(|x| (min..=max).contains(&x)),
            Range::Float { min, max } => v.as_f64().is_some_and(|x| x.is_finite() && (min..=max).contains(&x)),
            Range::Bool => v.is_boolean(),
            Range::Choice(names) => v.as_str().is_some_and(|s| names.contains(&s)),
            Range::List => v.is_array(),
        }
    }
}

/// A time in picoseconds as a person writes it (`1 us`, `60 s`).
fn show_ps(ps: u64) -> String {
    use inalab_core::time::{MS, NS, S, US};
    for (unit, name) in [(S, "s"), (MS, "ms"), (US, "us"), (NS, "ns")] {
        if ps >= unit && ps % unit == 0 {
            return format!("{} {name}", ps / unit);
        }
    }
    format!("{ps} ps")
}

/// Characters of a bad value quoted in an error (a configuration may hold a huge string).
const QUOTE_CHARS: usize = 64;

/// A JSON value as an error quotes it: at most [`QUOTE_CHARS`] characters.
pub fn quote(v: &Value) -> String {
    clip(&v.to_string(), QUOTE_CHARS)
}

/// `s`, cut to `n` characters with "..." where it was cut.
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let head: String = s.chars().take(n).collect();
    format!("{head}...")
}

impl Param {
    /// `Ok` if `v` is one of the parameter's values, else an error naming it, the value and the
    /// allowed values.
    pub fn check(&self, v: &Value) -> Result<(), PlanError> {
        if self.range.allows(v) {
            return Ok(());
        }
        Err(PlanError::new(self.name, format!("{} is not allowed; allowed: {}", quote(v), self.range.describe(self.unit))))
    }
}

/// Checks every parameter `config` sets against its [`Range`]; an error names the first one
/// outside it. A parameter under something that is not an object is left to the parser.
pub fn check_params(params: &[Param], config: &Value) -> Result<(), PlanError> {
    for p in params {
        let value = p.name.split('.').try_fold(config, |v, key| v.as_object()?.get(key));
        if let Some(v) = value {
            p.check(v)?;
        }
    }
    Ok(())
}

/// How many server hosts a scheme takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Servers {
    None,
    ExactlyOne,
    AtLeastOne,
}

/// Settings a driver imposes on every job unless the job sets them itself (the UDP runtime's
/// loss-recovery timeout, per-job switch pool and values per packet, tuned for software
/// switches).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// For `ina.timeout_ps`.
    pub timeout_ps: Option<u64>,
    /// For `ina.pool_slots` when the job leaves it out or gives 0 ("an equal share", which a
    /// driver that admits jobs one at a time cannot compute).
    pub pool_slots: Option<u32>,
    /// Values per packet, for schemes that take any ([`Scheme::any_packet_values`]): a job
    /// that gives no `ina.packet_bytes` gets its header plus 4 B per value (the UDP runtime's
    /// large datagrams; a Tofino's sizes are the defaults).
    pub packet_values: Option<u32>,
}

impl Overrides {
    /// (parameter, value, whether a 0 the job gave counts as left out).
    fn entries(&self) -> [(&'static str, Option<u64>, bool); 2] {
        [("ina.timeout_ps", self.timeout_ps, false), ("ina.pool_slots", self.pool_slots.map(u64::from), true)]
    }
}

/// What a driver knows of a tensor when it hands it to a scheme that ranks tensors (DSA's
/// priority policy, DSA §V).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorContext {
    /// The model layer the tensor belongs to, 1-based in forward order (a partition of a
    /// layer has its layer's).
    pub layer: u32,
    /// Layers of the model.
    pub layers: u32,
    /// One iteration's communication time over its computation time.
    pub comm_over_comp: f64,
    /// Estimated time left in the current iteration, ps.
    pub remaining_ps: Time,
}

/// One allreduce scheme as the drivers see it: a job's configuration as JSON in, a plan out.
/// Schemes do not implement it by hand: each implements [`TypedScheme`] against its own
/// configuration struct, and the blanket implementation below parses the JSON once per call.
pub trait Scheme: Sync {
    /// The name jobs give in `scheme`.
    fn name(&self) -> &'static str;
    /// One sentence for users.
    fn doc(&self) -> &'static str;
    /// Every parameter of the configuration, with unit and range ([`Scheme::defaults`] holds
    /// their defaults).
    fn params(&self) -> Vec<Param>;
    fn servers(&self) -> Servers;
    /// Checks a configuration and fills every default.
    fn normalize(&self, config: &Value) -> Result<Value, PlanError>;
    /// The configuration with every default filled: what a job that names only the scheme
    /// gets, and where each [`Param`]'s default is read.
    fn defaults(&self) -> Value {
        self.normalize(&serde_json::json!({"scheme": self.name()})).expect("a scheme's defaults are a valid configuration")
    }
    /// Fills the settings a driver imposes where the configuration left them out, for the
    /// parameters this scheme has, then every default.
    fn apply(&self, config: &Value, o: &Overrides) -> Result<Value, PlanError> {
        // The job's own values first: an error is about what the job gave, not about a value
        // derived from it (a packet size from a header out of range).
        let params = self.params();
        check_params(&params, config)?;
        let mut config = config.clone();
        for (name, value, zero_is_unset) in o.entries() {
            let Some(value) = value.filter(|_| params.iter().any(|p| p.name == name)) else { continue };
            let pointer = format!("/{}", name.replace('.', "/"));
            let given = config.pointer(&pointer).filter(|v| !(zero_is_unset && v.as_u64() == Some(0)));
            if given.is_none() {
                set_path(&mut config, name, value.into());
            }
        }
        let has_header = params.iter().any(|p| p.name == "ina.header_bytes");
        if let (Some(values), None, true, true) = (o.packet_values, config.pointer("/ina/packet_bytes"), has_header, self.any_packet_values()) {
            // The job's header, else the default's (checked by `normalize` below).
            let header = config.pointer("/ina/header_bytes").or(self.defaults().pointer("/ina/header_bytes")).and_then(Value::as_u64).unwrap_or(0);
            set_path(&mut config, "ina.packet_bytes", (header + 4 * values as u64).into());
        }
        self.normalize(&config)
    }
    /// Whether a packet may carry any number of values (`ina.packet_bytes` and
    /// `ina.header_bytes` set it; a packet wider than the hardware's takes several of its
    /// aggregators), so that [`Overrides::packet_values`] applies.
    fn any_packet_values(&self) -> bool;
    /// How the scheme's workers quantize (their endpoints in a plan are wrapped in
    /// `inalab_host::Quantized` with it); a configuration that does not parse gets the
    /// defaults'.
    fn quantization(&self, config: &Value) -> Quantization;
    /// The switch program this scheme's admissions are for, sized for one switch (`None`: the
    /// scheme runs on hosts only).
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>>;
    /// How a job's packets are spread over a sharded switch's threads ([`TypedScheme::steering`]).
    fn steering(&self) -> Option<fn(&inalab_core::wire::Header) -> u32>;
    /// Whether the scheme has a switch program (what a UDP switch can run).
    fn has_program(&self) -> bool {
        self.program(0, &NoNetwork).is_some()
    }
    /// Names of the shares the job takes part in (see [`NetView::share`]); none for a
    /// configuration that does not parse (its plan says why).
    fn shares(&self, job: &JobSpec, net: &dyn NetView) -> Vec<String>;
    fn plan(&self, job: &JobSpec, net: &dyn NetView) -> Result<Plan, PlanError>;
    /// [`TypedScheme::workers_serve_peers`].
    fn workers_serve_peers(&self) -> bool;
    /// The priority a tensor's allreduce request carries ([`TypedScheme::priority`]).
    fn priority(&self, config: &Value, tensor: &TensorContext) -> u32;
}

/// One allreduce scheme, written against its own configuration. Each lives in its own module
/// and is listed once in the registry. Its configuration is declared once: the struct's
/// `Default` holds every default, [`TypedScheme::params`] every unit, range and doc, and the
/// JSON a job gives is parsed into the struct once per call ([`TypedScheme::parse`]), so no
/// scheme re-parses or re-states a default.
pub trait TypedScheme: Sync {
    /// The configuration: serde with `default` and `deny_unknown_fields`, the `scheme` key
    /// aside. Serialized, it is the normalized configuration.
    type Config: DeserializeOwned + Serialize;
    /// The name jobs give in `scheme`.
    fn name(&self) -> &'static str;
    /// One sentence for users.
    fn doc(&self) -> &'static str;
    /// Every parameter of the configuration, with unit, range and doc.
    fn params(&self) -> Vec<Param>;
    fn servers(&self) -> Servers;
    /// What the ranges and serde cannot check (a header too short for the scheme's own, one
    /// setting against another); an error names the field.
    fn check(&self, _config: &Self::Config) -> Result<(), PlanError> {
        Ok(())
    }
    /// `config` checked ([`check_params`], serde with the offending key's path, then
    /// [`TypedScheme::check`]) and parsed.
    fn parse(&self, config: &Value) -> Result<Self::Config, PlanError> {
        let c = parse_config(config, &self.params())?;
        self.check(&c)?;
        Ok(c)
    }
    /// Whether a packet may carry any number of values ([`Scheme::any_packet_values`]).
    fn any_packet_values(&self) -> bool {
        false
    }
    /// How the scheme's workers quantize.
    fn quantization(&self, _config: &Self::Config) -> Quantization {
        Quantization::None
    }
    /// The switch program this scheme's admissions are for, sized for one switch (`None`: the
    /// scheme runs on hosts only).
    fn program(&self, _switch: NodeId, _net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        None
    }
    /// How a job's packets are spread over a sharded switch's threads, each running the
    /// scheme's program with the job admitted, so that one job uses several cores: a key from
    /// a packet's header, the thread being the key modulo their count. Only for a program
    /// whose state is per key (an aggregator slot, a fragment) and that keeps nothing across
    /// keys; `None` (the default): a job runs on one thread.
    fn steering(&self) -> Option<fn(&inalab_core::wire::Header) -> u32> {
        None
    }
    /// Names of the shares the job takes part in (see [`NetView::share`]).
    fn shares(&self, _job: &JobSpec, _config: &Self::Config, _net: &dyn NetView) -> Vec<String> {
        vec![]
    }
    /// The job's plan, `config` being its configuration parsed.
    fn plan(&self, job: &JobSpec, config: Self::Config, net: &dyn NetView) -> Result<Plan, PlanError>;
    /// Whether a worker that finished its last allreduce must go on answering its peers until
    /// they finished too (Canary: a block's leader restores a result a peer lost), so that a
    /// runtime worker's `close` lingers until every worker of the job left. Default false: a
    /// worker is done once its protocol has nothing left to send.
    fn workers_serve_peers(&self) -> bool {
        false
    }
    /// The priority a tensor's allreduce request carries (`TensorAttrs::priority`, higher
    /// first); 0 for schemes that do not rank tensors.
    fn priority(&self, _config: &Self::Config, _tensor: &TensorContext) -> u32 {
        0
    }
}

impl<T: TypedScheme> Scheme for T {
    fn name(&self) -> &'static str {
        TypedScheme::name(self)
    }
    fn doc(&self) -> &'static str {
        TypedScheme::doc(self)
    }
    fn params(&self) -> Vec<Param> {
        TypedScheme::params(self)
    }
    fn servers(&self) -> Servers {
        TypedScheme::servers(self)
    }
    fn normalize(&self, config: &Value) -> Result<Value, PlanError> {
        let mut v = serde_json::to_value(self.parse(config)?).map_err(|e| PlanError::new("", e.to_string()))?;
        if let Some(m) = v.as_object_mut() {
            m.insert("scheme".into(), TypedScheme::name(self).into());
        }
        Ok(v)
    }
    fn any_packet_values(&self) -> bool {
        TypedScheme::any_packet_values(self)
    }
    fn quantization(&self, config: &Value) -> Quantization {
        let defaults = || self.parse(&serde_json::json!({})).expect("a scheme's defaults are a valid configuration");
        TypedScheme::quantization(self, &self.parse(config).unwrap_or_else(|_| defaults()))
    }
    fn program(&self, switch: NodeId, net: &dyn NetView) -> Option<Box<dyn SwitchProgram>> {
        TypedScheme::program(self, switch, net)
    }
    fn steering(&self) -> Option<fn(&inalab_core::wire::Header) -> u32> {
        TypedScheme::steering(self)
    }
    fn shares(&self, job: &JobSpec, net: &dyn NetView) -> Vec<String> {
        self.parse(&job.config).map(|c| TypedScheme::shares(self, job, &c, net)).unwrap_or_default()
    }
    fn plan(&self, job: &JobSpec, net: &dyn NetView) -> Result<Plan, PlanError> {
        check_servers(self, job)?;
        let config = self.parse(&job.config)?;
        TypedScheme::plan(self, job, config, net)
    }
    fn workers_serve_peers(&self) -> bool {
        TypedScheme::workers_serve_peers(self)
    }
    fn priority(&self, config: &Value, tensor: &TensorContext) -> u32 {
        self.parse(config).map_or(0, |c| TypedScheme::priority(self, &c, tensor))
    }
}

/// Parses a configuration into a scheme's struct, after checking every parameter in `params`
/// (the scheme's, [`Scheme::params`]) against its range ([`check_params`]); an error names the
/// offending key by its dotted path (`ina.pool_slots`), quoting at most 64 characters of it.
pub fn parse_config<T: DeserializeOwned>(config: &Value, params: &[Param]) -> Result<T, PlanError> {
    check_params(params, config)?;
    let mut v = config.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("scheme");
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // The path ends at the offending key (an unknown key included); "." is the root.
        let field = if path == "." { String::new() } else { clip(&path, QUOTE_CHARS) };
        // serde quotes a bad string or key in full: a configuration may hold a huge one.
        PlanError::new(field, clip(&inner, 4 * QUOTE_CHARS))
    })
}

/// Sets the dotted `path` of an object to `value`, making the objects on the way.
fn set_path(v: &mut Value, path: &str, value: Value) {
    let mut at = v;
    for key in path.split('.') {
        if !at.is_object() {
            *at = Value::Object(Default::default());
        }
        at = at.as_object_mut().expect("an object").entry(key.to_string()).or_insert(Value::Null);
    }
    *at = value;
}

/// Checks a job's server count against what the scheme takes.
fn check_servers(scheme: &dyn Scheme, job: &JobSpec) -> Result<(), PlanError> {
    let (name, n) = (scheme.name(), job.servers.len());
    match scheme.servers() {
        Servers::None if n > 0 => Err(PlanError::new("servers", format!("scheme {name:?} uses no separate servers; remove `servers`"))),
        Servers::ExactlyOne if n != 1 => Err(PlanError::new(
            "servers",
            if n == 0 { format!("scheme {name:?} needs one parameter-server host") } else { format!("scheme {name:?} uses exactly one parameter server, got {n}") },
        )),
        Servers::AtLeastOne if n == 0 => Err(PlanError::new("servers", format!("scheme {name:?} needs at least one server host"))),
        _ => Ok(()),
    }
}

/// A network with nothing in it, for questions that do not depend on one.
struct NoNetwork;

impl NetView for NoNetwork {
    fn tor(&self, host: NodeId) -> NodeId {
        host
    }
    fn port_toward(&self, _switch: NodeId, _host: NodeId) -> Option<PortId> {
        None
    }
    fn programmable(&self, _switch: NodeId) -> bool {
        false
    }
    fn memory_bytes(&self, _switch: NodeId) -> u64 {
        0
    }
    fn name(&self, node: NodeId) -> String {
        format!("node {node}")
    }
    fn share(&self, _job: u32, _key: &str) -> (u32, u32) {
        (0, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Hosts 0, 1 under leaf 4 and 2, 3 under leaf 5; spines 6 and 7 join the leaves.
    struct TwoLeaves;

    impl NetView for TwoLeaves {
        fn tor(&self, host: NodeId) -> NodeId {
            4 + host / 2
        }
        fn port_toward(&self, _switch: NodeId, _host: NodeId) -> Option<PortId> {
            None
        }
        fn programmable(&self, _switch: NodeId) -> bool {
            true
        }
        fn memory_bytes(&self, _switch: NodeId) -> u64 {
            0
        }
        fn name(&self, node: NodeId) -> String {
            format!("n{node}")
        }
        fn share(&self, _job: u32, _key: &str) -> (u32, u32) {
            (0, 1)
        }
        fn links(&self, switch: NodeId) -> Vec<(PortId, NodeId)> {
            let peers: Vec<NodeId> = match switch {
                4 => vec![0, 1, 6, 7],
                5 => vec![2, 3, 6, 7],
                _ => vec![4, 5],
            };
            peers.into_iter().enumerate().map(|(p, n)| (p as PortId, n)).collect()
        }
    }

    #[test]
    fn the_result_tree_reaches_a_switch_over_its_least_loaded_link() {
        let plain = shortest_path_tree(&TwoLeaves, 0, &[1, 2, 3], &BTreeMap::new());
        assert_eq!(plain, vec![(0, 4), (4, 1), (4, 6), (5, 2), (5, 3), (6, 5)], "no load: the first parent found (spine 6)");
        // The policy's gradients fill spine 6's link down to leaf 5 (#38: results on it took a
        // fifth of the plan's rate).
        let load = BTreeMap::from([((6, 5), 3), ((7, 5), 1)]);
        let tree = shortest_path_tree(&TwoLeaves, 0, &[1, 2, 3], &load);
        assert_eq!(tree, vec![(0, 4), (4, 1), (4, 7), (5, 2), (5, 3), (7, 5)], "leaf 5 is reached through spine 7");
        assert!(shortest_path_tree(&TwoLeaves, 0, &[1, 9], &BTreeMap::new()).is_empty(), "an unreachable leaf: no tree");
    }
}
