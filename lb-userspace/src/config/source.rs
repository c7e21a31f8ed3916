//! The `source:` section: where the VIPs come from. Without it, the
//! file's `vips:`; with `source: {etcd: ...}`, a tier's desired state in
//! etcd ([`crate::tier`]), while every box-specific setting (interfaces,
//! tunnel sources, peers, sizes) stays in the file. Types and rules only.
//!
//! ```yaml
//! source:
//!   etcd:
//!     endpoints: [https://10.0.0.1:2379, https://10.0.0.2:2379]
//!     prefix: /lb/tier1
//!     name: lb1            # this balancer in the tier; default: the host name
//!     tls: { ca: /etc/lb/etcd-ca.pem, cert: /etc/lb/lb1.pem, key: /etc/lb/lb1.key }
//! ```

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    duration,
    error::{ConfigError, excerpt, prefixed, problem},
};

/// `source:`: one source of VIPs other than the file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSource>,
}

/// A tier's desired state in etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSource {
    /// Client URLs of the cluster's members (`http://` or, with `tls`,
    /// `https://`).
    pub endpoints: Vec<String>,
    /// The tier's keys live under it: `<prefix>/desired` (the VIPs),
    /// `<prefix>/balancers/<name>` (each balancer's report).
    pub prefix: String,
    /// This balancer's name in the tier; the host name when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<EtcdTls>,
    /// etcd's own authentication: a user and its password, read from a
    /// private file (with `tls`, or the password crosses the network in
    /// clear).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<EtcdAuth>,
    /// How long a connection or a request may take.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// The lease of this balancer's report: it disappears this long after
    /// the balancer stops renewing it (dead, or cut off from etcd).
    #[serde(default = "default_lease", with = "duration")]
    pub lease: Duration,
}

/// TLS to etcd: the cluster's CA, and this balancer's client certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdTls {
    pub ca: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The client key: private to its owner (mode 0600), like a BGP
    /// `password_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// The name the members' certificates carry, when the endpoints are
    /// addresses that do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// A user of etcd's own authentication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdAuth {
    pub user: String,
    /// The password, alone in a file only its owner may read (mode 0600;
    /// a trailing newline is not part of it).
    pub password_file: PathBuf,
}

impl EtcdAuth {
    /// The password, read from its file.
    pub fn password(&self) -> Result<String, String> {
        private_file(&self.password_file)?;
        let text = std::fs::read_to_string(&self.password_file)
            .map_err(|e| format!("{}: {e}", self.password_file.display()))?;
        let password = text.strip_suffix('\n').unwrap_or(&text);
        if password.is_empty() || password.len() > 1024 || password.contains('\n') {
            return Err(format!(
                "{}: one line of 1-1024 bytes",
                self.password_file.display()
            ));
        }
        Ok(password.to_string())
    }
}

/// The largest desired state a balancer takes (etcd's own default limit
/// of a request is 1.5 MiB, `--max-request-bytes`).
pub const MAX_DESIRED_BYTES: usize = 1 << 20;
/// Endpoints a source may list.
const MAX_ENDPOINTS: usize = 16;
/// Longest prefix (keys below it are a few dozen bytes longer).
const MAX_PREFIX: usize = 128;

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_lease() -> Duration {
    Duration::from_secs(10)
}

impl SourceConfig {
    pub fn validate(&self) -> Vec<ConfigError> {
        match &self.etcd {
            Some(etcd) => prefixed("etcd", etcd.validate()),
            None => vec![problem(
                "",
                "name a source of VIPs (`etcd`), or leave `source` out",
            )],
        }
    }
}

/// A balancer's name in a tier: 1-63 letters, digits, `.`, `-` and `_`
/// (it is part of an etcd key and a column of `lbctl tier status`).
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

