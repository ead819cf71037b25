//! Every decoder on arbitrary bytes: decode or `ERR_DECODE`, never a panic; whatever decodes
//! re-encodes in every format, and vLLM's encoding decodes back to the same bytes.
#![no_main]

use kvplane_core::codec::{self, Dialect, Format};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
  let Some((&which, bytes)) = data.split_first() else {
    return;
  };
  let dialect = [
    Dialect::Vllm,
    Dialect::Sglang,
    Dialect::Trtllm,
    Dialect::TrtllmJson,
    Dialect::SmgProto,
  ][which as usize % 5];
  match codec::decode(bytes, dialect) {
    Err(e) => assert_eq!(e.code, kvplane_core::ErrorCode::Decode),
    Ok(d) => {
      let _ = codec::check_layout(&d.batches);
      for b in &d.batches {
        for f in [Format::Vllm, Format::VllmLegacy, Format::Sglang, Format::SmgProto] {
          let _ = codec::encode(b, f);
        }
        let once = codec::encode(b, Format::Vllm);
        let again = codec::decode(&once, Dialect::Vllm).expect("our own encoding decodes");
        assert_eq!(codec::encode(&again.batches[0], Format::Vllm), once);
      }
    }
  }
});
