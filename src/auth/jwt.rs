//! etcd's JWT tokens (`--auth-token jwt,priv-key=...,pub-key=...,sign-method=...,ttl=...`).
//!
//! A token carries its user, the auth revision it was issued at and its
//! expiry (etcd's claims `username`, `revision`, `exp`), signed with keys
//! read from files. Nothing about it lives on the instance that issued it:
//! every instance (and etcd) given the same keys accepts it, before and
//! after a restart. An auth change (a new revision) makes the tokens issued
//! before it too old for key access, as in etcd (`auth: revision in header
//! is old`), and clients authenticate again.
//!
//! Keys are read as etcd's jwt-go reads them: RSA private keys in PKCS#1 or
//! PKCS#8, EC private keys in PKCS#8 (SEC1 `EC PRIVATE KEY` files are
//! refused: convert with `openssl pkcs8 -topk8 -nocrypt`), public keys as
//! SubjectPublicKeyInfo or a certificate, HMAC secrets as the private key
//! file's bytes; an empty file is no key. With a private key the public half
//! is derived from it (a `pub-key` given too must be that half, as etcd
//! checks); with only a public key tokens are verified but none can be
//! issued. The options are read before the datastore is opened, so a bad one
//! stops the server with nothing created.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};

/// etcd's DefaultTTL for JWT tokens.
const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);

/// Why `--auth-token` cannot be used, with etcd's texts where etcd has one.
#[derive(Debug, thiserror::Error)]
pub enum TokenOptionsError {
    /// A malformed option list, or a bad ttl or unreadable key file.
    #[error("auth: invalid auth options")]
    InvalidOptions,
    /// `sign-method` missing or not one of jwt-go's.
    #[error("auth: invalid auth signature method")]
    InvalidMethod,
    /// The method needs a key that was not given.
    #[error("auth: missing key data")]
    MissingKey,
    /// jwt-go's `none`, which etcd refuses.
    #[error("unsupported signing method: *jwt.signingMethodNone")]
    UnsupportedMethod,
    /// A method etcd takes that cetera's JWT crate cannot do.
    #[error("sign-method {0} is not supported by cetera (use ES256, ES384, RS*, PS* or HS*)")]
    NotSupportedHere(String),
    /// Both keys given, and the public one is not the private one's.
    #[error("auth: public and private keys don't match")]
    KeyMismatch,
    /// A key file that does not hold a key of the method's kind.
    #[error("{0}")]
    BadKey(String),
}

/// etcd's JWT claims, in the order jwt-go writes them (a Go map, sorted).
#[derive(Serialize)]
struct Claims<'a> {
    exp: u64,
    revision: u64,
    username: &'a str,
}

/// The claims as read back: jwt-go decodes numbers as float64, and etcd
/// reads `revision` from one.
#[derive(Deserialize)]
struct ParsedClaims {
    username: String,
    revision: f64,
}

/// The user and auth revision a valid token names.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    /// etcd's `username` claim.
    pub username: String,
    /// etcd's `revision` claim: the auth revision when it was issued.
    pub revision: u64,
}

/// A JWT token provider: the method, the keys and the lifetime.
pub struct JwtTokens {
    algorithm: Algorithm,
    /// `None`: only a public key was given (etcd's verifyOnly).
    signing: Option<EncodingKey>,
    verifying: DecodingKey,
    ttl: Duration,
}

impl std::fmt::Debug for JwtTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtTokens")
            .field("algorithm", &self.algorithm)
            .field("verify_only", &self.signing.is_none())
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// etcd's decomposeOpts: `type,key=value,...`, each key at most once.
pub fn decompose(text: &str) -> Result<(String, BTreeMap<String, String>), TokenOptionsError> {
    let mut parts = text.split(',');
    let kind = parts.next().unwrap_or_default().to_string();
    let mut options = BTreeMap::new();
    for part in parts {
        let pair: Vec<&str> = part.split('=').collect();
        let [key, value] = pair[..] else {
            return Err(TokenOptionsError::InvalidOptions);
        };
        if options.insert(key.to_string(), value.to_string()).is_some() {
            return Err(TokenOptionsError::InvalidOptions);
        }
    }
    Ok((kind, options))
}