impl EtcdSource {
    pub fn validate(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if self.endpoints.is_empty() || self.endpoints.len() > MAX_ENDPOINTS {
            errors.push(problem(
                "endpoints",
                format!("list 1-{MAX_ENDPOINTS} of the cluster's client URLs"),
            ));
        }
        let tls = self.tls.is_some();
        for (i, url) in self.endpoints.iter().enumerate() {
            if let Err(e) = check_endpoint(url, tls) {
                errors.push(problem(format!("endpoints[{i}]"), e));
            }
        }
        let p = &self.prefix;
        if !p.starts_with('/')
            || p.len() < 2
            || p.len() > MAX_PREFIX
            || p.ends_with('/')
            || p.contains("//")
            || !p.chars().all(|c| c.is_ascii_graphic())
        {
            errors.push(problem(
                "prefix",
                format!(
                    "{} must be a key path such as /lb/tier1: a leading `/`, no trailing one, at most {MAX_PREFIX} printable characters",
                    excerpt(p)
                ),
            ));
        }
        if let Some(name) = &self.name
            && !valid_name(name)
        {
            errors.push(problem(
                "name",
                format!(
                    "{} must be 1-63 letters, digits, `.`, `-` and `_`",
                    excerpt(name)
                ),
            ));
        }
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            errors.push(problem("tls", "`cert` and `key` go together"));
        }
        if let Some(auth) = &self.auth
            && (auth.user.is_empty()
                || auth.user.len() > 128
                || !auth.user.chars().all(|c| c.is_ascii_graphic()))
        {
            errors.push(problem("auth.user", "1-128 printable characters, no space"));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&self.timeout) {
            errors.push(problem("timeout", "must be between 100ms and 60s"));
        }
        if !(Duration::from_secs(2)..=Duration::from_secs(300)).contains(&self.lease) {
            errors.push(problem("lease", "must be between 2s and 5m"));
        } else if self.lease <= self.timeout {
            // One renewal waits up to `timeout`: a lease no longer than
            // that expires while a live balancer renews it.
            errors.push(problem("lease", "must be longer than timeout"));
        }
        errors
    }

    /// Checks what lives outside the configuration: the CA and the
    /// certificate readable, the key readable and private. `lbd check`
    /// and the start call it.
    pub fn check_files(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if let Some(auth) = &self.auth
            && let Err(e) = auth.password()
        {
            errors.push(problem("auth.password_file", e));
        }
        let Some(tls) = &self.tls else {
            return prefixed("source.etcd", errors);
        };
        for (field, path) in [("ca", Some(&tls.ca)), ("cert", tls.cert.as_ref())] {
            if let Some(path) = path
                && let Err(e) = std::fs::File::open(path)
            {
                errors.push(problem(
                    format!("tls.{field}"),
                    format!("{}: {e}", path.display()),
                ));
            }
        }
        if let Some(key) = &tls.key
            && let Err(e) = private_file(key)
        {
            errors.push(problem("tls.key", e));
        }
        prefixed("source.etcd", errors)
    }
}

/// A URL of the form `scheme://host:port`, with `https` exactly when TLS
/// is configured.
fn check_endpoint(url: &str, tls: bool) -> Result<(), String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        format!(
            "{} is not a URL such as https://10.0.0.1:2379",
            excerpt(url)
        )
    })?;
    match (scheme, tls) {
        ("https", true) | ("http", false) => {}
        ("https", false) => return Err(format!("{} needs `tls` (the cluster's CA)", excerpt(url))),
        ("http", true) => {
            return Err(format!(
                "{} is plain HTTP while `tls` is set: use https:// for every endpoint",
                excerpt(url)
            ));
        }
        _ => return Err(format!("{}: the scheme is http or https", excerpt(url))),
    }
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("{}: give the port (etcd's is 2379)", excerpt(url)))?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("{} is not host:port", excerpt(rest)));
    }
    Ok(())
}

