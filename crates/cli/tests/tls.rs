//! NBD over TLS with real clients (libnbd's nbdinfo, nbdcopy and fio's nbd engine; qemu-io
//! and qemu-img with tls-creds objects), certificates made here with certtool and keys with
//! psktool (gnutls-bin, from scripts/setup.sh); and every refusal the server promises, each
//! followed by a client that is still served: plaintext against `--tls require`, a wrong key,
//! an unknown identity, a client certificate from another CA or expired, a client outside the
//! allowlist, garbage instead of a ClientHello, plaintext after STARTTLS, a client that
//! stalls in the handshake, too many clients in the handshake.

mod common;

use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_STARTTLS: u32 = 5;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_ERR_TLS_REQD: u32 = 0x8000_0005;
const REP_ERR_UNSUP: u32 = 0x8000_0001;

fn create(dir: &Path) -> Vec<PathBuf> {
    let m: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("m{i}"))).collect();
    run(Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args([
            "create", "--level", "5", "--chunk", "64K", "-N", "vol", "--size", "16M",
        ])
        .args(&m));
    m
}

fn certtool(dir: &Path, args: &[&str]) {
    run(Command::new("certtool").args(args).current_dir(dir));
}

/// Writes a certtool template and returns its name.
fn template(dir: &Path, name: &str, text: &str) -> String {
    std::fs::write(dir.join(name), text).unwrap();
    name.to_string()
}

/// A CA in `dir` (ca-key.pem, ca-cert.pem).
fn make_ca(dir: &Path, cn: &str) {
    std::fs::create_dir_all(dir).unwrap();
    certtool(dir, &["--generate-privkey", "--outfile", "ca-key.pem"]);
    let t = template(
        dir,
        "ca.info",
        &format!("cn = {cn}\nca\ncert_signing_key\nexpiration_days = 30\n"),
    );
    certtool(
        dir,
        &[
            "--generate-self-signed",
            "--load-privkey",
            "ca-key.pem",
            "--template",
            &t,
            "--outfile",
            "ca-cert.pem",
        ],
    );
}

/// A key (`name`-key.pem) and a certificate (`name`-cert.pem) in `dir`, signed by the CA in
/// `ca`, from `body` (certtool template lines).
fn make_cert(dir: &Path, ca: &Path, name: &str, body: &str) {
    let key = format!("{name}-key.pem");
    certtool(dir, &["--generate-privkey", "--outfile", &key]);
    let t = template(dir, &format!("{name}.info"), body);
    let (ca_cert, ca_key) = (ca.join("ca-cert.pem"), ca.join("ca-key.pem"));
    certtool(
        dir,
        &[
            "--generate-certificate",
            "--load-ca-certificate",
            ca_cert.to_str().unwrap(),
            "--load-ca-privkey",
            ca_key.to_str().unwrap(),
            "--load-privkey",
            &key,
            "--template",
            &t,
            "--outfile",
            &format!("{name}-cert.pem"),
        ],
    );
}

fn server_body(cn: &str) -> String {
    format!(
        "organization = uraid\ncn = {cn}\ndns_name = localhost\nip_address = 127.0.0.1\n\
         tls_www_server\nencryption_key\nsigning_key\nexpiration_days = 30\n"
    )
}

const CLIENT_BODY: &str = "organization = uraid\ncn = client1\ntls_www_client\nencryption_key\n\
                           signing_key\nexpiration_days = 30\n";

/// The server's and the good client's directory (nbdkit's and qemu's file names; libnbd
/// reads the client's files from the same directory).
fn pki(dir: &Path) -> PathBuf {
    let p = dir.join("pki");
    make_ca(&p, "uraid test CA");
    make_cert(&p, &p, "server", &server_body("localhost"));
    make_cert(&p, &p, "client", CLIENT_BODY);
    p
}

/// A client directory that trusts the server's CA but brings `client-*.pem` from elsewhere.
fn client_dir(dir: &Path, name: &str, good: &Path) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(good.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
    d
}

