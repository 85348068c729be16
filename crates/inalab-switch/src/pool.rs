//! A switch's aggregator pool: a fixed array of register slots, each free or holding one
//! aggregator, as a Tofino lays them out (a memory budget divided by the slot size, indexed
//! by the packet, one access per pass). ATP's shared pool uses it; DSA's, Canary's
//! descriptors and GRID's aggregators are pools of their own slot types.

/// `slots` aggregators of type `T`, with a count of those in use.
#[derive(Debug, Clone)]
pub struct Pool<T> {
    slots: Vec<Option<T>>,
    in_use: u32,
}

impl<T: Clone> Pool<T> {
    pub fn new(slots: u32) -> Self {
        Pool { slots: vec![None; slots as usize], in_use: 0 }
    }
}

impl<T> Pool<T> {
    /// Slots in the pool.
    pub fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slots holding an aggregator.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// Whether `idx` names a slot of this pool (an index beyond it is a packet's error or a
    /// pool smaller than the job assumed).
    pub fn contains(&self, idx: usize) -> bool {
        idx < self.slots.len()
    }

    /// The aggregator in slot `idx` (`None`: free or beyond the pool).
    pub fn get(&self, idx: usize) -> Option<&T> {
        self.slots.get(idx).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, idx: usize) -> Option<&mut T> {
        self.slots.get_mut(idx).and_then(Option::as_mut)
    }

    /// Puts `agg` into the free slot `idx` and returns it. Panics if the slot is taken or
    /// beyond the pool: callers check with [`Pool::get`] and [`Pool::contains`] first.
    pub fn insert(&mut self, idx: usize, agg: T) -> &mut T {
        let slot = &mut self.slots[idx];
        assert!(slot.is_none(), "slot {idx} is in use");
        self.in_use += 1;
        slot.insert(agg)
    }

    /// Frees slot `idx`, returning what it held.
    pub fn take(&mut self, idx: usize) -> Option<T> {
        let taken = self.slots.get_mut(idx).and_then(Option::take);
        self.in_use -= taken.is_some() as u32;
        taken
    }

    /// Frees every slot whose aggregator `held` picks (a control-plane register reset);
    /// returns how many.
    pub fn free_where(&mut self, held: impl Fn(&T) -> bool) -> u32 {
        let mut freed = 0;
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(&held) {
                *slot = None;
                freed += 1;
            }
        }
        self.in_use -= freed;
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_it_holds() {
        let mut p: Pool<(u32, u32)> = Pool::new(4);
        assert!(p.contains(3) && !p.contains(4));
        p.insert(1, (7, 1));
        p.insert(2, (8, 1));
        p.insert(3, (7, 2));
        assert_eq!(p.in_use(), 3);
        assert_eq!(p.take(2), Some((8, 1)));
        assert_eq!(p.take(2), None);
        assert_eq!(p.take(9), None, "beyond the pool");
        assert_eq!(p.free_where(|a| a.0 == 7), 2);
        assert_eq!((p.in_use(), p.get(1)), (0, None));
    }

    #[test]
    #[should_panic(expected = "in use")]
    fn a_taken_slot_is_not_overwritten() {
        let mut p: Pool<u8> = Pool::new(1);
        p.insert(0, 1);
        p.insert(0, 2);
    }
}
