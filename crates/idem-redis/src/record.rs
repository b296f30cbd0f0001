//! One record as one Redis string, and back.
//!
//! The layout is the table in the crate docs: a fixed-width head of [`FENCED_LEN`]
//! bytes holding every field the scripts read or change at fixed offsets (token at 2,
//! `expires_at` at 10, `lease_until` or `completed_at` at 18, state at 26), then the
//! scope's parts and, once completed, the answer. The scripts in `scripts/` use those
//! offsets (counting from 1, as Lua does); the tests below pin them.
//!
//! An in-progress record may keep one byte after the scope: why its attempt left it in
//! progress ([`Record::in_progress_ambiguity`], as `mark.lua` writes it: the reason's
//! place in [`Ambiguity::ALL`] plus one). Completing keeps bytes 0..18 and 27..the end
//! of the scope of the in-progress record, writes `completed_at` and `C` over 18..27,
//! and appends the answer: status, then the header block with the answer's metadata
//! and its ambiguity reason (`idem_core::codec::encode_response_headers`), then the
//! body. The listing reads every record it scans, so the reason needs no place of its
//! own to be found.

use bytes::Bytes;
use idem_core::codec::{decode_response_headers, encode_response_headers};
use idem_core::{
    Ambiguity, Endpoint, FencingToken, Fingerprint, Key, Record, RecordState, Result, Scope,
    StoredResponse, Tenant, Timestamp,
};

use crate::error::corrupt;

/// The first bytes of every record: the format's name and version.
pub(crate) const MAGIC: &[u8; 2] = b"I1";
/// `state` of a record whose attempt is running.
const IN_PROGRESS: u8 = b'P';
/// `state` of a record whose answer is recorded.
const COMPLETED: u8 = b'C';
/// `state` of a tombstone (SPEC S16), kept at its own key beside the record's: the
/// head of the completed record with its completion time, its own end as `expires_at`,
/// then the scope and the status, and nothing else.
const TOMBSTONE: u8 = b'T';
/// The head that identifies one version of a record (everything up to the scope).
pub(crate) const FENCED_LEN: usize = 71;
/// The head plus the three lengths of the scope's parts.
const FIXED_LEN: usize = FENCED_LEN + 12;

/// The fields of an in-progress record, borrowed from the caller.
pub(crate) struct InProgress<'a> {
    pub(crate) scope: &'a Scope,
    pub(crate) fingerprint: &'a Fingerprint,
    pub(crate) token: FencingToken,
    pub(crate) created_at: Timestamp,
    pub(crate) expires_at: Timestamp,
    pub(crate) lease_until: Timestamp,
    pub(crate) attempt: u32,
}

impl InProgress<'_> {
    /// The record as stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let scope = self.scope;
        let parts = [
            scope.tenant().as_str(),
            scope.endpoint_str(),
            scope.key().as_str(),
        ];
        let mut out = Vec::with_capacity(FIXED_LEN + parts.iter().map(|p| p.len()).sum::<usize>());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.token.as_u64().to_be_bytes());
        out.extend_from_slice(&self.expires_at.as_millis().to_be_bytes());
        out.extend_from_slice(&self.lease_until.as_millis().to_be_bytes());
        out.push(IN_PROGRESS);
        out.extend_from_slice(&self.created_at.as_millis().to_be_bytes());
        out.extend_from_slice(&self.attempt.to_be_bytes());
        out.extend_from_slice(self.fingerprint.as_bytes());
        for part in parts {
            out.extend_from_slice(&len_u32(part.len()).to_be_bytes());
        }
        for part in parts {
            out.extend_from_slice(part.as_bytes());
        }
        out
    }
}

/// What completing appends before the body: status, then the headers with their
/// length. The body follows as it is.
pub(crate) fn encode_answer_head(response: &StoredResponse) -> Vec<u8> {
    let headers = encode_response_headers(response, true);
    let mut out = Vec::with_capacity(6 + headers.len());
    out.extend_from_slice(&response.status.to_be_bytes());
    out.extend_from_slice(&len_u32(headers.len()).to_be_bytes());
    out.extend_from_slice(&headers);
    out
}

