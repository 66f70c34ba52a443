#![no_main]
// Body and what it covers: choria_provisioner::fuzzing::v2_discovery_reply.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    choria_provisioner::fuzzing::v2_discovery_reply(data);
});
