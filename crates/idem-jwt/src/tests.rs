use std::io::Write;

use idem_test_support::jwt::{Signer, epoch, jwks};
use serde_json::json;

use super::*;

/// A JWKS file of `signers`, rewritten by [`write`].
fn jwks_file(signers: &[&Signer]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    write(&file, signers);
    file
}

fn write(file: &tempfile::NamedTempFile, signers: &[&Signer]) {
    let mut f = std::fs::File::create(file.path()).unwrap();
    f.write_all(jwks(signers).to_string().as_bytes()).unwrap();
}

fn claims(sub: &str) -> Value {
    json!({"sub": sub, "iss": "https://issuer.test", "aud": "payments", "exp": epoch(600), "iat": epoch(0)})
}

async fn verifier(file: &tempfile::NamedTempFile) -> JwtVerifier {
    JwtVerifier::builder()
        .jwks(JwksFile(file.path().to_owned()))
        .issuer("https://issuer.test")
        .audience("payments")
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_refreshed_token_names_the_same_tenant_and_another_subject_another() {
    let ed = Signer::ed25519("ed-1");
    let ec = Signer::es256("ec-1");
    let file = jwks_file(&[&ed, &ec]);
    let v = verifier(&file).await;
    let key = idem_core::TenantKey::new(&[9; 32]).unwrap();
    let first = v.verify(&ed.sign(&claims("cus_1"))).await.unwrap();
    // A new token for the same subject, later, from another key of the issuer.
    let mut later = claims("cus_1");
    later["iat"] = json!(epoch(5));
    later["jti"] = json!("another");
    let refreshed = v.verify(&ec.sign(&later)).await.unwrap();
    assert_eq!(first.tenant(&key), refreshed.tenant(&key));
    assert_eq!(first.names(), [("sub".to_owned(), "cus_1".to_owned())]);
    let other = v.verify(&ed.sign(&claims("cus_2"))).await.unwrap();
    assert_ne!(first.tenant(&key), other.tenant(&key));
    // Never the subject in clear.
    assert!(!first.tenant(&key).as_str().contains("cus_1"));
}

#[tokio::test]
async fn forged_expired_and_misaddressed_tokens_are_refused() {
    let ed = Signer::ed25519("ed-1");
    let file = jwks_file(&[&ed]);
    let v = verifier(&file).await;
    // Another key under the same kid: the signature fails.
    let forger = Signer::ed25519("ed-1");
    let e = v.verify(&forger.sign(&claims("cus_1"))).await.unwrap_err();
    assert_eq!(e, JwtError::Signature);
    // A payload swapped under a real signature.
    let real = ed.sign(&claims("cus_1"));
    let forged = ed.sign(&claims("cus_2"));
    let mut parts: Vec<&str> = real.split('.').collect();
    parts[1] = forged.split('.').nth(1).unwrap();
    assert_eq!(
        v.verify(&parts.join(".")).await.unwrap_err(),
        JwtError::Signature
    );
    let mut c = claims("cus_1");
    c["exp"] = json!(epoch(-120));
    assert_eq!(v.verify(&ed.sign(&c)).await.unwrap_err(), JwtError::Expired);
    // Within the leeway, an expired token still passes.
    c["exp"] = json!(epoch(-30));
    assert!(v.verify(&ed.sign(&c)).await.is_ok());
    c.as_object_mut().unwrap().remove("exp");
    assert_eq!(v.verify(&ed.sign(&c)).await.unwrap_err(), JwtError::Expired);
    let mut c = claims("cus_1");
    c["nbf"] = json!(epoch(300));
    assert_eq!(
        v.verify(&ed.sign(&c)).await.unwrap_err(),
        JwtError::NotYetValid
    );
    let mut c = claims("cus_1");
    c["iss"] = json!("https://evil.test");
    assert_eq!(v.verify(&ed.sign(&c)).await.unwrap_err(), JwtError::Issuer);
    let mut c = claims("cus_1");
    c["aud"] = json!(["other", "reports"]);
    assert_eq!(
        v.verify(&ed.sign(&c)).await.unwrap_err(),
        JwtError::Audience
    );
    c["aud"] = json!(["other", "payments"]);
    assert!(v.verify(&ed.sign(&c)).await.is_ok());
    let mut c = claims("cus_1");
    c["sub"] = json!({"id": 1});
    assert_eq!(
        v.verify(&ed.sign(&c)).await.unwrap_err(),
        JwtError::Claim("sub".into())
    );
}

#[tokio::test]
async fn algorithms_must_fit_their_keys() {
    let ed = Signer::ed25519("ed-1");
    let file = jwks_file(&[&ed]);
    let v = verifier(&file).await;
    let body = claims("cus_1");
    // `none`, and a header that lies about the algorithm.
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
        URL_SAFE_NO_PAD.encode(body.to_string())
    );
    assert_eq!(
        v.verify(&none).await.unwrap_err(),
        JwtError::Algorithm("none".into())
    );
    let lying = ed.sign_with_header(&json!({"alg": "ES256", "kid": "ed-1"}), &body);
    assert!(matches!(
        v.verify(&lying).await.unwrap_err(),
        JwtError::UnknownKey(..)
    ));
    // HS256 signed with the public key's bytes as the secret (the classic confusion):
    // without an HS256 secret configured, HS256 is not accepted at all.
    let public = URL_SAFE_NO_PAD
        .decode(ed.jwk()["x"].as_str().unwrap())
        .unwrap();
    let confused = Signer::hs256("ed-1", &public).sign(&body);
    assert_eq!(
        v.verify(&confused).await.unwrap_err(),
        JwtError::Algorithm("HS256".into())
    );
    let crit = ed.sign_with_header(
        &json!({"alg": "EdDSA", "kid": "ed-1", "crit": ["exp"]}),
        &body,
    );
    assert_eq!(v.verify(&crit).await.unwrap_err(), JwtError::Critical);
    for bad in ["", "a.b", "a.b.c.d", "!!.e30.e30", "e30.e30.!!"] {
        assert!(
            matches!(v.verify(bad).await.unwrap_err(), JwtError::Malformed(_)),
            "{bad}"
        );
    }
}

