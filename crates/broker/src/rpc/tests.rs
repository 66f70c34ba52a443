//! Tests of the RPC's parts that need no broker: the actions, the lock refusal, the screen
//! and the watch's window. The calls themselves are tested against `nats-server` in
//! tests/it/rpc_broker.rs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

use choria_wire::identity::Identity;
use choria_wire::v1::client;

use crate::gate::{Gate, Halt};
use crate::observe::Observer;

use super::screen::{ReplyScreen, Screened};
use super::*;

#[test]
fn max_tries_per_action_as_go() {
    // The lock: go-choria provision.go, New (`lockedAction` for exactly these five).
    #[rustfmt::skip]
    let actions = [
        (&Action::JWT, "choria_provision#jwt", 3, 20, true),
        (&Action::GEN25519, "choria_provision#gen25519", 5, 20, true),
        (&Action::INVENTORY, "rpcutil#inventory", 5, 2, false),
        (&Action::GENCSR, "choria_provision#gencsr", 1, 20, true),
        (&Action::CONFIGURE, "choria_provision#configure", 5, 20, true),
        (&Action::RESTART, "choria_provision#restart", 3, 20, false),
        (&Action::SHUTDOWN, "choria_provision#shutdown", 3, 20, false),
        (&Action::RELEASE_UPDATE, "choria_provision#release_update", 3, 20, true),
    ];
    for (action, label, tries, ddl_secs, locked) in actions {
        assert_eq!(action.tries, tries, "{label}");
        assert_eq!(action.takes_lock, locked, "{label}");
        assert_eq!(action.ddl_timeout, Duration::from_secs(ddl_secs), "{label}");
        assert_eq!(action.label, label);
        assert_eq!(format!("{}#{}", action.agent, action.name), label);
        assert!(Action::ALL.contains(&action), "{label} is in ALL");
    }
    assert_eq!(Action::ALL.len(), 8);
}

#[test]
fn a_lock_refusal_is_gos_exact_message_to_an_action_that_takes_the_lock() {
    let exact = LOCK_REFUSED_MESSAGE;
    #[rustfmt::skip]
    let cases: [(&Action, u8, &str, bool); 13] = [
        (&Action::JWT,            1, exact, true),
        (&Action::GEN25519,       1, exact, true),
        (&Action::GENCSR,         1, exact, true),
        (&Action::CONFIGURE,      1, exact, true),
        (&Action::RELEASE_UPDATE, 1, exact, true),
        // Actions go-choria never locks: whoever sends it, it is not the node's lock.
        (&Action::INVENTORY,      1, exact, false),
        (&Action::RESTART,        1, exact, false),
        (&Action::SHUTDOWN,       1, exact, false),
        // Not go-choria's words, or not its code (`abort` sets Aborted, 1).
        (&Action::JWT,            4, exact, false),
        (&Action::JWT,            0, exact, false),
        (&Action::JWT,            1, "Could not obtain provisioning lock: held by x", false),
        (&Action::JWT,            1, "could not obtain provisioning lock", false),
        (&Action::JWT,            1, " Could not obtain provisioning lock", false),
    ];
    for (action, code, message, refusal) in cases {
        assert_eq!(
            is_lock_refusal(action, code, message),
            refusal,
            "{action} {code} {message:?}"
        );
    }
}

const REQUEST: &str = "0123456789abcdef0123456789abcdef";

fn reply(sender: &str, code: u8, message: &str, data: serde_json::Value) -> Vec<u8> {
    let body = choria_wire::v1::server::encode_rpc_reply("inventory", code, message, &data);
    choria_wire::v1::server::encode_reply(REQUEST, sender, "rpcutil", &body, 1)
}

fn screen_of(watch: &ReplyWatch, observer: Arc<dyn Observer>) -> ReplyScreen {
    ReplyScreen::new(
        client::decode_reply,
        Identity::parse("n1.example.net").expect("identity"),
        REQUEST.into(),
        Action::INVENTORY.label,
        observer,
        Some(watch.shared()),
    )
}

