//! Sealed records (SPEC S17): recorded answers encrypted at rest under keys named by
//! id, so that a copy of the store (a SQLite file, a PostgreSQL dump, a Redis RDB)
//! holds no body and no header in plain text.
//!
//! [`RecordKeys`] is the key ring; [`Sealed`] is the store wrapper that
//! seals every answer it records and opens every answer it reads.
//!
//! # What a sealed answer looks like in the store
//!
//! A sealed [`StoredResponse`] is still a [`StoredResponse`], so every store keeps it
//! without a change to its schema:
//!
//! - `status`: the recorded status, in plain text (the decision table and operators
//!   read it; it is bound to the ciphertext, so it cannot be changed unnoticed);
//! - `headers`: none;
//! - `meta`: [`sealed_by`](crate::ResponseMeta::sealed_by), the id of the key that
//!   sealed it (kept under [`SEALED_HEADER`] in the store's header block), and the
//!   [`ambiguity`](crate::ResponseMeta::ambiguity) reason, in plain text so that a
//!   listing of ambiguous records finds sealed ones too: a label from a short fixed list
//!   ([`Ambiguity::as_str`](crate::Ambiguity::as_str)), as telling as the plain status
//!   beside it, and about the gateway's outcome, not the answer's content;
//! - `body`: a version byte, a random 24-byte nonce, then the XChaCha20-Poly1305
//!   ciphertext of the header block of the real headers and every metadata field
//!   ([`codec`](crate::codec): the reference, the trace context, the trailers and the
//!   ambiguity reason again) and of the body, with its 16-byte tag. On opening, every
//!   field comes from the ciphertext: the plain ambiguity reason is an index, never
//!   trusted.
//!
//! The associated data binds the ciphertext to the record it was recorded in
//! ([`SealBinding`]): its scope (tenant, endpoint, key), the fingerprint of the request
//! it answers, the fencing token of the attempt that recorded it, its status and the
//! key id. An answer copied into another record (another tenant's, another key's), into
//! the same key's record for another payload, or into a later life of the same record
//! (the key reused after the answer expired, with the same payload), or given another
//! status, fails to open. What no seal can tell apart is a whole row put back as it
//! was, token and fingerprint included: that is the record as it stood.
//!
//! Version 1 of the format (bound to scope, status and key id only) opens only where a
//! migration setting allows it ([`Sealed::read_unsealed`](crate::Sealed::read_unsealed)).

mod store;

pub use store::Sealed;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use chacha20poly1305::aead::{AeadInOut, KeyInit};
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};

use crate::codec::{decode_headers, encode_headers, header_list, split_header_list};
use crate::{
    FencingToken, Fingerprint, Lease, Record, ResponseMeta, Scope, StoreError, StoredResponse,
};

/// The name under which a store's header block keeps the id of the key that sealed an
/// answer ([`ResponseMeta::sealed_by`](crate::ResponseMeta::sealed_by)).
pub const SEALED_HEADER: &str = crate::codec::SEALED_HEADER;

/// The first byte of a sealed body: the format's version.
const VERSION: u8 = 2;

/// The version of answers sealed before they were bound to their request and attempt.
const UNBOUND_VERSION: u8 = 1;

/// What a sealed answer is bound to (see the [module docs](self)): the record it is
/// recorded in.
#[derive(Debug, Clone, Copy)]
pub struct SealBinding<'a> {
    /// The record's scope.
    pub scope: &'a Scope,
    /// The fingerprint of the request the record was reserved for.
    pub fingerprint: &'a Fingerprint,
    /// The fencing token of the attempt that recorded the answer.
    pub token: FencingToken,
}