/// A key file that only its owner may read, and that `lbd` can.
fn private_file(path: &std::path::Path) -> Result<(), String> {
    super::parse::private_file(path)?;
    std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(yaml: &str) -> EtcdSource {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn a_plain_source_is_valid_and_defaults_its_timers() {
        let s = source("endpoints: [http://127.0.0.1:2379]\nprefix: /lb/tier1\n");
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        assert_eq!(
            (s.timeout, s.lease),
            (Duration::from_secs(5), Duration::from_secs(10))
        );
    }

    #[test]
    fn every_problem_is_named() {
        let s = source(
            "endpoints: [https://a:2379, 'ftp://b:1', 'http://c', 'http://:5']\nprefix: lb/\nname: 'a b'\ntimeout: 10ms\nlease: 1s\n",
        );
        let fields: Vec<_> = s.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "endpoints[0]",
                "endpoints[1]",
                "endpoints[2]",
                "endpoints[3]",
                "prefix",
                "name",
                "timeout",
                "lease"
            ]
        );
    }

    #[test]
    fn a_lease_outlives_one_request() {
        let s = source("endpoints: [http://a:2379]\nprefix: /t\ntimeout: 5s\nlease: 5s\n");
        let problems = s.validate();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "lease");
        let s = source("endpoints: [http://a:2379]\nprefix: /t\ntimeout: 2s\nlease: 3s\n");
        assert!(s.validate().is_empty(), "{:?}", s.validate());
    }

    #[test]
    fn tls_wants_https_everywhere_and_a_private_key() {
        let dir = crate::scratch::ScratchDir::new("lb-source-tls");
        let (ca, key) = (dir.join("ca.pem"), dir.join("c.key"));
        std::fs::write(&ca, "x").unwrap();
        std::fs::write(&key, "x").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = source(&format!(
            "endpoints: [http://a:2379]\nprefix: /t\ntls: {{ ca: {}, cert: {}, key: {} }}\n",
            ca.display(),
            ca.display(),
            key.display()
        ));
        assert!(s.validate()[0].message.contains("plain HTTP"));
        let files = s.check_files();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].field, "source.etcd.tls.key");
        assert!(files[0].message.contains("chmod 600"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(s.check_files().is_empty());
    }

    /// Each rule alone, at its bounds: the most allowed passes, one step
    /// beyond is refused with the field's name.
    #[test]
    fn each_rule_holds_alone_and_its_bounds_are_inclusive() {
        let base = "prefix: /t\n";
        let urls = |n: usize| {
            let list: Vec<String> = (0..n).map(|i| format!("http://e{i}:2379")).collect();
            format!("endpoints: [{}]\n", list.join(", "))
        };
        let one = urls(1);
        let fields = |yaml: &str| -> Vec<String> {
            source(yaml)
                .validate()
                .into_iter()
                .map(|e| e.field)
                .collect()
        };
        let long = |n: usize| format!("/{}", "p".repeat(n - 1));
        let user = |u: &str| format!("{one}{base}auth: {{ user: '{u}', password_file: /x }}\n");
        for ok in [
            format!("{}{base}", urls(16)),
            format!("{one}prefix: /a\n"),
            format!("{one}prefix: {}\n", long(128)),
            format!("endpoints: [https://a:2379]\n{base}tls: {{ ca: /c, cert: /c, key: /k }}\n"),
            user(&"u".repeat(128)),
        ] {
            assert_eq!(fields(&ok), Vec::<String>::new(), "{ok}");
        }
        let bad: Vec<(String, &str)> = vec![
            (format!("endpoints: []\n{base}"), "endpoints"),
            (format!("{}{base}", urls(17)), "endpoints"),
            (format!("{one}prefix: lb\n"), "prefix"),
            (format!("{one}prefix: /\n"), "prefix"),
            (format!("{one}prefix: {}\n", long(129)), "prefix"),
            (format!("{one}prefix: /a/\n"), "prefix"),
            (format!("{one}prefix: /a//b\n"), "prefix"),
            (format!("{one}prefix: /a\u{e9}\n"), "prefix"),
            (
                format!("endpoints: [https://a:2379]\n{base}tls: {{ ca: /c, cert: /c }}\n"),
                "tls",
            ),
            (
                format!("endpoints: [https://a:2379]\n{base}tls: {{ ca: /c, key: /k }}\n"),
                "tls",
            ),
            (user(""), "auth.user"),
            (user(&"u".repeat(129)), "auth.user"),
            (user("a b"), "auth.user"),
            (
                format!("endpoints: ['http://a/b:2379']\n{base}"),
                "endpoints[0]",
            ),
        ];
        for (yaml, field) in bad {
            assert_eq!(fields(&yaml), [field], "{yaml}");
        }
        let https = source(&format!("endpoints: [https://a:2379]\n{base}")).validate();
        assert!(https[0].message.contains("needs `tls`"), "{https:?}");
        // The section: an etcd source's problems under `etcd.`, and one
        // that names no source is refused.
        let section = SourceConfig {
            etcd: Some(source(&format!("{one}prefix: lb\n"))),
        };
        let fields: Vec<String> = section.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["etcd.prefix"]);
        let empty = SourceConfig::default().validate();
        assert!(
            empty.len() == 1 && empty[0].message.contains("name a source"),
            "{empty:?}"
        );
    }

    #[test]
    fn etcd_auth_wants_a_user_and_a_private_one_line_password() {
        let dir = crate::scratch::ScratchDir::new("lb-source-auth");
        let file = dir.join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let s = source(&format!(
            "endpoints: [http://a:2379]\nprefix: /t\nauth: {{ user: lb1, password_file: {} }}\n",
            file.display()
        ));
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        let files = s.check_files();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].field, "source.etcd.auth.password_file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(s.check_files().is_empty());
        assert_eq!(s.auth.as_ref().unwrap().password().unwrap(), "s3cret");
        // One line of 1 to 1024 bytes, its newline left out.
        let auth = s.auth.as_ref().unwrap();
        std::fs::write(&file, format!("{}\n", "p".repeat(1024))).unwrap();
        assert_eq!(auth.password().unwrap().len(), 1024);
        for bad in ["two\nlines\n".to_string(), "\n".into(), "p".repeat(1025)] {
            std::fs::write(&file, &bad).unwrap();
            let e = auth.password().unwrap_err();
            assert!(
                e.contains("one line of 1-1024 bytes"),
                "{} bytes: {e}",
                bad.len()
            );
        }
        let bad = source(
            "endpoints: [http://a:2379]\nprefix: /t\nauth: { user: \"a b\", password_file: /x }\n",
        );
        assert_eq!(bad.validate()[0].field, "auth.user");
    }
}
