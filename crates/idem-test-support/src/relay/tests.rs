//! The relay's own tests, against a loopback echo server.

use std::time::Duration;

use super::*;

#[test]
fn url_via_replaces_only_host_and_port() {
    let addr: SocketAddr = "10.0.0.9:7000".parse().unwrap();
    for (url, via) in [
        ("redis://127.0.0.1:6379", "redis://10.0.0.9:7000"),
        ("redis://:pw@db:6379/2", "redis://:pw@10.0.0.9:7000/2"),
        (
            "postgres://postgres@127.0.0.1:5432/test",
            "postgres://postgres@10.0.0.9:7000/test?sslmode=disable",
        ),
        (
            "postgres://u:p@db/idem?sslmode=disable",
            "postgres://u:p@10.0.0.9:7000/idem?sslmode=disable",
        ),
    ] {
        assert_eq!(url_via(url, addr), via, "{url}");
    }
}

/// A loopback echo server, for the relay's tests.
async fn echo() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rx, mut tx) = conn.split();
                let _ = tokio::io::copy(&mut rx, &mut tx).await;
            });
        }
    });
    addr
}

/// Sends `ping` on `conn` and reads what comes back within `within`: the echo,
/// `Some(empty)` for a closed or reset connection, `None` for silence.
async fn ping(conn: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    if conn.write_all(b"ping").await.is_err() {
        return Some(Vec::new());
    }
    let mut buf = [0u8; 4];
    match tokio::time::timeout(within, conn.read(&mut buf)).await {
        Err(_) => None,
        Ok(Ok(n)) => Some(buf[..n].to_vec()),
        Ok(Err(_)) => Some(Vec::new()),
    }
}

async fn connect(relay: &Relay) -> std::io::Result<TcpStream> {
    TcpStream::connect(relay.addr()).await
}

const ANSWER: Duration = Duration::from_secs(5);

#[tokio::test]
async fn relay_modes_refuse_reset_and_stall_then_forward_again() {
    let relay = Relay::start(echo().await).await;
    let mut live = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut live, ANSWER).await.unwrap(), b"ping");

    // Down: the live connection is reset, a new one refused; back on the same port.
    relay.set_mode(RelayMode::Refuse);
    assert_eq!(ping(&mut live, ANSWER).await.unwrap(), b"");
    let refused = async {
        loop {
            if connect(&relay).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(ANSWER, refused)
        .await
        .expect("the port closes");
    relay.set_mode(RelayMode::Forward);
    let again = async {
        loop {
            if let Ok(conn) = connect(&relay).await {
                return conn;
            }
            tokio::task::yield_now().await;
        }
    };
    let mut conn = tokio::time::timeout(ANSWER, again)
        .await
        .expect("the port reopens");
    assert_eq!(ping(&mut conn, ANSWER).await.unwrap(), b"ping");

    // A broken link: live and new connections are reset.
    relay.set_mode(RelayMode::Reset);
    assert_eq!(ping(&mut conn, ANSWER).await.unwrap(), b"");
    let mut new = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut new, ANSWER).await.unwrap(), b"");

    // A silent service: nothing comes back on live or new connections, until the
    // mode changes and they are reset.
    relay.set_mode(RelayMode::Forward);
    let mut held = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut held, ANSWER).await.unwrap(), b"ping");
    relay.set_mode(RelayMode::Stall);
    let mut stalled = connect(&relay).await.unwrap();
    let quiet = Duration::from_millis(200);
    assert_eq!(
        ping(&mut held, quiet).await,
        None,
        "a held connection is silent"
    );
    assert_eq!(ping(&mut stalled, quiet).await, None, "a new one too");
    relay.set_mode(RelayMode::Forward);
    let mut buf = [0u8; 4];
    for conn in [&mut held, &mut stalled] {
        let read = tokio::time::timeout(ANSWER, conn.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "reset when the stall ends"
        );
    }
    let mut fresh = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut fresh, ANSWER).await.unwrap(), b"ping");
}

#[tokio::test]
async fn faults_apply_to_the_next_connections_in_order() {
    let relay = Relay::start(echo().await).await;
    relay.fault_next([Fault::Close, Fault::LoseReply, Fault::HoldReply]);

    let mut closed = connect(&relay).await.unwrap();
    assert_eq!(
        ping(&mut closed, ANSWER).await.unwrap(),
        b"",
        "closed at once"
    );
    let mut lost = connect(&relay).await.unwrap();
    assert_eq!(
        ping(&mut lost, ANSWER).await.unwrap(),
        b"",
        "the echo is lost"
    );
    relay.wait_replies_lost(1).await;
    let mut held = connect(&relay).await.unwrap();
    assert_eq!(
        ping(&mut held, Duration::from_millis(200)).await,
        None,
        "the echo is held back"
    );
    relay.wait_replies_lost(2).await;
    let mut passed = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut passed, ANSWER).await.unwrap(), b"ping");
    assert_eq!((relay.connections(), relay.replies_lost()), (4, 2));
}

#[tokio::test]
async fn a_marked_request_loses_its_reply_and_earlier_ones_get_theirs() {
    let relay = Relay::start(echo().await).await;
    relay.lose_reply_to(b"mark");
    let mut conn = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut conn, ANSWER).await.unwrap(), b"ping");
    conn.write_all(b"mark").await.unwrap();
    let mut buf = [0u8; 4];
    let read = tokio::time::timeout(ANSWER, conn.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert_eq!(relay.replies_lost(), 1);
    let mut next = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut next, ANSWER).await.unwrap(), b"ping", "once only");
}

#[tokio::test]
async fn service_addr_adds_the_default_port() {
    let named = service_addr("redis://127.0.0.1:6380", 6379).await;
    assert_eq!(named, "127.0.0.1:6380".parse().unwrap());
    let default = service_addr("postgres://u@127.0.0.1/test", 5432).await;
    assert_eq!(default, "127.0.0.1:5432".parse().unwrap());
}

#[tokio::test]
async fn a_delayed_reply_comes_late_and_whole_and_later_ones_in_time() {
    let relay = Relay::start(echo().await).await;
    let delay = Duration::from_millis(300);
    relay.delay_reply_to(b"mark", delay);
    let mut conn = connect(&relay).await.unwrap();
    assert_eq!(ping(&mut conn, ANSWER).await.unwrap(), b"ping");
    let sent = std::time::Instant::now();
    conn.write_all(b"mark").await.unwrap();
    let mut buf = [0u8; 4];
    let read = tokio::time::timeout(ANSWER, conn.read_exact(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(4))), "{read:?}");
    assert_eq!(&buf, b"mark");
    assert!(sent.elapsed() >= delay, "held {:?}", sent.elapsed());
    assert_eq!(relay.replies_delayed(), 1);
    assert_eq!(ping(&mut conn, ANSWER).await.unwrap(), b"ping", "once only");
    assert_eq!(relay.replies_delayed(), 1);
}