impl JwtTokens {
    /// etcd's newTokenProviderJWT from the options after `jwt,`.
    pub fn new(options: &BTreeMap<String, String>) -> Result<Self, TokenOptionsError> {
        let unknown: Vec<&str> = options
            .keys()
            .map(String::as_str)
            .filter(|key| !["sign-method", "pub-key", "priv-key", "ttl"].contains(key))
            .collect();
        if !unknown.is_empty() {
            tracing::warn!(keys = ?unknown, "unknown JWT options");
        }
        let option = |name: &str| options.get(name).filter(|v| !v.is_empty());
        let ttl = match option("ttl") {
            Some(text) => {
                crate::go_duration::parse(text).map_err(|_| TokenOptionsError::InvalidOptions)?
            }
            None => DEFAULT_TTL,
        };
        let read = |name: &str| -> Result<Option<Vec<u8>>, TokenOptionsError> {
            let Some(path) = option(name) else {
                return Ok(None);
            };
            let bytes = std::fs::read(path).map_err(|error| {
                tracing::error!(%path, %error, "problem loading JWT options");
                TokenOptionsError::InvalidOptions
            })?;
            // An empty file is no key, as in etcd (`auth: missing key data`).
            Ok(Some(bytes).filter(|bytes| !bytes.is_empty()))
        };
        let public = read("pub-key")?;
        let private = read("priv-key")?;
        let method = option("sign-method").map(String::as_str).unwrap_or("");
        let algorithm = match method {
            "HS256" => Algorithm::HS256,
            "HS384" => Algorithm::HS384,
            "HS512" => Algorithm::HS512,
            "RS256" => Algorithm::RS256,
            "RS384" => Algorithm::RS384,
            "RS512" => Algorithm::RS512,
            "PS256" => Algorithm::PS256,
            "PS384" => Algorithm::PS384,
            "PS512" => Algorithm::PS512,
            "ES256" => Algorithm::ES256,
            "ES384" => Algorithm::ES384,
            "ES512" => return Err(TokenOptionsError::NotSupportedHere(method.to_string())),
            "none" => return Err(TokenOptionsError::UnsupportedMethod),
            _ => return Err(TokenOptionsError::InvalidMethod),
        };
        let (signing, verifying) = match algorithm {
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
                let secret = private.ok_or(TokenOptionsError::MissingKey)?;
                (
                    Some(EncodingKey::from_secret(&secret)),
                    DecodingKey::from_secret(&secret),
                )
            }
            Algorithm::ES256 | Algorithm::ES384 => ec_keys(algorithm, private, public)?,
            _ => rsa_keys(private, public)?,
        };
        Ok(JwtTokens {
            algorithm,
            signing,
            verifying,
            ttl,
        })
    }

    /// A signed token for `username` at auth revision `revision`; `None`
    /// with only a public key (etcd's ErrVerifyOnly).
    pub fn assign(&self, username: &str, revision: u64) -> Option<Result<String, String>> {
        let key = self.signing.as_ref()?;
        let exp = (SystemTime::now() + self.ttl)
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = Claims {
            exp,
            revision,
            username,
        };
        Some(
            jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key)
                .map_err(|e| e.to_string()),
        )
    }

    /// The user and revision of a valid token: signed with this method and
    /// key, not expired (jwt-go: `exp` optional, no leeway).
    pub fn info(&self, token: &str) -> Option<TokenInfo> {
        let mut validation = Validation::new(self.algorithm);
        validation.leeway = 0;
        validation.required_spec_claims.clear();
        validation.validate_nbf = true;
        match jsonwebtoken::decode::<ParsedClaims>(token, &self.verifying, &validation) {
            Ok(data) => Some(TokenInfo {
                username: data.claims.username,
                revision: data.claims.revision as u64,
            }),
            Err(error) => {
                tracing::warn!(%error, "failed to parse a JWT token");
                None
            }
        }
    }
}

/// jwt-go's errors for key files, which etcd prints as they are (as
/// golang-jwt v5 spells them, in etcd 3.6 on; 3.5's jwt-go capitalises
/// them).
const NOT_PEM: &str = "invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key";
const NOT_RSA_PRIVATE: &str = "key is not a valid RSA private key";
const NOT_RSA_PUBLIC: &str = "key is not a valid RSA public key";
const NOT_EC_PRIVATE: &str = "key is not a valid ECDSA private key";
const NOT_EC_PUBLIC: &str = "key is not a valid ECDSA public key";

fn bad_key(what: &str, error: impl std::fmt::Display) -> TokenOptionsError {
    TokenOptionsError::BadKey(format!("{what} ({error})"))
}

/// The first PEM block of a key file (text around it is skipped, as Go's
/// pem.Decode skips it); jwt-go's error when there is none.
fn pem_block(pem: &[u8]) -> Result<x509_parser::pem::Pem, TokenOptionsError> {
    match x509_parser::pem::Pem::iter_from_buffer(pem).next() {
        Some(Ok(block)) => Ok(block),
        _ => Err(TokenOptionsError::BadKey(NOT_PEM.to_string())),
    }
}

/// The private key of a key file that has a PEM block.
fn private_der(pem: &[u8], not_valid: &str) -> Result<PrivateKeyDer<'static>, TokenOptionsError> {
    pem_block(pem)?;
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| bad_key(not_valid, e))
}

