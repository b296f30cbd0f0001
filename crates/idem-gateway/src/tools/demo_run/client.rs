//! The demo's client: each operation sent with its fault and retried until answered,
//! and the charges the API lists at the end.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::{
    CONCURRENCY, Fault, HttpClient, OPERATION_DEADLINE, Read, SHORT_TIMEOUT, SLOW_ANSWER, Side,
    TIMEOUT, fault_of,
};

/// Runs the operations `ops` on one side, [`CONCURRENCY`] at a time.
pub(super) async fn operations(
    client: &HttpClient,
    side: &Side,
    run: &str,
    ops: std::ops::Range<u32>,
    n: u32,
) -> Result<(), String> {
    let mut done = futures_util::stream::iter(ops)
        .map(|op| operation(client, side, run, op, fault_of(op, n)))
        .buffer_unordered(CONCURRENCY);
    while let Some(result) = done.next().await {
        result?;
    }
    Ok(())
}

/// One operation with its fault, retried until answered.
async fn operation(
    client: &HttpClient,
    side: &Side,
    run: &str,
    op: u32,
    fault: Fault,
) -> Result<(), String> {
    let slow = (fault == Fault::ClientTimeout).then_some(SLOW_ANSWER);
    match fault {
        Fault::AnswerLost => {
            attempt(client, side, run, op, None, Read::HangUp).await;
        }
        Fault::ClientTimeout => {
            attempt(client, side, run, op, slow, Read::Within(SHORT_TIMEOUT)).await;
        }
        Fault::DuplicateSend => {
            let (a, b) = tokio::join!(
                retry(client, side, run, op, None),
                retry(client, side, run, op, None)
            );
            a?;
            b?;
            side.tally.answered.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        Fault::None | Fault::GatewayKill => {}
    }
    retry(client, side, run, op, slow).await?;
    side.tally.answered.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Sends operation `op` until it is answered 201; a 409, a 429, a 5xx or no answer are
/// retried after a short backoff, anything else is an error.
pub(super) async fn retry(
    client: &HttpClient,
    side: &Side,
    run: &str,
    op: u32,
    slow: Option<Duration>,
) -> Result<(), String> {
    let deadline = Instant::now() + OPERATION_DEADLINE;
    let mut pause = Duration::from_millis(20);
    loop {
        match attempt(client, side, run, op, slow, Read::Within(TIMEOUT)).await {
            Some(201) => return Ok(()),
            Some(s) if !(s == 409 || s == 429 || s >= 500) => {
                return Err(format!(
                    "operation {op} {} idem was answered {s}",
                    side.name
                ));
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!(
                "operation {op} {} idem got no 201 within {}s",
                side.name,
                OPERATION_DEADLINE.as_secs()
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// One attempt at operation `op`: its status when the client read the answer.
pub(super) async fn attempt(
    client: &HttpClient,
    side: &Side,
    run: &str,
    op: u32,
    slow: Option<Duration>,
    read: Read,
) -> Option<u16> {
    let t = &side.tally;
    let request = payment(side, run, op, slow);
    match read {
        Read::HangUp => {
            // The answer's head has arrived: the work is done (and recorded, behind the
            // gateway); the client drops it and its connection unread.
            let _ = tokio::time::timeout(TIMEOUT, client.request(request)).await;
            t.unanswered.fetch_add(1, Ordering::Relaxed);
            None
        }
        Read::Within(limit) => {
            let exchange = async {
                let res = client.request(request).await.ok()?;
                let status = res.status().as_u16();
                let replayed = res
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                res.into_body().collect().await.ok()?;
                Some((status, replayed))
            };
            match tokio::time::timeout(limit, exchange).await {
                Ok(Some((status, replayed))) => {
                    t.answers.fetch_add(1, Ordering::Relaxed);
                    if replayed {
                        t.replays.fetch_add(1, Ordering::Relaxed);
                    }
                    if status == 409 {
                        t.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(status)
                }
                _ => {
                    t.unanswered.fetch_add(1, Ordering::Relaxed);
                    None
                }
            }
        }
    }
}

/// The request of operation `op`, the same on every attempt: its key (with idem), its
/// body tagged with the run, side and operation, and on a slow one `?delay_ms=`.
fn payment(side: &Side, run: &str, op: u32, slow: Option<Duration>) -> http::Request<Full<Bytes>> {
    let uri = match slow {
        Some(d) => format!("{}/v1/charges?delay_ms={}", side.url, d.as_millis()),
        None => format!("{}/v1/charges", side.url),
    };
    let body = json!({
        "amount": 100 + op % 900,
        "currency": "eur",
        "metadata": { "demo": run, "side": side.name, "operation": op },
    });
    let mut request = http::Request::post(uri).header("content-type", "application/json");
    if side.keyed {
        request = request.header("idempotency-key", format!("demo-{run}-{op}"));
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request")
}

/// The API's charges (`GET /v1/charges`).
pub(super) async fn list_charges(client: &HttpClient, api: &str) -> Result<Value, String> {
    let request = http::Request::get(format!("{api}/v1/charges"))
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let res = tokio::time::timeout(TIMEOUT, client.request(request))
        .await
        .map_err(|_| "the demo API did not list its charges in time".to_owned())?
        .map_err(|e| format!("listing the charges: {e}"))?;
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("listing the charges: {e}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("the charges are not JSON: {e}"))
}
