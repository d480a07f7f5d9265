//! What must hold of the daemon's answer to any input: it closes the connection once the client
//! has half-closed it; everything it sends is whole lines, each a valid server line written
//! exactly as the protocol module writes it, each a reply or an event; and each request line
//! gets exactly one reply, naming the id its line has.

use leash_client::protocol::{ErrorCode, MAX_LINE_BYTES, ServerLine, decode_request};

use crate::{
    preview,
    relay::{CHILD_PLACEHOLDER, Conversation, Ending},
};

/// Up to this many lines, the daemon must read the whole input and answer every line. It
/// disconnects a client that leaves 1024 replies unread; the relay reads all the time, but a
/// flood of short lines may outrun the daemon's writer, and then the connection is reset.
pub const FEW_LINES: usize = 256;

/// Checks what the daemon made of `input`; panics, showing both sides, if something does not
/// hold. Returns every line it sent.
pub fn check(input: &[u8], conversation: &Conversation) -> Vec<ServerLine> {
    let fail = |what: String| -> ! {
        panic!(
            "{what}\n--- input ---\n{}\n--- the daemon sent ({:?}) ---\n{}",
            preview(input),
            conversation.ending,
            preview(&conversation.output)
        )
    };
    let requests = input.iter().filter(|&&b| b == b'\n').count();
    match conversation.ending {
        Ending::Closed => {}
        Ending::Reset if requests > FEW_LINES => {}
        Ending::Reset => fail(format!(
            "the daemon reset a connection that sent only {requests} lines"
        )),
        Ending::Deadline => fail(format!(
            "the daemon did not close the connection within {:?} of the client's half-close",
            crate::relay::CLOSE_DEADLINE
        )),
        Ending::TooMuch => fail(format!(
            "the daemon sent more than {} bytes",
            crate::relay::MAX_OUTPUT
        )),
        Ending::ConnectFailed => fail("the daemon refused the connection".to_owned()),
    }
    let output = &conversation.output;
    if !output.is_empty() && !output.ends_with(b"\n") {
        fail("the daemon's last line is not whole".to_owned());
    }
    let mut lines = Vec::new();
    for line in output.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let parsed: ServerLine = serde_json::from_slice(line).unwrap_or_else(|e| {
            fail(format!(
                "the daemon sent a line that is not a server line ({e}): {}",
                preview(line)
            ))
        });
        let again = serde_json::to_vec(&parsed).expect("a server line encodes");
        if again != line {
            fail(format!(
                "a line of the daemon's is not written as the protocol writes it: {}",
                preview(line)
            ));
        }
        // A line with parts of two shapes (a reply and an event, say) does not write back
        // the same, which the check above sees: the shapes need no check of their own.
        if let ServerLine::Error { id: None, error } = &parsed
            && !matches!(error.code, ErrorCode::BadRequest | ErrorCode::TooLong)
        {
            fail(format!(
                "only an undecodable line gets a reply without an id: {}",
                preview(line)
            ));
        }
        lines.push(parsed);
    }
    if conversation.ending == Ending::Closed && requests <= FEW_LINES {
        let mut got: Vec<Option<u64>> = lines
            .iter()
            .filter(|line| !matches!(line, ServerLine::Event { .. }))
            .map(ServerLine::id)
            .collect();
        if got.len() != requests {
            fail(format!(
                "{requests} request lines got {} replies",
                got.len()
            ));
        }
        // The relay puts pids where `$CHILD` is, which may be in an id.
        if !contains(input, CHILD_PLACEHOLDER) {
            let mut expected = expected_ids(input);
            // A kill's reply comes when the tree is empty, after later requests' replies.
            got.sort_unstable();
            expected.sort_unstable();
            if got != expected {
                fail(format!(
                    "the replies name ids {got:?}, and the requests {expected:?}"
                ));
            }
        }
    }
    lines
}

/// The id each complete line's reply must name: the request's, or the line's when it is
/// refused (none for a line too long to read: longer than [`MAX_LINE_BYTES`] with its
/// newline).
fn expected_ids(input: &[u8]) -> Vec<Option<u64>> {
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    // What follows the last newline is no request: the daemon never sees its end.
    lines.pop();
    lines
        .into_iter()
        .map(|line| {
            if line.len() + 1 > MAX_LINE_BYTES {
                None
            } else {
                match decode_request(line) {
                    Ok(request) => Some(request.id),
                    Err(error) => error.id,
                }
            }
        })
        .collect()
}

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(output: &str) -> Conversation {
        Conversation {
            ending: Ending::Closed,
            output: output.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_well_answered_input_passes() {
        let input =
            b"{\"id\":1,\"op\":\"list\"}\nnot json\n{\"id\":3,\"op\":\"nope\"}\nunterminated";
        let output = concat!(
            r#"{"id":1,"ok":{"trees":[]}}"#,
            "\n",
            r#"{"error":{"code":"bad_request","message":"not JSON"}}"#,
            "\n",
            r#"{"event":{"kind":"dropped","tree":0,"lease":0,"count":2}}"#,
            "\n",
            r#"{"id":3,"error":{"code":"bad_request","message":"unknown op"}}"#,
            "\n",
        );
        assert_eq!(check(input, &closed(output)).len(), 4);
    }

    #[test]
    #[should_panic(expected = "2 request lines got 1 replies")]
    fn a_missing_reply_fails() {
        check(
            b"{\"id\":1,\"op\":\"list\"}\n{\"id\":2,\"op\":\"list\"}\n",
            &closed("{\"id\":1,\"ok\":{\"trees\":[]}}\n"),
        );
    }

    #[test]
    #[should_panic(expected = "the replies name ids")]
    fn a_wrong_id_fails() {
        check(
            b"{\"id\":1,\"op\":\"list\"}\n",
            &closed("{\"id\":2,\"ok\":{\"trees\":[]}}\n"),
        );
    }

    #[test]
    #[should_panic(expected = "not written as the protocol writes it")]
    fn a_line_written_otherwise_fails() {
        check(
            b"{\"id\":1,\"op\":\"list\"}\n",
            &closed("{\"ok\":{\"trees\":[]},\"id\":1}\n"),
        );
    }

    #[test]
    fn a_line_too_long_is_answered_without_an_id() {
        let line = |len: usize| {
            let mut line = format!(r#"{{"id":5,"op":"list","pad":"{}"}}"#, "x".repeat(len - 29));
            assert_eq!(line.len(), len);
            line.push('\n');
            line
        };
        assert_eq!(
            expected_ids(line(MAX_LINE_BYTES - 1).as_bytes()),
            vec![Some(5)]
        );
        assert_eq!(expected_ids(line(MAX_LINE_BYTES).as_bytes()), vec![None]);
    }
}
