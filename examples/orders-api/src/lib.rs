//! A tiny orders API with Idempotency-Key handling: axum, `idem-tower`, and one SQLite
//! file for both the orders and the idempotency records.
//!
//! Two layers keep a retried order from being created twice:
//!
//! 1. **The key** (SPEC S5): `POST` routes require an `Idempotency-Key`; a retry while
//!    the key's record lives is answered from the record, and the handler does not run.
//! 2. **The order number** (SPEC S8): the client names each order with an
//!    `order_number`, unique per tenant in the `orders` table. A retry after the key's
//!    record expired (24 h by default) runs the handler again; its insert hits the
//!    constraint and the handler answers `200 OK` with the order that exists, never a
//!    second order and never a 500.
//!
//! The order insert, the key's completion and the order's `order.created` event commit
//! in one transaction (SPEC S9, [`SqliteStore::complete_in`] with the lease from the
//! request's [`IdempotencyContext`], and [`Outbox::stage`] of `idem-outbox`): there is no
//! moment at which the order exists and the key is still open or its event unsent, or
//! the key is completed or the event staged without the order. A relay
//! ([`idem_outbox::Relay`]) publishes the staged events to a broker afterwards. If a step before the commit
//! fails, neither is written, and the handler answers 503 and releases the key so that
//! the retry runs cleanly; if the process dies there, the key stays in progress until
//! its lease lapses and the retry then takes it over. (A handler that panics is
//! answered by the layer with a recorded 500, as anywhere: its order rolled back, but
//! the layer cannot know that.)
//!
//! ```no_run
//! # async fn demo() -> Result<(), orders_api::BoxError> {
//! let store = orders_api::open("sqlite://orders.db", orders_api::system_clock()).await?;
//! let (router, in_flight) = orders_api::app(store, orders_api::Settings::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, router).await?;
//! in_flight.wait().await;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idem_core::{SharedClock, StoredResponse, SystemClock};
use idem_outbox::{Destination, Message, Outbox, SqliteOutbox};
use idem_sqlite::{SqlitePool, SqliteStore};
use idem_tower::{Disposition, IdempotencyContext, IdempotencyLayer, InFlight, Observer};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

/// The error type of [`open`] and [`migrate`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a key's record lives unless [`Settings::key_ttl`] says otherwise (SPEC S8).
pub const DEFAULT_KEY_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long an attempt's lease lasts unless [`Settings::lease`] says otherwise (SPEC S7).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// Payments over this amount are declined: a 402 that is recorded and replayed.
pub const DECLINE_OVER_CENTS: u64 = 100_000;

/// The longest `order_number` accepted, in bytes.
pub const MAX_ORDER_NUMBER_LEN: usize = 64;

/// The subject (NATS) or queue (RabbitMQ) of the `order.created` events.
pub const ORDER_CREATED: &str = "orders.created";

/// The problem type of a 409 for an order number that names a different order.
pub const ORDER_NUMBER_TAKEN: &str = "/problems/order-number-taken";

/// The `orders` table: the business record, with the unique constraint that outlives
/// every idempotency record. Order numbers are the client's, so they are unique per
/// tenant (the layer's tenant: an HMAC of the `Authorization` header, SPEC S3).
// ANCHOR: schema (the user guide shows the unique constraint from here)
const ORDERS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS orders (
    id           INTEGER PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    order_number TEXT    NOT NULL,
    sku          TEXT    NOT NULL,
    qty          INTEGER NOT NULL,
    amount_cents INTEGER NOT NULL,
    status       TEXT    NOT NULL,
    UNIQUE (tenant, order_number)
)";
// ANCHOR_END: schema

