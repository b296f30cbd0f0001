//! One record as a Redis hash, and back.
//!
//! | field          | value                                              |
//! |----------------|----------------------------------------------------|
//! | `tenant`       | the tenant's stored name                           |
//! | `endpoint`     | `METHOD route`, empty in internal mode             |
//! | `key`          | the idempotency key                                |
//! | `fingerprint`  | 32 raw bytes                                       |
//! | `created_at`   | ms since the epoch (decimal)                       |
//! | `expires_at`   | ms since the epoch                                 |
//! | `lease_until`  | ms since the epoch; in progress only               |
//! | `attempt`      | 1, 2, …                                            |
//! | `token`        | the fencing token, decimal `u64`                   |
//! | `state`        | `in_progress` or `completed`                       |
//! | `status`       | HTTP status; completed only                        |
//! | `headers`      | `idem_core::codec::encode_headers`; completed only |
//! | `body`         | raw bytes; completed only                          |
//! | `completed_at` | ms since the epoch; completed only                 |

use std::collections::HashMap;
use std::str::FromStr;

use bytes::Bytes;
use idem_core::codec::decode_headers;
use idem_core::{
    Endpoint, FencingToken, Fingerprint, Key, Record, RecordState, Result, Scope, StoredResponse,
    Tenant, Timestamp,
};
use redis::Value;

use crate::error::corrupt;

/// `state` of a record whose attempt is running.
pub(crate) const IN_PROGRESS: &str = "in_progress";
/// `state` of a record whose answer is recorded.
pub(crate) const COMPLETED: &str = "completed";

/// A record's hash fields, as `HGETALL` returned them.
#[derive(Debug, Default)]
pub(crate) struct Fields(HashMap<String, Vec<u8>>);

impl Fields {
    /// The fields in an `HGETALL` reply (flat pairs in RESP2, a map in RESP3), or `None`
    /// when the hash does not exist.
    pub(crate) fn from_reply(reply: Value) -> Result<Option<Fields>> {
        let pairs: Vec<(Value, Value)> = match reply {
            Value::Nil => return Ok(None),
            Value::Map(pairs) => pairs,
            Value::Array(items) => {
                if items.len() % 2 != 0 {
                    return Err(corrupt("*", "odd number of hash elements"));
                }
                let mut it = items.into_iter();
                let mut pairs = Vec::with_capacity(it.len() / 2);
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                pairs
            }
            other => return Err(corrupt("*", format!("unexpected reply {other:?}"))),
        };
        if pairs.is_empty() {
            return Ok(None);
        }
        let mut map = HashMap::with_capacity(pairs.len());
        for (k, v) in pairs {
            let name = String::from_utf8(blob(k)?).map_err(|_| corrupt("*", "field name"))?;
            map.insert(name, blob(v)?);
        }
        Ok(Some(Fields(map)))
    }

    fn take(&mut self, name: &str) -> Result<Vec<u8>> {
        self.0.remove(name).ok_or_else(|| corrupt(name, "missing"))
    }

    fn text(&mut self, name: &str) -> Result<String> {
        String::from_utf8(self.take(name)?).map_err(|_| corrupt(name, "not UTF-8"))
    }

    fn number<T: FromStr>(&mut self, name: &str) -> Result<T> {
        self.text(name)?
            .parse()
            .map_err(|_| corrupt(name, "not a number"))
    }

    fn timestamp(&mut self, name: &str) -> Result<Timestamp> {
        self.number(name).map(Timestamp::from_millis)
    }