/// The first well-formed reply is queued with its arrival; a copy is no news; a different
/// one is a conflict naming what each said, queued, counted and recorded once however many
/// follow; replies in another name never get that far.
#[test]
fn the_screen_takes_the_first_reply_and_reports_a_different_one_once() {
    let counts = Arc::new(crate::observe::Counts::default());
    let watch = ReplyWatch::unwatched();
    let screen = screen_of(&watch, counts.clone());
    let real = reply("n1.example.net", 0, "OK", serde_json::json!({"v": 1}));
    let forged = reply(
        "n1.example.net",
        1,
        "Could not obtain provisioning lock\r\nfake line",
        serde_json::json!({}),
    );
    assert!(screen
        .screen(reply("n2.example.net", 0, "OK", serde_json::json!({})))
        .is_none());
    let arrived = match screen.screen(real.clone()) {
        Some(Screened::Reply(rpc, arrived)) => {
            assert_eq!(rpc.statuscode, 0);
            arrived
        }
        _ => panic!("the first reply is queued"),
    };
    assert!(screen.screen(real.clone()).is_none(), "a copy is no news");
    assert_eq!(watch.conflict(), None);
    let conflict = match screen.screen(forged.clone()) {
        Some(Screened::Conflict(conflict)) => conflict,
        _ => panic!("a different reply is a conflict"),
    };
    assert!(screen
        .screen(reply(
            "n1.example.net",
            0,
            "OK",
            serde_json::json!({"v": 2})
        ))
        .is_none());
    assert_eq!(watch.conflict().as_ref(), Some(&*conflict), "recorded once");
    assert_eq!(counts.get("reply_conflict:rpcutil#inventory"), 1);
    assert_eq!(counts.get("malformed:reply_mismatch"), 1);
    assert_eq!(conflict.sender, "n1.example.net");
    assert_eq!(
        conflict.first,
        ReplySummary {
            statuscode: 0,
            statusmsg: "OK".into(),
            bytes: real.len()
        }
    );
    assert_eq!(conflict.other.statuscode, 1);
    assert_eq!(conflict.other.bytes, forged.len());
    assert!(conflict.after <= arrived.elapsed());
    let text = conflict.to_string();
    assert!(
        text.starts_with(
            "two different replies to rpcutil#inventory (request 0123456789abcdef0123456789abcdef), \
             both sent in the name of n1.example.net: first status 0 OK ("
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"later status 1 "Could not obtain provisioning lock\r\nfake line" ("#),
        "{text}"
    );
    assert!(!text.contains(['\r', '\n']), "{text}");
}

/// Runs `wait_stood` on a thread, so a wait that does not end as it should fails the test
/// after a minute instead of hanging it.
fn wait_stood_on_a_thread(
    watch: ReplyWatch,
    gate: Arc<Gate>,
) -> crossbeam_channel::Receiver<Result<(), Challenge>> {
    let (tx, rx) = bounded(1);
    std::thread::Builder::new()
        .name("wait-stood".into())
        .spawn(move || {
            let _ = tx.send(watch.wait_stood(&gate));
        })
        .expect("thread");
    rx
}

const BOUND: Duration = Duration::from_secs(60);

#[test]
fn an_answer_stands_for_the_rest_of_the_window_unless_challenged_or_halted() {
    let gate = Arc::new(Gate::new(false));
    // Nothing taken, or taken longer ago than the window: nothing to wait for.
    assert_eq!(ReplyWatch::unregistered(BOUND).wait_stood(&gate), Ok(()));
    let watch = ReplyWatch::unregistered(Duration::from_millis(200));
    if let Some(long_ago) = Instant::now().checked_sub(Duration::from_secs(1)) {
        watch.recorder().took(long_ago);
    }
    assert_eq!(watch.wait_stood(&gate), Ok(()));

    // Taken now: the wait lasts the rest of the window (a lower bound, whatever the load).
    let grace = Duration::from_millis(300);
    let watch = ReplyWatch::unregistered(grace);
    let taken = Instant::now();
    watch.recorder().took(taken);
    assert_eq!(watch.wait_stood(&gate), Ok(()));
    assert!(taken.elapsed() >= grace, "{:?}", taken.elapsed());

    // A window far longer than the test's bound: only the conflict ends it.
    let watch = ReplyWatch::unregistered(Duration::from_secs(600));
    watch.recorder().took(Instant::now());
    let recorder = watch.recorder();
    let result = wait_stood_on_a_thread(watch, gate.clone());
    std::thread::sleep(Duration::from_millis(50));
    let conflict = ReplyConflict {
        action: Action::GENCSR.label,
        request_id: REQUEST.into(),
        sender: "n1.example.net".into(),
        first: ReplySummary {
            statuscode: 0,
            statusmsg: "OK".into(),
            bytes: 1,
        },
        other: ReplySummary {
            statuscode: 0,
            statusmsg: "OK".into(),
            bytes: 2,
        },
        after: Duration::from_millis(40),
    };
    recorder.record(conflict.clone());
    assert_eq!(
        result
            .recv_timeout(BOUND)
            .expect("the conflict ends the wait"),
        Err(Challenge::Conflict(Box::new(conflict.clone())))
    );
    // A conflict seen before the wait ends it before it starts.
    let watch = ReplyWatch::unregistered(Duration::from_secs(600));
    watch.recorder().took(Instant::now());
    watch.recorder().record(conflict.clone());
    assert_eq!(
        watch.wait_stood(&gate),
        Err(Challenge::Conflict(Box::new(conflict)))
    );

    // And a pause ends it too.
    let watch = ReplyWatch::unregistered(Duration::from_secs(600));
    watch.recorder().took(Instant::now());
    let result = wait_stood_on_a_thread(watch, gate.clone());
    std::thread::sleep(Duration::from_millis(50));
    gate.set_paused(true);
    assert_eq!(
        result.recv_timeout(BOUND).expect("the pause ends the wait"),
        Err(Challenge::Halted(Halt::Paused))
    );
}
