//! Property tests for key parsing and fingerprint normalisation (SPEC S2, S4).

use idem_core::{Fingerprint, FingerprintOptions, Key, MAX_KEY_LEN};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

fn printable_key() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[ -~]{1,255}").expect("regex")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn sf_string_round_trips(raw in printable_key()) {
        let key = Key::new(raw.clone()).unwrap();
        let parsed = Key::parse(key.to_sf_string().as_bytes()).unwrap();
        prop_assert_eq!(parsed.as_str(), raw.as_str());
    }

    #[test]
    fn bare_and_sf_forms_name_the_same_key(raw in "[!#-~][ -~]{0,253}[!-~]|[!#-~]") {
        // The bare form cannot start with `"` (that selects the quoted form) nor carry
        // surrounding whitespace (HTTP trims it), so the generator leaves those out.
        let bare = Key::parse(raw.as_bytes()).unwrap();
        let quoted = Key::parse(bare.to_sf_string().as_bytes()).unwrap();
        prop_assert_eq!(&bare, &quoted);
        prop_assert_eq!(bare.as_str(), raw.as_str());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(key) = Key::parse(&bytes) {
            let s = key.as_str();
            prop_assert!(!s.is_empty() && s.len() <= MAX_KEY_LEN);
            prop_assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        }
    }

    #[test]
    fn arbitrary_quoted_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut v = vec![b'"'];
        v.extend_from_slice(&bytes);
        let _ = Key::parse(&v);
        v.push(b'"');
        let _ = Key::parse(&v);
    }

    #[test]
    fn permuted_json_fingerprints_equal(value in json(), seed in any::<u64>()) {
        let opts = FingerprintOptions::default();
        let compact = serde_json::to_vec(&value).unwrap();
        let mut shuffled = Vec::new();
        write_shuffled(&value, &mut Rng(seed | 1), &mut shuffled);
        prop_assert_eq!(fp(&compact, &opts), fp(&shuffled, &opts),
            "{} vs {}", String::from_utf8_lossy(&compact), String::from_utf8_lossy(&shuffled));
    }

    #[test]
    fn different_values_differ(value in json(), seed in any::<u64>()) {
        let opts = FingerprintOptions::default();
        let mut changed = value.clone();
        prop_assume!(mutate_a_leaf(&mut changed, &mut Rng(seed | 1)));
        prop_assume!(changed != value);
        let a = serde_json::to_vec(&value).unwrap();
        let b = serde_json::to_vec(&changed).unwrap();
        prop_assert_ne!(fp(&a, &opts), fp(&b, &opts),
            "{} vs {}", String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
    }
}

fn fp(body: &[u8], opts: &FingerprintOptions) -> Fingerprint {
    Fingerprint::compute(
        "POST",
        "POST /v1/orders",
        Some("application/json"),
        body,
        opts,
    )
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        (-1e9f64..1e9).prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-zA-Z0-9 \u{e9}\u{1f600}\"\\\\]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A tiny deterministic generator for permutations and whitespace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn ws(&mut self, out: &mut Vec<u8>) {
        for _ in 0..self.next() % 3 {
            out.push([b' ', b'\n', b'\t', b'\r'][(self.next() % 4) as usize]);
        }
    }
}

/// Serialises `v` with object members in a random order and random insignificant
/// whitespace: the same JSON value, spelled differently.
fn write_shuffled(v: &Value, rng: &mut Rng, out: &mut Vec<u8>) {
    rng.ws(out);
    match v {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            for i in (1..entries.len()).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                entries.swap(i, j);
            }
            out.push(b'{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                rng.ws(out);
                out.extend_from_slice(serde_json::to_string(k).unwrap().as_bytes());
                rng.ws(out);
                out.push(b':');
                write_shuffled(val, rng, out);
            }
            rng.ws(out);
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_shuffled(item, rng, out);
            }
            rng.ws(out);
            out.push(b']');
        }
        other => out.extend_from_slice(serde_json::to_string(other).unwrap().as_bytes()),
    }
    rng.ws(out);
}

/// Changes one leaf (or adds a member to an empty container); false if nothing changed.
fn mutate_a_leaf(v: &mut Value, rng: &mut Rng) -> bool {
    match v {
        Value::Object(map) if !map.is_empty() => {
            let n = (rng.next() % map.len() as u64) as usize;
            let key = map.keys().nth(n).cloned().expect("in range");
            mutate_a_leaf(map.get_mut(&key).expect("present"), rng)
        }
        Value::Object(map) => {
            map.insert("added".into(), Value::Null);
            true
        }
        Value::Array(items) if !items.is_empty() => {
            let n = (rng.next() % items.len() as u64) as usize;
            mutate_a_leaf(&mut items[n], rng)
        }
        Value::Array(items) => {
            items.push(Value::Null);
            true
        }
        Value::Null => {
            *v = Value::Bool(false);
            true
        }
        Value::Bool(b) => {
            *b = !*b;
            true
        }
        Value::Number(n) => {
            *v = match n.as_i64() {
                Some(i) => Value::Number(i.wrapping_add(1).into()),
                None => Number::from_f64(n.as_f64().unwrap_or(0.0) + 1.0)
                    .map_or(Value::Null, Value::Number),
            };
            true
        }
        Value::String(s) => {
            s.push('x');
            true
        }
    }
}
