#![no_main]
// Body and what it covers: choria_provisioner::fuzzing::provisioning_jwt.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    choria_provisioner::fuzzing::provisioning_jwt(data);
});
