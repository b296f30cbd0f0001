//! A key set whose source fails: a token it cannot check is the verifier's fault (503),
//! a token checked against a set that loaded stays a bad one (401).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem_test_support::jwt::{Signer, epoch, jwks};
use idem_tower::{Credential, CredentialError};
use serde_json::json;

use crate::{JwksSource, JwtError, JwtVerifier, RELOAD_INTERVAL};

/// A JWKS in memory that can be taken down (every load fails) and put back; its loads
/// counted.
#[derive(Clone, Default)]
struct Switch {
    doc: Arc<Mutex<Option<Vec<u8>>>>,
    loads: Arc<AtomicUsize>,
}

impl Switch {
    fn serve(&self, signers: &[&Signer]) {
        *self.doc.lock().unwrap() = Some(jwks(signers).to_string().into_bytes());
    }

    fn take_down(&self) {
        *self.doc.lock().unwrap() = None;
    }

    fn loads(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }
}

impl JwksSource for Switch {
    fn load(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send + '_>>
    {
        Box::pin(async move {
            self.loads.fetch_add(1, Ordering::SeqCst);
            let doc = self.doc.lock().unwrap().clone();
            doc.ok_or_else(|| "connection refused".to_owned())
        })
    }

    fn describe(&self) -> String {
        "switch".into()
    }
}

fn claims(sub: &str) -> serde_json::Value {
    json!({"sub": sub, "exp": epoch(600), "iat": epoch(0)})
}

/// A token naming a kid the set lacks, while the JWKS cannot be loaded, is unavailable
/// (for a while after the failed load too, without another load), never a bad token;
/// a token whose kid the held set has and whose signature fails stays refused; once the
/// JWKS loads again, the new kid verifies and a stranger's is refused.
#[tokio::test(start_paused = true)]
async fn a_key_set_that_cannot_load_is_unavailable_not_a_bad_token() {
    let ed = Signer::ed25519("ed-1");
    let source = Switch::default();
    source.serve(&[&ed]);
    let v = JwtVerifier::builder()
        .jwks(source.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(source.loads(), 1);

    source.take_down();
    let new = Signer::es256("ec-2");
    let token = new.sign(&claims("cus_1"));
    let e = v.verify(&token).await.unwrap_err();
    assert_eq!(e, JwtError::KeysUnavailable);
    assert!(e.is_unavailable());
    assert_eq!(source.loads(), 2, "the unknown kid asked for one load");
    // Right after the failed load: unavailable at once, with no load of its own.
    match v.principal(&token).await {
        Err(CredentialError::Unavailable {
            reason,
            retry_after,
        }) => {
            assert_eq!(retry_after, RELOAD_INTERVAL);
            assert!(reason.contains("could not be loaded"), "{reason}");
            assert!(
                !reason.contains("connection refused"),
                "the cause is not told: {reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(source.loads(), 2);
    // A token the held set can check is checked: another key under a known kid.
    let forger = Signer::ed25519("ed-1");
    let forged = v.verify(&forger.sign(&claims("cus_1"))).await.unwrap_err();
    assert_eq!(forged, JwtError::Signature);
    assert!(!forged.is_unavailable());
    assert!(matches!(
        v.principal(&forger.sign(&claims("cus_1"))).await,
        Err(CredentialError::Refused(_))
    ));
    assert!(v.verify(&ed.sign(&claims("cus_1"))).await.is_ok());

    // Back up, after the interval between loads: the new kid verifies, and a kid the
    // loaded set lacks is a bad token again.
    source.serve(&[&ed, &new]);
    tokio::time::advance(RELOAD_INTERVAL).await;
    assert!(v.verify(&token).await.is_ok());
    assert_eq!(source.loads(), 3);
    let stranger = Signer::ed25519("never-published").sign(&claims("cus_1"));
    assert!(matches!(
        v.verify(&stranger).await.unwrap_err(),
        JwtError::UnknownKey(..)
    ));
    assert_eq!(source.loads(), 3, "right after a load that gave a set");
}