    /// The record these fields describe.
    pub(crate) fn into_record(mut self) -> Result<Record> {
        let endpoint = self.text("endpoint")?;
        let scope = Scope::from_parts(
            Tenant::new(self.text("tenant")?),
            (!endpoint.is_empty()).then(|| Endpoint::from_raw(endpoint)),
            Key::new(self.text("key")?).map_err(|e| corrupt("key", e))?,
        );
        let fingerprint = Fingerprint::from_slice(&self.take("fingerprint")?)
            .ok_or_else(|| corrupt("fingerprint", "not 32 bytes"))?;
        let state = match self.text("state")?.as_str() {
            IN_PROGRESS => RecordState::InProgress {
                lease_until: self.timestamp("lease_until")?,
            },
            COMPLETED => RecordState::Completed {
                response: StoredResponse {
                    status: self.number("status")?,
                    headers: decode_headers(&self.take("headers")?)?,
                    body: Bytes::from(self.take("body")?),
                },
                completed_at: self.timestamp("completed_at")?,
            },
            other => return Err(corrupt("state", format!("unknown state {other:?}"))),
        };
        Ok(Record {
            scope,
            fingerprint,
            created_at: self.timestamp("created_at")?,
            expires_at: self.timestamp("expires_at")?,
            attempt: self.number("attempt")?,
            token: FencingToken::from_u64(self.number("token")?),
            state,
        })
    }
}

fn blob(v: Value) -> Result<Vec<u8>> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        other => Err(corrupt("*", format!("unexpected element {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::codec::encode_headers;

    fn bulk(s: &[u8]) -> Value {
        Value::BulkString(s.to_vec())
    }

    fn completed_reply(body: &[u8]) -> Value {
        let headers = encode_headers(&[("content-type".into(), Bytes::from_static(b"a/b"))]);
        let fp = [7u8; 32];
        let fields: Vec<(&str, &[u8])> = vec![
            ("tenant", b"t"),
            ("endpoint", b""),
            ("key", b"k-1"),
            ("fingerprint", &fp),
            ("created_at", b"1000"),
            ("expires_at", b"2000"),
            ("attempt", b"2"),
            ("token", b"18446744073709551615"),
            ("state", b"completed"),
            ("status", b"201"),
            ("headers", &headers),
            ("body", body),
            ("completed_at", b"1500"),
        ];
        Value::Array(
            fields
                .into_iter()
                .flat_map(|(k, v)| [bulk(k.as_bytes()), bulk(v)])
                .collect(),
        )
    }

    #[test]
    fn completed_hash_decodes_every_field() {
        let record = Fields::from_reply(completed_reply(&[0, 255, 13, 10]))
            .unwrap()
            .unwrap()
            .into_record()
            .unwrap();
        assert_eq!(
            record.scope,
            Scope::from_parts(Tenant::new("t"), None, Key::new("k-1").unwrap())
        );
        assert_eq!(record.fingerprint, Fingerprint::from_bytes([7; 32]));
        assert_eq!(record.created_at, Timestamp::from_millis(1000));
        assert_eq!(record.expires_at, Timestamp::from_millis(2000));
        assert_eq!(record.attempt, 2);
        assert_eq!(record.token, FencingToken::from_u64(u64::MAX));
        assert_eq!(
            record.state,
            RecordState::Completed {
                response: StoredResponse::new(201, vec![0, 255, 13, 10])
                    .with_header("content-type", "a/b"),
                completed_at: Timestamp::from_millis(1500),
            }
        );
    }

    #[test]
    fn empty_reply_is_no_record() {
        assert!(Fields::from_reply(Value::Array(vec![])).unwrap().is_none());
        assert!(Fields::from_reply(Value::Map(vec![])).unwrap().is_none());
    }

    #[test]
    fn missing_or_malformed_fields_are_corrupt() {
        let Value::Array(mut items) = completed_reply(b"x") else {
            unreachable!()
        };
        // Drop the `completed_at` pair.
        items.truncate(items.len() - 2);
        let err = Fields::from_reply(Value::Array(items.clone()))
            .unwrap()
            .unwrap()
            .into_record()
            .unwrap_err();
        assert!(err.to_string().contains("completed_at"), "{err}");
        items.pop();
        assert!(Fields::from_reply(Value::Array(items)).is_err());
    }
}