/// A length as stored. Nothing the store keeps comes near 4 GiB: Redis refuses
/// values over 512 MiB.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The record a stored value holds. The body of a completed record is a slice of
/// `value`, not a copy.
pub(crate) fn decode(value: Bytes) -> Result<Record> {
    let mut r = Reader {
        value: &value,
        at: 0,
    };
    if r.take(MAGIC.len(), "format")? != MAGIC {
        return Err(corrupt(
            "format",
            "not a record of this store (no `I1` at its start)",
        ));
    }
    let token = FencingToken::from_u64(u64::from_be_bytes(r.array("token")?));
    let expires_at = r.timestamp("expires_at")?;
    let lease_or_completed = r.timestamp("lease_until")?;
    let state = r.take(1, "state")?[0];
    let created_at = r.timestamp("created_at")?;
    let attempt = u32::from_be_bytes(r.array("attempt")?);
    let fingerprint = Fingerprint::from_bytes(r.array("fingerprint")?);
    let lens: [[u8; 4]; 3] = [r.array("tenant")?, r.array("endpoint")?, r.array("key")?];
    let [tenant, endpoint, key] = lens.map(|l| u32::from_be_bytes(l) as usize);
    let tenant = r.text(tenant, "tenant")?;
    let endpoint = r.text(endpoint, "endpoint")?;
    let key = Key::new(r.text(key, "key")?).map_err(|e| corrupt("key", e))?;
    let scope = Scope::from_parts(
        Tenant::new(tenant),
        (!endpoint.is_empty()).then(|| Endpoint::from_raw(endpoint)),
        key,
    );
    let mut in_progress_ambiguity = None;
    let state = match state {
        IN_PROGRESS if r.at == value.len() => RecordState::InProgress {
            lease_until: lease_or_completed,
        },
        IN_PROGRESS if r.at + 1 == value.len() => {
            in_progress_ambiguity = ambiguity_of(value[r.at]);
            RecordState::InProgress {
                lease_until: lease_or_completed,
            }
        }
        IN_PROGRESS => return Err(corrupt("state", "an in-progress record with an answer")),
        COMPLETED => {
            let status = u16::from_be_bytes(r.array("status")?);
            let headers_len = u32::from_be_bytes(r.array("headers")?) as usize;
            let (headers, meta) = decode_response_headers(r.take(headers_len, "headers")?, None)?;
            RecordState::Completed {
                response: StoredResponse {
                    status,
                    headers,
                    body: value.slice(r.at..),
                    meta,
                },
                completed_at: lease_or_completed,
            }
        }
        TOMBSTONE => {
            let status = u16::from_be_bytes(r.array("status")?);
            if r.at != value.len() {
                return Err(corrupt("state", "a tombstone with an answer"));
            }
            RecordState::Tombstone {
                completed_at: lease_or_completed,
                status,
            }
        }
        other => {
            return Err(corrupt(
                "state",
                format!("unknown state {:?}", char::from(other)),
            ));
        }
    };
    let tombstone_until = matches!(state, RecordState::Tombstone { .. }).then_some(expires_at);
    Ok(Record {
        scope,
        fingerprint,
        created_at,
        expires_at,
        attempt,
        token,
        state,
        tombstone_until,
        in_progress_ambiguity,
    })
}

/// The byte `mark.lua` keeps after an in-progress record's scope for `reason`.
pub(crate) fn ambiguity_byte(reason: Ambiguity) -> u8 {
    let place = Ambiguity::ALL.iter().position(|a| *a == reason);
    place.map_or(0, |p| p as u8 + 1)
}

/// The reason [`ambiguity_byte`] wrote; `None` for one this build does not know.
fn ambiguity_of(byte: u8) -> Option<Ambiguity> {
    Ambiguity::ALL
        .get(usize::from(byte).checked_sub(1)?)
        .copied()
}