/// The algorithm confusion (a public key's bytes as an `HS256` secret) and `none`,
/// where the verifier holds an `HS256` secret beside the key set.
#[tokio::test]
async fn alg_none_and_a_public_key_as_an_hs256_secret_are_refused() {
    let ed = Signer::ed25519("ed-1");
    let file = jwks_file(&[&ed]);
    let v = JwtVerifier::builder()
        .jwks(JwksFile(file.path().to_owned()))
        .hs256_secret([7u8; 32].to_vec())
        .build()
        .await
        .unwrap();
    let body = claims("cus_1");
    // An HS256 token meets the secret alone: the key's bytes, its base64url text or
    // its whole JWK as the secret, all fail.
    let x = ed.jwk()["x"].as_str().unwrap().to_owned();
    let ed_key = DecodingKey::from_ed_components(&x).unwrap();
    for secret in [
        URL_SAFE_NO_PAD.decode(&x).unwrap(),
        x.into_bytes(),
        ed.jwk().to_string().into_bytes(),
    ] {
        let confused = Signer::hs256("ed-1", &secret).sign(&body);
        assert_eq!(v.verify(&confused).await.unwrap_err(), JwtError::Signature);
    }
    // `none`, with no signature or with a real key's.
    let signed = ed.sign_with_header(&json!({"alg": "none", "kid": "ed-1"}), &body);
    let unsigned = format!("{}.", signed.rsplit_once('.').unwrap().0);
    for token in [signed, unsigned] {
        assert_eq!(
            v.verify(&token).await.unwrap_err(),
            JwtError::Algorithm("none".into())
        );
    }
    // Under the verifier, the crypto takes no RSA or Ed25519 public key as an HMAC
    // secret, and no secret as a public key.
    let rsa_key = DecodingKey::from_rsa_components("AQAB", "AQAB").unwrap();
    for key in [&rsa_key, &ed_key] {
        assert!(provider::verifier_factory(&Algorithm::HS256, key).is_err());
    }
    let secret = DecodingKey::from_secret(&[7; 32]).unwrap();
    for alg in [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA] {
        assert!(provider::verifier_factory(&alg, &secret).is_err());
    }
}