fn cmd(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// nbdinfo of `uri` succeeds and says the connection is encrypted (or not).
fn nbdinfo_ok(uri: &str, tls: bool) {
    let o = cmd("nbdinfo", &[uri]);
    let t = text(&o);
    assert!(o.status.success(), "nbdinfo {uri}: {t}");
    let want = if tls { "with TLS" } else { "without TLS" };
    assert!(t.contains(want), "nbdinfo {uri}: {t}");
}

fn nbdinfo_fails(uri: &str) -> String {
    let o = cmd("nbdinfo", &[uri]);
    let t = text(&o);
    assert!(!o.status.success(), "nbdinfo {uri} should fail: {t}");
    t
}

fn status(srv: &Server) -> Value {
    let o = cmd(
        "curl",
        &[
            "-sf",
            "--unix-socket",
            srv.ctl.to_str().unwrap(),
            "http://uraid/status",
        ],
    );
    assert!(o.status.success(), "status: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn refused(srv: &Server, reason: &str) -> u64 {
    status(srv)["connections"]["refused"][reason]
        .as_u64()
        .unwrap()
}

fn tls_failures(srv: &Server) -> u64 {
    status(srv)["tls"]["failures"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// A raw client's view of the option phase.
struct Raw<S: Read + Write> {
    s: S,
}

impl<S: Read + Write> Raw<S> {
    /// Reads the greeting, sends fixed-newstyle + no-zeroes.
    fn new(mut s: S) -> Raw<S> {
        let mut g = [0u8; 18];
        s.read_exact(&mut g).expect("greeting");
        assert_eq!(&g[8..16], &IHAVEOPT.to_be_bytes());
        s.write_all(&3u32.to_be_bytes()).unwrap();
        Raw { s }
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        self.s.write_all(&v).unwrap();
    }

    /// The next option reply: (option, type).
    fn reply(&mut self) -> (u32, u32) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).expect("option reply");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let mut data = vec![0u8; be(&h[16..20]) as usize];
        self.s.read_exact(&mut data).unwrap();
        (be(&h[8..12]), be(&h[12..16]))
    }

    /// The server closes the connection (after whatever it still sends, such as an alert)
    /// within `within`.
    fn closed_within(&mut self, within: Duration) {
        let t0 = Instant::now();
        let mut b = [0u8; 4096];
        loop {
            match self.s.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(_) => assert!(t0.elapsed() < within, "still open after {within:?}"),
            }
        }
    }
}

fn tcp(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn go_data() -> Vec<u8> {
    let mut d = 0u32.to_be_bytes().to_vec();
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

#[test]
fn x509_require_serves_libnbd_and_qemu_and_refuses_the_rest() {
    let dir = tmp("x509");
    let ms = create(&dir);
    let p = pki(&dir);
    let pki_s = p.to_str().unwrap().to_string();
    let srv = Serve::new(&dir)
        .tcp()
        .metrics()
        .log(&dir.join("serve.log"))
        .args([
            "--tls",
            "require",
            "--tls-certificates",
            &pki_s,
            "--tls-verify-peer",
            "--handshake-timeout",
            "2",
            "--max-handshakes",
            "3",
        ])
        .members(&ms)
        .start();
    let tcp_uri = format!("nbds://{}/vol?tls-certificates={pki_s}", srv.tcp_addr());
    let unix_uri = format!(
        "nbds+unix:///vol?socket={}&tls-certificates={pki_s}",
        srv.sock.display()
    );
    nbdinfo_ok(&tcp_uri, true);
    nbdinfo_ok(&unix_uri, true);

    // Data both ways over TLS: nbdcopy in and out, byte for byte.
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("in"), &data).unwrap();
    let input = dir.join("in");
    let o = cmd("nbdcopy", &[input.to_str().unwrap(), &tcp_uri]);
    assert!(o.status.success(), "nbdcopy in: {}", text(&o));
    let out = dir.join("out");
    let o = cmd("nbdcopy", &[&unix_uri, out.to_str().unwrap()]);
    assert!(o.status.success(), "nbdcopy out: {}", text(&o));
    assert!(
        std::fs::read(&out).unwrap()[..data.len()] == data[..],
        "read back over TLS differs"
    );

    // qemu-io with a tls-creds-x509 object; qemu 9+ also asks for extended headers, after
    // STARTTLS (what it negotiated before is forgotten there). Kept open on its stdin while
    // the server's client list is read.
    let mut q = Command::new("qemu-io")
        .args([
            "--object",
            &format!("tls-creds-x509,id=tls0,dir={pki_s},endpoint=client"),
            "--image-opts",
            &format!(
                "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={},export=vol,tls-creds=tls0",
                srv.tcp_addr().rsplit(':').next().unwrap()
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(
        q.stdin.as_mut().unwrap(),
        "write -P 0xa5 1M 1M\nread -P 0xa5 1M 1M"
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = status(&srv);
        let c = st["connections"]["clients"].as_array().unwrap().clone();
        if let Some(c) = c.iter().find(|c| c["phase"] == "transmission") {
            assert_eq!(c["headers"], "extended", "{c}");
            assert_eq!(c["tls"]["version"], "TLSv1.3", "{c}");
            assert_eq!(c["tls"]["peer"], "CN=client1", "{c}");
            break;
        }
        assert!(Instant::now() < deadline, "qemu-io not listed: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    writeln!(q.stdin.as_mut().unwrap(), "quit").unwrap();
    let o = q.wait_with_output().unwrap();
    assert!(
        o.status.success() && !text(&o).contains("fail"),
        "qemu-io: {}",
        text(&o)
    );

    // Refusals; after each, a good client is still served.
    // 1. Plaintext against require: every option but STARTTLS gets NBD_REP_ERR_TLS_REQD.
    let t = nbdinfo_fails(&format!("nbd://{}/vol", srv.tcp_addr()));
    assert!(t.contains("not supported") || t.contains("TLS"), "{t}");
    let mut raw = Raw::new(tcp(srv.tcp_addr()));
    raw.option(OPT_GO, &go_data());
    assert_eq!(raw.reply(), (OPT_GO, REP_ERR_TLS_REQD));
    raw.option(1, b"vol"); // NBD_OPT_EXPORT_NAME: cannot be refused, so the server hangs up
    raw.closed_within(Duration::from_secs(5));
    nbdinfo_ok(&unix_uri, true);

    // 2. A client certificate from another CA, and an expired one from the right CA.
    let other_ca = dir.join("other-ca");
    make_ca(&other_ca, "another CA");
    let other = client_dir(&dir, "other", &p);
    make_cert(&other, &other_ca, "client", CLIENT_BODY);
    let expired = client_dir(&dir, "expired", &p);
    make_cert(
        &expired,
        &p,
        "client",
        "cn = old\ntls_www_client\nencryption_key\nsigning_key\n\
         activation_date = \"2020-01-01 00:00:00 UTC\"\n\
         expiration_date = \"2020-02-01 00:00:00 UTC\"\n",
    );
    // And none at all.
    let none = client_dir(&dir, "none", &p);
    for d in [&other, &expired, &none] {
        nbdinfo_fails(&format!(
            "nbds://{}/vol?tls-certificates={}",
            srv.tcp_addr(),
            d.display()
        ));
        nbdinfo_ok(&tcp_uri, true);
    }

    // 3. Garbage instead of a ClientHello; plaintext after STARTTLS.
    for junk in [
        &b"\x00\x01\x02 this is not TLS at all \xff\xfe"[..],
        &{
            let mut v = IHAVEOPT.to_be_bytes().to_vec();
            v.extend_from_slice(&OPT_GO.to_be_bytes());
            v.extend_from_slice(&6u32.to_be_bytes());
            v.extend_from_slice(&go_data());
            v
        }[..],
    ] {
        let mut raw = Raw::new(tcp(srv.tcp_addr()));
        raw.option(OPT_STARTTLS, &[]);
        assert_eq!(raw.reply(), (OPT_STARTTLS, REP_ACK));
        raw.s.write_all(junk).unwrap();
        raw.closed_within(Duration::from_secs(5));
        nbdinfo_ok(&unix_uri, true);
    }

    // 4. Stalls: a client that stops mid-ClientHello is cut off after --handshake-timeout;
    // more than --max-handshakes at once are closed before the greeting.
    let before = refused(&srv, "handshake_timeout");
    let mut stalled = Raw::new(tcp(srv.tcp_addr()));
    stalled.option(OPT_STARTTLS, &[]);
    assert_eq!(stalled.reply(), (OPT_STARTTLS, REP_ACK));
    stalled.s.write_all(&[0x16, 0x03, 0x01, 0x02]).unwrap();
    let t0 = Instant::now();
    stalled.closed_within(Duration::from_secs(10));
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(6),
        "cut off after {waited:?} (timeout 2 s)"
    );
    assert_eq!(refused(&srv, "handshake_timeout"), before + 1);
    let held: Vec<TcpStream> = (0..3).map(|_| tcp(srv.tcp_addr())).collect();
    let mut g = [0u8; 18];
    for mut h in &held {
        h.read_exact(&mut g).expect("greeting while under the cap");
    }
    let mut fourth = tcp(srv.tcp_addr());
    assert!(
        matches!(fourth.read(&mut g), Ok(0) | Err(_)),
        "a fourth client in the handshake is closed unserved"
    );
    assert!(refused(&srv, "too_many_handshakes") >= 1);
    drop(held);
    // The held ones leave (or are cut off); then clients are served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = cmd("nbdinfo", &[&tcp_uri]);
        if o.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "not served again: {}", text(&o));
        std::thread::sleep(Duration::from_millis(100));
    }

    // Counters and the log: handshakes by identity, failures by reason, bytes; refused
    // clients logged with their address; no key or panic anywhere.
    let st = status(&srv);
    let tls = &st["tls"];
    assert_eq!(tls["mode"], "require");
    assert!(tls["peers"]["CN=client1"].as_u64().unwrap() >= 5, "{tls}");
    assert!(tls_failures(&srv) >= 5, "{tls}");
    assert!(tls["bytes_encrypted"].as_u64().unwrap() > data.len() as u64);
    assert!(tls["bytes_decrypted"].as_u64().unwrap() > data.len() as u64);
    let metrics = cmd("curl", &["-sf", srv.metrics_url()]);
    let m = String::from_utf8_lossy(&metrics.stdout);
    for want in [
        "uraid_nbd_tls_handshakes_total{array=\"vol\",peer=\"CN=client1\"}",
        "uraid_nbd_tls_failures_total{array=\"vol\",reason=",
        "uraid_nbd_tls_bytes_total{array=\"vol\",direction=\"encrypted\"}",
        "uraid_nbd_refused_total{array=\"vol\",reason=\"too_many_handshakes\"}",
    ] {
        assert!(m.contains(want), "metrics lack {want}: {m}");
    }
    srv.stop();
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    assert!(log.contains("TLS handshake with 127.0.0.1 failed"), "{log}");
    assert!(log.contains("cut off 127.0.0.1"), "{log}");
    assert!(log.contains("refused a connection from 127.0.0.1"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn psk_serves_libnbd_and_qemu_and_refuses_wrong_keys_and_identities() {
    let dir = tmp("psk");
    let ms = create(&dir);
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let file = keys.join("keys.psk");
    run(Command::new("psktool").args(["-u", "alice", "-p", file.to_str().unwrap()]));
    run(Command::new("psktool").args(["-u", "bob", "-p", file.to_str().unwrap()]));
    let file_s = file.to_str().unwrap().to_string();
    let srv = Serve::new(&dir)
        .tcp()
        .log(&dir.join("serve.log"))
        .args(["--tls", "require", "--tls-psk", &file_s])
        .members(&ms)
        .start();
    let uri =
        |user: &str, f: &str| format!("nbds://{user}@{}/vol?tls-psk-file={f}", srv.tcp_addr());
    nbdinfo_ok(&uri("alice", &file_s), true);
    nbdinfo_ok(
        &format!(
            "nbds+unix://bob@/vol?socket={}&tls-psk-file={file_s}",
            srv.sock.display()
        ),
        true,
    );
    // qemu-img with a tls-creds-psk object (keys.psk in its directory).
    let o = cmd(
        "qemu-img",
        &[
            "info",
            "--object",
            &format!(
                "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
                keys.display()
            ),
            "--image-opts",
            &format!(
                "file.driver=nbd,file.host=127.0.0.1,file.port={},file.export=vol,file.tls-creds=tls0",
                srv.tcp_addr().rsplit(':').next().unwrap()
            ),
        ],
    );
    assert!(o.status.success(), "qemu-img info over PSK: {}", text(&o));
    assert!(text(&o).contains("virtual size: "), "{}", text(&o));

    // A wrong key for a known identity, and an identity the server does not have.
    let wrong = dir.join("wrong.psk");
    run(Command::new("psktool").args(["-u", "alice", "-p", wrong.to_str().unwrap()]));
    let fails_before = tls_failures(&srv);
    nbdinfo_fails(&uri("alice", wrong.to_str().unwrap()));
    nbdinfo_ok(&uri("alice", &file_s), true);
    let carol = dir.join("carol.psk");
    run(Command::new("psktool").args(["-u", "carol", "-p", carol.to_str().unwrap()]));
    nbdinfo_fails(&uri("carol", carol.to_str().unwrap()));
    nbdinfo_ok(&uri("alice", &file_s), true);
    assert!(tls_failures(&srv) >= fails_before + 2);
    let tls = &status(&srv)["tls"];
    assert!(tls["peers"]["alice"].as_u64().unwrap() >= 3, "{tls}");
    assert!(tls["peers"]["bob"].as_u64().unwrap() >= 1, "{tls}");
    assert!(
        tls["credentials"].as_str().unwrap().contains("alice, bob"),
        "{tls}"
    );
    srv.stop();
    // Identities are logged; keys never are.
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    let secret = std::fs::read_to_string(&file).unwrap();
    for line in secret.lines() {
        let key = line.split(':').nth(1).unwrap();
        assert!(!log.contains(key), "a key in the log");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--tls on` serves both kinds of client; `--tls off` (the default) refuses STARTTLS as a
/// server without TLS would; the allowlist refuses before the greeting; reload swaps the
/// certificate for new connections while an established one goes on, and a bad file is
/// refused with the credentials in use kept.
#[test]
fn tls_on_allowlist_and_reload_without_dropping_a_client() {
    let dir = tmp("on");
    let ms = create(&dir);
    let p = pki(&dir);
    let pki_s = p.to_str().unwrap().to_string();
    // SAFETY: getuid(2) has no preconditions.
    let me = unsafe { libc::getuid() };
    let srv = Serve::new(&dir)
        .tcp()
        .log(&dir.join("serve.log"))
        .args([
            "--tls-certificates",
            &pki_s,
            "--allow",
            &format!("uid:{me}"),
            "--deny",
            "anyunix,127.0.0.2",
        ])
        .members(&ms)
        .start();
    let plain = format!("nbd+unix:///vol?socket={}", srv.sock.display());
    let secure = format!(
        "nbds+unix:///vol?socket={}&tls-certificates={pki_s}",
        srv.sock.display()
    );
    nbdinfo_ok(&plain, false);
    nbdinfo_ok(&secure, true);
    nbdinfo_ok(&format!("nbd://{}/vol", srv.tcp_addr()), false);

    // fio's nbd engine: libnbd refuses local file names in its URIs, so the certificates
    // come from $HOME/.pki/libnbd, libnbd's default place (where it finds the CA, but sends
    // no client certificate: so here, without --tls-verify-peer).
    let home = dir.join("home");
    std::fs::create_dir_all(home.join(".pki")).unwrap();
    std::os::unix::fs::symlink(&p, home.join(".pki/libnbd")).unwrap();
    let o = Command::new("fio")
        .env("HOME", &home)
        .args([
            "--name=tls",
            "--ioengine=nbd",
            &format!("--uri=nbds://{}/vol", srv.tcp_addr()),
            "--rw=randwrite",
            "--bs=4k",
            "--size=4m",
            "--iodepth=8",
            "--verify=crc32c",
            "--do_verify=1",
            "--output-format=json",
        ])
        .output()
        .unwrap();
    // fio's nbd engine prints a line before the JSON.
    let out = String::from_utf8_lossy(&o.stdout);
    let fio: Value = serde_json::from_str(&out[out.find('{').unwrap_or(0)..])
        .unwrap_or_else(|e| panic!("fio output ({e}): {}", text(&o)));
    assert!(o.status.success(), "fio: {}", text(&o));
    assert_eq!(fio["jobs"][0]["error"], 0, "fio: {}", text(&o));

    // Denied: TCP from 127.0.0.2 (matches the deny list), closed before the greeting.
    let port = srv.tcp_addr().rsplit(':').next().unwrap().to_string();
    let local = std::net::SocketAddr::from(([127, 0, 0, 2], 0));
    let sock = socket_from(local, &format!("127.0.0.1:{port}"));
    let mut b = [0u8; 18];
    let mut s = sock;
    assert!(
        matches!(s.read(&mut b), Ok(0) | Err(_)),
        "denied client got a greeting"
    );
    assert_eq!(refused(&srv, "not_allowed"), 1);
    nbdinfo_ok(&plain, false);

    // An established TLS client (nbdcopy into a pipe nobody reads yet) across a reload.
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let input = dir.join("in");
    std::fs::write(&input, &data).unwrap();
    let o = cmd("nbdcopy", &[input.to_str().unwrap(), &secure]);
    assert!(o.status.success(), "{}", text(&o));
    let mut copy = Command::new("nbdcopy")
        .args([&secure, "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let clients = loop {
        let c = status(&srv)["connections"]["clients"].clone();
        // Listed with TLS once STARTTLS is done, in transmission once its options are:
        // wait for both (status may be read between the two).
        if c.as_array()
            .unwrap()
            .iter()
            .any(|c| c["tls"].is_object() && c["phase"] == "transmission")
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no TLS client in transmission: {c}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let c = clients
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["tls"].is_object() && c["phase"] == "transmission")
        .unwrap();
    assert_eq!(c["tls"]["version"], "TLSv1.3", "{c}");
    assert!(
        c["tls"]["cipher"].as_str().unwrap().contains("AES_128_GCM"),
        "the server's order puts AES-128-GCM first: {c}"
    );
    assert_eq!(c["phase"], "transmission");
    let shown = ok(&uraid(
        &["tls", "--control", "unix:ctl.sock", "m0", "m1", "m2", "m3"],
        &dir,
    ));
    assert!(
        shown.contains("TLS on: X.509 certificate CN=localhost"),
        "{shown}"
    );
    assert!(shown.contains("TLSv1.3"), "{shown}");

    // New server certificate, then reload: new clients see it, the copy goes on.
    make_cert(&p, &p, "server", &server_body("localhost-2"));
    let reload = || {
        let args = ["tls", "--reload", "--control", "unix:ctl.sock"];
        uraid(&[&args[..], &["m0", "m1", "m2", "m3"]].concat(), &dir)
    };
    let r = ok(&reload());
    assert!(r.contains("CN=localhost-2"), "{r}");
    nbdinfo_ok(&secure, true);
    // A broken key file: refused, the loaded credentials stay.
    std::fs::write(p.join("server-key.pem"), "not a key\n").unwrap();
    let e = one_line_error(&reload());
    assert!(e.contains("server-key.pem"), "{e}");
    nbdinfo_ok(&secure, true);
    let mut got = Vec::new();
    copy.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    let st = copy.wait().unwrap();
    assert!(st.success(), "nbdcopy across the reload failed");
    assert!(
        got[..data.len()] == data[..],
        "data read across the reload differs"
    );
    srv.stop();

    // --tls off (the default): STARTTLS is refused as unsupported; plaintext is served.
    let srv = Serve::new(&dir).members(&ms).start();
    let mut raw = Raw::new(UnixStream::connect(&srv.sock).unwrap());
    raw.option(OPT_STARTTLS, &[]);
    assert_eq!(raw.reply(), (OPT_STARTTLS, REP_ERR_UNSUP));
    nbdinfo_ok(
        &format!("nbd+unix:///vol?socket={}", srv.sock.display()),
        false,
    );
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TCP connection from `local` to `to`.
fn socket_from(local: std::net::SocketAddr, to: &str) -> TcpStream {
    use std::os::fd::FromRawFd;
    let to: std::net::SocketAddrV4 = to.parse().unwrap();
    let std::net::SocketAddr::V4(local) = local else {
        panic!("v4 only")
    };
    let sa = |a: std::net::SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket(2), then bind(2) and connect(2) with sockaddr_in values that live
    // across the calls; the fd is owned by the TcpStream from then on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let l = sa(local);
        assert_eq!(
            libc::bind(fd, &l as *const _ as *const libc::sockaddr, len),
            0
        );
        let t = sa(to);
        assert_eq!(
            libc::connect(fd, &t as *const _ as *const libc::sockaddr, len),
            0,
            "connect: {}",
            std::io::Error::last_os_error()
        );
        let s = TcpStream::from_raw_fd(fd);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }
}

/// Refusals at start: one line each, naming the flag or the file.
#[test]
fn bad_tls_settings_are_refused_before_anything_is_opened() {
    let dir = tmp("bad");
    let ms = create(&dir);
    let m: Vec<&str> = ms.iter().map(|p| p.to_str().unwrap()).collect();
    let serve = |extra: &[&str]| {
        let mut a = vec!["serve", "--control", "none", "--listen", "unix:x.sock"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&m);
        one_line_error(&uraid(&a, &dir))
    };
    let e = serve(&["--tls", "require"]);
    assert!(
        e.contains("--tls require needs --tls-certificates DIR or --tls-psk FILE"),
        "{e}"
    );
    let e = serve(&["--tls-verify-peer"]);
    assert!(e.contains("--tls-verify-peer"), "{e}");
    let e = serve(&["--tls-certificates", dir.to_str().unwrap()]);
    assert!(e.contains("server-cert.pem"), "{e}");
    std::fs::write(dir.join("bad.psk"), "alice:00\nbob:xyz\n").unwrap();
    let e = serve(&["--tls-psk", "bad.psk"]);
    assert!(e.contains("bad.psk: line 2"), "{e}");
    assert!(!e.contains("xyz"), "{e}");
    let e = serve(&["--allow", "10.0.0.0/40"]);
    assert!(e.contains("--allow '10.0.0.0/40'"), "{e}");
    let e = serve(&["--handshake-timeout", "0"]);
    assert!(e.contains("--handshake-timeout"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
