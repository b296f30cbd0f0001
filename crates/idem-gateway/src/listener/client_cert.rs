//! The names in a client certificate that the TLS handshake verified
//! (`--tls-client-ca`), for `--tenant-from cert`: its subject alternative names (URI,
//! DNS, e-mail) and its subject, read from the certificate's DER (RFC 5280 §4.1).
//!
//! Only a certificate rustls has already verified against the configured CA is read,
//! so the reader expects well-formed DER and gives up (naming nothing) on anything
//! else: a certificate it cannot read names no tenant.

/// The names of one client certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClientNames {
    /// The subject's DER (a `Name`), as issued.
    pub(crate) subject: Vec<u8>,
    /// `uniformResourceIdentifier` SANs (a SPIFFE id, say).
    pub(crate) uris: Vec<String>,
    /// `dNSName` SANs.
    pub(crate) dns: Vec<String>,
    /// `rfc822Name` SANs.
    pub(crate) emails: Vec<String>,
}

/// Which name of a client certificate names its tenant (`tenant_cert_name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertName {
    /// The first URI SAN.
    Uri,
    /// The first DNS SAN.
    Dns,
    /// The first e-mail SAN.
    Email,
    /// The whole subject name.
    Subject,
}

impl CertName {
    /// As the setting spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CertName::Uri => "uri",
            CertName::Dns => "dns",
            CertName::Email => "email",
            CertName::Subject => "subject",
        }
    }

    /// Parses the setting.
    pub(crate) fn parse(s: &str) -> Result<CertName, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "uri" => CertName::Uri,
            "dns" => CertName::Dns,
            "email" => CertName::Email,
            "subject" => CertName::Subject,
            other => return Err(format!("{other:?} is not uri, dns, email or subject")),
        })
    }

    /// The principal `names` give under this choice, or `None` when the certificate
    /// has no such name.
    pub(crate) fn principal(self, names: &ClientNames) -> Option<idem_tower::Principal> {
        let value = match self {
            CertName::Uri => names.uris.first()?.clone(),
            CertName::Dns => names.dns.first()?.clone(),
            CertName::Email => names.emails.first()?.clone(),
            CertName::Subject if names.subject.is_empty() => return None,
            CertName::Subject => names.subject.iter().map(|b| format!("{b:02x}")).collect(),
        };
        Some(idem_tower::Principal::new(
            Some("client-certificate".to_owned()),
            [(self.as_str(), value)],
        ))
    }
}

/// One DER element: its tag, and its contents.
struct Tlv<'a> {
    tag: u8,
    body: &'a [u8],
}

/// Reads the element at the start of `der`; the element and what follows it.
fn read(der: &[u8]) -> Option<(Tlv<'_>, &[u8])> {
    let (&tag, rest) = der.split_first()?;
    // High tag numbers (0x1f) never occur in a certificate's structure.
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((
        Tlv {
            tag,
            body: &rest[..len],
        },
        &rest[len..],
    ))
}

/// The elements of a constructed element's contents.
fn children(mut body: &[u8]) -> Option<Vec<Tlv<'_>>> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let (tlv, rest) = read(body)?;
        out.push(tlv);
        body = rest;
    }
    Some(out)
}

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const OCTET_STRING: u8 = 0x04;
/// `[3] EXPLICIT` around the extensions.
const EXTENSIONS: u8 = 0xa3;
/// `id-ce-subjectAltName`, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// The names in the DER certificate `cert`, or `None` when it does not read as one.
pub(crate) fn names(cert: &[u8]) -> Option<ClientNames> {
    let (certificate, _) = read(cert)?;
    if certificate.tag != SEQUENCE {
        return None;
    }
    let (tbs, _) = read(certificate.body)?;
    if tbs.tag != SEQUENCE {
        return None;
    }
    let fields = children(tbs.body)?;
    // version [0] (optional), serialNumber, signature, issuer, validity, subject, ...
    let skip = usize::from(fields.first()?.tag == 0xa0);
    let subject = fields.get(skip + 4)?;
    if subject.tag != SEQUENCE {
        return None;
    }
    let mut names = ClientNames {
        subject: subject.body.to_vec(),
        ..ClientNames::default()
    };
    let Some(extensions) = fields.iter().find(|f| f.tag == EXTENSIONS) else {
        return Some(names);
    };
    let (list, _) = read(extensions.body)?;
    for ext in children(list.body)? {
        let parts = children(ext.body)?;
        let (Some(oid), Some(value)) = (parts.first(), parts.last()) else {
            return None;
        };
        if oid.tag != OID || oid.body != SUBJECT_ALT_NAME {
            continue;
        }
        if value.tag != OCTET_STRING || parts.iter().skip(1).rev().skip(1).any(|p| p.tag != BOOLEAN)
        {
            return None;
        }
        let (general_names, _) = read(value.body)?;
        for name in children(general_names.body)? {
            let text = || std::str::from_utf8(name.body).ok().map(str::to_owned);
            match name.tag {
                0x81 => names.emails.extend(text()),
                0x82 => names.dns.extend(text()),
                0x86 => names.uris.extend(text()),
                _ => {}
            }
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(sans: Vec<rcgen::SanType>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "payments-worker");
        params.subject_alt_names = sans;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_sans_and_the_subject_are_read() {
        let der = cert(vec![
            rcgen::SanType::URI("spiffe://example.org/ns/pay/sa/worker".try_into().unwrap()),
            rcgen::SanType::DnsName("worker.pay.internal".try_into().unwrap()),
            rcgen::SanType::Rfc822Name("ops@example.org".try_into().unwrap()),
            rcgen::SanType::IpAddress("10.0.0.7".parse().unwrap()),
        ]);
        let n = names(&der).expect("a certificate");
        assert_eq!(n.uris, ["spiffe://example.org/ns/pay/sa/worker"]);
        assert_eq!(n.dns, ["worker.pay.internal"]);
        assert_eq!(n.emails, ["ops@example.org"]);
        // The subject's DER holds its common name.
        assert!(
            n.subject
                .windows(b"payments-worker".len())
                .any(|w| w == b"payments-worker")
        );
        let p = CertName::Uri.principal(&n).unwrap();
        assert_eq!(p.names()[0].1, "spiffe://example.org/ns/pay/sa/worker");
        assert!(CertName::Subject.principal(&n).is_some());
    }

    #[test]
    fn a_certificate_without_the_name_names_nothing_and_garbage_is_refused() {
        let n = names(&cert(vec![])).unwrap();
        assert!(n.uris.is_empty() && n.dns.is_empty());
        assert_eq!(CertName::Uri.principal(&n), None);
        assert!(names(b"").is_none());
        assert!(names(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        let mut der = cert(vec![]);
        der.truncate(der.len() / 2);
        assert!(names(&der).is_none());
        assert!(CertName::parse("URI").is_ok());
        assert!(CertName::parse("cn").is_err());
    }
}