#[tokio::test]
async fn hs256_from_a_secret_and_claims_by_pointer() {
    let secret = [7u8; 32];
    let v = JwtVerifier::builder()
        .hs256_secret(secret.to_vec())
        .claim("/org/id")
        .claim("client_id")
        .build()
        .await
        .unwrap();
    let s = Signer::hs256("any", &secret);
    let p = v
        .verify(&s.sign(&json!({"exp": epoch(60), "org": {"id": 42}, "client_id": "app-1"})))
        .await
        .unwrap();
    assert_eq!(
        p.names(),
        [
            // A number, named apart from the string "42" (issue 61 item 6).
            ("/org/id\0number".to_owned(), "42".to_owned()),
            ("client_id".to_owned(), "app-1".to_owned())
        ]
    );
    let wrong = Signer::hs256("any", &[8u8; 32]);
    assert_eq!(
        v.verify(&wrong.sign(&json!({"exp": epoch(60)})))
            .await
            .unwrap_err(),
        JwtError::Signature
    );
    // A short secret, or nothing to verify with, is refused when built.
    let e = JwtVerifier::builder()
        .hs256_secret(vec![1; 8])
        .build()
        .await;
    assert!(e.unwrap_err().contains("at least 32"));
    assert!(JwtVerifier::builder().build().await.is_err());
}

#[tokio::test]
async fn a_rotated_key_is_loaded_without_a_restart() {
    let old = Signer::es256("2026-01");
    let file = jwks_file(&[&old]);
    let v = verifier(&file).await;
    assert!(v.verify(&old.sign(&claims("cus_1"))).await.is_ok());
    let new = Signer::ed25519("2026-02");
    write(&file, &[&old, &new]);
    let p = v.verify(&new.sign(&claims("cus_1"))).await.unwrap();
    assert_eq!(p.names()[0].1, "cus_1");
    // An unknown kid within the interval does not load again: no amplification.
    let stranger = Signer::ed25519("2026-03");
    assert!(matches!(
        v.verify(&stranger.sign(&claims("cus_1")))
            .await
            .unwrap_err(),
        JwtError::UnknownKey(Some(_), "EdDSA")
    ));
    // A key set that cannot be parsed keeps the old keys.
    std::fs::write(file.path(), b"{not json").unwrap();
    assert!(v.reload().await.is_err());
    assert!(v.verify(&new.sign(&claims("cus_1"))).await.is_ok());
}

#[tokio::test]
async fn rs256_through_openssl_keys() {
    let rsa = match Signer::rs256("rsa-1") {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED rs256: no usable openssl command: {e}");
            assert!(
                !idem_test_support::services_required(),
                "openssl is needed: {e}"
            );
            return;
        }
    };
    let file = jwks_file(&[&rsa]);
    let v = verifier(&file).await;
    assert!(v.verify(&rsa.sign(&claims("cus_1"))).await.is_ok());
    let other = Signer::rs256("rsa-1").unwrap();
    assert_eq!(
        v.verify(&other.sign(&claims("cus_1"))).await.unwrap_err(),
        JwtError::Signature
    );
}