/// What the API is configured with.
#[derive(Clone)]
pub struct Settings {
    /// How long a key's completed record lives, from its first request
    /// ([`DEFAULT_KEY_TTL`]). After it, a retry with the key runs the handler again and
    /// the order number answers it.
    pub key_ttl: Duration,
    /// How long an attempt's lease lasts ([`DEFAULT_LEASE`]): how long the key of an
    /// attempt that died stays in progress before a retry may take it over.
    pub lease: Duration,
    /// Told every request's outcome (metrics, tests).
    pub observer: Option<Arc<dyn Observer>>,
    /// The subject (NATS) or queue (RabbitMQ, through the default exchange) of the
    /// `order.created` events ([`ORDER_CREATED`]).
    pub events_subject: String,
    /// For demonstrations and tests of SPEC S9: the process exits with
    /// [`CRASH_EXIT_CODE`], as a power cut would stop it, after creating an order and
    /// completing its key inside their transaction and before the `COMMIT`. Never set
    /// it in service.
    pub crash_before_commit: bool,
}

/// The exit status of a process that [`Settings::crash_before_commit`] stopped.
pub const CRASH_EXIT_CODE: i32 = 70;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            key_ttl: DEFAULT_KEY_TTL,
            lease: DEFAULT_LEASE,
            observer: None,
            events_subject: ORDER_CREATED.to_owned(),
            crash_before_commit: false,
        }
    }
}

/// The system clock, for [`open`] outside tests.
pub fn system_clock() -> SharedClock {
    Arc::new(SystemClock)
}

/// Opens (creating if missing) the SQLite database at `url` (`sqlite://orders.db`) with
/// the idempotency records, the `orders` table and the event outbox in it. The store reads the time
/// from `clock`, so tests move it by hand.
pub async fn open(url: &str, clock: SharedClock) -> Result<SqliteStore, BoxError> {
    let store = SqliteStore::builder().clock(clock).connect(url).await?;
    migrate(store.pool()).await?;
    Ok(store)
}

/// Creates the `orders` table and the outbox table if they are missing.
pub async fn migrate(pool: &SqlitePool) -> Result<(), BoxError> {
    sqlx::query(ORDERS_SCHEMA).execute(pool).await?;
    outbox(pool).migrate().await?;
    Ok(())
}

/// The outbox the handlers stage events in: the default table, in the store's file.
pub fn outbox(pool: &SqlitePool) -> SqliteOutbox {
    SqliteOutbox::new(pool.clone())
}

/// The `order.created` event a new order stages: its id is the consumers'
/// de-duplication id, and the order's id its ordering key (the events of one order stay
/// in order).
fn order_created(subject: &str, tenant: &str, order: &Order) -> Message {
    let body = json!({
        "order_id": order.id,
        "tenant": tenant,
        "order_number": order.order_number,
        "sku": order.sku,
        "qty": order.qty,
        "amount_cents": order.amount_cents,
    });
    Message::with_id(
        format!("order-{}.created", order.id),
        Destination::subject(subject),
        body.to_string(),
    )
    .header("content-type", "application/json")
    .ordering_key(format!("order-{}", order.id))
}

/// What a client sends to create an order.
#[derive(Debug, Deserialize)]
struct NewOrder {
    order_number: String,
    sku: String,
    qty: u32,
    amount_cents: u64,
}

/// An order as stored and returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Order {
    id: i64,
    order_number: String,
    sku: String,
    qty: i64,
    amount_cents: i64,
    status: String,
}

impl<'r> sqlx::FromRow<'r, SqliteRow> for Order {
    /// Reads `id, order_number, sku, qty, amount_cents, status`, in this order.
    fn from_row(row: &'r SqliteRow) -> Result<Order, sqlx::Error> {
        Ok(Order {
            id: row.try_get(0)?,
            order_number: row.try_get(1)?,
            sku: row.try_get(2)?,
            qty: row.try_get(3)?,
            amount_cents: row.try_get(4)?,
            status: row.try_get(5)?,
        })
    }
}

impl Order {
    /// Whether `new` asks for this very order (a retry), not another one under the
    /// same number.
    fn is(&self, new: &NewOrder) -> bool {
        self.sku == new.sku
            && i64::from(new.qty) == self.qty
            && i64::try_from(new.amount_cents) == Ok(self.amount_cents)
    }
}

