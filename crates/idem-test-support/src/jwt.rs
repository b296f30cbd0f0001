//! Signed JSON Web Tokens for the tests of tenants named by a verified token: keys made
//! at run time (Ed25519 and ECDSA P-256 by ring, RSA by the `openssl` command), their
//! JWKS entries, and compact tokens signed with them.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};

/// A signing key and the `kid` its tokens name.
pub struct Signer {
    kid: String,
    key: Key,
}

enum Key {
    Ed25519(Ed25519KeyPair),
    P256(EcdsaKeyPair),
    Hs256(Vec<u8>),
    /// A PEM private key in a file the `openssl` command signs with.
    Rsa {
        pem: tempfile::NamedTempFile,
        n: Vec<u8>,
    },
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

impl Signer {
    /// A new Ed25519 key (`EdDSA`).
    pub fn ed25519(kid: &str) -> Signer {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("an Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("its own PKCS#8");
        Signer {
            kid: kid.into(),
            key: Key::Ed25519(pair),
        }
    }

    /// A new ECDSA P-256 key (`ES256`).
    pub fn es256(kid: &str) -> Signer {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("its own PKCS#8");
        Signer {
            kid: kid.into(),
            key: Key::P256(pair),
        }
    }

    /// An `HS256` secret.
    pub fn hs256(kid: &str, secret: &[u8]) -> Signer {
        Signer {
            kid: kid.into(),
            key: Key::Hs256(secret.to_vec()),
        }
    }

    /// A new 2048-bit RSA key (`RS256`), made by `openssl genpkey`; `Err` when the
    /// command is not there or fails.
    pub fn rs256(kid: &str) -> Result<Signer, String> {
        let pem = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        let run = |args: &[&str]| -> Result<Vec<u8>, String> {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .map_err(|e| format!("openssl: {e}"))?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).into_owned());
            }
            Ok(out.stdout)
        };
        let path = pem.path().to_str().ok_or("a temporary path")?.to_owned();
        run(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            &path,
        ])?;
        let modulus = String::from_utf8(run(&["rsa", "-in", &path, "-noout", "-modulus"])?)
            .map_err(|e| e.to_string())?;
        let hex = modulus
            .trim()
            .strip_prefix("Modulus=")
            .ok_or("no modulus printed")?;
        let n = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| e.to_string()))
            .collect::<Result<Vec<u8>, String>>()?;
        Ok(Signer {
            kid: kid.into(),
            key: Key::Rsa { pem, n },
        })
    }

    /// The `alg` its tokens carry.
    pub fn alg(&self) -> &'static str {
        match self.key {
            Key::Ed25519(_) => "EdDSA",
            Key::P256(_) => "ES256",
            Key::Hs256(_) => "HS256",
            Key::Rsa { .. } => "RS256",
        }
    }

    /// Its public key as a JWKS entry (`Null` for an HS256 secret, which has none).
    pub fn jwk(&self) -> Value {
        match &self.key {
            Key::Ed25519(pair) => json!({
                "kty": "OKP", "crv": "Ed25519", "use": "sig", "kid": self.kid,
                "x": b64(pair.public_key().as_ref()),
            }),
            Key::P256(pair) => {
                let point = pair.public_key().as_ref();
                json!({
                    "kty": "EC", "crv": "P-256", "alg": "ES256", "kid": self.kid,
                    "x": b64(&point[1..33]), "y": b64(&point[33..65]),
                })
            }
            Key::Rsa { n, .. } => json!({
                "kty": "RSA", "alg": "RS256", "kid": self.kid,
                "n": b64(n), "e": b64(&[1, 0, 1]),
            }),
            Key::Hs256(_) => Value::Null,
        }
    }

    /// A compact token of `claims`, its header naming this key's `alg` and `kid`.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(
            &json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }

    /// A compact token with `header` as given, signed by this key.
    pub fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
        let message = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = match &self.key {
            Key::Ed25519(pair) => pair.sign(message.as_bytes()).as_ref().to_vec(),
            Key::P256(pair) => pair
                .sign(&SystemRandom::new(), message.as_bytes())
                .expect("an ES256 signature")
                .as_ref()
                .to_vec(),
            Key::Hs256(secret) => {
                let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
                ring::hmac::sign(&key, message.as_bytes()).as_ref().to_vec()
            }
            Key::Rsa { pem, .. } => {
                let mut child = std::process::Command::new("openssl")
                    .args(["dgst", "-sha256", "-sign"])
                    .arg(pem.path())
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("openssl runs");
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(message.as_bytes())
                    .unwrap();
                let out = child.wait_with_output().unwrap();
                assert!(out.status.success(), "openssl dgst -sign failed");
                out.stdout
            }
        };
        format!("{message}.{}", b64(&sig))
    }
}

/// A JWKS document of `signers`' public keys.
pub fn jwks(signers: &[&Signer]) -> Value {
    json!({ "keys": signers.iter().map(|s| s.jwk()).filter(|k| !k.is_null()).collect::<Vec<_>>() })
}

/// Seconds since the Unix epoch, `offset` seconds from now.
pub fn epoch(offset: i64) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    now + offset
}