/// The public key bits of a public key file (SubjectPublicKeyInfo, a
/// certificate, or for RSA a PKCS#1 `RSA PUBLIC KEY`), if the key is of
/// `kind` (an algorithm OID of the SubjectPublicKeyInfo). RSA's bits are its
/// PKCS#1 DER and EC's the point, as ring gives a private key's public half.
fn public_bits(
    pem: &[u8],
    kind: &x509_parser::oid_registry::Oid<'static>,
    not_valid: &str,
) -> Result<Vec<u8>, TokenOptionsError> {
    use x509_parser::prelude::FromDer;
    use x509_parser::x509::SubjectPublicKeyInfo;
    let block = pem_block(pem)?;
    let rsa = x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION;
    if block.label == "RSA PUBLIC KEY" && *kind == rsa {
        return Ok(block.contents);
    }
    let info = match SubjectPublicKeyInfo::from_der(&block.contents) {
        Ok((_, info)) => info,
        Err(_) => match x509_parser::parse_x509_certificate(&block.contents) {
            Ok((_, certificate)) => certificate.tbs_certificate.subject_pki,
            Err(e) => return Err(bad_key(not_valid, e)),
        },
    };
    if info.algorithm.algorithm != *kind {
        return Err(TokenOptionsError::BadKey(not_valid.to_string()));
    }
    Ok(info.subject_public_key.data.to_vec())
}

/// etcd's check when both keys are given: the public key must be the
/// private key's.
fn matching(derived: &[u8], given: Option<&[u8]>) -> Result<(), TokenOptionsError> {
    match given {
        Some(given) if given != derived => Err(TokenOptionsError::KeyMismatch),
        _ => Ok(()),
    }
}

/// RSA keys: sign with the private key, verify with its public half (or
/// the public key alone).
fn rsa_keys(
    private: Option<Vec<u8>>,
    public: Option<Vec<u8>>,
) -> Result<(Option<EncodingKey>, DecodingKey), TokenOptionsError> {
    // The private key is read first, then the public one, as etcd reads
    // them (so a file bad in both ways gets etcd's error).
    let rsa = x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION;
    let public_of = |public: Option<Vec<u8>>| {
        public
            .map(|pem| public_bits(&pem, &rsa, NOT_RSA_PUBLIC))
            .transpose()
    };
    if let Some(pem) = private {
        let der = private_der(&pem, NOT_RSA_PRIVATE)?;
        let pair = match &der {
            PrivateKeyDer::Pkcs1(key) => {
                ring::signature::RsaKeyPair::from_der(key.secret_pkcs1_der())
            }
            PrivateKeyDer::Pkcs8(key) => {
                ring::signature::RsaKeyPair::from_pkcs8(key.secret_pkcs8_der())
            }
            _ => return Err(TokenOptionsError::BadKey(NOT_RSA_PRIVATE.to_string())),
        }
        .map_err(|e| bad_key(NOT_RSA_PRIVATE, e))?;
        let signing = EncodingKey::from_rsa_pem(&pem).map_err(|e| bad_key(NOT_RSA_PRIVATE, e))?;
        use ring::signature::KeyPair;
        let derived = pair.public_key().as_ref();
        matching(derived, public_of(public)?.as_deref())?;
        return Ok((Some(signing), DecodingKey::from_rsa_der(derived)));
    }
    let public = public_of(public)?.ok_or(TokenOptionsError::MissingKey)?;
    Ok((None, DecodingKey::from_rsa_der(&public)))
}