impl<'a> SealBinding<'a> {
    /// The binding of the answer `lease`'s attempt records.
    pub fn of_lease(lease: &'a Lease) -> SealBinding<'a> {
        SealBinding {
            scope: &lease.scope,
            fingerprint: &lease.fingerprint,
            token: lease.token,
        }
    }

    /// The binding of the answer `record` holds.
    pub fn of_record(record: &'a Record) -> SealBinding<'a> {
        SealBinding {
            scope: &record.scope,
            fingerprint: &record.fingerprint,
            token: record.token,
        }
    }
}

/// The nonce's length: XChaCha20's 192 bits, safe to draw at random for every record.
const NONCE_LEN: usize = 24;

/// The Poly1305 tag's length.
const TAG_LEN: usize = 16;

/// The bytes sealing adds to an answer: version, nonce, tag, and the length of the
/// inner header block.
pub const SEAL_OVERHEAD: usize = 1 + NONCE_LEN + TAG_LEN + 4;

/// The longest key id.
pub const MAX_KEY_ID_LEN: usize = 32;

/// Why a key ring could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordKeyError {
    /// The key file holds no key.
    #[error("the record key file holds no key; add a line `id:<64 hex digits>`")]
    Empty,
    /// A line is not `id:<64 hex digits>`.
    #[error("line {line}: {why} (each key is a line `id:<64 hex digits>`)")]
    Line {
        /// The line's number, from 1 (for [`RecordKeys::new`], the key's position).
        line: usize,
        /// What is wrong with it; never the key's bytes.
        why: String,
    },
    /// Two keys have the same id.
    #[error("line {line}: the key id {id:?} is used twice; every key needs its own id")]
    DuplicateId {
        /// The line's number, from 1 (for [`RecordKeys::new`], the key's position).
        line: usize,
        /// The id.
        id: String,
    },
}

/// One key of the ring: its id and its cipher.
struct RecordKey {
    id: String,
    cipher: XChaCha20Poly1305,
}

/// The keys records are sealed and opened with: the first seals every new answer, and
/// each opens the answers sealed under its id, so keys rotate without downtime (add the
/// new key first, wait one record TTL, drop the old one).
///
/// Cheap to clone. `Debug` shows the ids, never the keys. Two rings are equal when they
/// hold the same keys under the same ids in the same order (told by a SHA-256 digest of
/// them made with the ring, so that a reloaded key file can be compared with the one in
/// force; the keys themselves are not kept).
#[derive(Clone)]
pub struct RecordKeys {
    keys: Arc<[RecordKey]>,
    digest: [u8; 32],
}

impl PartialEq for RecordKeys {
    fn eq(&self, other: &RecordKeys) -> bool {
        self.digest == other.digest
    }
}

impl Eq for RecordKeys {}

impl fmt::Debug for RecordKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordKeys")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish()
    }
}

