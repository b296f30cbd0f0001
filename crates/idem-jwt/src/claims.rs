//! The claims that name a token's tenant, and the names their values give the
//! [`Principal`](idem_tower::Principal): a string as it is, a number in a canonical
//! form under a name of its own, so that no number and string name one tenant.

use serde_json::{Number, Value};

use super::JwtError;

/// Added to a claim's name when its value is a number (`sub` gives `sub\0number`): a
/// claim name as configured has no control character ([`check_claim`]), so a number's
/// name is never a string's, and the string claims' names, and so their tenants, are
/// the ones they always were.
pub const NUMBER_SUFFIX: &str = "\0number";

/// Whether `claim` names a claim (a name, or a JSON pointer other than `/`, without
/// control characters): the check [`JwtVerifierBuilder::build`](crate::JwtVerifierBuilder::build)
/// makes, for a configuration to make before it builds.
pub fn check_claim(claim: &str) -> Result<(), String> {
    if claim.is_empty() || claim == "/" {
        return Err(format!("{claim:?} names no claim"));
    }
    if claim.chars().any(char::is_control) {
        return Err(format!("{claim:?} has a control character"));
    }
    Ok(())
}

/// A claim that names the tenant: a top-level name, or a JSON pointer (`/org/id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Claim(String);

impl Claim {
    pub(super) fn new(name: String) -> Claim {
        Claim(name)
    }

    fn find<'a>(&self, claims: &'a Value) -> Option<&'a Value> {
        if self.0.starts_with('/') {
            claims.pointer(&self.0)
        } else {
            claims.get(&self.0)
        }
    }

    /// Its name and value in `claims`: a non-empty string as it is, a number as
    /// [`canonical`] writes it under the name with [`NUMBER_SUFFIX`].
    pub(super) fn named(&self, claims: &Value) -> Result<(String, String), JwtError> {
        match self.find(claims) {
            Some(Value::String(s)) if !s.is_empty() => Ok((self.0.clone(), s.clone())),
            Some(Value::Number(n)) => Ok((format!("{}{NUMBER_SUFFIX}", self.0), canonical(n))),
            _ => Err(JwtError::Claim(self.0.clone())),
        }
    }
}

/// A number in one form for one value: an integer in decimal digits, exact to 64 bits
/// (`1`, `1.0`, `1e0` and `10E-1` are all `1`); any other as the shortest decimal that
/// reads back as the same double, without an exponent (`0.5`, `1e21` as
/// `1000000000000000000000`); `-0` as `0`.
pub(super) fn canonical(n: &Number) -> String {
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    let f = n.as_f64().unwrap_or(0.0);
    if f == 0.0 {
        return "0".into();
    }
    // Rust writes a double as the shortest decimal that reads back as it, in digits.
    format!("{f}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(json: &str) -> String {
        canonical(&serde_json::from_str::<Number>(json).unwrap())
    }

    #[test]
    fn one_number_one_form() {
        for one in ["1", "1.0", "1e0", "10E-1", "0.1e1"] {
            assert_eq!(canon(one), "1", "{one}");
        }
        assert_eq!(canon("-0"), "0");
        assert_eq!(canon("-0.0"), "0");
        assert_eq!(canon("-7"), "-7");
        assert_eq!(canon("-7.0"), "-7");
        assert_eq!(canon("0.5"), "0.5");
        assert_eq!(canon("18446744073709551615"), "18446744073709551615");
        assert_eq!(canon("1e19"), "10000000000000000000");
        assert_eq!(canon("10000000000000000000"), "10000000000000000000");
        assert_eq!(canon("1e21"), "1000000000000000000000");
        assert_eq!(canon("-9223372036854775808"), "-9223372036854775808");
    }

    #[test]
    fn a_number_and_its_string_have_two_names() {
        let sub = Claim::new("sub".into());
        let number = sub.named(&serde_json::json!({"sub": 1})).unwrap();
        let string = sub.named(&serde_json::json!({"sub": "1"})).unwrap();
        assert_eq!(string, ("sub".to_owned(), "1".to_owned()));
        assert_eq!(number, ("sub\0number".to_owned(), "1".to_owned()));
        assert_eq!(sub.named(&serde_json::json!({"sub": 1.0})).unwrap(), number);
        assert!(check_claim("sub\0number").is_err());
    }
}
