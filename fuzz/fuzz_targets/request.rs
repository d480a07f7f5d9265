//! The daemon's decoding of one request line, on any bytes: what `decode_request` makes of a
//! line must hold together. It never panics; a request it accepts encodes back to a line that
//! decodes to the same request, with the id the line had; a line it refuses gets a one-line
//! error reply that names the line's id when the line has one.
//!
//! The line framing (newlines, the length limit) is the daemon's own, private to its connection
//! module: the `connection` target covers it, through the real daemon.
//!
//! Seeds: fuzz/corpus/request/, made by fuzz/seed-corpus.sh from docs/PROTOCOL.md.

#![no_main]

use leash_client::protocol::{ServerLine, decode_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &[u8]| {
    // The id the daemon may name in its reply: a JSON object's `id`, if it is a u64.
    let id = serde_json::from_slice::<serde_json::Value>(line)
        .ok()
        .and_then(|value| value.get("id").and_then(serde_json::Value::as_u64));
    match decode_request(line) {
        Ok(request) => {
            assert_eq!(
                Some(request.id),
                id,
                "a decoded request keeps its line's id"
            );
            let encoded = serde_json::to_vec(&request).expect("a request always encodes");
            assert!(!encoded.contains(&b'\n'), "an encoded request is one line");
            assert_eq!(
                decode_request(&encoded).as_ref(),
                Ok(&request),
                "a request decodes to itself after encoding: {}",
                String::from_utf8_lossy(&encoded)
            );
        }
        Err(error) => {
            assert_eq!(error.id, id, "a refused line's reply names its id");
            let reply = serde_json::to_vec(&error.reply()).expect("an error reply always encodes");
            assert!(!reply.contains(&b'\n'), "an error reply is one line");
            let again: ServerLine =
                serde_json::from_slice(&reply).expect("an error reply decodes as a server line");
            assert_eq!(again, error.reply());
        }
    }
});