/// Whether `id` may name a key: 1 to [`MAX_KEY_ID_LEN`] letters, digits, `.`, `_` or
/// `-`, since it is stored in every record.
fn valid_id(id: &str) -> bool {
    (1..=MAX_KEY_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl RecordKeys {
    /// A ring from `(id, key)` pairs, the first sealing new answers.
    pub fn new<I, S>(keys: I) -> Result<RecordKeys, RecordKeyError>
    where
        I: IntoIterator<Item = (S, [u8; 32])>,
        S: Into<String>,
    {
        use sha2::Digest;
        let mut ring: Vec<RecordKey> = Vec::new();
        let mut digest = sha2::Sha256::new();
        for (i, (id, key)) in keys.into_iter().enumerate() {
            let id = id.into();
            let line = i + 1;
            if !valid_id(&id) {
                return Err(RecordKeyError::Line {
                    line,
                    why: format!(
                        "the key id {id:?} is not 1 to {MAX_KEY_ID_LEN} letters, digits, '.', '_' or '-'"
                    ),
                });
            }
            if ring.iter().any(|k| k.id == id) {
                return Err(RecordKeyError::DuplicateId { line, id });
            }
            digest.update((id.len() as u64).to_be_bytes());
            digest.update(id.as_bytes());
            digest.update(key);
            let cipher = XChaCha20Poly1305::new(&key.into());
            ring.push(RecordKey { id, cipher });
        }
        if ring.is_empty() {
            return Err(RecordKeyError::Empty);
        }
        Ok(RecordKeys {
            keys: ring.into(),
            digest: digest.finalize().into(),
        })
    }

    /// A ring from a key file's text: one key per line, `id:<64 hex digits>` (32
    /// bytes), the first line sealing new answers. Blank lines and lines starting with
    /// `#` are skipped; spaces around the id and the key are trimmed. Errors name the
    /// line, never the key.
    ///
    /// ```
    /// let keys = idem_core::RecordKeys::parse(
    ///     "# rotated 2026-03-01\n\
    ///      k2:1111111111111111111111111111111111111111111111111111111111111111\n\
    ///      k1:2222222222222222222222222222222222222222222222222222222222222222\n",
    /// )
    /// .unwrap();
    /// assert_eq!(keys.current_id(), "k2");
    /// ```
    pub fn parse(text: &str) -> Result<RecordKeys, RecordKeyError> {
        let mut pairs = Vec::new();
        let mut ids: Vec<String> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let number = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| RecordKeyError::Line {
                line: number,
                why: why.to_owned(),
            };
            let (id, hex_key) = line
                .split_once(':')
                .ok_or_else(|| bad("no ':' between the key id and the key"))?;
            let (id, hex_key) = (id.trim(), hex_key.trim());
            if !valid_id(id) {
                return Err(bad(&format!(
                    "the key id {id:?} is not 1 to {MAX_KEY_ID_LEN} letters, digits, '.', '_' or '-'"
                )));
            }
            if ids.iter().any(|seen| seen == id) {
                return Err(RecordKeyError::DuplicateId {
                    line: number,
                    id: id.to_owned(),
                });
            }
            let mut key = [0u8; 32];
            if hex_key.len() != 64 || hex::decode_to_slice(hex_key, &mut key).is_err() {
                return Err(bad(&format!(
                    "the key is {} characters, not 64 hex digits (32 bytes; `openssl rand -hex 32` makes one)",
                    hex_key.len()
                )));
            }
            ids.push(id.to_owned());
            pairs.push((id.to_owned(), key));
        }
        // Ids and duplicates are checked above, by line: `new` can only find none.
        RecordKeys::new(pairs)
    }

    /// The id of the key new answers are sealed with.
    pub fn current_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Every key's id, the current one first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }

    /// `response` sealed for the record `binding` names under the current key (see the
    /// [module docs](self)). An answer that is sealed already is returned as it is.
    pub fn seal(&self, binding: SealBinding<'_>, response: &StoredResponse) -> StoredResponse {
        if is_sealed(response) {
            return response.clone();
        }
        let key = &self.keys[0];
        let headers = encode_headers(&header_list(response, true));
        let mut out = Vec::with_capacity(SEAL_OVERHEAD + headers.len() + response.body.len());
        out.push(VERSION);
        out.extend_from_slice(&random_nonce());
        out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        out.extend_from_slice(&headers);
        out.extend_from_slice(&response.body);
        let nonce = XNonce::try_from(&out[1..1 + NONCE_LEN]).expect("24 bytes");
        let aad = associated_data(VERSION, binding, response.status, &key.id);
        let tag = key
            .cipher
            .encrypt_inout_detached(&nonce, &aad, (&mut out[1 + NONCE_LEN..]).into())
            .expect("an answer under 256 GiB seals");
        out.extend_from_slice(&tag);
        StoredResponse {
            status: response.status,
            headers: Vec::new(),
            body: Bytes::from(out),
            meta: ResponseMeta {
                sealed_by: Some(key.id.clone()),
                ambiguity: response.meta.ambiguity,
                ..ResponseMeta::default()
            },
        }
    }

    /// The answer `stored` holds for the record `binding` names: opened if it is
    /// sealed, as it is if not (an answer recorded before sealing was turned on). Fails
    /// with [`StoreError::Sealed`] when it names a key this ring lacks, when its bytes,
    /// status or binding are not the ones it was sealed with, or when it was sealed in
    /// version 1 of the format, bound to less.
    pub fn open(
        &self,
        binding: SealBinding<'_>,
        stored: StoredResponse,
    ) -> Result<StoredResponse, StoreError> {
        self.open_with(binding, stored, false)
    }

    /// [`open`](Self::open), which opens version 1 answers too when `unbound` says so.
    pub(crate) fn open_with(
        &self,
        binding: SealBinding<'_>,
        stored: StoredResponse,
        unbound: bool,
    ) -> Result<StoredResponse, StoreError> {
        let Some(id) = stored.meta.sealed_by.as_deref() else {
            return Ok(stored);
        };
        let key = self.keys.iter().find(|k| k.id == id).ok_or_else(|| {
            StoreError::Sealed(format!(
                "the answer is sealed with the key {id:?}, which the record key file lacks \
                 (it has {:?})",
                self.ids().collect::<Vec<_>>()
            ))
        })?;
        let body = &stored.body[..];
        if body.len() < SEAL_OVERHEAD || !matches!(body[0], VERSION | UNBOUND_VERSION) {
            return Err(StoreError::Sealed(format!(
                "the sealed answer is {} bytes or of an unknown version",
                body.len()
            )));
        }
        let version = body[0];
        if version == UNBOUND_VERSION && !unbound {
            return Err(StoreError::Sealed(
                "the answer is sealed in version 1 of the format, bound to its scope but not \
                 to its request and attempt, so a copy of an older answer would open in its \
                 place; the migration setting to read unsealed records reads it while such \
                 answers age out"
                    .into(),
            ));
        }
        let nonce = XNonce::try_from(&body[1..1 + NONCE_LEN]).expect("24 bytes");
        let (sealed, tag) = body[1 + NONCE_LEN..].split_at(body.len() - 1 - NONCE_LEN - TAG_LEN);
        let tag = Tag::try_from(tag).expect("16 bytes");
        let mut plain = sealed.to_vec();
        let aad = associated_data(version, binding, stored.status, &key.id);
        key.cipher
            .decrypt_inout_detached(&nonce, &aad, plain.as_mut_slice().into(), &tag)
            .map_err(|_| {
                StoreError::Sealed(format!(
                    "the answer sealed with the key {id:?} does not open: its bytes or status \
                     were changed, it was recorded for another scope, request or attempt \
                     (copied from another record), or the key under that id is not the \
                     one it was sealed with"
                ))
            })?;
        let corrupt =
            |why: &str| StoreError::Sealed(format!("the opened answer is corrupt: {why}"));
        let (len, rest) = plain.split_at(4);
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        if rest.len() < len {
            return Err(corrupt("its header block is truncated"));
        }
        let list = decode_headers(&rest[..len]).map_err(|e| corrupt(&e.to_string()))?;
        let (headers, meta) = split_header_list(list);
        let body = Bytes::from(plain).slice(4 + len..);
        Ok(StoredResponse {
            status: stored.status,
            headers,
            body,
            meta,
        })
    }
}

/// Whether `response` is sealed (names the key that sealed it,
/// [`ResponseMeta::sealed_by`](crate::ResponseMeta::sealed_by)).
pub fn is_sealed(response: &StoredResponse) -> bool {
    response.meta.sealed_by.is_some()
}

/// What the tag covers besides the ciphertext: a label, the scope's parts and the key
/// id (length-prefixed), then (from version 2) the fingerprint and the attempt's token,
/// and the status.
fn associated_data(version: u8, binding: SealBinding<'_>, status: u16, key_id: &str) -> Vec<u8> {
    let scope = binding.scope;
    let parts = [
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
        key_id,
    ];
    let mut aad = Vec::with_capacity(64 + parts.iter().map(|p| 4 + p.len()).sum::<usize>());
    aad.extend_from_slice(if version == UNBOUND_VERSION {
        b"idem-seal-v1"
    } else {
        b"idem-seal-v2"
    });
    for part in parts {
        aad.extend_from_slice(&(part.len() as u32).to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    }
    if version != UNBOUND_VERSION {
        aad.extend_from_slice(binding.fingerprint.as_bytes());
        aad.extend_from_slice(&binding.token.as_u64().to_be_bytes());
    }
    aad.extend_from_slice(&status.to_be_bytes());
    aad
}

fn random_nonce() -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).expect("the operating system's random generator failed");
    nonce
}

#[cfg(test)]
mod tests;
