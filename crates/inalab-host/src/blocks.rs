//! The int32 tensors an INA host cuts into fixed-size blocks (the static trees' blocks, GRID's
//! fragments): block numbers run across the host's whole stream, each block has its span in its
//! tensor, and a tensor's result is put together as its blocks finish.

use inalab_core::{AppRequest, HostEvent, Payload};

pub(crate) struct Tensor {
    pub id: u64,
    pub values: usize,
    pub first: u64,
    pub left: u64,
    /// The host's own values (`None` without a payload, and once the tensor is done).
    pub data: Option<Vec<i32>>,
    pub result: Option<Vec<i32>>,
}

pub(crate) struct Blocks {
    per: usize,
    pub tensors: Vec<Tensor>,
    /// The next block number to give out: blocks below it belong to submitted tensors.
    pub next: u64,
}

impl Blocks {
    pub fn new(per: usize) -> Self {
        Blocks { per, tensors: vec![], next: 0 }
    }

    /// Takes an allreduce of int32 values (or of `bytes / 4` values without a payload). `Err`
    /// is the event to report at once: the request rejected (`who` sums only int32 allreduces),
    /// or an empty tensor already done.
    pub fn submit(&mut self, req: AppRequest, who: &str) -> Result<(), HostEvent> {
        let AppRequest::Allreduce { id, bytes, data, .. } = req else {
            return Err(HostEvent::Rejected { id: 0, reason: format!("{who} only allreduce") });
        };
        let data = match data {
            None => None,
            Some(Payload::I32(v)) => Some(v),
            Some(_) => return Err(HostEvent::Rejected { id, reason: format!("{who} sum int32 values") }),
        };
        let values = data.as_ref().map_or((bytes / 4) as usize, Vec::len);
        if values == 0 {
            return Err(HostEvent::Done { id, data: data.map(Payload::I32) });
        }
        let blocks = values.div_ceil(self.per) as u64;
        self.tensors.push(Tensor { id, values, first: self.next, left: blocks, result: data.clone(), data });
        self.next += blocks;
        Ok(())
    }

    /// The tensor `block` belongs to.
    pub fn tensor_of(&self, block: u64) -> usize {
        self.tensors.partition_point(|t| t.first <= block) - 1
    }

    /// Values [start, end) of `block` in `tensor`.
    pub fn span(&self, tensor: usize, block: u64) -> (usize, usize) {
        let t = &self.tensors[tensor];
        let start = ((block - t.first) as usize) * self.per;
        (start, (start + self.per).min(t.values))
    }

    /// The host's own values of `block`, if it has a payload.
    pub fn payload(&self, tensor: usize, block: u64) -> Option<Box<Payload>> {
        let (s, e) = self.span(tensor, block);
        self.tensors[tensor].data.as_ref().map(|d| Box::new(Payload::I32(d[s..e].to_vec())))
    }

    /// Whether a result's `values` fit `block`: as many as its span, or none without a payload.
    pub fn fits(&self, tensor: usize, block: u64, values: Option<&[i32]>) -> bool {
        let (s, e) = self.span(tensor, block);
        values.map(<[i32]>::len) == self.tensors[tensor].data.as_ref().map(|_| e - s)
    }

    /// Stores a finished block's result; the tensor's `Done` when it was its last block.
    pub fn finish(&mut self, tensor: usize, block: u64, values: Option<&[i32]>) -> Option<HostEvent> {
        let (s, e) = self.span(tensor, block);
        let t = &mut self.tensors[tensor];
        if let (Some(r), Some(v)) = (&mut t.result, values) {
            r[s..e].copy_from_slice(v);
        }
        t.left -= 1;
        if t.left > 0 {
            return None;
        }
        // The tensor's own values are not needed any more.
        t.data = None;
        Some(HostEvent::Done { id: t.id, data: t.result.take().map(Payload::I32) })
    }
}
