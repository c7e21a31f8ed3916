//! A real etcd (Debian's `etcd-server`) in a test's namespace, and
//! `etcdctl` to write and read it: the tier tests' store, and the
//! independent reader of what each `lbd` publishes there. One member or
//! a cluster of several in one namespace (each on its own ports), data
//! under the rig's directory; killed when dropped.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{netns::Netns, routers::wait_for};

pub const ETCD: &str = "/usr/bin/etcd";
pub const ETCDCTL: &str = "/usr/bin/etcdctl";

/// One member of the cluster.
struct Member {
    name: String,
    child: Option<Child>,
    data: PathBuf,
    /// Its client and peer ports (every address of the namespace).
    client: u16,
    peer: u16,
}

/// A running etcd cluster of one or more members in one namespace;
/// stopped (SIGKILL) when dropped.
pub struct Etcd {
    members: Vec<Member>,
    ns_path: String,
    log: PathBuf,
    /// The client URLs tests use (from inside the namespace).
    pub local: String,
    /// `user:password` for etcdctl, once authentication is on.
    user: Option<String>,
    /// With TLS: the certificates (clients must present one).
    tls: Option<Certs>,
}

/// A test CA, etcd's server certificate (for 127.0.0.1 and the given
/// addresses) and a client certificate, made with openssl (P-256).
#[derive(Clone, Debug)]
pub struct Certs {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    /// Mode 0600, as `lbd` wants it.
    pub client_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl")?;
    if !out.status.success() {
        bail!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Certs {
    /// Makes them in `dir`.
    pub fn make(dir: &Path, addresses: &[std::net::Ipv4Addr]) -> Result<Certs> {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=lb-tests CA"];
        ca.extend_from_slice(&ec);
        ca.extend_from_slice(&["-keyout", "ca.key", "-out", "ca.pem"]);
        openssl(dir, &ca)?;
        let sans: Vec<String> = std::iter::once("IP:127.0.0.1".to_string())
            .chain(addresses.iter().map(|a| format!("IP:{a}")))
            .collect();
        std::fs::write(
            dir.join("server.ext"),
            format!(
                "subjectAltName={}\nextendedKeyUsage=serverAuth,clientAuth\n",
                sans.join(",")
            ),
        )?;
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
        for who in ["server", "client"] {
            let (key, csr, pem, ext) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.pem"),
                format!("{who}.ext"),
            );
            let mut req = vec!["req", "-subj", "/CN=lb-tests"];
            req.extend_from_slice(&ec);
            req.extend_from_slice(&["-keyout", &key, "-out", &csr]);
            openssl(dir, &req)?;
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                    "-out",
                    &pem,
                ],
            )?;
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            dir.join("client.key"),
            std::fs::Permissions::from_mode(0o600),
        )?;
        Ok(Certs {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        })
    }
}

/// Member `i`'s client port (2379, 12379, 22379, ...) and peer port.
pub fn client_port(i: usize) -> u16 {
    2379 + 10_000 * i as u16
}

/// How long an idle authentication token lives in the tests' etcd.
pub const AUTH_TOKEN_TTL: Duration = Duration::from_secs(3);

impl Etcd {
    /// Starts a one-member cluster in `ns`, serving clients on every
    /// address of the namespace, port 2379; waits until it answers.
    pub fn start(ns: &Netns, dir: &Path) -> Result<Etcd> {
        Etcd::cluster(ns, dir, 1)
    }

    /// Starts a cluster of `n` members (at most 5) in `ns`: member `i`
    /// serves clients on port [`client_port`]`(i)`; waits until the
    /// cluster answers.
    pub fn cluster(ns: &Netns, dir: &Path, n: usize) -> Result<Etcd> {
        Etcd::cluster_with(ns, dir, n, None)
    }

    /// A one-member cluster on port 2379 that speaks TLS only and wants
    /// a client certificate signed by `certs.ca`.
    pub fn start_tls(ns: &Netns, dir: &Path, certs: Certs) -> Result<Etcd> {
        Etcd::cluster_with(ns, dir, 1, Some(certs))
    }

