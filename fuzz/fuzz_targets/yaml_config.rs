#![no_main]
// Body and what it covers: choria_provisioner::fuzzing::yaml_config.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    choria_provisioner::fuzzing::yaml_config(data);
});
