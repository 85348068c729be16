//! Run-time choice of vector width for the loops over whole tensors.
//!
//! The wheel is built for every x86-64 CPU (SSE2, two f64 or four i32 per instruction). The
//! loops that touch every value of a tensor (quantization, the switch's sums) run twice as wide
//! with AVX2, which nearly every server since 2013 has: [`avx2_dispatch!`] compiles such a
//! function twice and picks the AVX2 copy when the running CPU has it (std caches the CPUID
//! check). Results are the same bits either way: the same operations, only wider.

/// Defines `fn NAME(args) -> T { body }` whose body runs compiled for AVX2 when the CPU has
/// it, else as built. Arguments must be plain identifiers; no generics.
#[macro_export]
macro_rules! avx2_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the running CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            imp($($arg),*)
        }
    };
}