/// The handlers' state.
#[derive(Clone)]
struct Orders {
    store: SqliteStore,
    outbox: SqliteOutbox,
    events_subject: Arc<str>,
    crash_before_commit: bool,
}

/// The API with idempotency on every route, over `store` (which [`open`] gave, so the
/// `orders` table is there); returns the in-flight handle for shutdown.
// ANCHOR: app (the user guide shows the layer's set-up from here)
pub fn app(store: SqliteStore, settings: Settings) -> (Router, InFlight) {
    let mut layer = IdempotencyLayer::new(store.clone())
        .require_key_if(|method, _| method == Method::POST)
        .ttl(settings.key_ttl)
        .lease(settings.lease);
    if let Some(observer) = settings.observer {
        layer = layer.observer(observer);
    }
    let in_flight = layer.in_flight();
    let router = Router::new()
        .route("/v1/orders", post(create_order))
        .route("/v1/orders/{id}", get(get_order))
        .route("/v1/orders/{id}/capture", post(capture_order))
        .with_state(Orders {
            outbox: outbox(store.pool()),
            events_subject: settings.events_subject.into(),
            store,
            crash_before_commit: settings.crash_before_commit,
        })
        .layer(layer);
    (router, in_flight)
}
// ANCHOR_END: app

async fn create_order(
    State(orders): State<Orders>,
    Extension(ctx): Extension<IdempotencyContext>,
    Json(new): Json<NewOrder>,
) -> Response {
    // 422 releases the key: the client may fix the body and retry with it.
    if new.order_number.trim().is_empty() || new.order_number.len() > MAX_ORDER_NUMBER_LEN {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("order_number must be 1 to {MAX_ORDER_NUMBER_LEN} bytes, not blank"),
        );
    }
    if new.qty == 0 {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "qty must be at least 1");
    }
    if new.amount_cents > DECLINE_OVER_CENTS {
        // Recorded: the card stays declined on retry.
        return problem(StatusCode::PAYMENT_REQUIRED, "the card was declined");
    }
    match insert_order(&orders, &ctx, &new).await {
        Ok(response) => response,
        Err(e) => unavailable(&e),
    }
}

// ANCHOR: insert_order (the user guide shows the same-transaction completion from here)
/// Inserts the order, or finds the one its number names, stages a new order's
/// `order.created` event, and completes the key with the answer, all in the same
/// transaction. Nothing is written unless the whole commits.
async fn insert_order(
    orders: &Orders,
    ctx: &IdempotencyContext,
    new: &NewOrder,
) -> Result<Response, BoxError> {
    let store = &orders.store;
    let tenant = ctx.scope.tenant().as_str();
    // IMMEDIATE: the write lock up front, so the lookup after a conflicting insert
    // cannot race another writer (and no upgrade can fail with SQLITE_BUSY).
    let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
    let inserted: Option<Order> = sqlx::query_as(
        "INSERT INTO orders (tenant, order_number, sku, qty, amount_cents, status)
         VALUES (?1, ?2, ?3, ?4, ?5, 'created')
         ON CONFLICT (tenant, order_number) DO NOTHING
         RETURNING id, order_number, sku, qty, amount_cents, status",
    )
    .bind(tenant)
    .bind(&new.order_number)
    .bind(&new.sku)
    .bind(i64::from(new.qty))
    .bind(i64::try_from(new.amount_cents)?)
    .fetch_optional(&mut *tx)
    .await?;
    let (status, order) = match inserted {
        Some(order) => (StatusCode::CREATED, order),
        None => {
            // The constraint held: this order number is an order already (a retry whose
            // key expired, or a duplicate sent under another key).
            let existing: Order = sqlx::query_as("SELECT id, order_number, sku, qty, amount_cents, status FROM orders WHERE tenant = ?1 AND order_number = ?2")
            .bind(tenant)
            .bind(&new.order_number)
            .fetch_one(&mut *tx)
            .await?;
            if !existing.is(new) {
                // Nothing written; 409 releases the key.
                return Ok(problem_of_type(
                    StatusCode::CONFLICT,
                    ORDER_NUMBER_TAKEN,
                    &format!(
                        "order_number {:?} is order {}, for other items or another amount",
                        new.order_number, existing.id
                    ),
                ));
            }
            (StatusCode::OK, existing)
        }
    };
    if status == StatusCode::CREATED {
        orders
            .outbox
            .stage(
                &mut tx,
                &order_created(&orders.events_subject, tenant, &order),
            )
            .await?;
    }
    let (stored, response) = order_response(status, &order);
    // Fenced if another attempt took the key over: dropping `tx` rolls the order and
    // its event back.
    store.complete_in(&mut tx, &ctx.lease, &stored).await?;
    if orders.crash_before_commit && status == StatusCode::CREATED {
        eprintln!("orders-api: exiting before COMMIT, as crash_before_commit asks");
        std::process::exit(CRASH_EXIT_CODE);
    }
    tx.commit().await?;
    Ok(response)
}
// ANCHOR_END: insert_order

