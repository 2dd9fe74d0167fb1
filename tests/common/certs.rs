//! Test certificates made with rcgen: a CA that issues server and client
//! certificates for localhost and 127.0.0.1, for the TLS tests of cetera
//! and of real etcd.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA with its key.
pub struct Ca {
    /// The CA certificate (PEM).
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate and key (PEM) for `common_name`, valid for localhost and
    /// 127.0.0.1, for servers or for clients.
    pub fn issue(&self, common_name: &str, usage: ExtendedKeyUsagePurpose) -> (String, String) {
        self.issue_for(common_name, &["localhost", "127.0.0.1"], &[usage])
    }

    /// A certificate and key (PEM) for `common_name`, valid for `names` (host
    /// names or IP addresses) and the `usages` given.
    pub fn issue_for(
        &self,
        common_name: &str,
        names: &[&str],
        usages: &[ExtendedKeyUsagePurpose],
    ) -> (String, String) {
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}
