//! A table of named deadlines for protocols that keep many timers (Canary one per
//! descriptor, DSA one per sequence number): set, reset or cancel a key's deadline, ask for
//! the earliest, take the expired ones in (deadline, key) order. Deterministic: ties break
//! by key. A switch program arms one driver timer (`SwitchAction::SetTimer`) for
//! [`TimerTable::next`]; a host protocol returns it from `poll_timeout`. A key whose
//! deadline passed again waits longer each time: [`backed_off`], the one back-off rule of
//! every host protocol that retransmits.

use crate::Time;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hash};

/// Each key's deadline by key: only looked up, never iterated, so a hash map (with a fixed
/// hasher, no per-process state) keeps runs deterministic; it costs the host protocols that
/// keep thousands of timers (Canary's window of 4096 blocks) less than an ordered map.
type ByKey<K> = HashMap<K, Time, BuildHasherDefault<DefaultHasher>>;

/// A key's timeout doubles on each expiry at most this many times (RFC 6298 §5.5's back-off,
/// bounded so that a key that never completes is still retried every 64 timeouts).
pub const MAX_BACKOFF_DOUBLINGS: u32 = 6;
/// The most a timeout grows by backing off: 2^[`MAX_BACKOFF_DOUBLINGS`] = 64 times.
pub const MAX_BACKOFF: u64 = 1 << MAX_BACKOFF_DOUBLINGS;

/// The timeout of a key after `expiries` expiries: `timeout` doubled per expiry, at most
/// [`MAX_BACKOFF`] times (saturating; no shift overflows however often a key expired).
pub fn backed_off(timeout: Time, expiries: u32) -> Time {
    timeout.saturating_mul(1 << expiries.min(MAX_BACKOFF_DOUBLINGS))
}

#[derive(Debug, Clone)]
pub struct TimerTable<K: Ord + Copy + Hash> {
    by_key: ByKey<K>,
    by_time: BTreeSet<(Time, K)>,
}

impl<K: Ord + Copy + Hash> Default for TimerTable<K> {
    fn default() -> Self {
        TimerTable { by_key: ByKey::default(), by_time: BTreeSet::new() }
    }
}

impl<K: Ord + Copy + Hash> TimerTable<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key`'s deadline to `at`, replacing an earlier one.
    pub fn set(&mut self, key: K, at: Time) {
        if let Some(old) = self.by_key.insert(key, at) {
            self.by_time.remove(&(old, key));
        }
        self.by_time.insert((at, key));
    }

    /// Cancels `key`'s deadline; returns it if there was one.
    pub fn cancel(&mut self, key: K) -> Option<Time> {
        let at = self.by_key.remove(&key)?;
        self.by_time.remove(&(at, key));
        Some(at)
    }

    /// `key`'s deadline.
    pub fn get(&self, key: K) -> Option<Time> {
        self.by_key.get(&key).copied()
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Time> {
        self.by_time.first().map(|&(at, _)| at)
    }

    /// Removes and returns the earliest key whose deadline is at or before `now`; call until
    /// `None` to take every expired key in (deadline, key) order.
    pub fn pop_expired(&mut self, now: Time) -> Option<K> {
        let &(at, key) = self.by_time.first()?;
        if at > now {
            return None;
        }
        self.by_time.pop_first();
        self.by_key.remove(&key);
        Some(key)
    }

    /// Cancels every deadline.
    pub fn clear(&mut self) {
        self.by_key.clear();
        self.by_time.clear();
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_doubles_per_expiry_up_to_64_times_and_never_overflows() {
        let rto: Time = 1_000_000;
        let seen: Vec<Time> = (0..9).map(|e| backed_off(rto, e)).collect();
        assert_eq!(seen, [1, 2, 4, 8, 16, 32, 64, 64, 64].map(|k| k * rto));
        assert_eq!(backed_off(rto, u32::MAX), MAX_BACKOFF * rto, "a key that expired without end waits 64 timeouts");
        assert_eq!(backed_off(Time::MAX / 2, 3), Time::MAX, "saturates rather than wrapping");
    }

    #[test]
    fn expired_keys_come_in_deadline_then_key_order() {
        let mut t = TimerTable::new();
        t.set(5u32, 30);
        t.set(2, 10);
        t.set(9, 10);
        t.set(7, 50);
        t.set(5, 20); // reset: the old 30 is gone
        assert_eq!(t.cancel(7), Some(50));
        assert_eq!((t.next(), t.len()), (Some(10), 3));
        let fired: Vec<u32> = std::iter::from_fn(|| t.pop_expired(20)).collect();
        assert_eq!(fired, [2, 9, 5]);
        assert!(t.is_empty() && t.next().is_none() && t.pop_expired(u64::MAX).is_none());
    }
}