/// ECDSA keys, as rsa_keys; a private key must be of the method's curve.
fn ec_keys(
    algorithm: Algorithm,
    private: Option<Vec<u8>>,
    public: Option<Vec<u8>>,
) -> Result<(Option<EncodingKey>, DecodingKey), TokenOptionsError> {
    let ec = x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY;
    let public_of = |public: Option<Vec<u8>>| {
        public
            .map(|pem| public_bits(&pem, &ec, NOT_EC_PUBLIC))
            .transpose()
    };
    if let Some(pem) = private {
        let der = private_der(&pem, NOT_EC_PRIVATE)?;
        let PrivateKeyDer::Pkcs8(pkcs8) = &der else {
            return Err(bad_key(
                NOT_EC_PRIVATE,
                "only PKCS#8 (BEGIN PRIVATE KEY) is read; convert with `openssl pkcs8 -topk8 -nocrypt`",
            ));
        };
        let ring_algorithm = if algorithm == Algorithm::ES256 {
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING
        } else {
            &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING
        };
        let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
            ring_algorithm,
            pkcs8.secret_pkcs8_der(),
            &ring::rand::SystemRandom::new(),
        )
        .map_err(|e| bad_key(&format!("{NOT_EC_PRIVATE} of the sign method's curve"), e))?;
        use ring::signature::KeyPair;
        let derived = pair.public_key().as_ref();
        matching(derived, public_of(public)?.as_deref())?;
        let signing = EncodingKey::from_ec_der(pkcs8.secret_pkcs8_der());
        return Ok((Some(signing), DecodingKey::from_ec_der(derived)));
    }
    let public = public_of(public)?.ok_or(TokenOptionsError::MissingKey)?;
    Ok((None, DecodingKey::from_ec_der(&public)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, text: &[u8]) -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_are_decomposed_as_etcd_does() {
        let (kind, opts) = decompose("jwt,sign-method=RS256,ttl=10m").unwrap();
        assert_eq!(kind, "jwt");
        assert_eq!(opts["sign-method"], "RS256");
        assert_eq!(opts["ttl"], "10m");
        assert!(decompose("jwt,sign-method").is_err());
        assert!(decompose("jwt,a=1,a=2").is_err());
        assert!(decompose("jwt,a=b=c").is_err());
        assert_eq!(decompose("simple").unwrap().1.len(), 0);
    }

    #[test]
    fn hmac_tokens_round_trip_and_carry_etcds_claims() {
        let dir = tempfile::tempdir().unwrap();
        let key = write(&dir, "secret", b"a shared secret");
        let tokens = JwtTokens::new(&options(&[
            ("sign-method", "HS256"),
            ("priv-key", &key),
            ("ttl", "1h"),
        ]))
        .unwrap();
        let token = tokens.assign("alice", 7).unwrap().unwrap();
        let mut unchecked = Validation::new(Algorithm::HS256);
        unchecked.insecure_disable_signature_validation();
        let claims = jsonwebtoken::decode::<serde_json::Value>(
            &token,
            &DecodingKey::from_secret(b""),
            &unchecked,
        )
        .unwrap()
        .claims;
        assert_eq!(claims["username"], "alice");
        assert_eq!(claims["revision"], 7);
        assert!(claims["exp"].as_u64().unwrap() > 0);
        assert_eq!(
            tokens.info(&token),
            Some(TokenInfo {
                username: "alice".into(),
                revision: 7
            })
        );
        // Another key, another method, or a damaged token: refused.
        let other = write(&dir, "other", b"another secret");
        let stranger =
            JwtTokens::new(&options(&[("sign-method", "HS256"), ("priv-key", &other)])).unwrap();
        assert_eq!(stranger.info(&token), None);
        let hs512 =
            JwtTokens::new(&options(&[("sign-method", "HS512"), ("priv-key", &key)])).unwrap();
        assert_eq!(hs512.info(&token), None);
        assert_eq!(tokens.info(&format!("{token}x")), None);
    }

    #[test]
    fn expired_tokens_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = write(&dir, "secret", b"k");
        let tokens = JwtTokens::new(&options(&[
            ("sign-method", "HS256"),
            ("priv-key", &key),
            ("ttl", "0"),
        ]))
        .unwrap();
        let token = tokens.assign("bob", 2).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(tokens.info(&token), None);
    }

    #[test]
    fn bad_options_get_etcds_errors() {
        let dir = tempfile::tempdir().unwrap();
        let key = write(&dir, "secret", b"k");
        let error =
            |pairs: &[(&str, &str)]| JwtTokens::new(&options(pairs)).unwrap_err().to_string();
        assert_eq!(
            error(&[("priv-key", &key)]),
            "auth: invalid auth signature method"
        );
        assert_eq!(
            error(&[("sign-method", "XY256")]),
            "auth: invalid auth signature method"
        );
        assert_eq!(error(&[("sign-method", "HS256")]), "auth: missing key data");
        assert_eq!(error(&[("sign-method", "RS256")]), "auth: missing key data");
        assert_eq!(
            error(&[("sign-method", "HS256"), ("priv-key", "/no/such/file")]),
            "auth: invalid auth options"
        );
        assert_eq!(
            error(&[("sign-method", "HS256"), ("priv-key", &key), ("ttl", "5")]),
            "auth: invalid auth options"
        );
        assert_eq!(
            error(&[("sign-method", "RS256"), ("priv-key", &key)]),
            NOT_PEM
        );
        // An empty key file is no key, as in etcd.
        let empty = write(&dir, "empty", b"");
        for method in ["HS256", "RS256", "ES256"] {
            assert_eq!(
                error(&[
                    ("sign-method", method),
                    ("priv-key", &empty),
                    ("pub-key", &empty)
                ]),
                "auth: missing key data",
                "{method}"
            );
        }
    }
}