    fn cluster_with(ns: &Netns, dir: &Path, n: usize, tls: Option<Certs>) -> Result<Etcd> {
        if !Path::new(ETCD).is_file() || !Path::new(ETCDCTL).is_file() {
            bail!(
                "{ETCD} is missing: the tier tests need etcd (`apt-get install etcd-server etcd-client`, or `cargo xtask setup`)"
            );
        }
        let members: Vec<Member> = (0..n.clamp(1, 5))
            .map(|i| Member {
                name: format!("m{i}"),
                child: None,
                data: dir.join(format!("etcd{i}.data")),
                client: client_port(i),
                peer: client_port(i) + 1,
            })
            .collect();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let local = members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",");
        let mut etcd = Etcd {
            members,
            ns_path: ns.path(),
            log: dir.join("etcd.log"),
            local,
            user: None,
            tls,
        };
        etcd.resume(ns)?;
        Ok(etcd)
    }

    /// Starts every stopped member again on its data (after
    /// [`kill`](Self::kill)); waits until the cluster answers.
    pub fn resume(&mut self, ns: &Netns) -> Result<()> {
        let cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        for m in self.members.iter_mut().filter(|m| m.child.is_none()) {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)?;
            let scheme = if self.tls.is_some() { "https" } else { "http" };
            let client = format!("{scheme}://0.0.0.0:{}", m.client);
            let advertise = format!("{scheme}://127.0.0.1:{}", m.client);
            let peer = format!("http://127.0.0.1:{}", m.peer);
            let mut command = ns.command(ETCD);
            if let Some(c) = &self.tls {
                command
                    .arg("--cert-file")
                    .arg(&c.server_cert)
                    .arg("--key-file")
                    .arg(&c.server_key)
                    .arg("--trusted-ca-file")
                    .arg(&c.ca)
                    .arg("--client-cert-auth");
            }
            let child = command
                .args(["--name", &m.name, "--data-dir"])
                .arg(&m.data)
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &advertise])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &cluster])
                .args(["--initial-cluster-token", "lb-tests"])
                // With authentication on, a token idle this long expires
                // (etcd's default: 300 s): the tests see what a quiet
                // tier sees after five minutes.
                .args(["--auth-token-ttl", &AUTH_TOKEN_TTL.as_secs().to_string()])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting etcd")?;
            m.child = Some(child);
        }
        wait_for(
            "etcd answering",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || Ok(self.ctl(&["put", "/lb-tests/ready", "1"]).is_ok()),
        )
        .map_err(|e| anyhow::anyhow!("{e}:\n{}", self.log_text()))?;
        Ok(())
    }

    /// Saves a snapshot of the store at `path` (`etcdctl snapshot save`,
    /// as an operator backs etcd up).
    pub fn snapshot(&self, path: &Path) -> Result<()> {
        let path = path.to_str().context("a snapshot path in UTF-8")?;
        self.ctl(&["snapshot", "save", path])?;
        Ok(())
    }

    /// Restores a one-member cluster from `snapshot`, as an operator
    /// restores a backup: the member stopped, its data replaced by
    /// `etcdctl snapshot restore` (the store's revision goes back to the
    /// snapshot's), started again; waits until it answers.
    pub fn restore(&mut self, ns: &Netns, snapshot: &Path) -> Result<()> {
        if self.members.len() != 1 || self.tls.is_some() || self.user.is_some() {
            bail!("restore: a one-member cluster without TLS or users only");
        }
        self.kill();
        let m = &self.members[0];
        if m.data.exists() {
            std::fs::remove_dir_all(&m.data)?;
        }
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let out = Command::new(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(snapshot)
            .arg("--data-dir")
            .arg(&m.data)
            .args(["--name", &m.name])
            .args(["--initial-cluster", &format!("{}={peer}", m.name)])
            .args(["--initial-cluster-token", "lb-tests"])
            .args(["--initial-advertise-peer-urls", &peer])
            .output()
            .context("running etcdctl snapshot restore")?;
        if !out.status.success() {
            bail!(
                "etcdctl snapshot restore: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.resume(ns)
    }

    /// Stops every member at once (their data stays).
    pub fn kill(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// The member that leads now (its index), from `etcdctl endpoint
    /// status`.
    pub fn leader(&self) -> Result<usize> {
        let out = self.ctl(&["endpoint", "status", "-w", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        let rows = v.as_array().context("a list of endpoints")?;
        for row in rows {
            let status = &row["Status"];
            if status["leader"].as_u64().is_some()
                && status["leader"] == status["header"]["member_id"]
            {
                let endpoint = row["Endpoint"].as_str().unwrap_or_default();
                return self
                    .members
                    .iter()
                    .position(|m| endpoint.ends_with(&format!(":{}", m.client)))
                    .context("the leader's endpoint");
            }
        }
        bail!("no member leads: {out}")
    }

    /// Turns etcd's authentication on: a `root` user (whom etcdctl is
    /// from now on), and `user` with `password`, allowed to read and write
    /// under `prefix/` only.
    pub fn enable_auth(&mut self, prefix: &str, user: &str, password: &str) -> Result<()> {
        let root = "root-password-of-the-test";
        self.ctl(&[
            "user",
            "add",
            "root",
            &format!("--new-user-password={root}"),
        ])?;
        self.ctl(&[
            "user",
            "add",
            user,
            &format!("--new-user-password={password}"),
        ])?;
        self.ctl(&["role", "add", "tier"])?;
        self.ctl(&[
            "role",
            "grant-permission",
            "tier",
            "--prefix=true",
            "readwrite",
            &format!("{prefix}/"),
        ])?;
        self.ctl(&["user", "grant-role", user, "tier"])?;
        self.ctl(&["auth", "enable"])?;
        self.user = Some(format!("root:{root}"));
        Ok(())
    }

    /// Narrows `role` (after [`enable_auth`](Self::enable_auth)) to
    /// reading `prefix/` and writing only under `prefix/<each of
    /// writable>`.
    pub fn restrict_role(&self, role: &str, prefix: &str, writable: &[&str]) -> Result<()> {
        let all = format!("{prefix}/");
        self.ctl(&["role", "revoke-permission", role, "--prefix=true", &all])?;
        self.ctl(&[
            "role",
            "grant-permission",
            role,
            "--prefix=true",
            "read",
            &all,
        ])?;
        for w in writable {
            let key = format!("{prefix}/{w}");
            self.ctl(&[
                "role",
                "grant-permission",
                role,
                "--prefix=true",
                "readwrite",
                &key,
            ])?;
        }
        Ok(())
    }

    /// Stops member `i` at once (SIGKILL; its data stays).
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut c) = self.members.get_mut(i).and_then(|m| m.child.take()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn command(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ns_path))
            .arg(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.local, "--command-timeout=5s"]);
        if let Some(user) = &self.user {
            c.args(["--user", user]);
        }
        if let Some(t) = &self.tls {
            c.arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.client_cert)
                .arg("--key")
                .arg(&t.client_key);
        }
        c
    }

    /// Runs `etcdctl ARGS`; its standard output.
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command()
            .args(args)
            .output()
            .context("running etcdctl")?;
        if !out.status.success() {
            bail!(
                "etcdctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes `value` at `key` (through standard input: values of any
    /// size); returns the store's revision after the write.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<i64> {
        use std::io::Write as _;
        let mut child = self
            .command()
            .args(["put", key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running etcdctl put")?;
        child.stdin.take().context("stdin")?.write_all(value)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "etcdctl put {key}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.revision_of(key)
    }

    /// The modification revision of `key` (0: absent), read from
    /// `etcdctl get -w json`.
    pub fn revision_of(&self, key: &str) -> Result<i64> {
        let out = self.ctl(&["get", key, "-w", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        Ok(v["kvs"][0]["mod_revision"].as_i64().unwrap_or(0))
    }

    /// The value at `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        let out = self.ctl(&["get", key, "--print-value-only"])?;
        let out = out.strip_suffix('\n').unwrap_or(&out);
        Ok((!out.is_empty()).then(|| out.to_string()))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
