#![no_main]
// Body and what it covers: choria_provisioner::fuzzing::csr.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    choria_provisioner::fuzzing::csr(data);
});
