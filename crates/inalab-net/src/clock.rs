//! Wall-clock time in the protocols' unit (picoseconds since the driver started).

use inalab_core::Time;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    pub fn new() -> Clock {
        Clock(Instant::now())
    }
    pub fn now(&self) -> Time {
        self.0.elapsed().as_nanos() as Time * 1000
    }
    /// How long until `at` (zero if it has passed).
    pub fn until(&self, at: Time) -> Duration {
        Duration::from_nanos(at.saturating_sub(self.now()) / 1000)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
