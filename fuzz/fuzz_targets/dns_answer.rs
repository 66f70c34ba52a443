#![no_main]
// Body and what it covers: choria_provisioner::fuzzing::dns_answer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    choria_provisioner::fuzzing::dns_answer(data);
});
