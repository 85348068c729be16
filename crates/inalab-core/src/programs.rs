//! Several programs on one switch (Canary on every switch while ATP and DSA share the ToRs):
//! a composite that hands each packet to the program whose protocol it belongs to.

use crate::{Admission, AdmitError, Packet, PortId, SwitchAction, SwitchCtx, SwitchProgram, Time, TimerToken};

/// Bits of a timer token left to a member program; the top byte names the program.
const TOKEN_BITS: u32 = 56;

/// The programs installed on one switch, by name, in installation order. A packet goes to the
/// first program that claims it (`job_of` is `Some`); a packet no program claims, including a
/// well-formed frame of a scheme this switch does not run, is routed like any packet.
#[derive(Default)]
pub struct Programs {
    members: Vec<(&'static str, Box<dyn SwitchProgram>)>,
    /// Timer actions of the member being called, re-tagged before they reach the driver.
    scratch: Vec<SwitchAction>,
}

impl Programs {
    pub fn new() -> Self {
        Programs::default()
    }

    /// Adds a program; errs if one of that name is installed or the switch is full (256).
    pub fn install(&mut self, name: &'static str, program: Box<dyn SwitchProgram>) -> Result<(), AdmitError> {
        if self.has(name) {
            return Err(AdmitError(format!("the {name} program is already installed")));
        }
        if self.members.len() > u8::MAX as usize {
            return Err(AdmitError("a switch runs at most 256 programs".into()));
        }
        self.members.push((name, program));
        Ok(())
    }

    pub fn has(&self, name: &str) -> bool {
        self.members.iter().any(|(n, _)| *n == name)
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Names of the installed programs, joined by "+" ("" for none).
    pub fn names(&self) -> String {
        self.members.iter().map(|(n, _)| *n).collect::<Vec<_>>().join("+")
    }

    /// Admits `job` at the program called `name`.
    pub fn admit_at(&mut self, name: &str, job: u32, adm: Admission) -> Result<(), AdmitError> {
        match self.members.iter_mut().find(|(n, _)| *n == name) {
            Some((_, p)) => p.admit(job, adm),
            None => Err(AdmitError(format!("this switch does not run the {name} program (it runs: {})", self.names()))),
        }
    }

    /// Calls `f` on member `i` and tags the timers it sets with `i`.
    fn call(&mut self, i: usize, out: &mut Vec<SwitchAction>, f: impl FnOnce(&mut dyn SwitchProgram, &mut Vec<SwitchAction>)) {
        let mut scratch = std::mem::take(&mut self.scratch);
        f(self.members[i].1.as_mut(), &mut scratch);
        for a in scratch.drain(..) {
            out.push(match a {
                SwitchAction::SetTimer { at, token } => {
                    debug_assert!(token >> TOKEN_BITS == 0, "timer tokens of a program fit in {TOKEN_BITS} bits");
                    SwitchAction::SetTimer { at, token: (i as u64) << TOKEN_BITS | token & ((1 << TOKEN_BITS) - 1) }
                }
                other => other,
            });
        }
        self.scratch = scratch;
    }
}

impl SwitchProgram for Programs {
    fn on_packet(&mut self, now: Time, ctx: &dyn SwitchCtx, in_port: PortId, pkt: Packet, out: &mut Vec<SwitchAction>) {
        match self.members.iter().position(|(_, p)| p.job_of(&pkt).is_some()) {
            Some(i) => self.call(i, out, |p, o| p.on_packet(now, ctx, in_port, pkt, o)),
            None => out.push(SwitchAction::Route { pkt }),
        }
    }

    fn on_timer(&mut self, now: Time, ctx: &dyn SwitchCtx, token: TimerToken, out: &mut Vec<SwitchAction>) {
        let i = (token >> TOKEN_BITS) as usize;
        if i < self.members.len() {
            self.call(i, out, |p, o| p.on_timer(now, ctx, token & ((1 << TOKEN_BITS) - 1), o));
        }
    }

    /// Admits at the only program; with several, use [`Programs::admit_at`].
    fn admit(&mut self, job: u32, adm: Admission) -> Result<(), AdmitError> {
        match self.members.as_mut_slice() {
            [(_, p)] => p.admit(job, adm),
            _ => Err(AdmitError(format!("this switch runs {} programs; name one to admit at", self.members.len()))),
        }
    }

    fn release(&mut self, job: u32) -> u32 {
        self.members.iter_mut().map(|(_, p)| p.release(job)).sum()
    }

    fn job_of(&self, pkt: &Packet) -> Option<u32> {
        self.members.iter().find_map(|(_, p)| p.job_of(pkt))
    }

    /// Asks the program the packet goes to (the same one `on_packet` picks).
    fn processes(&self, ctx: &dyn SwitchCtx, in_port: PortId, pkt: &Packet) -> bool {
        self.members.iter().find(|(_, p)| p.job_of(pkt).is_some()).is_some_and(|(_, p)| p.processes(ctx, in_port, pkt))
    }

    fn aggregators_in_use(&self) -> u32 {
        self.members.iter().map(|(_, p)| p.aggregators_in_use()).sum()
    }

    /// Every program's counters; a name several programs use ("completed") is their sum.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = vec![];
        for (name, v) in self.members.iter().flat_map(|(_, p)| p.counters()) {
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, total)) => *total += v,
                None => out.push((name, v)),
            }
        }
        out
    }
}
