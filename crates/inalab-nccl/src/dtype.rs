//! The element types the CollNet allreduce sums, and their conversion to and from the float32
//! values inalab's worker library takes (the switch sums fixed-point integers; the scheme's
//! quantization layer converts, as for every other caller).

use half::{bf16, f16};

/// `ncclRedOp_t`'s `ncclSum`: the only operation a switch performs.
pub const NCCL_SUM: i32 = 0;

/// The `ncclDataType_t`s summed here; any other is reported unsupported so NCCL runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F16,
    F32,
    Bf16,
}

impl DType {
    /// From `ncclDataType_t` (nccl.h: ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9).
    pub fn from_nccl(t: i32) -> Option<DType> {
        match t {
            6 => Some(DType::F16),
            7 => Some(DType::F32),
            9 => Some(DType::Bf16),
            _ => None,
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// Reads `count` elements at `data` as float32.
    ///
    /// # Safety
    /// `data` points to `count` readable elements of this type (alignment not required).
    pub unsafe fn read(self, data: *const u8, count: usize) -> Vec<f32> {
        let bytes = std::slice::from_raw_parts(data, count * self.bytes());
        match self {
            DType::F32 => bytes.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect(),
            DType::F16 => bytes.chunks_exact(2).map(|b| f16::from_ne_bytes([b[0], b[1]]).to_f32()).collect(),
            DType::Bf16 => bytes.chunks_exact(2).map(|b| bf16::from_ne_bytes([b[0], b[1]]).to_f32()).collect(),
        }
    }

    /// Writes `values` at `data` in this type, rounding to nearest even.
    ///
    /// # Safety
    /// `data` points to `values.len()` writable elements of this type.
    pub unsafe fn write(self, values: &[f32], data: *mut u8) {
        let out = std::slice::from_raw_parts_mut(data, values.len() * self.bytes());
        match self {
            DType::F32 => out.chunks_exact_mut(4).zip(values).for_each(|(o, v)| o.copy_from_slice(&v.to_ne_bytes())),
            DType::F16 => out.chunks_exact_mut(2).zip(values).for_each(|(o, v)| o.copy_from_slice(&f16::from_f32(*v).to_ne_bytes())),
            DType::Bf16 => out.chunks_exact_mut(2).zip(values).for_each(|(o, v)| o.copy_from_slice(&bf16::from_f32(*v).to_ne_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_exact_values_and_rounds_to_nearest_even() {
        let vs = [0.0f32, -2.25, 3.5, 1024.0, -0.125];
        for t in [DType::F32, DType::F16, DType::Bf16] {
            let mut buf = vec![0u8; vs.len() * t.bytes() + 1];
            // An odd offset: NCCL's staging buffers are aligned, but nothing here relies on it.
            unsafe {
                t.write(&vs, buf.as_mut_ptr().add(1));
                assert_eq!(t.read(buf.as_ptr().add(1), vs.len()), vs, "{t:?}");
            }
        }
        // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even one (1.0).
        let mut b = [0u8; 2];
        unsafe {
            DType::Bf16.write(&[1.0 + 1.0 / 256.0], b.as_mut_ptr());
            assert_eq!(DType::Bf16.read(b.as_ptr(), 1), [1.0]);
        }
    }

    #[test]
    fn only_the_three_float_types_are_summed() {
        let summed: Vec<i32> = (0..10).filter(|t| DType::from_nccl(*t).is_some()).collect();
        assert_eq!(summed, [6, 7, 9]);
    }
}
