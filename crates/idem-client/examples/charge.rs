//! Makes one charge through an idempotent API and sends it twice, as a client that lost
//! the first answer would: both sends carry the key fixed when the operation was made,
//! so the second is answered from the record.
//!
//! Against the gateway in front of its demo API (the user guide's client page):
//! `cargo run -p idem-client --example charge -- http://127.0.0.1:8080/v1/charges`

use std::time::Duration;

use idem_client::{Client, Error, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8080/v1/charges".to_owned());
    let client = Client::builder()
        .policy(
            RetryPolicy::default()
                .max_attempts(5)
                .attempt_timeout(Duration::from_secs(10))
                .deadline(Duration::from_secs(60)),
        )
        .build()?;

    // The key is chosen here, once, and every send of `charge` carries it.
    let charge = client
        .post(&url)
        .json(&serde_json::json!({"amount": 1200, "currency": "eur"}));
    for send in 1..=2 {
        let outcome = charge.send().await?;
        println!(
            "send {send}: {} replayed={} attempts={} key={}\n  {}",
            outcome.status(),
            outcome.replayed(),
            outcome.attempts(),
            outcome.key(),
            outcome.text()
        );
    }
    Ok(())
}