async fn get_order(State(orders): State<Orders>, Path(id): Path<i64>) -> Response {
    let found: Result<Option<Order>, sqlx::Error> = sqlx::query_as(
        "SELECT id, order_number, sku, qty, amount_cents, status FROM orders WHERE id = ?1",
    )
    .bind(id)
    .fetch_optional(orders.store.pool())
    .await;
    match found {
        Ok(Some(order)) => Json(order).into_response(),
        Ok(None) => problem(StatusCode::NOT_FOUND, "no such order"),
        Err(e) => unavailable(&e.into()),
    }
}

async fn capture_order(
    State(orders): State<Orders>,
    Extension(ctx): Extension<IdempotencyContext>,
    Path(id): Path<i64>,
) -> Response {
    match capture(&orders.store, &ctx, id).await {
        Ok(response) => response,
        Err(e) => unavailable(&e),
    }
}

/// Captures the tenant's order `id` and completes the key in the same transaction.
async fn capture(
    store: &SqliteStore,
    ctx: &IdempotencyContext,
    id: i64,
) -> Result<Response, BoxError> {
    let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
    let captured: Option<Order> = sqlx::query_as(
        "UPDATE orders SET status = 'captured' WHERE id = ?1 AND tenant = ?2
         RETURNING id, order_number, sku, qty, amount_cents, status",
    )
    .bind(id)
    .bind(ctx.scope.tenant().as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(order) = captured else {
        // 404 releases the key.
        return Ok(problem(StatusCode::NOT_FOUND, "no such order"));
    };
    let (stored, response) = order_response(StatusCode::OK, &order);
    store.complete_in(&mut tx, &ctx.lease, &stored).await?;
    tx.commit().await?;
    Ok(response)
}

/// The answer for `order`, as the record keeps it and as the client gets it: the same
/// status, headers and bytes.
fn order_response(status: StatusCode, order: &Order) -> (StoredResponse, Response) {
    let body = serde_json::to_vec(order).expect("an order serialises");
    let location = format!("/v1/orders/{}", order.id);
    let stored = StoredResponse::new(status.as_u16(), body.clone())
        .with_header("content-type", "application/json")
        .with_header("location", location.clone());
    let response = (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::LOCATION,
                HeaderValue::try_from(location).expect("a path is a header value"),
            ),
        ],
        body,
    )
        .into_response();
    (stored, response)
}

/// 503 for a failure before the commit: nothing was written, so the key is released
/// and the retry (after `Retry-After`) runs the handler afresh.
fn unavailable(error: &BoxError) -> Response {
    eprintln!("orders-api: an order's transaction failed, nothing written: {error}");
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the order could not be written; nothing was created, retry with the same key",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response.extensions_mut().insert(Disposition::Release);
    response
}

fn problem(status: StatusCode, detail: &str) -> Response {
    problem_of_type(status, "about:blank", detail)
}

fn problem_of_type(status: StatusCode, kind: &str, detail: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        json!({ "type": kind, "title": status.canonical_reason(), "status": status.as_u16(), "detail": detail })
            .to_string(),
    )
        .into_response()
}