/// Reads a value front to back.
struct Reader<'a> {
    value: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        let bytes = self
            .value
            .get(self.at..)
            .and_then(|rest| rest.get(..n))
            .ok_or_else(|| corrupt(field, "the value ends before it"))?;
        self.at += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        Ok(self.take(N, field)?.try_into().expect("N bytes"))
    }

    fn timestamp(&mut self, field: &str) -> Result<Timestamp> {
        Ok(Timestamp::from_millis(i64::from_be_bytes(
            self.array(field)?,
        )))
    }

    fn text(&mut self, n: usize, field: &str) -> Result<String> {
        String::from_utf8(self.take(n, field)?.to_vec()).map_err(|_| corrupt(field, "not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(endpoint: Option<&str>) -> Scope {
        Scope::from_parts(
            Tenant::new("t-ü"),
            endpoint.map(Endpoint::from_raw),
            Key::new("k-1").unwrap(),
        )
    }

    fn in_progress(scope: &Scope, fingerprint: &Fingerprint) -> Vec<u8> {
        InProgress {
            scope,
            fingerprint,
            token: FencingToken::from_u64(u64::MAX - 1),
            created_at: Timestamp::from_millis(1_000),
            expires_at: Timestamp::from_millis(i64::MAX),
            lease_until: Timestamp::from_millis(-5),
            attempt: 7,
        }
        .encode()
    }

    /// What `complete.lua` makes of an in-progress value.
    fn completed(value: &[u8], completed_at: i64, response: &StoredResponse) -> Vec<u8> {
        let mut out = value[..18].to_vec();
        out.extend_from_slice(&completed_at.to_be_bytes());
        out.push(b'C');
        out.extend_from_slice(&value[27..]);
        out.extend_from_slice(&encode_answer_head(response));
        out.extend_from_slice(&response.body);
        out
    }

    #[test]
    fn in_progress_record_round_trips_at_the_documented_offsets() {
        let scope = scope(Some("POST /v1/x"));
        let fp = Fingerprint::from_bytes([7; 32]);
        let value = in_progress(&scope, &fp);
        // The offsets the scripts read.
        assert_eq!(&value[0..2], b"I1");
        assert_eq!(value[2..10], (u64::MAX - 1).to_be_bytes());
        assert_eq!(value[10..18], i64::MAX.to_be_bytes());
        assert_eq!(value[18..26], (-5i64).to_be_bytes());
        assert_eq!(value[26], b'P');
        assert_eq!(value[27..35], 1_000i64.to_be_bytes());
        assert_eq!(value[35..39], 7u32.to_be_bytes());
        assert_eq!(value[39..71], [7; 32]);
        assert_eq!(value[71..75], 4u32.to_be_bytes(), "t-ü is 4 bytes");
        assert_eq!(&value[83..], "t-üPOST /v1/xk-1".as_bytes());

        let record = decode(value.into()).unwrap();
        assert_eq!(record.scope, scope);
        assert_eq!(record.fingerprint, fp);
        assert_eq!(record.token, FencingToken::from_u64(u64::MAX - 1));
        assert_eq!(record.created_at, Timestamp::from_millis(1_000));
        assert_eq!(record.expires_at, Timestamp::from_millis(i64::MAX));
        assert_eq!(record.attempt, 7);
        assert_eq!(
            record.state,
            RecordState::InProgress {
                lease_until: Timestamp::from_millis(-5)
            }
        );
    }

    #[test]
    fn completed_record_round_trips_binary_answer_and_internal_scope() {
        let scope = scope(None);
        let fp = Fingerprint::from_bytes([1; 32]);
        let response =
            StoredResponse::new(201, vec![0u8, 255, 13, 10]).with_header("content-type", "a/b");
        let value = completed(&in_progress(&scope, &fp), 1_500, &response);
        let record = decode(value.into()).unwrap();
        assert_eq!(record.scope, scope);
        assert_eq!(record.scope.endpoint(), None);
        assert_eq!(record.attempt, 7);
        assert_eq!(
            record.state,
            RecordState::Completed {
                response,
                completed_at: Timestamp::from_millis(1_500),
            }
        );
        // An empty body is the end of the value.
        let empty = StoredResponse::new(204, Bytes::new());
        let record = decode(completed(&in_progress(&scope, &fp), 9, &empty).into()).unwrap();
        assert!(
            matches!(record.state, RecordState::Completed { response, .. } if response == empty)
        );
    }

    #[test]
    fn foreign_truncated_or_malformed_values_are_corrupt() {
        let scope = scope(Some("POST /v1/x"));
        let fp = Fingerprint::from_bytes([7; 32]);
        let good = in_progress(&scope, &fp);
        let err = |value: Vec<u8>| decode(value.into()).unwrap_err().to_string();

        assert!(err(b"not a record".to_vec()).contains("format"));
        assert!(err(Vec::new()).contains("format"));
        for cut in [10, 70, 82, good.len() - 1] {
            assert!(err(good[..cut].to_vec()).contains("ends before"), "{cut}");
        }
        let mut trailing = good.clone();
        trailing.extend([1, 0]);
        assert!(err(trailing).contains("state"));
        // One byte after the scope is the reason `mark.lua` keeps.
        let mut marked = good.clone();
        marked.push(ambiguity_byte(Ambiguity::UpstreamTimeout));
        let record = decode(marked.into()).unwrap();
        assert_eq!(
            record.in_progress_ambiguity,
            Some(Ambiguity::UpstreamTimeout)
        );
        let mut state = good.clone();
        state[26] = b'X';
        assert!(err(state).contains("unknown state 'X'"));
        let mut huge = good.clone();
        huge[79..83].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(err(huge).contains("key"));
        let mut bad_headers = completed(&good, 1, &StoredResponse::new(200, "x"));
        let headers_len_at = good.len() + 2;
        bad_headers[headers_len_at..headers_len_at + 4].copy_from_slice(&1u32.to_be_bytes());
        assert!(decode(bad_headers.into()).is_err());
    }
}
