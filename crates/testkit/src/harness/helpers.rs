//! Helper processes for the provisioner: Python scripts written into the world (the rules
//! helper, the key helper), the test CA they sign with, and the helper command's quoting.

use std::path::Path;
use std::process::{Command, Stdio};

use super::world::World;

/// A Python helper script written into the world's directory; returns the `helper:` command.
pub fn python_helper(world: &World, name: &str, source: &str, args: &[&str]) -> String {
    let path = world.write(name, source);
    let mut command = format!("python3 {path}");
    for arg in args {
        command.push(' ');
        command.push_str(&shell_quote(arg));
    }
    command
}

/// Single-quotes an argument for the helper command line (shell quoting rules).
pub fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', "'\\''"))
}

/// Makes a test CA (`ca.pem`, `ca-key.pem`) in `dir` with the openssl command line.
pub fn make_ca(dir: &Path) {
    std::fs::create_dir_all(dir).expect("CA dir");
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout"])
        .arg(dir.join("ca-key.pem"))
        .arg("-out")
        .arg(dir.join("ca.pem"))
        .args(["-days", "30", "-subj", "/CN=Choria E2E Test CA"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs (install the openssl package)");
    assert!(status.success(), "openssl could not make the test CA");
}

/// The YAML for a helper command (quoted for YAML).
pub fn yaml_helper(command: &str) -> String {
    format!(
        "helper: {}\n",
        serde_json::to_string(command).expect("a string")
    )
}

/// The e2e tests' own helper: configures every node out of provisioning mode, except where
/// its rules file (argument 1, JSON) says otherwise:
/// `{"defer": [identity..], "shutdown": [identity..], "fail": [identity..],
///   "upgrade": {identity: version}, "brokers": "nats://..", "record_dir": DIR,
///   "wait_for": FILE}` (`fail`: exit 1 without an answer). With `record_dir` it writes each
/// input it was given to `DIR/<identity>.<n>.json`, so tests can check what the provisioner
/// passed; with `wait_for` it answers only once FILE exists (at most 300 s), so a test can
/// keep nodes in flight.
pub const RULES_HELPER: &str = r#"#!/usr/bin/env python3
import json, os, sys, time

rules = json.load(open(sys.argv[1]))
node = json.load(sys.stdin)
identity = node["identity"]
inventory = json.loads(node.get("inventory") or "{}")

if rules.get("record_dir"):
    name = "%s.%d.%d.json" % (identity, time.time_ns(), os.getpid())
    with open(os.path.join(rules["record_dir"], name), "w") as f:
        json.dump(node, f)

if rules.get("wait_for"):
    deadline = time.time() + 300
    while not os.path.exists(rules["wait_for"]) and time.time() < deadline:
        time.sleep(0.1)

if identity in rules.get("fail", []):
    sys.exit("e2e rules fail " + identity)
if identity in rules.get("defer", []):
    reply = {"defer": True, "msg": "e2e rules defer " + identity}
elif identity in rules.get("shutdown", []):
    reply = {"shutdown": True, "msg": "e2e rules shut down " + identity}
else:
    reply = {
        "defer": False,
        "msg": "configured by the e2e rules helper",
        "configuration": {
            "identity": identity,
            "plugin.choria.server.provision": "false",
            "plugin.choria.middleware_hosts": rules.get("brokers", "nats://broker.example.net:4222"),
        },
    }
    upgrade = rules.get("upgrade", {}).get(identity)
    if upgrade:
        reply["upgrade"] = upgrade
print("e2e-helper: %s runs %s" % (identity, inventory.get("version")), file=sys.stderr)
json.dump(reply, sys.stdout)
"#;

/// Signs a certificate with the test CA for a private key it generates itself, and returns
/// that key with the certificate: the provisioner must carry it to the node encrypted.
const KEY_HELPER: &str = r#"#!/usr/bin/env python3
import json, os, subprocess, sys, tempfile

ca_dir, brokers = sys.argv[1], sys.argv[2]
node = json.load(sys.stdin)
identity = node["identity"]
if not node.get("jwt"):
    sys.exit("key-helper: no verified provisioning JWT claims for %s" % identity)
ssldir = node["csr"]["ssldir"]

def openssl(*args):
    done = subprocess.run(["openssl"] + list(args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        sys.exit("key-helper: openssl %s: %s" % (args[0], done.stderr))
    return done.stdout

with tempfile.TemporaryDirectory() as work:
    key_file = os.path.join(work, "key.pem")
    csr_file = os.path.join(work, "req.csr")
    # PKCS#1 ("RSA PRIVATE KEY"), as go-choria writes and reads private.pem.
    openssl("genrsa", "-traditional", "-out", key_file, "2048")
    openssl("req", "-new", "-key", key_file, "-subj", "/CN=" + identity, "-out", csr_file)
    certificate = openssl("x509", "-req", "-in", csr_file, "-CA", os.path.join(ca_dir, "ca.pem"),
                          "-CAkey", os.path.join(ca_dir, "ca-key.pem"), "-set_serial",
                          str(int.from_bytes(os.urandom(8), "big")), "-days", "2", "-sha256")
    key = open(key_file).read()
ca = open(os.path.join(ca_dir, "ca.pem")).read()
print("key-helper: made a key and a certificate for %s" % identity, file=sys.stderr)
json.dump({
    "defer": False,
    "msg": "key and certificate from the e2e key helper",
    "key": key,
    "certificate": certificate,
    "ca": ca,
    "ssldir": ssldir,
    "configuration": {
        "identity": identity,
        "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": brokers,
        "plugin.security.provider": "file",
        "plugin.security.file.certificate": ssldir + "/certificate.pem",
        "plugin.security.file.key": ssldir + "/private.pem",
        "plugin.security.file.ca": ssldir + "/ca.pem",
    },
}, sys.stdout)
"#;

/// Writes [`KEY_HELPER`] into the world for the CA in `ca_dir`; returns the `helper:` command.
pub fn key_helper(world: &World, ca_dir: &Path) -> String {
    python_helper(
        world,
        "key-helper.py",
        KEY_HELPER,
        &[&ca_dir.display().to_string(), &world.broker.url()],
    )
}

/// Writes the rules helper and its rules into the world; returns the `helper:` command.
pub fn rules_helper(world: &World, rules: &serde_json::Value) -> String {
    let rules_path = world.write("helper-rules.json", &rules.to_string());
    python_helper(world, "e2e-rules-helper.py", RULES_HELPER, &[&rules_path])
}
