//! `check_splice_invariants` on arbitrary bytes: the first byte chooses a
//! cut index (0xff = none), the next 16 bytes are the removal mask, the rest
//! is a records section. Panics only if segments/decode/splice break an
//! invariant (see `antidote::kafka::fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 17 {
        return;
    }
    let cut = (data[0] != 0xff).then_some(data[0] as usize);
    antidote::kafka::fuzz::check_splice_invariants(&data[17..], &data[1..17], cut);
});
