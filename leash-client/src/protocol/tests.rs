//! The protocol's messages as docs/PROTOCOL.md writes them, and requests as the daemon decodes
//! them.

use super::*;

fn round_trip_request(line: &str) -> Request {
    let request: Request = serde_json::from_str(line).unwrap();
    let again: Request = serde_json::from_str(&serde_json::to_string(&request).unwrap()).unwrap();
    assert_eq!(request, again);
    request
}

#[test]
fn requests_parse_as_documented() {
    assert_eq!(
        round_trip_request(r#"{"id":1,"op":"hello","protocol":1}"#).op,
        Op::Hello { protocol: 1 }
    );
    assert_eq!(
        round_trip_request(
            r#"{"id":2,"op":"register","pid":42,"on_root_exit":"keep","grace_ms":0}"#
        )
        .op,
        Op::Register {
            pid: Some(42),
            pidfd: false,
            lease: None,
            on_root_exit: Some(RootExitPolicy::Keep),
            grace_ms: Some(0)
        }
    );
    assert_eq!(
        round_trip_request(r#"{"id":3,"op":"kill","tree":5}"#).op,
        Op::Kill {
            tree: 5,
            grace_ms: None
        }
    );
    assert_eq!(
        round_trip_request(r#"{"id":4,"op":"list"}"#).op,
        Op::List {
            tree: None,
            leases: false
        }
    );
    assert_eq!(
        round_trip_request(r#"{"id":4,"op":"list","tree":3}"#).op,
        Op::List {
            tree: Some(3),
            leases: false
        }
    );
    assert_eq!(
        round_trip_request(r#"{"id":4,"op":"list","leases":true}"#).op,
        Op::List {
            tree: None,
            leases: true
        }
    );
}

#[test]
fn bad_requests_are_errors() {
    for line in [
        r#"{"id":1,"op":"reboot"}"#,
        r#"{"id":1}"#,
        r#"{"id":1,"op":"kill"}"#,
        r#"{"id":1,"op":"kill","tree":-1}"#,
        r#"{"id":1,"op":"register","pid":"x"}"#,
        r#"[1,2,3]"#,
        "not json",
    ] {
        assert!(serde_json::from_str::<Request>(line).is_err(), "{line}");
    }
}

#[test]
fn decoding_keeps_the_id_of_a_bad_request() {
    assert_eq!(
        decode_request(br#"{"id":4,"op":"list"}"#),
        Ok(Request {
            id: 4,
            op: Op::List {
                tree: None,
                leases: false
            }
        })
    );
    let error = decode_request(br#"{"id":7,"op":"reboot"}"#).unwrap_err();
    assert_eq!(error.id, Some(7));
    assert!(error.message.contains("reboot"), "{}", error.message);
    for line in [
        &b"not json"[..],
        br#"{"id":-1,"op":"list"}"#,
        br#"{"id":"7","op":"list"}"#,
        br#"[{"id":7}]"#,
        b"{\"id\":7,\"op\":\"list\"}\xff",
        b"",
    ] {
        let error = decode_request(line).unwrap_err();
        assert_eq!(error.id, None, "{}", String::from_utf8_lossy(line));
    }
    assert!(
        decode_request(b"not json")
            .unwrap_err()
            .message
            .starts_with("not JSON: ")
    );
    for out_of_range in [0, MAX_PID + 1, i32::MAX as u32 + 1, u32::MAX] {
        let line = format!(r#"{{"id":8,"op":"register","pid":{out_of_range}}}"#);
        let error = decode_request(line.as_bytes()).unwrap_err();
        assert_eq!(error.id, Some(8), "{line}");
        assert!(
            error.message.contains("a pid, from 1 to"),
            "{}",
            error.message
        );
    }
    for (line, expected) in [
        (r#"{"id":8,"op":"register","pid":4194304}"#, Some(MAX_PID)),
        (r#"{"id":8,"op":"register","pid":null,"pidfd":true}"#, None),
        (r#"{"id":8,"op":"register","pidfd":true}"#, None),
    ] {
        let decoded = decode_request(line.as_bytes()).unwrap();
        assert!(
            matches!(decoded.op, Op::Register { pid, .. } if pid == expected),
            "{line}"
        );
    }
    let reply = decode_request(br#"{"id":9}"#).unwrap_err().reply();
    assert_eq!(reply.id(), Some(9));
    assert_eq!(reply.error_body().unwrap().code, ErrorCode::BadRequest);
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(decode_request(deep.as_bytes()).unwrap_err().id, None);
    let deep_id = format!(
        r#"{{"id":1,"op":"list","x":{}1{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    assert!(decode_request(deep_id.as_bytes()).is_err());
}

#[test]
fn a_quoted_line_is_cut_at_a_character_boundary() {
    assert_eq!(quote_line(b"short"), "short");
    let long = "x".repeat(MAX_QUOTED_BYTES + 50);
    assert_eq!(quote_line(long.as_bytes()).len(), MAX_QUOTED_BYTES);
    // "é" is two bytes: one straddling the cut goes whole.
    let straddling = format!("{}é", "x".repeat(MAX_QUOTED_BYTES - 1));
    assert_eq!(
        quote_line(straddling.as_bytes()),
        "x".repeat(MAX_QUOTED_BYTES - 1)
    );
    let fits = format!("{}é", "x".repeat(MAX_QUOTED_BYTES - 2));
    assert_eq!(quote_line(fits.as_bytes()), fits);
    assert_eq!(quote_line(b"a\xffb"), "a\u{fffd}b");
}

#[test]
fn a_closing_event_says_its_reason() {
    for reason in ClosingReason::ALL {
        let event = Event::closing(7, reason);
        assert_eq!(event.closing_reason(), Some(reason));
        let line = serde_json::to_string(&ServerLine::event(event)).unwrap();
        let again: ServerLine = serde_json::from_str(&line).unwrap();
        let ServerLine::Event { event } = again else {
            panic!("{line}")
        };
        assert_eq!(event.closing_reason(), Some(reason));
    }
    let unknown = read_event(r#"{"kind":"closing","tree":0,"lease":7,"reason":"moon_phase"}"#);
    assert_eq!(unknown.kind, EventKind::Closing);
    assert_eq!(unknown.closing_reason(), None);
    assert_eq!(
        Event::new(EventKind::Exit, 1, 7, Some(3)).closing_reason(),
        None
    );
}

/// The event of a daemon's `event` line whose event is `event`, checking that it is written
/// back byte for byte.
fn read_event(event: &str) -> Event {
    let line = format!(r#"{{"event":{event}}}"#);
    let read: ServerLine = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(serde_json::to_string(&read).unwrap(), line);
    let ServerLine::Event { event } = read else {
        panic!("{line}")
    };
    event
}

/// One string on the wire, three vocabularies: the event's kind says which a word is of, so
/// `shutdown` is a kill reason in `kill_started` and a closing reason in `closing`, and a word
/// a newer daemon may send is kept rather than failing the line.
#[test]
fn a_reason_is_read_by_its_events_kind() {
    let reason = |kind: &str, word: &str| {
        read_event(&format!(
            r#"{{"kind":"{kind}","tree":3,"lease":7,"reason":"{word}"}}"#
        ))
        .reason
    };
    for killed in KillReason::ALL {
        assert_eq!(
            reason("kill_started", killed.as_str()),
            Some(EventReason::Kill(killed))
        );
        assert_eq!(
            Event::kill_started(3, 7, killed),
            read_event(&format!(
                r#"{{"kind":"kill_started","tree":3,"lease":7,"reason":"{killed}"}}"#
            ))
        );
    }
    assert_eq!(
        reason("closing", "shutdown"),
        Some(EventReason::Closing(ClosingReason::Shutdown))
    );
    assert_eq!(
        reason("kill_failed", "shutdown"),
        Some(EventReason::Failure("shutdown".into()))
    );
    assert_eq!(
        Event::kill_failed(3, 7, "stuck".into()),
        read_event(r#"{"kind":"kill_failed","tree":3,"lease":7,"reason":"stuck"}"#)
    );
    assert_eq!(
        reason("kill_started", "moon_phase"),
        Some(EventReason::Unknown("moon_phase".into()))
    );
    assert_eq!(
        reason("closing", "request"),
        Some(EventReason::Unknown("request".into()))
    );
    assert_eq!(
        reason("released", "shutdown"),
        Some(EventReason::Unknown("shutdown".into()))
    );
    assert_eq!(
        read_event(r#"{"kind":"exit","tree":3,"lease":7}"#).reason,
        None
    );
}

#[test]
fn server_lines_say_only_what_they_carry() {
    let line = serde_json::to_string(&ServerLine::ok(3, Reply::Released { tree: 9 })).unwrap();
    assert_eq!(line, r#"{"id":3,"ok":{"released":{"tree":9}}}"#);
    let line = serde_json::to_string(&ServerLine::error(None, ErrorCode::TooLong, "x")).unwrap();
    assert_eq!(line, r#"{"error":{"code":"too_long","message":"x"}}"#);
    assert_eq!(ErrorCode::PermissionDenied.to_string(), "permission_denied");
}

/// The words of the enums that have an `as_str` are their wire words: logs, metrics labels
/// and `leash ls` say what the protocol says.
#[test]
fn enum_words_are_their_wire_words() {
    let wire = |value: serde_json::Value| value.as_str().unwrap().to_owned();
    for reason in KillReason::ALL {
        assert_eq!(wire(serde_json::to_value(reason).unwrap()), reason.as_str());
    }
    for state in [TreeState::Live, TreeState::Killing, TreeState::Unkillable] {
        assert_eq!(wire(serde_json::to_value(state).unwrap()), state.as_str());
    }
    for policy in [RootExitPolicy::Kill, RootExitPolicy::Keep] {
        assert_eq!(wire(serde_json::to_value(policy).unwrap()), policy.as_str());
    }
    for reason in ClosingReason::ALL {
        assert_eq!(wire(serde_json::to_value(reason).unwrap()), reason.as_str());
    }
}

/// Every example in docs/PROTOCOL.md is a message of this module, written exactly as the
/// daemon writes it: the document cannot drift from the code.
#[test]
fn the_documented_examples_are_exact() {
    let doc = include_str!("../../../docs/PROTOCOL.md");
    let mut in_json = false;
    let mut checked = 0;
    for line in doc.lines() {
        match line.trim() {
            "```json" => in_json = true,
            "```" => in_json = false,
            example if in_json => {
                let again = if example.contains(r#""op":"#) {
                    let request: Request =
                        serde_json::from_str(example).unwrap_or_else(|e| panic!("{example}: {e}"));
                    serde_json::to_string(&request).unwrap()
                } else {
                    // A line of the daemon's, or else a report of the exec shim's.
                    let reply = serde_json::from_str::<ServerLine>(example)
                        .ok()
                        .map(|reply| serde_json::to_string(&reply).unwrap())
                        .filter(|reply| reply == example);
                    if let Some(reply) = reply {
                        reply
                    } else {
                        let report: ExecReport = serde_json::from_str(example)
                            .unwrap_or_else(|e| panic!("{example}: {e}"));
                        serde_json::to_string(&report).unwrap()
                    }
                };
                assert_eq!(again, example);
                checked += 1;
            }
            _ => {}
        }
    }
    assert!(checked >= 25, "only {checked} examples found");
}