#[test]
fn a_malformed_key_set_is_named_and_unusable_keys_skipped() {
    let e = parse_jwks(br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AAAA"}]}"#).unwrap_err();
    assert!(e.contains("32 bytes"), "{e}");
    let e =
        parse_jwks(br#"{"keys":[{"kty":"RSA","alg":"ES256","n":"AQAB","e":"AQAB"}]}"#).unwrap_err();
    assert!(e.contains("alg"), "{e}");
    assert!(parse_jwks(b"{}").is_err());
    let set = parse_jwks(
        br#"{"keys":[{"kty":"oct","k":"AAAA"},{"kty":"EC","crv":"P-384","x":"","y":""}]}"#,
    )
    .unwrap();
    assert!(set.keys.is_empty());
    assert_eq!(set.skipped.len(), 2);
    assert_eq!(set.skipped[1].alg, "kty EC, crv P-384");
}

/// Issue 61 item 7: a key for an algorithm the verifier does not accept (`PS256`,
/// `RS512`, one jsonwebtoken does not know) is skipped and named, and the rest of the
/// set used; a key whose `alg` cannot be its type's is still an error, and a key for
/// encryption is passed over unnamed.
#[test]
fn keys_of_unsupported_algorithms_are_skipped_and_named() {
    let ed = Signer::ed25519("ed-1");
    let rsa = |kid: &str, alg: &str| json!({"kty": "RSA", "kid": kid, "alg": alg, "n": "AQAB", "e": "AQAB"});
    let doc = json!({"keys": [
        rsa("ps", "PS256"), rsa("rs512", "RS512"), rsa("enc", "RSA-OAEP"), rsa("new", "RS999"),
        {"kty": "EC", "crv": "P-384", "kid": "p384", "alg": "ES384", "x": "", "y": ""},
        ed.jwk(),
    ]});
    let set = parse_jwks(doc.to_string().as_bytes()).unwrap();
    assert_eq!(set.keys.len(), 1);
    assert_eq!(set.keys[0].kid.as_deref(), Some("ed-1"));
    let named: Vec<String> = set.skipped.iter().map(ToString::to_string).collect();
    assert_eq!(
        named,
        [
            "kid \"ps\" (PS256)",
            "kid \"rs512\" (RS512)",
            "kid \"new\" (RS999)",
            "kid \"p384\" (ES384)"
        ]
    );
    let e = parse_jwks(json!({"keys": [rsa("x", "ES256")]}).to_string().as_bytes()).unwrap_err();
    assert!(e.contains("says alg ES256"), "{e}");
}

#[test]
fn only_a_bearer_jwt_is_read() {
    let h = |v: &[&str]| {
        let mut m = HeaderMap::new();
        for v in v {
            m.append(http::header::AUTHORIZATION, v.parse().unwrap());
        }
        m
    };
    assert_eq!(bearer_jwt(&h(&["Bearer a.b.c"])), Some("a.b.c"));
    assert_eq!(bearer_jwt(&h(&["bearer   a.b.c"])), Some("a.b.c"));
    assert_eq!(bearer_jwt(&h(&["Bearer opaque-token"])), None);
    assert_eq!(bearer_jwt(&h(&["Basic a.b.c"])), None);
    assert_eq!(bearer_jwt(&h(&["Bearer a.b.c", "Bearer d.e.f"])), None);
    assert_eq!(bearer_jwt(&HeaderMap::new()), None);
}

/// A JWKS that takes `delay` to load; its loads counted, and the most at once.
#[derive(Clone)]
struct Slow {
    doc: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    delay: Duration,
    loads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    now: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Slow {
    fn new(signers: &[&Signer], delay: Duration) -> Slow {
        Slow {
            doc: std::sync::Arc::new(std::sync::Mutex::new(
                jwks(signers).to_string().into_bytes(),
            )),
            delay,
            loads: Default::default(),
            now: Default::default(),
            most: Default::default(),
        }
    }

    fn serve(&self, signers: &[&Signer]) {
        *self.doc.lock().unwrap() = jwks(signers).to_string().into_bytes();
    }

    fn loads(&self) -> usize {
        self.loads.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl JwksSource for Slow {
    fn load(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send + '_>>
    {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            self.loads.fetch_add(1, SeqCst);
            self.most
                .fetch_max(self.now.fetch_add(1, SeqCst) + 1, SeqCst);
            let doc = self.doc.lock().unwrap().clone();
            tokio::time::sleep(self.delay).await;
            self.now.fetch_sub(1, SeqCst);
            Ok(doc)
        })
    }

    fn describe(&self) -> String {
        "slow".into()
    }
}

/// Counts what the key set reports.
#[derive(Default)]
struct Counted(
    std::sync::Mutex<Vec<(LoadCause, bool)>>,
    std::sync::atomic::AtomicUsize,
);

impl KeySetObserver for Counted {
    fn loaded(&self, cause: LoadCause, ok: bool) {
        self.0.lock().unwrap().push((cause, ok));
    }

    fn wait_timed_out(&self) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 61 item 2: concurrent tokens naming unknown kids share one load, and are
/// refused together when it ends; a kid unknown right after is refused without a load;
/// a periodic refresh going on is joined too.
#[tokio::test]
async fn unknown_kids_share_one_load_and_are_refused_when_it_ends() {
    const DELAY: Duration = Duration::from_millis(400);
    let ed = Signer::ed25519("ed-1");
    let source = Slow::new(&[&ed], DELAY);
    let seen = std::sync::Arc::new(Counted::default());
    let v = std::sync::Arc::new(
        JwtVerifier::builder()
            .jwks(source.clone())
            .observer(seen.clone())
            .build()
            .await
            .unwrap(),
    );
    assert_eq!(source.loads(), 1);
    let began = std::time::Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (v, token) = (
                v.clone(),
                Signer::ed25519(&format!("r{i}")).sign(&claims("cus_1")),
            );
            tokio::spawn(async move { v.verify(&token).await })
        })
        .collect();
    for t in tasks {
        assert!(matches!(
            t.await.unwrap(),
            Err(JwtError::UnknownKey(Some(_), "EdDSA"))
        ));
    }
    assert!(began.elapsed() < 2 * DELAY, "{:?}", began.elapsed());
    assert_eq!(source.loads(), 2);
    assert_eq!(source.most.load(std::sync::atomic::Ordering::SeqCst), 1);
    let again = std::time::Instant::now();
    let e = v
        .verify(&Signer::ed25519("r9").sign(&claims("cus_1")))
        .await;
    assert!(matches!(e, Err(JwtError::UnknownKey(..))));
    assert!(again.elapsed() < DELAY);
    assert_eq!(source.loads(), 2);

    // A refresh going on is joined by a token whose key it brings.
    let new = Signer::es256("ec-2");
    source.serve(&[&ed, &new]);
    let refresh = tokio::spawn({
        let v = v.clone();
        async move { v.reload().await }
    });
    while source.loads() < 3 {
        tokio::task::yield_now().await;
    }
    assert!(v.verify(&new.sign(&claims("cus_1"))).await.is_ok());
    assert!(refresh.await.unwrap().is_ok());
    assert_eq!(source.loads(), 3);
    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            (LoadCause::Start, true),
            (LoadCause::UnknownKey, true),
            (LoadCause::Refresh, true)
        ]
    );
}

/// Issue 61 item 2: a request waits for a load at most the bound, then is refused; the
/// load goes on, and the key it brings verifies once it has ended.
#[tokio::test]
async fn a_request_waits_for_keys_at_most_the_bound() {
    let ed = Signer::ed25519("ed-1");
    let source = Slow::new(&[&ed], Duration::from_millis(600));
    let seen = std::sync::Arc::new(Counted::default());
    let v = JwtVerifier::builder()
        .jwks(source.clone())
        .key_wait(Duration::from_millis(50))
        .observer(seen.clone())
        .build()
        .await
        .unwrap();
    let new = Signer::es256("ec-2");
    source.serve(&[&ed, &new]);
    let token = new.sign(&claims("cus_1"));
    assert_eq!(
        v.verify(&token).await.unwrap_err(),
        JwtError::KeysLate(Duration::from_millis(50))
    );
    assert_eq!(seen.1.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The periodic refresh joins the load going on, and returns when it has ended.
    assert_eq!(v.reload().await, Ok(()));
    assert_eq!(source.loads(), 2);
    assert!(v.verify(&token).await.is_ok());
    assert_eq!(source.loads(), 2);
}

/// Issue 61 item 7: a verifier is built from a set with a `PS256` key beside its own,
/// and refused, naming it, from a set of such keys alone.
#[tokio::test]
async fn a_set_with_an_unsupported_key_is_used_without_it() {
    let ed = Signer::ed25519("ed-1");
    let ps = json!({"kty": "RSA", "kid": "ps", "alg": "PS256", "n": "AQAB", "e": "AQAB"});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), json!({"keys": [ps, ed.jwk()]}).to_string()).unwrap();
    let v = JwtVerifier::builder()
        .jwks(JwksFile(file.path().to_owned()))
        .build()
        .await
        .unwrap();
    assert!(v.verify(&ed.sign(&claims("cus_1"))).await.is_ok());
    std::fs::write(file.path(), json!({"keys": [ps]}).to_string()).unwrap();
    let e = JwtVerifier::builder()
        .jwks(JwksFile(file.path().to_owned()))
        .build()
        .await
        .unwrap_err();
    assert!(e.contains("kid \"ps\" (PS256)"), "{e}");
}

/// Issue 61 item 6: the number `1` and the string `"1"` name two tenants; a string
/// claim's tenant is the principal of its name and value, as it always was.
#[tokio::test]
async fn a_number_claim_is_not_the_string_of_its_digits() {
    let ed = Signer::ed25519("ed-1");
    let file = jwks_file(&[&ed]);
    let v = verifier(&file).await;
    let key = idem_core::TenantKey::new(&[9; 32]).unwrap();
    let with = |sub: Value| {
        let mut c = claims("");
        c["sub"] = sub;
        ed.sign(&c)
    };
    let string = v.verify(&with(json!("1"))).await.unwrap();
    let number = v.verify(&with(json!(1))).await.unwrap();
    let float = v.verify(&with(json!(1.0))).await.unwrap();
    assert_ne!(string.tenant(&key), number.tenant(&key));
    assert_eq!(number.tenant(&key), float.tenant(&key));
    let before = Principal::new(Some("https://issuer.test".into()), [("sub", "1")]);
    assert_eq!(string.tenant(&key), before.tenant(&key));
}
