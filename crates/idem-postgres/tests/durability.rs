//! The store reads, as it connects, whether the server's settings let a crash lose
//! records it acknowledged, and says so.

mod common;

use idem_core::testing::unique_namespace;
use idem_postgres::PgStore;
use idem_test_support::figure;

const METRIC: &str = "idem_postgres_commits_may_be_lost";

/// `url` with `-c setting` added to the session options it asks for.
fn with_session_setting(url: &str, setting: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!(
        "{url}{separator}options=-c%20{}",
        setting.replace('=', "%3D")
    )
}

#[tokio::test]
async fn the_store_says_when_the_server_may_lose_acknowledged_records() {
    let ns = unique_namespace("durability");
    let Some(temp) = common::connect(PgStore::builder(), &ns).await else {
        return;
    };
    // As the server is set up (both settings on, on the test server).
    let (fsync, synchronous_commit): (String, String) =
        sqlx::query_as("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
            .fetch_one(temp.pool())
            .await
            .expect("settings");
    let as_set_up = fsync == "off" || synchronous_commit == "off";
    assert_eq!(
        temp.durability_risk().is_some(),
        as_set_up,
        "fsync {fsync}, synchronous_commit {synchronous_commit}: {:?}",
        temp.durability_risk()
    );
    assert_eq!(figure(&*temp, METRIC), u64::from(as_set_up));

    // The URL turns synchronous commit off for the store's sessions.
    let url = with_session_setting(&common::pg_url(), "synchronous_commit=off");
    let relaxed = PgStore::builder()
        .table(common::table_for(&ns))
        .connect(&url)
        .await
        .expect("connect with session options");
    let temp = common::TempStore {
        inner: relaxed,
        ..temp
    };
    let risk = temp.durability_risk().expect("a risk is reported");
    assert!(risk.synchronous_commit_off, "{risk:?}");
    assert_eq!(risk.fsync_off, fsync == "off");
    assert_eq!(figure(&*temp, METRIC), 1);
}
