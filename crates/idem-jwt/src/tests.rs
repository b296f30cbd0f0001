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
            ("/org/id".to_owned(), "42".to_owned()),
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
    let keys = parse_jwks(
        br#"{"keys":[{"kty":"oct","k":"AAAA"},{"kty":"EC","crv":"P-384","x":"","y":""}]}"#,
    )
    .unwrap();
    assert!(keys.is_empty());
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
