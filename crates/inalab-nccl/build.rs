//! Compiles the C shim that lays out NCCL's plugin tables (`ncclNetPlugin_v8` .. `_v12`,
//! `ncclCollNetPlugin_v8` .. `_v12`) from NVIDIA's own headers, vendored in `nccl/`.
fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=nccl");
    cc::Build::new().file("src/shim.c").include("nccl").warnings(true).extra_warnings(true).compile("inalab_nccl_shim");
}
